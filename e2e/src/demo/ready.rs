//! "Ready. In another terminal:": the commands that reach everything the demo started, as a
//! user types them.

use std::io::Write;

use super::{
    ACCOUNT, APPS_NAMESPACE, NAMESPACE, PROXY_APP, System, hub::Hub,
    kubectl_through_hub::ProxyKubeconfig, support::line,
};
use crate::{ControlPlane, KUBERNETES_VERSION};

/// Prints the block.
pub(super) fn show(
    control_plane: &ControlPlane,
    hub: &Hub,
    proxy: &ProxyKubeconfig,
    last_operation: &str,
    system: &System,
    out: &mut dyn Write,
) {
    let run_dir = control_plane.run_dir();
    let say = |out: &mut dyn Write, text: String| line(out, format!("    {text}"));
    line(out, "==> Ready. In another terminal:".into());
    say(
        out,
        format!(
            "export KUBECONFIG={}",
            control_plane.kubeconfig_path().display()
        ),
    );
    say(
        out,
        format!(
            "export PATH={}:$PATH   # kubectl {KUBERNETES_VERSION}",
            control_plane.binaries().dir().display()
        ),
    );
    say(out, "kubectl get crds".into());
    say(out, "kubectl explain scaleagent.spec".into());
    say(
        out,
        format!("kubectl get scaleagents,agentaccounts -n {NAMESPACE}"),
    );
    say(
        out,
        format!("kubectl -n {APPS_NAMESPACE} create configmap another --from-literal=a=b"),
    );
    for path in [
        "/api/v1/accounts".to_string(),
        format!("/api/v1/accounts/{ACCOUNT}"),
        format!("/api/v1/accounts/{ACCOUNT}/objects?kind=configmaps&namespace={APPS_NAMESPACE}"),
        "/api/v1/agents".to_string(),
    ] {
        say(out, hub.curl(&path));
    }
    say(
        out,
        format!(
            "{}   # kept 15 min",
            hub.curl(&format!("/api/v1/operations/{last_operation}"))
        ),
    );
    for agent in &system.agents {
        say(
            out,
            format!(
                "curl {}/accounts   # agent {}",
                agent.admin_url(),
                agent.pod_name()
            ),
        );
    }

    show_proxy_commands(hub, proxy, out);
    say(
        out,
        format!(
            "logs: {}/*.log, {}/agents/*/*.log",
            run_dir.display(),
            run_dir.display()
        ),
    );
}

/// The proxy kubeconfig in use, and the admin command's token management.
fn show_proxy_commands(hub: &Hub, proxy: &ProxyKubeconfig, out: &mut dyn Write) {
    let say = |out: &mut dyn Write, text: String| line(out, format!("    {text}"));
    say(
        out,
        format!(
            "# the cluster through the hub's Kubernetes API proxy, as account {ACCOUNT} (its token reaches no other account):"
        ),
    );
    say(out, format!("export KUBECONFIG={}", proxy.path.display()));
    say(out, "kubectl get deploy -A".into());
    say(
        out,
        format!("kubectl -n {APPS_NAMESPACE} scale deployment {PROXY_APP} --replicas=3"),
    );

    let flags = hub.admin_flags().join(" ");
    say(
        out,
        format!(
            "# the proxy's tokens, managed with the admin token the hub wrote to {}:",
            hub.admin_token_file.display()
        ),
    );
    say(
        out,
        format!("alias scale-agent-hub={}", hub.binary.display()),
    );
    say(out, format!("scale-agent-hub token list {flags}"));
    say(
        out,
        format!(
            "scale-agent-hub token revoke <ID> {flags}   # kubectl with that token then gets 401 Unauthorized"
        ),
    );
    say(
        out,
        format!(
            "scale-agent-hub kubeconfig --account {ACCOUNT} --token-name alice {flags} > alice.kubeconfig"
        ),
    );
}
