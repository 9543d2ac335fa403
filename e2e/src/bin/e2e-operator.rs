//! The `scale-agent-operator` command built inside this package, so end-to-end tests and
//! the demo that run the operator as a process always get a fresh binary
//! (`CARGO_BIN_EXE_e2e-operator`).

fn main() -> anyhow::Result<()> {
    scale_agent_operator::cli::main()
}
