//! The `scale-agent` command: flags, logging, run until SIGTERM or Ctrl-C; or `migrate`,
//! which prints the resources for an Armory agent. `main.rs` only calls [`main`], so
//! end-to-end tests can build the same command under another name.

use std::time::Duration;

use clap::Parser as _;

use crate::{
    Options,
    config::{Command, MigrateArgs},
    migrate,
};

pub fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    if let Some(Command::Migrate(args)) = &options.command {
        return run_migrate(args);
    }
    scale_agent_runtime::init_tracing(options.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(crate::run(options, scale_agent_runtime::shutdown_signal()));
    // Do not wait for stray blocking work once the agent has stopped.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result?;
    Ok(())
}

fn run_migrate(args: &MigrateArgs) -> anyhow::Result<()> {
    let input = migrate::read_input(&args.files)?;
    let options = migrate::MigrateOptions {
        name: args.name.clone(),
        namespace: args.namespace.clone(),
        hub_address: args.hub_address.clone(),
    };
    let migration = migrate::migrate(&input, &options)?;
    print!("{}", migrate::render(&migration)?);
    Ok(())
}
