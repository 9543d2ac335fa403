//! "The cluster through the hub, with kubectl": the hub's admin command issues a kubeconfig
//! for the demo account, and the real kubectl uses it. Every request goes to the hub's
//! Kubernetes API proxy (`https://<hub>/clusters/<account>/...`), which hands it to a
//! connected agent over that agent's existing stream; the agent replays it against the API
//! server as its own ServiceAccount. Nothing reaches the cluster from outside it.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client};

use super::{
    ACCOUNT, APPS_NAMESPACE, PROXY_APP, PROXY_KUBECONFIG, SCALE_AGENT,
    hub::Hub,
    support::{command_failed, line, lines, write_file},
};
use crate::{
    ControlPlane,
    error::{Result, io_err},
    kubectl::{Kubectl, Outcome},
};

/// How long one kubectl command may take.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(90);
/// Most lines of a command's output shown.
const MAX_LINES: usize = 12;
/// Characters of the token and of the CA data left visible in the kubeconfig shown.
const TOKEN_SHOWN: usize = 8;
const CA_DATA_SHOWN: usize = 16;

/// What the next steps need of this one: the kubeconfig, for the "Ready" block.
pub(super) struct ProxyKubeconfig {
    pub path: PathBuf,
}

/// The kubectl of the control plane with the proxy kubeconfig, narrating each command as a
/// user types it.
struct ProxyKubectl {
    kubectl: Kubectl,
    kubeconfig: PathBuf,
}

impl ProxyKubectl {
    /// Runs `kubectl --kubeconfig <file> <args>` and shows its output (abridged); a failure
    /// is an error.
    async fn run(&self, out: &mut dyn Write, args: &[&str]) -> Result<Outcome> {
        let command = format!(
            "kubectl --kubeconfig {} {}",
            self.kubeconfig.display(),
            args.join(" ")
        );
        line(out, format!("    $ {command}"));
        let args: Vec<String> = args.iter().map(|a| (*a).to_string()).collect();
        let outcome = self
            .kubectl
            .run(&self.kubeconfig, &args, None, KUBECTL_TIMEOUT)
            .await?;
        lines(out, "      ", outcome.stdout.trim_end(), MAX_LINES);
        lines(out, "      ", outcome.messages().trim_end(), MAX_LINES);
        if !outcome.success() {
            return Err(command_failed(
                &command,
                outcome.code,
                &outcome.stdout,
                &outcome.stderr,
            ));
        }
        Ok(outcome)
    }
}

/// The whole section: issue the kubeconfig, show it, list Deployments, apply one, check it
/// in the cluster and wait for its rollout, all through the hub.
pub(super) async fn show(
    control_plane: &ControlPlane,
    client: &Client,
    hub: &Hub,
    out: &mut dyn Write,
) -> Result<ProxyKubeconfig> {
    line(
        out,
        format!(
            "==> The cluster through the hub, with kubectl: a kubeconfig whose server is the hub's Kubernetes API proxy; each request goes over a connected agent's stream and the agent replays it against the API server as ServiceAccount {SCALE_AGENT}-agent"
        ),
    );
    let path = issue_kubeconfig(control_plane.run_dir(), hub, out).await?;
    show_kubeconfig(&path, out)?;
    let kubectl = ProxyKubectl {
        kubectl: Kubectl::new(
            control_plane.binaries().kubectl(),
            control_plane.run_dir().join("kubectl-home"),
        ),
        kubeconfig: path.clone(),
    };
    kubectl.run(out, &["get", "deploy", "-A"]).await?;
    apply_deployment(control_plane.run_dir(), &kubectl, client, out).await?;
    kubectl
        .run(
            out,
            &[
                "rollout",
                "status",
                &format!("deployment/{PROXY_APP}"),
                "-n",
                APPS_NAMESPACE,
                "--timeout=60s",
            ],
        )
        .await?;
    line(
        out,
        "      (kubectl watched the Deployment through the hub; its pods are KWOK's: reported Running and Ready, no container runs)".into(),
    );
    Ok(ProxyKubeconfig { path })
}

/// Runs the hub's admin command `scale-agent-hub kubeconfig` (the real binary, `e2e-hub`)
/// to write the account's kubeconfig into `run_dir`; returns its path.
async fn issue_kubeconfig(run_dir: &Path, hub: &Hub, out: &mut dyn Write) -> Result<PathBuf> {
    let path = run_dir.join(PROXY_KUBECONFIG);
    let mut args = vec![
        "kubeconfig".to_string(),
        "--account".into(),
        ACCOUNT.into(),
        "-o".into(),
        path.display().to_string(),
    ];
    args.extend(hub.admin_flags());
    let command = format!("scale-agent-hub {}", args.join(" "));
    line(out, format!("    $ {command}"));
    line(
        out,
        format!(
            "      (scale-agent-hub is {} here: the hub's own command; it asks the hub's admin API for a token with the admin token)",
            hub.binary.display()
        ),
    );
    let (_, stderr) = hub.run_admin(&args, &command).await?;
    lines(out, "      ", stderr.trim_end(), MAX_LINES);
    Ok(path)
}

/// Shows the kubeconfig with its token and CA data cut short.
fn show_kubeconfig(path: &Path, out: &mut dyn Write) -> Result<()> {
    let yaml = std::fs::read_to_string(path).map_err(io_err(format!("read {}", path.display())))?;
    line(
        out,
        format!(
            "    $ cat {}   # token and CA data cut short here",
            path.display()
        ),
    );
    lines(out, "      ", mask_kubeconfig(&yaml).trim_end(), 40);
    Ok(())
}

/// `yaml` with the value of every `token:` and `certificate-authority-data:` cut to its
/// first characters and `…`.
fn mask_kubeconfig(yaml: &str) -> String {
    const CUT: [(&str, usize); 2] = [
        ("token:", TOKEN_SHOWN),
        ("certificate-authority-data:", CA_DATA_SHOWN),
    ];
    let indent_of = |line: &str| line.len() - line.trim_start().len();
    let mut masked = Vec::new();
    let mut lines = yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let indent = indent_of(line);
        let Some((key, shown, value)) = CUT.iter().find_map(|(key, shown)| {
            trimmed
                .strip_prefix(key)
                .map(|value| (key, *shown, value.trim()))
        }) else {
            masked.push(line.to_string());
            continue;
        };
        // A long value is written as a block scalar (`>-`, `|`): its text is on the
        // more-indented lines that follow.
        let mut value = value.to_string();
        if value.starts_with(['>', '|']) {
            value.clear();
            while let Some(next) = lines.next_if(|next| indent_of(next) > indent) {
                value.push_str(next.trim());
            }
        }
        let shown: String = value.chars().take(shown).collect();
        masked.push(format!("{}{key} {shown}…", &line[..indent]));
    }
    masked.join("\n")
}

/// `kubectl apply`s a small Deployment through the hub, then reads it with the admin
/// client, directly from the API server, to show it reached the cluster.
async fn apply_deployment(
    run_dir: &Path,
    kubectl: &ProxyKubectl,
    client: &Client,
    out: &mut dyn Write,
) -> Result<()> {
    let manifest = run_dir.join(format!("{PROXY_APP}.yaml"));
    write_file(&manifest, &deployment_yaml())?;
    kubectl
        .run(out, &["apply", "-f", &manifest.display().to_string()])
        .await?;
    let deployment = Api::<Deployment>::namespaced(client.clone(), APPS_NAMESPACE)
        .get(PROXY_APP)
        .await?;
    let managers: Vec<String> = deployment
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect();
    let uid = deployment.metadata.uid.unwrap_or_default();
    line(
        out,
        format!(
            "    the API server (read directly with the admin client): deployment.apps/{PROXY_APP} in {APPS_NAMESPACE}, uid {}…, resourceVersion {}, field managers {}",
            uid.chars().take(8).collect::<String>(),
            deployment.metadata.resource_version.unwrap_or_default(),
            managers.join(", ")
        ),
    );
    Ok(())
}

/// The Deployment applied through the hub: 2 replicas, so the rollout has something to
/// wait for.
fn deployment_yaml() -> String {
    format!(
        "# Applied with kubectl through the hub's Kubernetes API proxy.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {PROXY_APP}
  namespace: {APPS_NAMESPACE}
  labels:
    app: {PROXY_APP}
spec:
  replicas: 2
  selector:
    matchLabels:
      app: {PROXY_APP}
  template:
    metadata:
      labels:
        app: {PROXY_APP}
    spec:
      containers:
      - name: {PROXY_APP}
        image: registry.example/{PROXY_APP}:1.0
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubeconfig_shown_keeps_only_the_start_of_the_token_and_ca() {
        let yaml = "apiVersion: v1\nclusters:\n- name: demo\n  cluster:\n    server: https://127.0.0.1:1/clusters/demo\n    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t\nusers:\n- name: u\n  user:\n    token: sat_0123456789abcdef\n";
        let masked = mask_kubeconfig(yaml);
        assert!(
            masked.lines().any(|l| l == "    token: sat_0123…"),
            "{masked}"
        );
        assert!(!masked.contains("456789abcdef"), "{masked}");
        assert!(
            masked.contains("    certificate-authority-data: LS0tLS1CRUdJTiBD…"),
            "{masked}"
        );
        assert!(
            masked.contains("    server: https://127.0.0.1:1/clusters/demo"),
            "{masked}"
        );

        // As the hub writes it: the CA data folded onto the next line.
        let folded = "    certificate-authority-data: >-\n      LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t\nusers: []";
        assert_eq!(
            mask_kubeconfig(folded),
            "    certificate-authority-data: LS0tLS1CRUdJTiBD…\nusers: []"
        );
    }
}
