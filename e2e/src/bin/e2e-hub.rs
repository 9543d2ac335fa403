//! The `scale-agent-hub` command built inside this package, so end-to-end tests and the demo
//! that run the hub as a process always get a fresh binary (`CARGO_BIN_EXE_e2e-hub`).

fn main() -> anyhow::Result<()> {
    scale_agent_hub::cli::main()
}
