//! `kudos-sim`: see the crate docs in lib.rs for what it does.
fn main() -> std::process::ExitCode {
    kudos_sim::main_with_args()
}
