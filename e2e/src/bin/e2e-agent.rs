//! The `scale-agent` command built inside this package, so end-to-end tests that run the
//! agent as a process always get a fresh binary through `CARGO_BIN_EXE_e2e-agent`.

fn main() -> anyhow::Result<()> {
    scale_agent::cli::main()
}
