//! `scale-agent-hub`: see [`scale_agent_hub::cli`].

fn main() -> anyhow::Result<()> {
    scale_agent_hub::cli::main()
}
