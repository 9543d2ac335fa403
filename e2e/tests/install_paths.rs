//! Every documented install path lands the operator's objects where the README says
//! (namespace `scale-agent-system`, or Helm's release namespace), whatever namespace the
//! user's kubeconfig points at: `helm install`, `kubectl apply --server-side -k manifests/`,
//! and the raw files with plain `kubectl apply -f` (not through kustomize), against the real
//! control plane with the real helm and kubectl.

// Helpers outside #[test] fns panic on purpose too; clippy's test allowance does not see them.
#![allow(clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Service, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{Api, Client, Resource};
use scale_agent_e2e::{ControlPlane, fixtures};
use serde::de::DeserializeOwned;

const SYSTEM: &str = "scale-agent-system";

/// Runs `program` with `kubeconfig` (and `args`) in the repository, as the README does.
fn run(program: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .current_dir(scale_agent_e2e::repo_root())
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "{} {args:?} failed: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A copy of the admin kubeconfig whose context points at `namespace`, as a user's often
/// points at some team namespace when they install.
fn kubeconfig_in(control_plane: &ControlPlane, namespace: &str) -> anyhow::Result<PathBuf> {
    let dir = fixtures::temp_dir("install-paths")?;
    let path = dir.join("kubeconfig");
    std::fs::copy(control_plane.kubeconfig_path(), &path)?;
    run(
        &control_plane.binaries().kubectl(),
        &path,
        &[
            "config",
            "set-context",
            "--current",
            &format!("--namespace={namespace}"),
        ],
    )?;
    Ok(path)
}

/// Whether `name` exists in `namespace`.
async fn exists<K>(client: &Client, namespace: &str, name: &str) -> anyhow::Result<bool>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Ok(Api::<K>::namespaced(client.clone(), namespace)
        .get_metadata_opt(name)
        .await?
        .is_some())
}

/// The operator's namespaced objects are in `expected` and none is in `elsewhere`.
async fn assert_landed(
    client: &Client,
    expected: &str,
    elsewhere: &str,
    how: &str,
) -> anyhow::Result<()> {
    for namespace in [expected, elsewhere] {
        let want = namespace == expected;
        let found = [
            (
                "Role scale-agent-operator-leader-election",
                exists::<Role>(client, namespace, "scale-agent-operator-leader-election").await?,
            ),
            (
                "RoleBinding scale-agent-operator-leader-election",
                exists::<RoleBinding>(client, namespace, "scale-agent-operator-leader-election")
                    .await?,
            ),
            (
                "RoleBinding scale-agent-operator",
                exists::<RoleBinding>(client, namespace, "scale-agent-operator").await?,
            ),
            (
                "ServiceAccount scale-agent-operator",
                exists::<ServiceAccount>(client, namespace, "scale-agent-operator").await?,
            ),
            (
                "Deployment scale-agent-operator",
                exists::<Deployment>(client, namespace, "scale-agent-operator").await?,
            ),
            (
                "Service scale-agent-operator-metrics",
                exists::<Service>(client, namespace, "scale-agent-operator-metrics").await?,
            ),
        ];
        for (what, present) in found {
            assert_eq!(
                present,
                want,
                "{how}: {what} {} in namespace {namespace}",
                if want { "missing" } else { "unexpectedly" }
            );
        }
    }
    Ok(())
}

/// Deletes the operator's objects (not its namespace: this control plane runs no namespace
/// controller to finish deleting one), through the raw files' explicit namespaces.
fn delete_operator(kubectl: &Path, kubeconfig: &Path) -> anyhow::Result<()> {
    let mut args = vec!["delete", "--wait"];
    for file in OPERATOR_FILES {
        args.extend(["-f", file]);
    }
    run(kubectl, kubeconfig, &args)?;
    Ok(())
}

/// The raw files of the operator install, but its Namespace.
const OPERATOR_FILES: &[&str] = &[
    "manifests/operator/rbac.yaml",
    "manifests/operator/serviceaccount.yaml",
    "manifests/operator/deployment.yaml",
    "manifests/operator/service.yaml",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_install_path_lands_where_the_docs_say() -> anyhow::Result<()> {
    let control_plane = ControlPlane::shared()?;
    let client = control_plane.client().await?;
    let elsewhere = control_plane.namespace(&client, "team-a").await?;
    let kubeconfig = kubeconfig_in(control_plane, &elsewhere)?;
    let kubectl = control_plane.binaries().kubectl();
    let helm = control_plane.binaries().helm();

    // Helm, as the README: the release namespace.
    run(
        &helm,
        &kubeconfig,
        &[
            "install",
            "scale-agent",
            "manifests/helm/scale-agent",
            "-n",
            SYSTEM,
            "--create-namespace",
        ],
    )?;
    assert_landed(&client, SYSTEM, &elsewhere, "helm install").await?;
    run(
        &helm,
        &kubeconfig,
        &["uninstall", "scale-agent", "-n", SYSTEM],
    )?;

    // kustomize, as the README.
    run(
        &kubectl,
        &kubeconfig,
        &["apply", "--server-side", "-k", "manifests/"],
    )?;
    assert_landed(&client, SYSTEM, &elsewhere, "kubectl apply -k manifests/").await?;
    delete_operator(&kubectl, &kubeconfig)?;

    // The raw files with plain `kubectl apply -f`, rbac.yaml first as a new user tries it.
    for file in ["manifests/operator/namespace.yaml"]
        .iter()
        .chain(OPERATOR_FILES)
    {
        run(&kubectl, &kubeconfig, &["apply", "-f", file])?;
    }
    assert_landed(
        &client,
        SYSTEM,
        &elsewhere,
        "kubectl apply -f manifests/operator/*.yaml",
    )
    .await?;
    delete_operator(&kubectl, &kubeconfig)?;
    Ok(())
}
