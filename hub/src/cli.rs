//! The `scale-agent-hub` command: flags, logging, run until SIGTERM or Ctrl-C. `main.rs`
//! only calls [`main`], so end-to-end tests can build the same command under another name.

use clap::Parser as _;

use crate::Args;

pub fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    scale_agent_runtime::init_tracing(args.log_format);
    let config = args.into_config()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(crate::run(config, scale_agent_runtime::shutdown_signal()))?;
    Ok(())
}
