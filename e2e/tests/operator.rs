//! The operator against a real control plane with kube-controller-manager (issue 4, tests
//! 1-5): owned objects and rollout, idempotence across a restart, real and minimal RBAC,
//! scope changes and garbage collection, certificate issue and renewal, invalid objects
//! rejected or reported; plus the examples and kustomize manifests, with the operator running
//! under its own least-privilege RBAC, and convergence after a restart.
//!
//! Each test runs its own operator in-process, watching only the test's namespace, so tests
//! do not see each other's objects and an operator can be stopped and restarted.
//! Test 6 (the full flow) runs the operator's agent pod as a real process with
//! `scale_agent_e2e::local_agent` and a real hub over mTLS.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use k8s_openapi::{
    ByteString,
    api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::{ConfigMap, Secret, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams},
};
use scale_agent_crds::{
    AgentAccount, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PART_OF,
    ScaleAgent,
    agent_config::AgentConfig,
    conditions::{
        ACCEPTED, CERTIFICATE_READY, DEGRADED, PROGRESSING, READY, find_condition, is_true,
    },
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    operator::{self, Operator, kubectl},
    pki::CertificateAuthority,
    wait::wait_for,
};
use scale_agent_operator::{Config, pki};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(|| {
        ControlPlaneOptions::default().with_controller_manager()
    })?)
}

/// An admin client, the CRDs installed, and a fresh namespace.
async fn setup(prefix: &str) -> anyhow::Result<(&'static ControlPlane, Client, String)> {
    // Operator logs with RUST_LOG=scale_agent_operator=debug and --nocapture.
    scale_agent_e2e::fixtures::init_logs("error");
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&client, prefix).await?;
    Ok((control_plane, client, namespace))
}

/// The operator's configuration of these tests: most exercise the operator-signed mode
/// (spec.clientCertificate); the enrolment tests turn it off.
fn operator_config(namespace: &str) -> Config {
    Config {
        allow_operator_signed_certificates: true,
        ..Operator::config(namespace)
    }
}

async fn create_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    data: &[(&str, &str)],
) -> anyhow::Result<()> {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// Creates the issuer Secret `agent-ca` and returns the CA certificate PEM.
async fn create_ca_secret(client: &Client, namespace: &str) -> anyhow::Result<(String, String)> {
    let ca = CertificateAuthority::new("scale-agent-e2e-agents")?;
    let (cert, key) = (ca.cert_pem, ca.key_pem);
    create_secret(
        client,
        namespace,
        "agent-ca",
        &[("tls.crt", &cert), ("tls.key", &key)],
    )
    .await?;
    Ok((cert, key))
}

async fn apply_json<K>(client: &Client, namespace: &str, value: Value) -> anyhow::Result<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let name = value["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no name"))?
        .to_owned();
    let api = Api::<K>::namespaced(client.clone(), namespace);
    Ok(api
        .patch(
            &name,
            &PatchParams::apply("scale-agent-e2e").force(),
            &Patch::Apply(&value),
        )
        .await?)
}

fn scale_agent(name: &str, spec: Value) -> Value {
    let mut base = json!({
        "hub": { "address": "hub.spinnaker.example.com:9091" },
        "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
    });
    if let (Some(base), Some(extra)) = (base.as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            base.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": name },
        "spec": base,
    })
}

fn agent_account(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "AgentAccount",
        "metadata": { "name": name },
        "spec": spec,
    })
}

async fn get_agent(client: &Client, namespace: &str, name: &str) -> anyhow::Result<ScaleAgent> {
    Ok(Api::<ScaleAgent>::namespaced(client.clone(), namespace)
        .get(name)
        .await?)
}

async fn get_account(client: &Client, namespace: &str, name: &str) -> anyhow::Result<AgentAccount> {
    Ok(Api::<AgentAccount>::namespaced(client.clone(), namespace)
        .get(name)
        .await?)
}

async fn agent_config(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Option<AgentConfig>> {
    let Some(cm) = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(&format!("{name}-agent"))
        .await?
    else {
        return Ok(None);
    };
    let yaml = cm
        .data
        .and_then(|d| d.get("scale-agent.yaml").cloned())
        .unwrap_or_default();
    Ok(Some(AgentConfig::from_yaml(&yaml)?))
}

fn account_names(config: &AgentConfig) -> Vec<String> {
    config
        .kubernetes
        .accounts
        .iter()
        .map(|a| a.name.clone())
        .collect()
}

fn api_code<T: std::fmt::Debug>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => Some(200),
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(_) => None,
    }
}

fn assert_labels<K: Resource>(obj: &K, instance: &str) {
    let labels = obj.meta().labels.clone().unwrap_or_default();
    for (key, value) in [
        (LABEL_NAME, "scale-agent"),
        (LABEL_INSTANCE, instance),
        (LABEL_COMPONENT, "agent"),
        (LABEL_MANAGED_BY, "scale-agent-operator"),
        (LABEL_PART_OF, "scale-agent"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "label {key} on {:?}",
            obj.meta().name
        );
    }
}

fn assert_owned_by<K: Resource>(obj: &K, owner: &ScaleAgent) {
    let refs = obj.meta().owner_references.clone().unwrap_or_default();
    assert!(
        refs.iter()
            .any(|r| Some(&r.uid) == owner.meta().uid.as_ref() && r.controller == Some(true)),
        "{:?} is not controlled by the ScaleAgent: {refs:?}",
        obj.meta().name
    );
}

/// Creates an empty ConfigMap `name` in `namespace` as `client`; the API server's answer.
async fn create_configmap(client: &Client, namespace: &str, name: &str) -> kube::Result<ConfigMap> {
    let configmap = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &configmap)
        .await
}

/// The resourceVersion of the namespaced object `name` (empty when it does not exist).
async fn rv_in<K>(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let object = Api::<K>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?;
    Ok(object
        .and_then(|o| o.meta().resource_version.clone())
        .unwrap_or_default())
}

/// The resourceVersion of the cluster-scoped object `name` (empty when it does not exist).
async fn rv_cluster<K>(client: &Client, name: &str) -> anyhow::Result<String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let object = Api::<K>::all(client.clone()).get_opt(name).await?;
    Ok(object
        .and_then(|o| o.meta().resource_version.clone())
        .unwrap_or_default())
}

/// resourceVersions of everything the operator made for ScaleAgent `name`, and of the
/// resources themselves.
async fn resource_versions(
    client: &Client,
    namespace: &str,
    name: &str,
    accounts: &[&str],
) -> anyhow::Result<BTreeMap<String, String>> {
    let agent = format!("{name}-agent");
    let rbac = format!("scale-agent:{namespace}:{name}");
    let rv =
        |o: Option<kube::api::ObjectMeta>| o.and_then(|m| m.resource_version).unwrap_or_default();
    let mut versions = BTreeMap::new();
    versions.insert(
        "ScaleAgent".into(),
        rv(Some(get_agent(client, namespace, name).await?.metadata)),
    );
    for account in accounts {
        versions.insert(
            format!("AgentAccount/{account}"),
            rv(Some(
                get_account(client, namespace, account).await?.metadata,
            )),
        );
    }
    for (kind, version) in [
        (
            "ServiceAccount",
            rv_in::<ServiceAccount>(client, namespace, &agent).await?,
        ),
        (
            "ConfigMap",
            rv_in::<ConfigMap>(client, namespace, &agent).await?,
        ),
        (
            "Secret",
            rv_in::<Secret>(client, namespace, &format!("{agent}-tls")).await?,
        ),
        (
            "Deployment",
            rv_in::<Deployment>(client, namespace, &agent).await?,
        ),
        (
            "ClusterRole",
            rv_cluster::<ClusterRole>(client, &rbac).await?,
        ),
        (
            "ClusterRoleBinding",
            rv_cluster::<ClusterRoleBinding>(client, &rbac).await?,
        ),
        ("Role", rv_in::<Role>(client, namespace, &rbac).await?),
    ] {
        versions.insert(kind.to_string(), version);
    }
    Ok(versions)
}

#[path = "operator/custom_resources.rs"]
mod custom_resources;
#[path = "operator/enrolment.rs"]
mod enrolment;
#[path = "operator/escalation.rs"]
mod escalation;
#[path = "operator/lifecycle.rs"]
mod lifecycle;
#[path = "operator/manifests.rs"]
mod manifests;
#[path = "operator/rbac.rs"]
mod rbac;
#[path = "operator/restarts.rs"]
mod restarts;
#[path = "operator/rollout.rs"]
mod rollout;
#[path = "operator/validation.rs"]
mod validation;
