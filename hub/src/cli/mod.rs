//! The `scale-agent-hub` command. Without a subcommand it runs the hub (flags: [`Args`]) until
//! SIGTERM or Ctrl-C; `kubeconfig` and `token` are admin commands that talk to a running
//! hub ([`admin`]). `main.rs` only calls [`main`], so end-to-end tests can build the same
//! command under another name.

pub mod admin;
pub mod identity;

use clap::Parser as _;

use crate::Args;

pub fn main() -> anyhow::Result<()> {
    // The admin commands are told apart by their first word, so the hub's own flags (and
    // their SCALE_AGENT_HUB_* environment variables, set in the hub's pod) never conflict
    // with them.
    if admin::is_admin_command(std::env::args().nth(1).as_deref()) {
        let command = admin::AdminCommand::parse();
        scale_agent_runtime::init_tracing(scale_agent_runtime::LogFormat::Text);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        return runtime.block_on(admin::run(command));
    }
    // Before the runtime's threads allocate.
    let allocator = crate::allocator::configure();
    let args = Args::parse();
    // The audit file is opened before the log starts, so a path the hub cannot write stops
    // it at once, saying so.
    let audit_file = args
        .logging
        .audit_log()
        .map(|options| {
            crate::audit_log::layer(options)
                .map(|l| -> scale_agent_runtime::ExtraLayer { Box::new(l) })
        })
        .transpose()?;
    scale_agent_runtime::init_tracing_with(args.logging.log_format, audit_file);
    tracing::debug!(
        allocator,
        mmap_threshold = crate::allocator::MMAP_THRESHOLD,
        "allocator's mmap threshold fixed"
    );
    let config = args.into_config()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(crate::run(config, scale_agent_runtime::shutdown_signal()))?;
    Ok(())
}
