//! `kudos-device-plugin`: see the crate docs in lib.rs for what it does.
fn main() -> std::process::ExitCode {
    kudos_device_plugin::main_with_args()
}
