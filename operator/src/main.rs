//! `scale-agent-operator`: see [`scale_agent_operator::cli`].

fn main() -> anyhow::Result<()> {
    scale_agent_operator::cli::main()
}
