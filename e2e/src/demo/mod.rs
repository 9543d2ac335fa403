//! `make demo`: a local Scale Agent system on a real control plane, explained as it starts.
//!
//! One step per module, each an `async fn` that narrates what it does and returns what the
//! next step needs; [`run`] and `run_system` below only call them in order:
//!
//! | step | module |
//! | --- | --- |
//! | the control plane (with KWOK's fake nodes) and the CRDs | `cluster` |
//! | the agents' CA and the hub's certificates | `certificates` |
//! | the hub (mutual TLS for agents, HTTPS for its API) | `hub` |
//! | the operator, the sample `ScaleAgent` and `AgentAccount`, and what it makes of them | `operator` |
//! | the agent pods, run as local processes (there is no kubelet, see [`crate::local_agent`]) | `agents` |
//! | the hub's view of the cluster, and a scripted change seen through it | `hub_view` |
//! | the cluster through the hub's Kubernetes API proxy, with the real kubectl | `kubectl_through_hub` |
//! | deploying, scaling, rolling back and deleting an application through the operations API | `operations` |
//! | how to reach everything from another terminal | `ready` |
//!
//! Everything stops in order at the end (agents, operator, hub, control plane), also when a
//! step fails.

mod agents;
mod certificates;
mod cluster;
mod hub;
mod hub_view;
mod kubectl_through_hub;
mod operations;
mod operator;
mod ready;
pub mod real_node;
mod support;

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use kube::Client;

use crate::{ControlPlane, error::Result, local_agent::LocalAgent, process::ManagedProcess};
use support::line;

pub use operations::{APP, APP_IMAGE};

/// What the demo does and where.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Where the demo keeps its cluster (certificates, kubeconfig, logs, etcd data).
    pub run_dir: PathBuf,
    /// Stop everything right after setting up, instead of waiting for Ctrl-C.
    pub once: bool,
}

/// The default place for the demo's cluster: tmpfs, so etcd writes to memory.
pub fn default_run_dir() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm/scale-agent-demo")
    } else {
        std::env::temp_dir().join("scale-agent-demo")
    }
}

/// Namespace of the sample ScaleAgent and AgentAccount.
pub const NAMESPACE: &str = "scale-agent";
/// The sample ScaleAgent; its Deployment is `<name>-agent`.
pub const SCALE_AGENT: &str = "demo";
/// The Spinnaker account name of the sample AgentAccount.
pub const ACCOUNT: &str = "demo-cluster";
/// Namespace of the scripted change, and of what is deployed through the hub.
pub const APPS_NAMESPACE: &str = "demo-apps";
/// The Deployment the scripted change creates (with the admin client).
pub const SCRIPTED_DEPLOYMENT: &str = "web";
/// The Deployment `kubectl apply` creates through the hub's Kubernetes API proxy.
pub const PROXY_APP: &str = "greeter";
/// The kubeconfig for [`ACCOUNT`] through the hub's proxy, in the run directory.
pub const PROXY_KUBECONFIG: &str = "demo-cluster.kubeconfig";

/// How long any one wait of the demo may take.
const WAIT: Duration = Duration::from_secs(90);

/// Runs the demo, narrating to `out`.
pub async fn run(options: DemoOptions, out: &mut impl Write) -> Result<()> {
    let control_plane = cluster::start_control_plane(&options.run_dir, out).await?;
    let client = cluster::install_crds(&control_plane, out).await?;
    let mut system = System::default();
    let result = run_system(&control_plane, &client, &options, out, &mut system).await;
    if let Err(e) = &result {
        line(out, format!("==> Failed: {e}"));
    }
    system.stop(out);
    cluster::stop_control_plane(control_plane, out);
    result
}

/// Everything after the CRDs; processes go into `system` as they start, so the caller
/// stops them whatever happens here.
async fn run_system(
    control_plane: &ControlPlane,
    client: &Client,
    options: &DemoOptions,
    out: &mut dyn Write,
    system: &mut System,
) -> Result<()> {
    let files = certificates::create(control_plane, client, out).await?;
    let hub = hub::start(control_plane, &files, system, out).await?;
    operator::start(control_plane, system, out).await?;
    let agent_deployment = operator::apply_sample(control_plane, client, &hub, out).await?;
    agents::start(control_plane, client, &agent_deployment, system, out).await?;
    let view = hub_view::show(&hub, out).await?;
    hub_view::scripted_change(client, &hub, &view, out).await?;
    let proxy = kubectl_through_hub::show(control_plane, client, &hub, out).await?;
    let last_operation = operations::deploy_through_hub(client, &hub, out).await?;
    ready::show(control_plane, &hub, &proxy, &last_operation, system, out);
    if !options.once {
        line(out, "==> Press Ctrl-C to stop everything.".into());
        support::wait_for_shutdown_signal().await;
    }
    Ok(())
}

/// The processes the demo starts after the control plane, stopped in reverse order.
#[derive(Default)]
struct System {
    hub: Option<ManagedProcess>,
    operator: Option<ManagedProcess>,
    agents: Vec<LocalAgent>,
}

impl System {
    fn stop(&mut self, out: &mut dyn Write) {
        if !self.agents.is_empty() {
            let pids: Vec<String> = self.agents.iter().map(|a| a.pid().to_string()).collect();
            line(
                out,
                format!("==> Stopping the agents (pids {})", pids.join(", ")),
            );
            for agent in &mut self.agents {
                agent.stop();
            }
            self.agents.clear();
        }
        for (what, process) in [
            ("the operator", self.operator.take()),
            ("the hub", self.hub.take()),
        ] {
            if let Some(mut process) = process {
                line(out, format!("==> Stopping {what} (pid {})", process.pid()));
                process.stop(Duration::from_secs(10));
            }
        }
    }
}
