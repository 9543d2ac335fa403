//! The admission policies on an API server without ValidatingAdmissionPolicy v1 (issue 27;
//! the audit found the default install failing below Kubernetes 1.30). A real kube-apiserver
//! started with
//! `--runtime-config=admissionregistration.k8s.io/v1/validatingadmissionpolicies=false,...`
//! and its ValidatingAdmissionPolicy admission plugin off
//! ([`ControlPlaneOptions::without_validating_admission_policy`]) serves the rest of
//! admissionregistration.k8s.io/v1 but not the policy kinds, as 1.28 and 1.29 do without
//! their beta API. Checked with the real helm and kubectl:
//! - `helm install` of the chart succeeds, installs no policy, and its NOTES say so (the
//!   chart asks the server's discovery: `.Capabilities.APIVersions`);
//! - the raw manifests (`manifests/policy`, and `manifests/` which includes them) are refused
//!   for the policy kinds with kubectl's "no matches for kind" error, as docs/src say, while
//!   `kubectl apply -k manifests/` still creates everything else.
//!
//! The v1beta1 branch is not run here: a 1.37 (or 1.32) server whose v1 policy API is off
//! and v1beta1 on would store the objects, but its admission plugin reads the v1 API, so
//! it would not show what a 1.28/1.29 server enforces (e2e/tests/chart.rs renders that
//! branch with `helm template --api-versions`).

// Helpers outside #[test] fns panic on purpose too; clippy's test allowance does not see them.
#![allow(clippy::expect_used)]

use std::{path::Path, process::Command};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use scale_agent_e2e::{ControlPlane, ControlPlaneOptions, crds};

const SYSTEM: &str = "scale-agent-system";

/// Runs `program` with the control plane's admin kubeconfig in the repository; returns
/// whether it succeeded, its stdout and its stderr.
fn run(control_plane: &ControlPlane, program: &Path, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(program)
        .env("KUBECONFIG", control_plane.kubeconfig_path())
        .args(args)
        .current_dir(scale_agent_e2e::repo_root())
        .output()
        .expect("run a tool of the control plane's build");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_policy_api_the_chart_installs_no_policy_and_warns() -> anyhow::Result<()> {
    let control_plane =
        ControlPlane::start(ControlPlaneOptions::default().without_validating_admission_policy())
            .await?;
    let client = control_plane.client().await?;
    let kubectl = control_plane.binaries().kubectl();
    let helm = control_plane.binaries().helm();

    // The server really lacks the kinds, and still serves the group version.
    let (ok, resources, err) = run(
        &control_plane,
        &kubectl,
        &[
            "api-resources",
            "--api-group=admissionregistration.k8s.io",
            "-o",
            "name",
        ],
    );
    assert!(ok, "kubectl api-resources: {err}");
    assert!(
        resources.contains("validatingwebhookconfigurations"),
        "{resources}"
    );
    assert!(
        !resources.contains("validatingadmissionpolicies"),
        "--runtime-config should switch the policy kinds off: {resources}"
    );

    // Helm: installs the rest, no policy, and NOTES warn.
    let (ok, notes, err) = run(
        &control_plane,
        &helm,
        &[
            "install",
            "scale-agent",
            "manifests/helm/scale-agent",
            "-n",
            SYSTEM,
            "--create-namespace",
        ],
    );
    assert!(ok, "helm install: {err}");
    assert!(
        notes.contains("WARNING: this API server serves no ValidatingAdmissionPolicy API"),
        "{notes}"
    );
    assert!(notes.contains("NOT installed"), "{notes}");
    let (ok, manifest, err) = run(
        &control_plane,
        &helm,
        &["get", "manifest", "scale-agent", "-n", SYSTEM],
    );
    assert!(ok, "helm get manifest: {err}");
    assert!(manifest.contains("kind: Deployment"), "{manifest}");
    assert!(
        !manifest.contains("kind: ValidatingAdmissionPolicy"),
        "{manifest}"
    );
    Api::<Deployment>::namespaced(client.clone(), SYSTEM)
        .get("scale-agent-operator")
        .await?;
    let (ok, _, err) = run(
        &control_plane,
        &helm,
        &["uninstall", "scale-agent", "-n", SYSTEM, "--wait"],
    );
    assert!(ok, "helm uninstall: {err}");

    // The raw policy files: refused, with kubectl's error for a kind the server lacks.
    let no_match = "no matches for kind \"ValidatingAdmissionPolicy\" in version \
                    \"admissionregistration.k8s.io/v1\"";
    let (ok, _, err) = run(
        &control_plane,
        &kubectl,
        &["apply", "--server-side", "-k", "manifests/policy"],
    );
    assert!(!ok, "kubectl apply -k manifests/policy should fail");
    assert!(err.contains(no_match), "{err}");

    // kustomize over everything: the CRDs and the operator land, the policies do not, and
    // kubectl says so (exit status 1).
    let (ok, applied, err) = run(
        &control_plane,
        &kubectl,
        &["apply", "--server-side", "-k", "manifests/"],
    );
    assert!(
        !ok,
        "kubectl apply -k manifests/ should report the policies"
    );
    assert!(err.contains(no_match), "{err}");
    assert!(
        applied.contains("deployment.apps/scale-agent-operator serverside-applied"),
        "{applied}"
    );
    for crd in crds::read_crds(&crds::manifests_dir())? {
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert!(
            applied.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{name}"
            )),
            "{name} in {applied}"
        );
    }
    Api::<Deployment>::namespaced(client, SYSTEM)
        .get("scale-agent-operator")
        .await?;
    control_plane.stop();
    Ok(())
}
