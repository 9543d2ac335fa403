//! `scale-agent`: see [`scale_agent::cli`].

fn main() -> anyhow::Result<()> {
    scale_agent::cli::main()
}
