//! `kudos-node-agent`: see the crate docs in lib.rs for what it does.
fn main() -> std::process::ExitCode {
    kudos_node_agent::main_with_args()
}
