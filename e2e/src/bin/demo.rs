//! `scale-agent-demo`: runs Scale Agent locally on a real control plane (`make demo`).

use std::path::PathBuf;

use clap::Parser;
use scale_agent_e2e::demo::{self, DemoOptions};

/// Starts a local Kubernetes control plane (with KWOK's fake nodes) with Scale Agent
/// installed: the hub, the operator and the agent pods (as local processes) it reconciles
/// from a sample ScaleAgent; shows the hub's view of the cluster as it changes, kubectl
/// through the hub's Kubernetes API proxy, deployments through its operations API, how to
/// reach everything, and stops it all on Ctrl-C.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory for the demo cluster's certificates, kubeconfig, logs and etcd data.
    /// Anything already there is replaced. Defaults to /dev/shm/scale-agent-demo.
    #[arg(long, env = "SCALE_AGENT_DEMO_DIR")]
    run_dir: Option<PathBuf>,

    /// Set everything up, then stop at once instead of waiting for Ctrl-C.
    #[arg(long)]
    once: bool,

    /// Instead of the demo: a one-node cluster with a real kubelet, containerd and runc,
    /// this build's images loaded, readied for the chart and left running to follow the
    /// guide's "On a real cluster" page on (`make demo-node`; needs root). Its directory
    /// defaults to /dev/shm/scale-agent-demo-node.
    #[arg(long)]
    real_node: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.real_node {
        let run_dir = args
            .run_dir
            .unwrap_or_else(demo::real_node::default_run_dir);
        return demo::real_node::run(&run_dir, args.once, &mut std::io::stdout()).await;
    }
    let options = DemoOptions {
        run_dir: args.run_dir.unwrap_or_else(demo::default_run_dir),
        once: args.once,
    };
    demo::run(options, &mut std::io::stdout()).await?;
    Ok(())
}
