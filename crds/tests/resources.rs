//! Parsing resources as users write them: defaults, round trips, helpers.

// Helpers outside #[test] fns panic on purpose too; clippy's test allowance does not see them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kube::CustomResourceExt;
use scale_agent_crds::v1alpha1::{
    Access, CredentialsType, DEFAULT_AGENT_IMAGE, ImagePullPolicy, Mode, ScopeType,
};
use scale_agent_crds::{AgentAccount, ScaleAgent};
use serde_json::Value;

const MINIMAL_SCALE_AGENT: &str = r#"
apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: prod
  namespace: scale-agent
spec:
  hub:
    address: scale-agent-hub.spinnaker.example.com:9091
  clientCertificate:
    issuerSecretRef:
      name: agent-ca
"#;

const FULL_SCALE_AGENT: &str = r#"
apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata:
  name: infra
  namespace: scale-agent
spec:
  mode: Infrastructure
  hub:
    address: "[2001:db8::1]:9091"
    tls:
      caSecretRef: {name: hub-ca, key: bundle.pem}
      serverName: hub.internal
  clientCertificate:
    issuerSecretRef: {name: agent-ca, certKey: ca.pem, keyKey: ca-key.pem}
    lifetime: 720h
    identity: prod-eu-west-1
  replicas: 3
  image: registry.example.com/scale-agent/agent:v9
  imagePullPolicy: Always
  resources:
    requests: {cpu: 100m, memory: 256Mi}
    limits: {memory: 1Gi}
  scope:
    type: Namespaces
    namespaces: [team-a, team-b]
  access: Deploy
  defaults:
    omitKinds: [Event]
  listBudget: {total: 40, perAccount: 10}
  heartbeat: {periodSeconds: 30}
  backoff: {baseSeconds: 2, factor: 2.0, jitter: 0.1, capSeconds: 60}
"#;

const MINIMAL_AGENT_ACCOUNT: &str = r#"
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: prod-eu-west-1
  namespace: scale-agent
spec:
  agentRef: prod
"#;

const FULL_AGENT_ACCOUNT: &str = r#"
apiVersion: scaleagent.dev/v1alpha1
kind: AgentAccount
metadata:
  name: remote
  namespace: scale-agent
spec:
  agentRef: infra
  accountName: remote-cluster-1
  credentials:
    type: Kubeconfig
    kubeconfigSecretRef: {name: remote-kubeconfig, context: admin@remote}
  namespaces: [team-a]
  kinds: [Deployment, services, ingresses.networking.k8s.io]
  customResources:
    - {kind: ServiceMonitor, group: monitoring.coreos.com}
    - {kind: ClusterIssuer, group: cert-manager.io, version: v1, namespaced: false}
  onlyNamespacedResources: true
  permissions:
    read: [dev, sre]
    write: [sre]
  podMetrics: true
"#;

#[test]
fn minimal_scale_agent_gets_defaults() {
    let agent: ScaleAgent = serde_saphyr::from_str(MINIMAL_SCALE_AGENT).unwrap();
    let spec = &agent.spec;
    assert_eq!(spec.mode, Mode::Agent);
    assert_eq!(spec.replicas, 2);
    assert_eq!(spec.image, None);
    assert_eq!(spec.image_or_default(), DEFAULT_AGENT_IMAGE);
    assert!(DEFAULT_AGENT_IMAGE.ends_with(concat!(":v", env!("CARGO_PKG_VERSION"))));
    assert_eq!(spec.image_pull_policy, ImagePullPolicy::IfNotPresent);
    assert_eq!(spec.image_pull_policy.as_str(), "IfNotPresent");
    assert_eq!(spec.resources, None);
    assert_eq!(spec.scope.type_, ScopeType::Cluster);
    assert!(spec.scope.is_cluster());
    assert!(spec.scope.namespaces.is_empty());
    assert_eq!(spec.access, Access::ReadOnly);
    assert!(spec.defaults.kinds.is_empty() && spec.defaults.omit_kinds.is_empty());
    assert_eq!(
        (spec.list_budget.total, spec.list_budget.per_account),
        (20, 5)
    );
    assert_eq!(spec.heartbeat.period_seconds, 15);
    assert_eq!(spec.backoff.base_seconds, 1);
    assert_eq!(spec.backoff.factor, 1.6);
    assert_eq!(spec.backoff.jitter, 0.2);
    assert_eq!(spec.backoff.cap_seconds, 120);

    assert_eq!(
        spec.hub.address,
        "scale-agent-hub.spinnaker.example.com:9091"
    );
    assert_eq!(spec.hub.tls.ca_secret_ref, None);
    assert_eq!(spec.hub.tls.server_name, None);
    assert!(!spec.hub.tls.insecure_plaintext);

    let cert = spec.client_certificate.as_ref().unwrap();
    assert_eq!(cert.issuer_secret_ref.name, "agent-ca");
    assert_eq!(cert.issuer_secret_ref.cert_key, "tls.crt");
    assert_eq!(cert.issuer_secret_ref.key_key, "tls.key");
    assert_eq!(cert.lifetime, "2160h");
    assert_eq!(cert.lifetime().unwrap(), Duration::from_secs(2160 * 3600));
    assert_eq!(cert.identity, None);
    assert_eq!(agent.client_identity().as_deref(), Some("prod.scale-agent"));
    assert!(agent.status.is_none());
}

#[test]
fn full_scale_agent_parses() {
    let agent: ScaleAgent = serde_saphyr::from_str(FULL_SCALE_AGENT).unwrap();
    let spec = &agent.spec;
    assert_eq!(spec.mode, Mode::Infrastructure);
    assert_eq!(spec.hub.address, "[2001:db8::1]:9091");
    let ca = spec.hub.tls.ca_secret_ref.as_ref().unwrap();
    assert_eq!(
        (ca.name.as_str(), ca.key.as_str()),
        ("hub-ca", "bundle.pem")
    );
    assert_eq!(spec.hub.tls.server_name.as_deref(), Some("hub.internal"));
    assert_eq!(spec.replicas, 3);
    assert_eq!(
        spec.image_or_default(),
        "registry.example.com/scale-agent/agent:v9"
    );
    assert_eq!(spec.image_pull_policy, ImagePullPolicy::Always);
    let requests = spec.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert_eq!(requests["memory"].0, "256Mi");
    assert_eq!(spec.scope.type_, ScopeType::Namespaces);
    assert_eq!(spec.scope.namespaces, ["team-a", "team-b"]);
    assert_eq!(spec.access, Access::Deploy);
    assert_eq!(spec.defaults.omit_kinds, ["Event"]);
    assert_eq!(spec.list_budget.per_account, 10);
    assert_eq!(spec.heartbeat.period_seconds, 30);
    assert_eq!(spec.backoff.factor, 2.0);
    let cert = spec.client_certificate.as_ref().unwrap();
    assert_eq!(cert.lifetime().unwrap(), Duration::from_secs(720 * 3600));
    assert_eq!(agent.client_identity().as_deref(), Some("prod-eu-west-1"));
}

fn round_trip<T>(yaml: &str)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let parsed: T = serde_saphyr::from_str(yaml).unwrap();
    let json = serde_json::to_string(&parsed).unwrap();
    let again: T = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed, again);
}

#[test]
fn resources_round_trip() {
    round_trip::<ScaleAgent>(MINIMAL_SCALE_AGENT);
    round_trip::<ScaleAgent>(FULL_SCALE_AGENT);
    round_trip::<AgentAccount>(MINIMAL_AGENT_ACCOUNT);
    round_trip::<AgentAccount>(FULL_AGENT_ACCOUNT);
}

#[test]
fn serialization_is_camel_case_and_omits_unset_fields() {
    let agent: ScaleAgent = serde_saphyr::from_str(MINIMAL_SCALE_AGENT).unwrap();
    let json = serde_json::to_value(&agent).unwrap();
    assert_eq!(json["apiVersion"], "scaleagent.dev/v1alpha1");
    assert_eq!(json["kind"], "ScaleAgent");
    let spec = &json["spec"];
    assert_eq!(spec["imagePullPolicy"], "IfNotPresent");
    assert_eq!(spec["listBudget"]["perAccount"], 5);
    assert_eq!(spec["scope"], serde_json::json!({"type": "Cluster"}));
    assert!(spec.get("image").is_none());
    assert!(spec["hub"]["tls"].get("insecurePlaintext").is_none());

    let account: AgentAccount = serde_saphyr::from_str(MINIMAL_AGENT_ACCOUNT).unwrap();
    let spec = serde_json::to_value(&account.spec).unwrap();
    assert_eq!(
        spec,
        serde_json::json!({"agentRef": "prod", "credentials": {"type": "ServiceAccount"}})
    );
}

#[test]
fn minimal_agent_account_gets_defaults() {
    let account: AgentAccount = serde_saphyr::from_str(MINIMAL_AGENT_ACCOUNT).unwrap();
    let spec = &account.spec;
    assert_eq!(spec.agent_ref, "prod");
    assert_eq!(spec.account_name, None);
    assert_eq!(account.account_name(), Some("prod-eu-west-1"));
    assert_eq!(spec.credentials.type_, CredentialsType::ServiceAccount);
    assert_eq!(spec.credentials.kubeconfig_secret_ref, None);
    assert!(spec.namespaces.is_empty() && spec.omit_namespaces.is_empty());
    assert!(spec.kinds.is_empty() && spec.omit_kinds.is_empty());
    assert!(spec.custom_resources.is_empty());
    assert!(!spec.only_namespaced_resources);
    assert!(spec.permissions.is_empty());
    assert!(!spec.pod_metrics);
}

#[test]
fn full_agent_account_parses() {
    let account: AgentAccount = serde_saphyr::from_str(FULL_AGENT_ACCOUNT).unwrap();
    let spec = &account.spec;
    assert_eq!(account.account_name(), Some("remote-cluster-1"));
    assert_eq!(spec.credentials.type_, CredentialsType::Kubeconfig);
    let kubeconfig = spec.credentials.kubeconfig_secret_ref.as_ref().unwrap();
    assert_eq!(kubeconfig.name, "remote-kubeconfig");
    assert_eq!(kubeconfig.key, "kubeconfig");
    assert_eq!(kubeconfig.context.as_deref(), Some("admin@remote"));
    assert_eq!(
        spec.kinds,
        ["Deployment", "services", "ingresses.networking.k8s.io"]
    );
    assert_eq!(spec.custom_resources.len(), 2);
    assert!(
        spec.custom_resources[0].namespaced,
        "namespaced defaults to true"
    );
    assert_eq!(spec.custom_resources[0].version, None);
    assert!(!spec.custom_resources[1].namespaced);
    assert_eq!(spec.custom_resources[1].version.as_deref(), Some("v1"));
    assert!(spec.only_namespaced_resources);
    assert_eq!(spec.permissions.read, ["dev", "sre"]);
    assert_eq!(spec.permissions.write, ["sre"]);
    assert!(spec.pod_metrics);
}

#[test]
fn status_round_trips_with_conditions() {
    let yaml = r#"
apiVersion: scaleagent.dev/v1alpha1
kind: ScaleAgent
metadata: {name: prod, namespace: scale-agent}
spec:
  hub: {address: "hub:9091", tls: {insecurePlaintext: true}}
status:
  observedGeneration: 3
  replicas: 2
  readyReplicas: 1
  accounts: 4
  connected: 1
  certificateExpiry: "2026-01-31T12:00:00Z"
  conditions:
    - type: Ready
      status: "False"
      reason: Rollout
      message: 1 of 2 agent pods ready
      observedGeneration: 3
      lastTransitionTime: "2025-11-21T10:00:00Z"
"#;
    let agent: ScaleAgent = serde_saphyr::from_str(yaml).unwrap();
    assert!(agent.spec.hub.tls.insecure_plaintext);
    assert!(agent.spec.client_certificate.is_none());
    assert_eq!(agent.client_identity().as_deref(), Some("prod.scale-agent"));
    let status = agent.status.as_ref().unwrap();
    assert_eq!(status.ready_replicas, 1);
    assert_eq!(status.connected, Some(1));
    assert!(!scale_agent_crds::conditions::is_true(
        &status.conditions,
        scale_agent_crds::conditions::READY
    ));
    round_trip::<ScaleAgent>(yaml);
}

#[test]
fn lifetime_errors_say_what_to_write() {
    let mut agent: ScaleAgent = serde_saphyr::from_str(MINIMAL_SCALE_AGENT).unwrap();
    let cert = agent.spec.client_certificate.as_mut().unwrap();
    cert.lifetime = "30d".into();
    let message = cert.lifetime().unwrap_err().to_string();
    assert!(
        message.contains("spec.clientCertificate.lifetime"),
        "{message}"
    );
    assert!(message.contains("720h"), "{message}");
    cert.lifetime = "-1h".into();
    assert!(cert.lifetime().is_err());
    cert.lifetime = "1h30m".into();
    assert_eq!(cert.lifetime().unwrap(), Duration::from_secs(5400));
}

#[test]
fn unknown_enum_values_are_rejected() {
    let yaml = MINIMAL_SCALE_AGENT.replace("spec:\n", "spec:\n  mode: Sidecar\n");
    assert!(serde_saphyr::from_str::<ScaleAgent>(&yaml).is_err());
}

/// Fills in schema defaults the way the API server does: a missing property with a `default`
/// gets it, then defaulting continues inside it.
fn apply_schema_defaults(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(object) => {
            let Some(props) = schema["properties"].as_object() else {
                return;
            };
            for (name, prop) in props {
                if !object.contains_key(name)
                    && let Some(default) = prop.get("default")
                {
                    object.insert(name.clone(), default.clone());
                }
                if let Some(child) = object.get_mut(name) {
                    apply_schema_defaults(prop, child);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                apply_schema_defaults(&schema["items"], item);
            }
        }
        _ => {}
    }
}

fn root_schema<K: CustomResourceExt>() -> Value {
    let crd = serde_json::to_value(K::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// An object read back from the API server (schema defaults applied) must equal what serde
/// makes of the same input, so Rust defaults and schema defaults cannot drift apart.
fn assert_defaults_agree<K>(yaml: &str)
where
    K: CustomResourceExt + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let parsed: K = serde_saphyr::from_str(yaml).unwrap();
    let mut defaulted: Value = serde_saphyr::from_str(yaml).unwrap();
    apply_schema_defaults(&root_schema::<K>(), &mut defaulted);
    let from_api_server: K = serde_json::from_value(defaulted).unwrap();
    assert_eq!(parsed, from_api_server);
}

#[test]
fn schema_defaults_match_serde_defaults() {
    assert_defaults_agree::<ScaleAgent>(MINIMAL_SCALE_AGENT);
    assert_defaults_agree::<ScaleAgent>(FULL_SCALE_AGENT);
    let with_ca = MINIMAL_SCALE_AGENT.replace(
        "    address: scale-agent-hub.spinnaker.example.com:9091\n",
        "    address: scale-agent-hub.spinnaker.example.com:9091\n    tls: {caSecretRef: {name: hub-ca}}\n",
    );
    assert_defaults_agree::<ScaleAgent>(&with_ca);
    let agent: ScaleAgent = serde_saphyr::from_str(&with_ca).unwrap();
    assert_eq!(agent.spec.hub.tls.ca_secret_ref.unwrap().key, "ca.crt");
    assert_defaults_agree::<AgentAccount>(MINIMAL_AGENT_ACCOUNT);
    assert_defaults_agree::<AgentAccount>(FULL_AGENT_ACCOUNT);
}
