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

/// Test 1: every owned object appears with the expected content, the Deployment rolls out to
/// a ReplicaSet, conditions and printer columns are right, and reconciling again (a
/// restarted operator) writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_objects_roll_out_and_a_second_reconcile_writes_nothing() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-objects").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));

    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({ "defaults": { "kinds": ["Deployment", "ConfigMap"] } }),
        ),
    )
    .await?;
    let web = format!("{ns}-web");
    let api_name = format!("{ns}-api");
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("web", json!({ "agentRef": "prod", "accountName": web })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "api",
            json!({ "agentRef": "prod", "accountName": api_name, "kinds": ["Service"] }),
        ),
    )
    .await?;

    let agent = wait_for(
        "ScaleAgent status with 2 accounts and a certificate",
        || async {
            let agent = get_agent(&client, &ns, "prod").await?;
            let ok = agent.status.as_ref().is_some_and(|s| {
                s.accounts == 2 && is_true(&s.conditions, CERTIFICATE_READY) && s.replicas == 2
            });
            Ok(ok.then_some(agent))
        },
    )
    .await?;

    // ServiceAccount, ConfigMap, Secret, Deployment: labelled and owned.
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .get("prod-agent")
        .await?;
    assert_labels(&sa, "prod");
    assert_owned_by(&sa, &agent);
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("prod-agent")
        .await?;
    assert_labels(&cm, "prod");
    assert_owned_by(&cm, &agent);
    let config = agent_config(&client, &ns, "prod").await?.expect("config");
    let mut expected = vec![api_name.clone(), web.clone()];
    expected.sort();
    assert_eq!(account_names(&config), expected);
    assert_eq!(config.clouddriver.grpc, "hub.spinnaker.example.com:9091");
    let web_config = config
        .kubernetes
        .accounts
        .iter()
        .find(|a| a.name == web)
        .expect("web");
    assert!(web_config.service_account);
    assert_eq!(
        web_config.kinds,
        ["Deployment", "ConfigMap"],
        "agent defaults"
    );
    let api_config = config
        .kubernetes
        .accounts
        .iter()
        .find(|a| a.name == api_name)
        .expect("api");
    assert_eq!(api_config.kinds, ["Service"]);
    let secret = Api::<Secret>::namespaced(client.clone(), &ns)
        .get("prod-agent-tls")
        .await?;
    assert_labels(&secret, "prod");
    assert_owned_by(&secret, &agent);
    let keys: Vec<_> = secret
        .data
        .clone()
        .unwrap_or_default()
        .into_keys()
        .collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("prod-agent")
        .await?;
    assert_labels(&deployment, "prod");
    assert_owned_by(&deployment, &agent);
    assert_eq!(deployment.spec.replicas, Some(2));
    let pod = deployment.spec.template.spec.clone().expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("prod-agent"));
    let container = &pod.containers[0];
    assert_eq!(
        container.args.clone().unwrap_or_default(),
        ["--config", "/etc/scale-agent/scale-agent.yaml"]
    );
    assert_eq!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem),
        Some(true)
    );

    // Cluster scope (the default): a ClusterRole with exactly the watched kinds and what the
    // read operations on them need (Events; a Deployment's ReplicaSets, pods and logs), bound.
    let rbac_name = format!("scale-agent:{ns}:prod");
    let cluster_role = Api::<ClusterRole>::all(client.clone())
        .get(&rbac_name)
        .await?;
    assert_labels(&cluster_role, "prod");
    let rules = cluster_role.rules.clone().unwrap_or_default();
    let granted: Vec<(String, Vec<String>)> = rules
        .iter()
        .map(|r| {
            (
                r.api_groups.clone().unwrap_or_default().join(","),
                r.resources.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        granted,
        [
            (
                String::new(),
                ["configmaps", "events", "pods", "services"]
                    .map(String::from)
                    .to_vec()
            ),
            (String::new(), vec!["pods/log".to_string()]),
            (
                "apps".to_string(),
                vec!["deployments".to_string(), "replicasets".to_string()]
            ),
        ]
    );
    assert!(rules.iter().all(|r| {
        r.verbs == ["get", "list", "watch"]
            || (r.resources == Some(vec!["pods/log".to_string()]) && r.verbs == ["get"])
    }));
    let binding = Api::<ClusterRoleBinding>::all(client.clone())
        .get(&rbac_name)
        .await?;
    let subject = &binding.subjects.clone().unwrap_or_default()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("prod-agent", Some(ns.as_str()))
    );

    // The Deployment rolls out to a ReplicaSet with the desired replicas (pods stay Pending:
    // there is no kubelet).
    let replica_set = wait_for("a ReplicaSet of the agent Deployment", || async {
        let sets = Api::<ReplicaSet>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{LABEL_INSTANCE}=prod")))
            .await?;
        Ok(sets
            .items
            .into_iter()
            .find(|rs| rs.spec.replicas == Some(2)))
    })
    .await?;
    assert_owned_by_deployment(&replica_set, &deployment);

    // Conditions.
    let agent = wait_for("ScaleAgent status reflecting the rollout", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| find_condition(&s.conditions, PROGRESSING).is_some())
            .then_some(agent))
    })
    .await?;
    let status = agent.status.clone().expect("status");
    assert_eq!(status.observed_generation, agent.metadata.generation);
    assert!(is_true(&status.conditions, CERTIFICATE_READY));
    assert!(!is_true(&status.conditions, DEGRADED));
    assert!(
        !is_true(&status.conditions, READY),
        "no kubelet, no ready pod"
    );
    assert!(is_true(&status.conditions, PROGRESSING));
    let ready = find_condition(&status.conditions, READY).expect("Ready");
    assert_eq!(ready.reason, "AgentsNotReady");
    assert!(status.certificate_expiry.is_some());
    for account in ["web", "api"] {
        let account = wait_for("account accepted", || async {
            let a = get_account(&client, &ns, account).await?;
            Ok(a.status.as_ref().is_some_and(|s| s.accepted).then_some(a))
        })
        .await?;
        assert!(is_true(
            &account.status.expect("status").conditions,
            ACCEPTED
        ));
    }

    // Events on the ScaleAgent and an account.
    let events = wait_for("Events about the ScaleAgent", || async {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items;
        let reasons: Vec<(String, String)> = events
            .iter()
            .filter_map(|e| {
                let regarding = e.regarding.as_ref()?;
                Some((regarding.kind.clone()?, e.reason.clone()?))
            })
            .collect();
        let has = |kind: &str, reason: &str| reasons.iter().any(|(k, r)| k == kind && r == reason);
        Ok((has("ScaleAgent", "CertificateIssued")
            && has("ScaleAgent", "Applied")
            && has("AgentAccount", "Accepted"))
        .then_some(reasons))
    })
    .await?;
    assert!(!events.is_empty());

    // Printer columns, as kubectl shows them.
    let table = kubectl(control_plane, &["get", "scaleagents", "-n", &ns])?;
    let mut lines = table.lines();
    let header: Vec<_> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "READY", "REPLICAS", "ACCOUNTS", "CONNECTED", "AGE"],
        "{table}"
    );
    let row: Vec<_> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..4], ["prod", "0", "2", "2"], "{table}");
    let table = kubectl(control_plane, &["get", "agentaccounts", "-n", &ns])?;
    assert!(
        table
            .lines()
            .next()
            .unwrap_or_default()
            .contains("ACCEPTED"),
        "{table}"
    );
    let web_row = table
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_default()
        .to_owned();
    let web_row: Vec<_> = web_row.split_whitespace().collect();
    assert_eq!(
        &web_row[..4],
        ["web", "prod", web.as_str(), "true"],
        "{table}"
    );

    // A second reconcile writes nothing: wait until nothing moves, restart the operator (which
    // reconciles everything on start) and compare resourceVersions.
    let accounts = ["web", "api"];
    let mut previous = resource_versions(&client, &ns, "prod", &accounts).await?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = resource_versions(&client, &ns, "prod", &accounts).await?;
        if now == previous {
            break;
        }
        // The comparison below means nothing unless the objects came to rest first.
        let moving: Vec<&String> = now
            .iter()
            .filter(|(kind, version)| previous.get(*kind) != Some(*version))
            .map(|(kind, _)| kind)
            .collect();
        anyhow::ensure!(
            Instant::now() < deadline,
            "the objects never settled within {TIMEOUT:?}; still changing: {moving:?}"
        );
        previous = now;
    }
    operator.stop().await?;
    let before = resource_versions(&client, &ns, "prod", &accounts).await?;
    // Compared below: it means nothing for objects that do not exist (an empty version on
    // both sides). Cluster scope: no namespaced Role.
    let absent: Vec<&String> = before
        .iter()
        .filter(|(kind, version)| version.is_empty() && kind.as_str() != "Role")
        .map(|(kind, _)| kind)
        .collect();
    anyhow::ensure!(absent.is_empty(), "the premise: {absent:?} exist");
    let operator = Operator::start(client.clone(), operator_config(&ns));
    wait_for("the restarted operator to reconcile", || async {
        Ok(
            (operator.reconciles("scaleagent") >= 1 && operator.reconciles("agentaccount") >= 2)
                .then_some(()),
        )
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = resource_versions(&client, &ns, "prod", &accounts).await?;
    assert_eq!(
        before, after,
        "a reconcile of unchanged objects wrote something"
    );
    operator.stop().await
}

fn assert_owned_by_deployment(replica_set: &ReplicaSet, deployment: &Deployment) {
    let refs = replica_set
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        refs.iter()
            .any(|r| Some(&r.uid) == deployment.metadata.uid.as_ref()),
        "{refs:?}"
    );
}

/// Test 2: with a token of the generated ServiceAccount, the configured kinds can be listed
/// and watched; other namespaces, other kinds and Secrets are forbidden; write verbs appear
/// only with `Deploy`. (`rbac_operations.rs` runs every documented operation under it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_is_real_and_minimal() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-rbac").await?;
    let in_scope = control_plane.namespace(&client, "op-rbac-in").await?;
    let out_of_scope = control_plane.namespace(&client, "op-rbac-out").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({ "scope": { "type": "Namespaces", "namespaces": [ns, in_scope] } }),
        ),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "web",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-web"), "kinds": ["Deployment", "ConfigMap"] }),
        ),
    )
    .await?;
    let rbac_name = format!("scale-agent:{ns}:prod");
    wait_for("Roles in both scope namespaces", || async {
        let mut found = 0;
        for namespace in [&ns, &in_scope] {
            let role = Api::<Role>::namespaced(client.clone(), namespace)
                .get_opt(&rbac_name)
                .await?;
            let grants = |resource: &str| {
                role.as_ref()
                    .and_then(|r| r.rules.as_ref())
                    .is_some_and(|rules| {
                        rules.iter().any(|rule| {
                            rule.resources
                                .as_ref()
                                .is_some_and(|r| r.iter().any(|r| r == resource))
                        })
                    })
            };
            if grants("configmaps") && grants("deployments") {
                found += 1;
            }
        }
        Ok((found == 2).then_some(()))
    })
    .await?;
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt(&rbac_name)
            .await?
            .is_none()
    );
    assert!(
        Api::<Role>::namespaced(client.clone(), &out_of_scope)
            .get_opt(&rbac_name)
            .await?
            .is_none()
    );

    let token = control_plane
        .service_account_token(&client, &ns, "prod-agent")
        .await?;
    let agent = control_plane.client_for_token(&token).await?;
    let lp = ListParams::default();
    for namespace in [&ns, &in_scope] {
        let deployments = Api::<Deployment>::namespaced(agent.clone(), namespace)
            .list(&lp)
            .await;
        assert_eq!(api_code(&deployments), Some(200), "{deployments:?}");
        let configmaps = Api::<ConfigMap>::namespaced(agent.clone(), namespace);
        let watch = configmaps
            .watch(&WatchParams::default().timeout(1), "0")
            .await;
        assert!(
            watch.is_ok(),
            "watch configmaps in {namespace}: {:?}",
            watch.err()
        );
    }
    let other = Api::<Deployment>::namespaced(agent.clone(), &out_of_scope)
        .list(&lp)
        .await;
    assert_eq!(api_code(&other), Some(403), "another namespace");
    let all = Api::<Deployment>::all(agent.clone()).list(&lp).await;
    assert_eq!(
        api_code(&all),
        Some(403),
        "cluster-wide list with namespace scope"
    );
    let services = Api::<k8s_openapi::api::core::v1::Service>::namespaced(agent.clone(), &ns)
        .list(&lp)
        .await;
    assert_eq!(api_code(&services), Some(403), "a kind no account watches");
    let secrets = Api::<Secret>::namespaced(agent.clone(), &ns);
    assert_eq!(
        api_code(&secrets.list(&lp).await),
        Some(403),
        "Secrets not watched"
    );
    assert_eq!(
        api_code(&secrets.get("agent-ca").await),
        Some(403),
        "Secret data"
    );
    let write = create_configmap(&agent, &ns, "x").await;
    assert_eq!(api_code(&write), Some(403), "ReadOnly cannot write");

    // Deploy, and an account that caches and deploys Secrets: writes, and Secret get (client-side
    // apply and replace read the live Secret; write responses carry it anyway).
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({ "access": "Deploy", "scope": { "type": "Namespaces", "namespaces": [ns, in_scope] } }),
        ),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "web",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-web"), "kinds": ["Deployment", "ConfigMap", "Secret"] }),
        ),
    )
    .await?;
    wait_for("Deploy rules", || async {
        let role = Api::<Role>::namespaced(client.clone(), &in_scope)
            .get_opt(&rbac_name)
            .await?;
        let rules = role.and_then(|r| r.rules).unwrap_or_default();
        let secrets = rules.iter().any(|r| {
            r.resources
                .as_ref()
                .is_some_and(|res| res.contains(&"secrets".to_string()))
        });
        let writes = rules
            .iter()
            .any(|r| r.verbs.contains(&"create".to_string()));
        Ok((secrets && writes).then_some(()))
    })
    .await?;
    let created = create_configmap(&agent, &in_scope, "deployed").await;
    assert_eq!(api_code(&created), Some(200), "{created:?}");
    let deleted = Api::<ConfigMap>::namespaced(agent.clone(), &in_scope)
        .delete("deployed", &DeleteParams::default())
        .await;
    assert!(deleted.is_ok(), "{deleted:?}");
    assert_eq!(
        api_code(&secrets.list(&lp).await),
        Some(200),
        "Secrets listed as metadata"
    );
    assert!(
        secrets
            .watch(&WatchParams::default().timeout(1), "0")
            .await
            .is_ok()
    );
    assert_eq!(
        api_code(&secrets.get("agent-ca").await),
        Some(200),
        "a deployable Secret is readable"
    );
    let out_write = create_configmap(&agent, &out_of_scope, "x").await;
    assert_eq!(
        api_code(&out_write),
        Some(403),
        "no writes outside the scope"
    );
    operator.stop().await
}

/// Test 3: scope namespaces → cluster → namespaces swaps Roles and ClusterRoles; removing an
/// account drops it from the config; deleting the ScaleAgent removes everything it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_changes_account_removal_and_deletion_clean_up() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-scope").await?;
    let other = control_plane.namespace(&client, "op-scope-other").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    let namespaces_scope = json!({ "scope": { "type": "Namespaces", "namespaces": [ns, other] } });
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", namespaces_scope.clone())).await?;
    for name in ["one", "two"] {
        apply_json::<AgentAccount>(
            &client,
            &ns,
            agent_account(name, json!({ "agentRef": "prod", "accountName": format!("{ns}-{name}"), "kinds": ["Pod"] })),
        )
        .await?;
    }
    let rbac_name = format!("scale-agent:{ns}:prod");
    let roles_in = |client: Client, namespaces: Vec<String>, rbac_name: String| async move {
        let mut present = Vec::new();
        for namespace in namespaces {
            if Api::<Role>::namespaced(client.clone(), &namespace)
                .get_opt(&rbac_name)
                .await?
                .is_some()
                && Api::<RoleBinding>::namespaced(client.clone(), &namespace)
                    .get_opt(&rbac_name)
                    .await?
                    .is_some()
            {
                present.push(namespace);
            }
        }
        anyhow::Ok(present)
    };
    let cluster_rbac = |client: Client, rbac_name: String| async move {
        let role = Api::<ClusterRole>::all(client.clone())
            .get_opt(&rbac_name)
            .await?;
        let binding = Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(&rbac_name)
            .await?;
        anyhow::Ok((role.is_some(), binding.is_some()))
    };
    let both = vec![ns.clone(), other.clone()];
    wait_for("Roles in both namespaces", || {
        let f = roles_in(client.clone(), both.clone(), rbac_name.clone());
        let expected = both.clone();
        async move { Ok((f.await? == expected).then_some(())) }
    })
    .await?;
    assert_eq!(
        cluster_rbac(client.clone(), rbac_name.clone()).await?,
        (false, false)
    );

    // → Cluster.
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("prod", json!({ "scope": { "type": "Cluster" } })),
    )
    .await?;
    wait_for("ClusterRole instead of Roles", || {
        let roles = roles_in(client.clone(), both.clone(), rbac_name.clone());
        let cluster = cluster_rbac(client.clone(), rbac_name.clone());
        async move { Ok((roles.await?.is_empty() && cluster.await? == (true, true)).then_some(())) }
    })
    .await?;

    // → Namespaces again, only the other namespace.
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({ "scope": { "type": "Namespaces", "namespaces": [other] } }),
        ),
    )
    .await?;
    wait_for("Roles instead of the ClusterRole", || {
        let roles = roles_in(client.clone(), both.clone(), rbac_name.clone());
        let cluster = cluster_rbac(client.clone(), rbac_name.clone());
        let other = other.clone();
        async move { Ok((roles.await? == [other] && cluster.await? == (false, false)).then_some(())) }
    })
    .await?;
    let config = agent_config(&client, &ns, "prod").await?.expect("config");
    assert!(
        config
            .kubernetes
            .accounts
            .iter()
            .all(|a| a.namespaces == [other.clone()])
    );

    // Remove an account: the config drops it.
    let two = format!("{ns}-two");
    wait_for("both accounts in the config", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        Ok((names.len() == 2).then_some(()))
    })
    .await?;
    Api::<AgentAccount>::namespaced(client.clone(), &ns)
        .delete("one", &DeleteParams::default())
        .await?;
    wait_for("the config without the removed account", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        Ok((names == [two.clone()]).then_some(()))
    })
    .await?;
    wait_for("accounts count 1", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent.status.is_some_and(|s| s.accounts == 1).then_some(()))
    })
    .await?;

    // Delete the ScaleAgent: the finalizer removes the RBAC, the garbage collector the rest.
    Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .delete("prod", &DeleteParams::default())
        .await?;
    wait_for("everything the ScaleAgent made to be gone", || async {
        let agent_gone = Api::<ScaleAgent>::namespaced(client.clone(), &ns)
            .get_opt("prod")
            .await?
            .is_none();
        let roles = roles_in(client.clone(), both.clone(), rbac_name.clone()).await?;
        let cluster = cluster_rbac(client.clone(), rbac_name.clone()).await?;
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent")
            .await?;
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent")
            .await?;
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent-tls")
            .await?;
        let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent")
            .await?;
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{LABEL_INSTANCE}=prod")))
            .await?
            .items;
        Ok((agent_gone
            && roles.is_empty()
            && cluster == (false, false)
            && sa.is_none()
            && cm.is_none()
            && secret.is_none()
            && deployment.is_none()
            && replica_sets.is_empty())
        .then_some(()))
    })
    .await?;
    operator.stop().await
}

/// Test 4: the certificate is issued by the CA for the agent's identity with a PKCS#8 key,
/// and, with a short lifetime, re-issued before it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_is_issued_by_the_ca_and_renewed_before_expiry() -> anyhow::Result<()> {
    let (_, client, ns) = setup("op-cert").await?;
    let (ca_cert, ca_key) = create_ca_secret(&client, &ns).await?;
    let ca = pki::Ca::from_pem(&ca_cert, &ca_key).map_err(anyhow::Error::msg)?;
    let mut config = operator_config(&ns);
    config.certificate_lifetime_override = Some(Duration::from_secs(15));
    let operator = Operator::start(client.clone(), config);
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({}))).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let read = |secret: &Secret, key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .unwrap_or_default()
    };
    let first = wait_for("the certificate Secret", || async {
        Ok(secrets.get_opt("prod-agent-tls").await?)
    })
    .await?;
    assert_eq!(first.type_.as_deref(), Some("kubernetes.io/tls"));
    let cert = read(&first, "tls.crt");
    let info = pki::parse(&cert).expect("a PEM certificate");
    let identity = format!("prod.{ns}");
    assert!(info.has_identity(&identity), "{info:?}");
    assert!(ca.signed(&cert), "signed by the issuer CA");
    assert!(pki::is_pkcs8_pem(&read(&first, "tls.key")), "PKCS#8 key");
    assert_eq!(read(&first, "ca.crt"), ca_cert);
    assert_eq!(info.not_after - info.not_before, 15);

    let agent = wait_for("CertificateReady", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, CERTIFICATE_READY))
            .then_some(agent))
    })
    .await?;
    let status = agent.status.expect("status");
    let condition = find_condition(&status.conditions, CERTIFICATE_READY).expect("condition");
    assert!(
        condition.message.contains("valid until"),
        "{}",
        condition.message
    );
    assert!(status.certificate_expiry.is_some());

    // Renewed when a third of the lifetime remains, before expiry.
    let renewed = wait_for("a renewed certificate", || async {
        let secret = secrets.get("prod-agent-tls").await?;
        let cert = read(&secret, "tls.crt");
        Ok((cert != read(&first, "tls.crt")).then_some(cert))
    })
    .await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let renewed_info = pki::parse(&renewed).expect("renewed certificate");
    assert!(
        renewed_info.not_before >= info.renew_at() - 1,
        "{renewed_info:?} vs {info:?}"
    );
    assert!(
        renewed_info.not_before < info.not_after,
        "renewed before the old one expired"
    );
    assert!(now <= renewed_info.not_after);
    assert!(renewed_info.has_identity(&identity));
    assert!(ca.signed(&renewed));
    wait_for("status with the new expiry", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        let expiry = agent.status.and_then(|s| s.certificate_expiry);
        Ok((expiry.as_deref()
            >= Some(scale_agent_operator::status::rfc3339(renewed_info.not_after).as_str()))
        .then_some(()))
    })
    .await?;
    operator.stop().await
}

/// Test 5: invalid objects are rejected by validation or reported in status with a message
/// that says what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_are_rejected_or_reported() -> anyhow::Result<()> {
    let (_, client, ns) = setup("op-invalid").await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), &ns);

    // CEL: both kinds and omitKinds.
    let both: AgentAccount = serde_json::from_value(agent_account(
        "both",
        json!({ "agentRef": "prod", "kinds": ["Pod"], "omitKinds": ["Event"] }),
    ))?;
    let rejected = accounts.create(&PostParams::default(), &both).await;
    assert_eq!(api_code(&rejected), Some(422), "{rejected:?}");
    assert!(format!("{rejected:?}").contains("not both"), "{rejected:?}");
    // CEL: namespace scope without namespaces.
    let no_namespaces: ScaleAgent = serde_json::from_value(scale_agent(
        "bad",
        json!({ "scope": { "type": "Namespaces" } }),
    ))?;
    let rejected = Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &no_namespaces)
        .await;
    assert_eq!(api_code(&rejected), Some(422), "{rejected:?}");

    // Unknown agent.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "orphan",
            json!({ "agentRef": "nope", "accountName": format!("{ns}-orphan") }),
        ),
    )
    .await?;
    let condition = wait_for_accepted_condition(&client, &ns, "orphan", "AgentNotFound").await?;
    assert!(
        condition.contains(&format!("ScaleAgent nope not found in namespace {ns}")),
        "{condition}"
    );

    // The issuer Secret is missing: Degraded says what to create; creating it heals.
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({}))).await?;
    let agent = wait_for("Degraded for the missing issuer", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, DEGRADED))
            .then_some(agent))
    })
    .await?;
    let status = agent.status.expect("status");
    let degraded = find_condition(&status.conditions, DEGRADED).expect("Degraded");
    assert_eq!(degraded.reason, "IssuerSecretNotFound");
    assert!(
        degraded.message.contains(&format!(
            "issuer Secret agent-ca not found in namespace {ns}: create it"
        )),
        "{}",
        degraded.message
    );
    assert!(!is_true(&status.conditions, CERTIFICATE_READY));
    assert!(!is_true(&status.conditions, READY));

    // Duplicate account names: the older account keeps the name.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "first",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-dup") }),
        ),
    )
    .await?;
    wait_for("the first account accepted", || async {
        let a = get_account(&client, &ns, "first").await?;
        Ok(a.status.is_some_and(|s| s.accepted).then_some(()))
    })
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "second",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-dup") }),
        ),
    )
    .await?;
    let condition =
        wait_for_accepted_condition(&client, &ns, "second", "DuplicateAccountName").await?;
    assert!(
        condition.contains(&format!("already used by AgentAccount {ns}/first")),
        "{condition}"
    );

    // Credentials that do not fit the mode, and a missing kubeconfig Secret.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "remote",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-remote"),
                    "credentials": { "type": "Kubeconfig", "kubeconfigSecretRef": { "name": "remote-kc" } } }),
        ),
    )
    .await?;
    wait_for_accepted_condition(&client, &ns, "remote", "CredentialsModeMismatch").await?;
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("infra", json!({ "mode": "Infrastructure" })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "remote",
            json!({ "agentRef": "infra", "accountName": format!("{ns}-remote"),
                    "credentials": { "type": "Kubeconfig", "kubeconfigSecretRef": { "name": "remote-kc" } } }),
        ),
    )
    .await?;
    let condition =
        wait_for_accepted_condition(&client, &ns, "remote", "KubeconfigSecretNotFound").await?;
    assert!(
        condition.contains("Secret remote-kc not found"),
        "{condition}"
    );
    create_secret(&client, &ns, "remote-kc", &[("other", "x")]).await?;
    wait_for_accepted_condition(&client, &ns, "remote", "KubeconfigKeyMissing").await?;

    // Fixing things heals them.
    create_ca_secret(&client, &ns).await?;
    wait_for("prod to recover", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| {
                is_true(&s.conditions, CERTIFICATE_READY) && !is_true(&s.conditions, DEGRADED)
            })
            .then_some(()))
    })
    .await?;
    let config = agent_config(&client, &ns, "prod").await?.expect("config");
    assert_eq!(
        account_names(&config),
        [format!("{ns}-dup")],
        "only the accepted account"
    );
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("remote-kc", &DeleteParams::default())
        .await?;
    create_secret(
        &client,
        &ns,
        "remote-kc",
        &[("kubeconfig", "apiVersion: v1\nkind: Config\n")],
    )
    .await?;
    wait_for("remote accepted", || async {
        let a = get_account(&client, &ns, "remote").await?;
        Ok(a.status.is_some_and(|s| s.accepted).then_some(()))
    })
    .await?;
    let infra = wait_for("infra config with the kubeconfig account", || async {
        Ok(agent_config(&client, &ns, "infra")
            .await?
            .filter(|c| c.kubernetes.accounts.len() == 1))
    })
    .await?;
    assert_eq!(
        infra.kubernetes.accounts[0].kubeconfig_file.as_deref(),
        Some("/var/run/scale-agent/kubeconfigs/remote-kc/kubeconfig")
    );
    let deployment = wait_for("infra Deployment mounting the kubeconfig", || async {
        let d = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("infra-agent")
            .await?;
        Ok(d.filter(|d| {
            d.spec.template.spec.as_ref().is_some_and(|p| {
                p.volumes.clone().unwrap_or_default().iter().any(|v| {
                    v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("remote-kc")
                })
            })
        }))
    })
    .await?;
    assert_eq!(
        deployment
            .spec
            .template
            .spec
            .and_then(|p| p.automount_service_account_token),
        Some(false)
    );
    // Infrastructure mode grants no RBAC in this cluster.
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt(&format!("scale-agent:{ns}:infra"))
            .await?
            .is_none()
    );
    operator.stop().await
}

/// Waits until AgentAccount `name` reports `Accepted=False` with `reason`; returns the message.
async fn wait_for_accepted_condition(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
) -> anyhow::Result<String> {
    wait_for(
        &format!("AgentAccount {name} rejected with {reason}"),
        || async {
            let account = get_account(client, namespace, name).await?;
            Ok(account.status.and_then(|s| {
                find_condition(&s.conditions, ACCEPTED)
                    .filter(|c| c.reason == reason && c.status == "False" && !s.accepted)
                    .map(|c| c.message.clone())
            }))
        },
    )
    .await
}

fn manifests_root() -> std::path::PathBuf {
    crds::manifests_dir()
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// Every example (one per mode) is a valid ScaleAgent/AgentAccount for the API server: the
/// schema and CEL rules accept it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn examples_for_each_mode_are_valid() -> anyhow::Result<()> {
    let (control_plane, _client, ns) = setup("op-examples").await?;
    for example in [
        "agent-mode.yaml",
        "infrastructure-mode.yaml",
        "spinnakerservice-mode.yaml",
    ] {
        let path = manifests_root().join("examples").join(example);
        let path = path.to_string_lossy();
        let out = kubectl(
            control_plane,
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "-n",
                &ns,
                "-f",
                &path,
            ],
        )?;
        assert!(out.contains("scaleagent.dev/"), "{example}: {out}");
    }
    Ok(())
}

/// The kustomize base and overlays render, and the operator's own least-privilege RBAC from
/// them is enough: an operator authenticated with its ServiceAccount's token reconciles a
/// ScaleAgent whose account watches everything (RBAC with `*`), and cleans it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_manifests_render_and_the_operator_rbac_suffices() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-manifests").await?;
    let root = manifests_root();
    for (dir, kinds) in [
        (
            "",
            vec!["CustomResourceDefinition", "Deployment", "ClusterRole"],
        ),
        (
            "operator",
            vec![
                "Namespace",
                "ServiceAccount",
                "ClusterRoleBinding",
                "Deployment",
            ],
        ),
        (
            "hub",
            vec!["Deployment", "Service", "PersistentVolumeClaim"],
        ),
        (
            "overlays/target-cluster",
            vec!["Deployment", "ScaleAgent", "AgentAccount"],
        ),
        ("overlays/spinnaker", vec!["Deployment", "Service"]),
    ] {
        let path = root.join(dir);
        let rendered = kubectl(control_plane, &["kustomize", &path.to_string_lossy()])?;
        for kind in kinds {
            assert!(
                rendered.contains(&format!("kind: {kind}\n")),
                "{dir} lacks a {kind}"
            );
        }
    }
    let as_operator = operator::shipped_operator(control_plane, &client).await?;
    // The operator's token really is restricted: no Secrets outside the namespaces it
    // watches, and none deleted anywhere.
    let forbidden = Api::<Secret>::namespaced(as_operator.clone(), &ns)
        .list(&ListParams::default())
        .await;
    assert_eq!(api_code(&forbidden), Some(403), "{forbidden:?}");
    // Watching the test's namespace: the RoleBinding manifests/operator/rbac.yaml says to
    // add for each namespace in --watch-namespaces.
    operator::bind_operator(
        control_plane,
        &ns,
        "scale-agent-operator",
        "scale-agent-operator-namespaced",
    )?;
    let forbidden = Api::<Secret>::namespaced(as_operator.clone(), &ns)
        .delete("anything", &DeleteParams::default())
        .await;
    assert_eq!(api_code(&forbidden), Some(403), "{forbidden:?}");
    // Granting the agent's Roles there, and the ClusterRoles of its Cluster-scope ScaleAgent
    // prod: the RoleBinding and the cluster grants rbac.yaml says to add
    // (e2e/tests/operator_rbac.rs proves what the operator may not do without them).
    operator::bind_operator(
        control_plane,
        &ns,
        "scale-agent-operator-grants",
        "scale-agent-operator-grants",
    )?;
    operator::list_in_cluster_grants(control_plane, &ns, "prod")?;

    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(as_operator, operator_config(&ns));
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("prod", json!({ "access": "Deploy" })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("all", json!({ "agentRef": "prod", "accountName": format!("{ns}-all"), "omitKinds": ["Secret"] })),
    )
    .await?;
    let rbac_name = format!("scale-agent:{ns}:prod");
    wait_for(
        "the ScaleAgent reconciled by the restricted operator",
        || async {
            let agent = get_agent(&client, &ns, "prod").await?;
            let ok = agent.status.as_ref().is_some_and(|s| {
                s.accounts == 1
                    && is_true(&s.conditions, CERTIFICATE_READY)
                    && !is_true(&s.conditions, DEGRADED)
            });
            Ok(ok.then_some(()))
        },
    )
    .await?;
    let cluster_role = Api::<ClusterRole>::all(client.clone())
        .get(&rbac_name)
        .await?;
    let rules = cluster_role.rules.unwrap_or_default();
    assert!(
        rules
            .iter()
            .any(|r| r.api_groups == Some(vec!["apps".to_string()])
                && r.resources == Some(vec!["*".to_string()])),
        "every group but core as *: {rules:?}"
    );
    assert!(
        rules.iter().all(|r| !r
            .resources
            .clone()
            .unwrap_or_default()
            .contains(&"secrets".to_string())),
        "Secrets omitted: {rules:?}"
    );
    Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .delete("prod", &DeleteParams::default())
        .await?;
    wait_for(
        "the finalizer to clean up under the operator's RBAC",
        || async {
            let gone = Api::<ScaleAgent>::namespaced(client.clone(), &ns)
                .get_opt("prod")
                .await?
                .is_none();
            let role = Api::<ClusterRole>::all(client.clone())
                .get_opt(&rbac_name)
                .await?;
            Ok((gone && role.is_none()).then_some(()))
        },
    )
    .await?;
    operator.stop().await
}

/// Changes made while the operator is down are picked up when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_converges() -> anyhow::Result<()> {
    let (_, client, ns) = setup("op-restart").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({}))).await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "one",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-one") }),
        ),
    )
    .await?;
    wait_for("one account in the config", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        Ok((names.len() == 1).then_some(()))
    })
    .await?;
    operator.stop().await?;

    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({ "replicas": 3 }))).await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "two",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-two") }),
        ),
    )
    .await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    wait_for("the changes applied after the restart", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get("prod-agent")
            .await?;
        let agent = get_agent(&client, &ns, "prod").await?;
        let observed = agent
            .status
            .is_some_and(|s| s.observed_generation == agent.metadata.generation && s.accounts == 2);
        Ok((names.len() == 2 && deployment.spec.replicas == Some(3) && observed).then_some(()))
    })
    .await?;
    operator.stop().await
}

/// The hub's view of `account` (`GET /api/v1/accounts/{account}`), once it is connected
/// and has cached at least one object of `kind` (the `objectCounts` key, e.g. `ConfigMap`).
async fn wait_for_hub_account(
    hub: std::net::SocketAddr,
    account: &str,
    kind: &str,
) -> anyhow::Result<Value> {
    use scale_agent_e2e::fixtures::hub_get_json as get_json;
    wait_for(
        &format!("account {account} in the hub with {kind}s"),
        || async {
            let view = get_json(hub, &format!("/api/v1/accounts/{account}")).await?;
            Ok(view.filter(|v| {
                v["state"] == "connected" && v["objectCounts"][kind].as_u64().unwrap_or(0) > 0
            }))
        },
    )
    .await
}

/// Test 6, the full flow: the operator's ConfigMap, client-certificate Secret and
/// ServiceAccount (through a TokenRequest token, so its RBAC applies) start a real agent
/// process, which registers with a real hub over mTLS (the hub trusts the ScaleAgent's
/// issuer CA); the account and its objects show up in the hub. The operator is stopped, a
/// second AgentAccount added, and the operator started again: it converges, the
/// ConfigMap the kubelet would project reaches the running agent, and the agent hot-reloads
/// the second account into the hub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_flow_agent_process_registers_with_the_hub_and_survives_an_operator_restart()
-> anyhow::Result<()> {
    use scale_agent_e2e::{
        fixtures::hub_get_json as get_json,
        local_agent::{LocalAgent, LocalAgentOptions},
    };
    let (control_plane, client, ns) = setup("op-full-flow").await?;
    let dir = std::env::temp_dir().join(format!("op-full-flow-{ns}"));
    std::fs::create_dir_all(&dir)?;

    // The agents' issuer CA (the operator signs with it, the hub trusts it) and the hub's
    // serving certificate from a CA of its own, handed to agents through Secret hub-ca.
    let (issuer_cert, _) = create_ca_secret(&client, &ns).await?;
    let hub_ca = CertificateAuthority::new("scale-agent-e2e-hub-ca")?;
    let serving = hub_ca.serving("scale-agent-hub", &[])?;
    create_secret(&client, &ns, "hub-ca", &[("ca.crt", &hub_ca.cert_pem)]).await?;
    let mut hub_config = scale_agent_hub::Config::new(
        scale_agent_hub::GrpcSecurity::MutualTls(scale_agent_hub::TlsMaterial {
            cert_pem: serving.cert_pem.into_bytes(),
            key_pem: serving.key_pem.into_bytes(),
            client_ca_pem: Some(issuer_cert.into_bytes()),
        }),
        dir.join("hub-data"),
    );
    hub_config.listeners.grpc_addr = "127.0.0.1:0".parse()?;
    hub_config.listeners.http_addr = "127.0.0.1:0".parse()?;
    // Operator-signed identities (--client-ca) register only what an --allow rule names.
    hub_config.agents.allow =
        vec![scale_agent_hub::identity::AllowRule::parse("*=*").map_err(anyhow::Error::msg)?];
    hub_config.api.api_tokens_file = Some(scale_agent_e2e::fixtures::write_api_tokens(&dir)?);
    let hub = scale_agent_hub::start(hub_config).await?;

    let mut operator = Operator::start(client.clone(), operator_config(&ns));
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({
                "hub": {
                    "address": format!("localhost:{}", hub.grpc_addr.port()),
                    "tls": { "caSecretRef": { "name": "hub-ca" } },
                },
                "replicas": 1,
                "scope": { "type": "Namespaces", "namespaces": [ns] },
                "defaults": { "kinds": ["ConfigMap", "Deployment"] },
            }),
        ),
    )
    .await?;
    let one = format!("{ns}-one");
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("one", json!({ "agentRef": "prod", "accountName": one })),
    )
    .await?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({ "metadata": { "name": "hello" }, "data": { "a": "b" } }),
            )?,
        )
        .await?;
    wait_for(
        "the operator's ConfigMap, Secret and Deployment",
        || async {
            let config = agent_config(&client, &ns, "prod").await?;
            let secret = Api::<Secret>::namespaced(client.clone(), &ns)
                .get_opt("prod-agent-tls")
                .await?;
            let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
                .get_opt("prod-agent")
                .await?;
            let ready = config.is_some_and(|c| account_names(&c) == [one.clone()])
                && secret.is_some()
                && deployment.is_some();
            Ok(ready.then_some(()))
        },
    )
    .await?;

    let mut agent = LocalAgent::start(
        control_plane,
        &client,
        LocalAgentOptions {
            env: vec![("RUST_LOG".into(), "info".into())],
            ..LocalAgentOptions::new(&ns, "prod-agent", dir.join("prod-agent-0"))
        },
    )
    .await?;
    agent.wait_ready(TIMEOUT).await?;
    let view = wait_for_hub_account(hub.http_addr, &one, "ConfigMap").await?;
    assert_eq!(
        view["streaming"]["identity"],
        format!("prod.{ns}"),
        "{view}"
    );
    assert_eq!(view["streaming"]["replica"], agent.pod_name(), "{view}");
    assert_eq!(
        view["cluster"]["apiServerHost"],
        control_plane.server(),
        "{view}"
    );
    let objects = get_json(
        hub.http_addr,
        &format!("/api/v1/accounts/{one}/objects?kind=configmaps"),
    )
    .await?
    .expect("objects");
    assert!(objects.to_string().contains("\"hello\""), "{objects}");
    // One agent process, identified by its client certificate.
    let agents = get_json(hub.http_addr, "/api/v1/agents")
        .await?
        .expect("agents");
    assert_eq!(agents.as_array().map(Vec::len), Some(1), "{agents}");

    // Restart the operator with a change made while it was down.
    operator.stop().await?;
    let two = format!("{ns}-two");
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "two",
            json!({ "agentRef": "prod", "accountName": two, "kinds": ["ConfigMap"] }),
        ),
    )
    .await?;
    operator = Operator::start(client.clone(), operator_config(&ns));
    let mut expected = vec![one.clone(), two.clone()];
    expected.sort();
    wait_for(
        "the ConfigMap with both accounts after the restart",
        || async {
            let names = agent_config(&client, &ns, "prod")
                .await?
                .map(|c| account_names(&c))
                .unwrap_or_default();
            let agent_status = get_agent(&client, &ns, "prod").await?;
            let observed = agent_status.status.is_some_and(|s| {
                s.observed_generation == agent_status.metadata.generation && s.accounts == 2
            });
            Ok((names == expected && observed).then_some(()))
        },
    )
    .await?;
    // The kubelet's part: project the new ConfigMap into the running pod.
    let changed = agent.sync_volumes(&client).await?;
    assert!(
        changed
            .iter()
            .any(|p| p.ends_with("etc/scale-agent/scale-agent.yaml")),
        "{changed:?}"
    );
    let view = wait_for_hub_account(hub.http_addr, &two, "ConfigMap").await?;
    assert_eq!(view["streaming"]["replica"], agent.pod_name(), "{view}");
    let first = get_json(hub.http_addr, &format!("/api/v1/accounts/{one}"))
        .await?
        .expect("the first account is still there");
    assert_eq!(first["state"], "connected", "{first}");
    agent.ensure_running()?;

    agent.stop();
    operator.stop().await?;
    hub.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A CustomResourceDefinition in group `e2e.scaleagent.dev` whose plural no English rule
/// guesses, optionally cluster-scoped or with a scale subresource.
fn crd(kind: &str, plural: &str, cluster: bool, scalable: bool) -> Value {
    let mut version = json!({
        "name": "v1", "served": true, "storage": true,
        "schema": { "openAPIV3Schema": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        } },
    });
    if scalable {
        version["subresources"] = json!({ "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
        } });
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{plural}.e2e.scaleagent.dev") },
        "spec": {
            "group": "e2e.scaleagent.dev",
            "names": { "kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List") },
            "scope": if cluster { "Cluster" } else { "Namespaced" },
            "versions": [version],
        },
    })
}

/// The rule of `rules` for `resource` in the e2e group, if any.
fn rule_for<'a>(
    rules: &'a [k8s_openapi::api::rbac::v1::PolicyRule],
    resource: &str,
) -> Option<&'a k8s_openapi::api::rbac::v1::PolicyRule> {
    rules.iter().find(|rule| {
        rule.api_groups
            .as_deref()
            .is_some_and(|g| g.iter().any(|g| g == "e2e.scaleagent.dev"))
            && rule
                .resources
                .as_deref()
                .is_some_and(|r| r.iter().any(|r| r == resource))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_get_rbac_for_what_the_cluster_serves() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-custom").await?;
    let definitions: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = [
        crd("Octopus", "octopodes", false, true),
        crd("Reef", "reefcatalog", true, false),
    ]
    .into_iter()
    .map(serde_json::from_value)
    .collect::<Result<_, _>>()?;
    crds::install(&client, &definitions).await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("prod", json!({ "access": "Deploy" })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "sea",
            json!({
                "agentRef": "prod",
                "accountName": format!("{ns}-sea"),
                "kinds": ["ConfigMap"],
                "customResources": [
                    { "kind": "Octopus", "group": "e2e.scaleagent.dev" },
                    { "kind": "Reef", "group": "e2e.scaleagent.dev" },
                ],
            }),
        ),
    )
    .await?;

    // The plurals, the cluster scope and the scale subresource come from discovery, not from
    // guesses ("octopuses", "reefs", no scale rule).
    let rbac_name = format!("scale-agent:{ns}:prod");
    let rules = wait_for("a ClusterRole with the custom resources", || async {
        let role = Api::<ClusterRole>::all(client.clone())
            .get_opt(&rbac_name)
            .await?;
        let rules = role.and_then(|r| r.rules).unwrap_or_default();
        Ok(
            (rule_for(&rules, "octopodes").is_some() && rule_for(&rules, "reefcatalog").is_some())
                .then_some(rules),
        )
    })
    .await?;
    let octopodes = rule_for(&rules, "octopodes").expect("waited for");
    for verb in ["get", "list", "watch", "create", "patch", "delete"] {
        assert!(
            octopodes.verbs.iter().any(|v| v == verb),
            "{verb} in {octopodes:?}"
        );
    }
    let scale = rule_for(&rules, "octopodes/scale")
        .unwrap_or_else(|| panic!("no scale rule for octopodes in {rules:?}"));
    assert!(scale.verbs.iter().any(|v| v == "update"), "{scale:?}");
    assert!(rule_for(&rules, "octopuses").is_none() && rule_for(&rules, "reefs").is_none());

    // The agent's own token can list both, the cluster-scoped one cluster-wide.
    let token = control_plane
        .service_account_token(&client, &ns, "prod-agent")
        .await?;
    let agent = control_plane.client_for_token(&token).await?;
    for (plural, namespaced) in [("octopodes", true), ("reefcatalog", false)] {
        let resource = kube::api::ApiResource {
            group: "e2e.scaleagent.dev".into(),
            version: "v1".into(),
            api_version: "e2e.scaleagent.dev/v1".into(),
            kind: String::new(),
            plural: plural.into(),
        };
        let api: Api<kube::api::DynamicObject> = if namespaced {
            Api::namespaced_with(agent.clone(), &ns, &resource)
        } else {
            Api::all_with(agent.clone(), &resource)
        };
        // The API server's RBAC authorizer learns of the ClusterRole (and its binding)
        // through its own informers, a moment after they are stored: wait for it.
        wait_for("the agent's token may list the custom resources", || {
            let api = api.clone();
            async move {
                let listed = api.list(&ListParams::default()).await;
                Ok((api_code(&listed) == Some(200)).then_some(()))
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{plural}: {e}"))?;
    }

    // A kind the cluster does not serve is reported, naming it, not guessed.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "squid",
            json!({
                "agentRef": "prod",
                "accountName": format!("{ns}-squid"),
                "kinds": ["ConfigMap"],
                "customResources": [{ "kind": "Squid", "group": "e2e.scaleagent.dev" }],
            }),
        ),
    )
    .await?;
    let message = wait_for("Degraded with reason UnknownKind", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        let conditions = agent.status.map(|s| s.conditions).unwrap_or_default();
        Ok(find_condition(&conditions, DEGRADED)
            .filter(|c| c.status == "True" && c.reason == "UnknownKind")
            .map(|c| c.message.clone()))
    })
    .await?;
    assert!(message.contains("Squid.e2e.scaleagent.dev"), "{message}");
    assert!(message.contains("CRD is installed"), "{message}");
    operator.stop().await
}

/// The condition `type_` of a ScaleAgent, when it has been written for its generation.
async fn agent_condition(
    client: &Client,
    namespace: &str,
    name: &str,
    type_: &str,
) -> anyhow::Result<Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>> {
    let agent = get_agent(client, namespace, name).await?;
    let conditions = agent.status.map(|s| s.conditions).unwrap_or_default();
    Ok(find_condition(&conditions, type_)
        .filter(|c| c.observed_generation == agent.metadata.generation)
        .cloned())
}

/// Whether the API server lets `user` do `verb` on ServiceAccount `name` in `namespace`.
async fn may(
    client: &Client,
    user: &str,
    verb: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some("serviceaccounts".into()),
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_is_not_an_escalation_path() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-policy").await?;
    let elsewhere = control_plane.namespace(&client, "op-policy-out").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));

    // Outside the watched namespaces: told so, and nothing made.
    apply_json::<ScaleAgent>(
        &client,
        &elsewhere,
        scale_agent("rogue", json!({ "access": "Deploy" })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &elsewhere,
        agent_account("rogue", json!({ "agentRef": "rogue" })),
    )
    .await?;
    let ready = wait_for(
        "the refusal of a ScaleAgent outside the watched namespaces",
        || async { agent_condition(&client, &elsewhere, "rogue", READY).await },
    )
    .await?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NamespaceNotWatched")
    );
    // Operators of concurrent tests watch other namespaces: whichever refuses first names
    // its own list.
    assert!(
        ready
            .message
            .contains("this operator reconciles ScaleAgents only in [")
            && ready.message.contains(&format!(
                "add {elsewhere} to the operator's --watch-namespaces"
            )),
        "{}",
        ready.message
    );
    let accepted = wait_for("the refusal of an AgentAccount outside", || async {
        let account = get_account(&client, &elsewhere, "rogue").await?;
        let conditions = account.status.map(|s| s.conditions).unwrap_or_default();
        Ok(find_condition(&conditions, ACCEPTED).cloned())
    })
    .await?;
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("False", "NamespaceNotWatched")
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &elsewhere);
    wait_for("a Warning Event on the refused ScaleAgent", || async {
        let found = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .any(|e| {
                e.reason.as_deref() == Some("NamespaceNotWatched")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("rogue")
            });
        Ok(found.then_some(()))
    })
    .await?;
    let rogue = get_agent(&client, &elsewhere, "rogue").await?;
    assert!(rogue.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        Api::<Deployment>::namespaced(client.clone(), &elsewhere)
            .get_opt("rogue-agent")
            .await?
            .is_none()
    );
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt(&format!("scale-agent:{elsewhere}:rogue"))
            .await?
            .is_none()
    );

    // An image outside the allowed prefixes: the reason and what to change; nothing made
    // until the image is fixed.
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("forked", json!({ "image": "evil.example/agent:v1" })),
    )
    .await?;
    let degraded = wait_for("the refusal of a foreign image", || async {
        Ok(agent_condition(&client, &ns, "forked", DEGRADED)
            .await?
            .filter(|c| c.status == "True"))
    })
    .await?;
    assert_eq!(degraded.reason, "ImageNotAllowed");
    assert!(
        degraded.message.contains("evil.example/agent:v1")
            && degraded.message.contains("ghcr.io/scale-agent/agent")
            && degraded.message.contains("--allowed-image-prefixes"),
        "{}",
        degraded.message
    );
    for (kind, found) in [
        (
            "Deployment",
            Api::<Deployment>::namespaced(client.clone(), &ns)
                .get_opt("forked-agent")
                .await?
                .is_some(),
        ),
        (
            "ServiceAccount",
            Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                .get_opt("forked-agent")
                .await?
                .is_some(),
        ),
        (
            "ClusterRole",
            Api::<ClusterRole>::all(client.clone())
                .get_opt(&format!("scale-agent:{ns}:forked"))
                .await?
                .is_some(),
        ),
    ] {
        assert!(!found, "a {kind} was made for a refused image");
    }
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("forked", json!({ "image": "ghcr.io/scale-agent/agent:v9" })),
    )
    .await?;
    wait_for("the Deployment once the image is allowed", || async {
        Ok(Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("forked-agent")
            .await?)
    })
    .await?;

    // Impersonation: the agent may impersonate exactly the named ServiceAccount, and with
    // every account impersonating its own rules stay read-only despite access: Deploy.
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("prod", json!({ "access": "Deploy" })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "web",
            json!({
                "agentRef": "prod",
                "accountName": format!("{ns}-web"),
                "kinds": ["ConfigMap"],
                "impersonateServiceAccount": { "namespace": ns, "name": "spinnaker" },
            }),
        ),
    )
    .await?;
    let impersonation = format!("scale-agent:{ns}:prod:impersonate");
    let role = wait_for("the impersonation Role", || async {
        Ok(Api::<Role>::namespaced(client.clone(), &ns)
            .get_opt(&impersonation)
            .await?)
    })
    .await?;
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0].verbs, ["impersonate"]);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["serviceaccounts".to_string()][..])
    );
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["spinnaker".to_string()][..])
    );
    let agent_user = format!("system:serviceaccount:{ns}:prod-agent");
    // The Role can be there before its RoleBinding, and the API server's RBAC authorizer
    // sees both a moment after they are stored (one full run asked in that window).
    wait_for("the agent allowed to impersonate spinnaker", || async {
        Ok(may(&client, &agent_user, "impersonate", &ns, "spinnaker")
            .await?
            .then_some(()))
    })
    .await?;
    assert!(!may(&client, &agent_user, "impersonate", &ns, "someone-else").await?);
    assert!(!may(&client, &agent_user, "impersonate", &elsewhere, "spinnaker").await?);
    let config = wait_for("the impersonation in the agent config", || async {
        Ok(agent_config(&client, &ns, "prod")
            .await?
            .filter(|c| !c.kubernetes.accounts.is_empty()))
    })
    .await?;
    assert_eq!(
        config.kubernetes.accounts[0]
            .impersonate_service_account
            .as_ref()
            .map(|sa| sa.username()),
        Some(format!("system:serviceaccount:{ns}:spinnaker"))
    );
    let cluster_role = wait_for("the agent's ClusterRole", || async {
        Ok(Api::<ClusterRole>::all(client.clone())
            .get_opt(&format!("scale-agent:{ns}:prod"))
            .await?)
    })
    .await?;
    let writes: Vec<String> = cluster_role
        .rules
        .unwrap_or_default()
        .into_iter()
        .flat_map(|r| r.verbs)
        .filter(|v| !["get", "list", "watch"].contains(&v.as_str()))
        .collect();
    assert!(writes.is_empty(), "the agent writes as itself: {writes:?}");

    // No account impersonating any more: the Role goes.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "web",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-web"), "kinds": ["ConfigMap"] }),
        ),
    )
    .await?;
    wait_for("the impersonation Role to go", || async {
        Ok(Api::<Role>::namespaced(client.clone(), &ns)
            .get_opt(&impersonation)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    assert!(!may(&client, &agent_user, "impersonate", &ns, "spinnaker").await?);
    operator.stop().await
}

/// A ScaleAgent spec that enrols with the hub at `hub` (TLS verified with Secret hub-ca)
/// using the token in Secret `token_secret`.
fn enrolling_agent(name: &str, hub: std::net::SocketAddr, token_secret: &str) -> Value {
    let mut agent = scale_agent(
        name,
        json!({
            "hub": {
                "address": format!("localhost:{}", hub.port()),
                "tls": { "caSecretRef": { "name": "hub-ca" } },
            },
            "enrolment": { "tokenSecretRef": { "name": token_secret } },
        }),
    );
    if let Some(spec) = agent["spec"].as_object_mut() {
        spec.remove("clientCertificate");
    }
    agent
}

/// The hub with TLS on gRPC (its own agent CA, no --client-ca) and HTTP, and its serving
/// CA in Secret hub-ca of `ns`.
async fn enrolment_hub(
    client: &Client,
    ns: &str,
    dir: &std::path::Path,
) -> anyhow::Result<scale_agent_e2e::fixtures::TlsHub> {
    let grpc_ca = CertificateAuthority::new("scale-agent-e2e-grpc-ca")?;
    let serving = grpc_ca.serving("scale-agent-hub", &[])?;
    create_secret(client, ns, "hub-ca", &[("ca.crt", &grpc_ca.cert_pem)]).await?;
    scale_agent_e2e::fixtures::TlsHub::start(dir, |config| {
        config.agents.security =
            scale_agent_hub::GrpcSecurity::MutualTls(scale_agent_hub::TlsMaterial {
                cert_pem: serving.cert_pem.into_bytes(),
                key_pem: serving.key_pem.into_bytes(),
                client_ca_pem: None,
            });
    })
    .await
}

/// A one-time enrolment token from the hub's admin API.
async fn enrolment_token(
    hub: &scale_agent_e2e::fixtures::TlsHub,
    identity: &str,
) -> anyhow::Result<String> {
    let response = hub
        .call(
            "POST",
            &format!("/api/v1/agent-tokens?identity={identity}&accounts=*&ttl=1h&once=true"),
        )
        .bearer(&hub.admin_token)
        .send()
        .await?;
    anyhow::ensure!(
        (200..300).contains(&response.status),
        "the hub refused a token: {} {}",
        response.status,
        response.body
    );
    response.json_or_null()["token"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no token in {}", response.body))
}

fn secret_field(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .unwrap_or_default()
}

/// Issue 10, item 6: a ScaleAgent with an enrolment token gets a TLS Secret with a
/// certificate the hub issued for the token's identity (not one chosen in the cluster); a
/// second ScaleAgent presenting the same, consumed, token gets the hub's refusal in its
/// conditions; the certificate renews by certificate for the same identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolment_gets_a_hub_issued_certificate_once_per_token() -> anyhow::Result<()> {
    use scale_agent_operator::enrol;
    let (_, client, ns) = setup("op-enrol").await?;
    let dir = scale_agent_e2e::fixtures::temp_dir("op-enrol")?;
    let hub = enrolment_hub(&client, &ns, &dir).await?;
    let grpc = hub.hub.grpc_addr;
    let token = enrolment_token(&hub, "prod-eu").await?;
    create_secret(&client, &ns, "enrol", &[("token", &token)]).await?;
    let mut config = operator_config(&ns);
    config.allow_operator_signed_certificates = false;
    let operator = Operator::start(client.clone(), config);
    apply_json::<ScaleAgent>(&client, &ns, enrolling_agent("prod", grpc, "enrol")).await?;

    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let secret = wait_for("the enrolled certificate Secret", || async {
        Ok(secrets.get_opt("prod-agent-tls").await?)
    })
    .await?;
    let cert = secret_field(&secret, "tls.crt");
    let key = secret_field(&secret, "tls.key");
    let ca = secret_field(&secret, "ca.crt");
    let info = pki::parse(&cert).expect("a PEM certificate");
    assert!(
        info.has_identity("prod-eu"),
        "the token's identity: {info:?}"
    );
    let hub_agent_ca = std::fs::read_to_string(dir.join("hub-data/agent-ca.crt"))?;
    assert_eq!(ca, hub_agent_ca, "ca.crt is the hub's agent CA");
    assert!(
        enrol::signed_by(&cert, &hub_agent_ca),
        "signed by the hub's CA"
    );
    assert!(pki::is_pkcs8_pem(&key));
    assert_eq!(
        secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(enrol::ISSUED_BY_ANNOTATION))
            .map(String::as_str),
        Some(enrol::ISSUED_BY_HUB)
    );
    let agent = wait_for("CertificateReady with the identity", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, CERTIFICATE_READY) && s.identity.is_some())
            .then_some(agent))
    })
    .await?;
    let status = agent.status.expect("status");
    assert_eq!(status.identity.as_deref(), Some("prod-eu"));
    assert_eq!(
        status.certificate_expiry.as_deref(),
        Some(scale_agent_operator::status::rfc3339(info.not_after).as_str())
    );
    assert!(status.enrolment_token_version.is_some());
    // The hub shows the token used.
    let tokens = hub
        .call("GET", "/api/v1/agent-tokens")
        .bearer(&hub.admin_token)
        .send()
        .await?
        .json_or_null();
    let used = tokens
        .as_array()
        .or_else(|| tokens["items"].as_array())
        .into_iter()
        .flatten()
        .any(|t| t["identity"] == "prod-eu" && t["used"].is_string());
    assert!(used, "the token is consumed: {tokens}");

    // A second ScaleAgent with the same token: the hub's refusal, and what to do.
    apply_json::<ScaleAgent>(&client, &ns, enrolling_agent("second", grpc, "enrol")).await?;
    let condition = wait_for("the refusal in CertificateReady", || async {
        let agent = get_agent(&client, &ns, "second").await?;
        Ok(agent
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, CERTIFICATE_READY).cloned())
            .filter(|c| c.status == "False"))
    })
    .await?;
    for part in [
        "refused the enrolment token",
        "PermissionDenied",
        "already used",
        "agent-token create",
        &format!("kubectl -n {ns} create secret generic enrol --from-literal=token="),
    ] {
        assert!(
            condition.message.contains(part),
            "{part}: {}",
            condition.message
        );
    }
    let second = get_agent(&client, &ns, "second").await?;
    let degraded = find_condition(
        &second.status.as_ref().expect("status").conditions,
        DEGRADED,
    )
    .cloned()
    .expect("Degraded");
    assert_eq!(degraded.reason, "EnrolmentRefused");
    assert!(secrets.get_opt("second-agent-tls").await?.is_none());
    // The refused token version is remembered, so the operator does not present it again.
    assert!(
        second
            .status
            .and_then(|s| s.enrolment_token_version)
            .is_some()
    );

    // Renewal by certificate: a new certificate for the same identity, no token.
    let endpoint = enrol::HubEndpoint {
        address: format!("localhost:{}", grpc.port()),
        server_name: None,
        ca_pem: Some(secret_field(&secrets.get("hub-ca").await?, "ca.crt")),
    };
    let (new_key, csr) = enrol::key_and_csr("renewal").map_err(anyhow::Error::msg)?;
    let renewed = enrol::enroll(&endpoint, "", &csr, Some((&cert, &key)))
        .await
        .map_err(|f| anyhow::anyhow!("{f:?}"))?;
    assert_eq!(renewed.identity, "prod-eu");
    assert_ne!(renewed.certificate_chain_pem, cert);
    let renewed_info = pki::parse(&renewed.certificate_chain_pem).expect("renewed");
    assert!(renewed_info.has_identity("prod-eu"));
    assert!(enrol::signed_by(
        &renewed.certificate_chain_pem,
        &hub_agent_ca
    ));
    assert!(pki::is_pkcs8_pem(&new_key));
    // Without a certificate an empty token is refused, with what to do.
    let refused = enrol::enroll(&endpoint, "", &csr, None)
        .await
        .expect_err("no token, no certificate");
    match refused {
        enrol::Failure::Refused { code, message } => {
            assert_eq!(code, tonic::Code::Unauthenticated);
            assert!(message.contains("agent-token create"), "{message}");
        }
        other => panic!("expected a refusal: {other:?}"),
    }

    operator.stop().await?;
    hub.hub.shutdown().await?;
    Ok(())
}

/// Issue 10, item 6: spec.clientCertificate (the operator signs with a CA key in the
/// cluster) is refused unless the operator runs with --allow-operator-signed-certificates,
/// with a condition that says what to change; with the flag it works as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_signed_certificates_need_the_flag() -> anyhow::Result<()> {
    let (_, client, ns) = setup("op-signed").await?;
    create_ca_secret(&client, &ns).await?;
    let mut config = operator_config(&ns);
    config.allow_operator_signed_certificates = false;
    let operator = Operator::start(client.clone(), config);
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({}))).await?;
    let agent = wait_for("the refusal", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, DEGRADED))
            .is_some_and(|c| c.status == "True")
            .then_some(agent))
    })
    .await?;
    let status = agent.status.expect("status");
    let degraded = find_condition(&status.conditions, DEGRADED).expect("Degraded");
    assert_eq!(degraded.reason, "OperatorSignedCertificatesNotAllowed");
    for part in [
        "--allow-operator-signed-certificates",
        "spec.enrolment.tokenSecretRef",
        "agent-token create --once",
        "--client-ca",
    ] {
        assert!(
            degraded.message.contains(part),
            "{part}: {}",
            degraded.message
        );
    }
    let certificate = find_condition(&status.conditions, CERTIFICATE_READY).expect("condition");
    assert_eq!(certificate.status, "False");
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    assert!(secrets.get_opt("prod-agent-tls").await?.is_none());
    operator.stop().await?;

    // With the flag, the operator signs.
    let operator = Operator::start(client.clone(), operator_config(&ns));
    let secret = wait_for("the operator-signed Secret", || async {
        Ok(secrets.get_opt("prod-agent-tls").await?)
    })
    .await?;
    let info = pki::parse(&secret_field(&secret, "tls.crt")).expect("certificate");
    assert!(info.has_identity(&format!("prod.{ns}")));
    operator.stop().await
}

/// The `Connected` condition of an AgentAccount or ScaleAgent: (status, reason, message).
fn connected(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    find_condition(conditions, scale_agent_crds::conditions::CONNECTED)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Issue 12, the hub's verdict in the cluster: a real agent process writes `Connected` into
/// its AgentAccounts and ScaleAgent (`kubectl wait` and `kubectl get` show it): Streaming for
/// an accepted account, Rejected naming the other cluster for a name another cluster holds,
/// HubUnreachable once the hub is gone; its token may patch no other object's status, and
/// the operator's conditions and the agent's live side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_writes_the_hubs_verdict_into_the_status() -> anyhow::Result<()> {
    use scale_agent_e2e::argocd;
    use scale_agent_e2e::local_agent::{LocalAgent, LocalAgentOptions};
    use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg, hub_message::Kind as Out};
    let (control_plane, client, ns) = setup("op-lifecycle").await?;
    let dir = std::env::temp_dir().join(format!("op-lifecycle-{ns}"));
    std::fs::create_dir_all(&dir)?;
    let (issuer_cert, issuer_key) = create_ca_secret(&client, &ns).await?;
    let hub_ca = CertificateAuthority::new("scale-agent-e2e-hub-ca")?;
    let serving = hub_ca.serving("scale-agent-hub", &[])?;
    create_secret(&client, &ns, "hub-ca", &[("ca.crt", &hub_ca.cert_pem)]).await?;
    let mut hub_config = scale_agent_hub::Config::new(
        scale_agent_hub::GrpcSecurity::MutualTls(scale_agent_hub::TlsMaterial {
            cert_pem: serving.cert_pem.clone().into_bytes(),
            key_pem: serving.key_pem.clone().into_bytes(),
            client_ca_pem: Some(issuer_cert.clone().into_bytes()),
        }),
        dir.join("hub-data"),
    );
    hub_config.listeners.grpc_addr = "127.0.0.1:0".parse()?;
    hub_config.listeners.http_addr = "127.0.0.1:0".parse()?;
    // Operator-signed identities (--client-ca) register only what an --allow rule names.
    hub_config.agents.allow =
        vec![scale_agent_hub::identity::AllowRule::parse("*=*").map_err(anyhow::Error::msg)?];
    hub_config.api.api_tokens_file = Some(scale_agent_e2e::fixtures::write_api_tokens(&dir)?);
    let hub = scale_agent_hub::start(hub_config).await?;

    // Another cluster already holds account name "<ns>-two": a stream of the same identity
    // from a replica elsewhere registered it with its own API server.
    let two = format!("{ns}-two");
    let identity = format!("prod.{ns}");
    let other_cluster = "https://other-cluster.example:6443";
    let issued = pki::Ca::from_pem(&issuer_cert, &issuer_key)
        .map_err(anyhow::Error::msg)?
        .issue(
            &identity,
            Duration::from_secs(3600),
            k8s_openapi::jiff::Timestamp::now().as_second(),
        )
        .map_err(anyhow::Error::msg)?;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&hub_ca.cert_pem))
        .identity(tonic::transport::Identity::from_pem(
            &issued.cert_pem,
            &issued.key_pem,
        ))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!(
        "https://127.0.0.1:{}",
        hub.grpc_addr.port()
    ))?
    .tls_config(tls)?
    .connect()
    .await?;
    let (impostor_tx, impostor_rx) = tokio::sync::mpsc::channel(8);
    impostor_tx
        .send(pb::AgentMessage {
            seq: 1,
            kind: Some(Msg::Hello(pb::Hello {
                replica: "elsewhere-0".into(),
                ..Default::default()
            })),
        })
        .await?;
    impostor_tx
        .send(pb::AgentMessage {
            seq: 2,
            kind: Some(Msg::RegisterAccount(pb::RegisterAccount {
                account: two.clone(),
                cluster: Some(pb::ClusterInfo {
                    api_server_host: other_cluster.into(),
                    ca_fingerprint: "ab".into(),
                    kubernetes_version: "v1.37.0".into(),
                }),
                ..Default::default()
            })),
        })
        .await?;
    let mut impostor = pb::agent_hub_client::AgentHubClient::new(channel)
        .session(tokio_stream::wrappers::ReceiverStream::new(impostor_rx))
        .await?
        .into_inner();
    loop {
        let message = tokio::time::timeout(TIMEOUT, impostor.message())
            .await??
            .ok_or_else(|| anyhow::anyhow!("the hub ended the other cluster's stream"))?;
        if let Some(Out::Assignment(a)) = message.kind {
            assert_eq!(
                a.role,
                pb::account_assignment::Role::Streaming as i32,
                "{a:?}"
            );
            break;
        }
    }

    let operator = Operator::start(client.clone(), operator_config(&ns));
    let hub_address = format!("localhost:{}", hub.grpc_addr.port());
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({
                "hub": {
                    "address": hub_address,
                    "tls": { "caSecretRef": { "name": "hub-ca" } },
                },
                "replicas": 1,
                "scope": { "type": "Namespaces", "namespaces": [ns] },
                "defaults": { "kinds": ["ConfigMap", "Secret"] },
            }),
        ),
    )
    .await?;
    let one = format!("{ns}-one");
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("one", json!({ "agentRef": "prod", "accountName": one })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("two", json!({ "agentRef": "prod", "accountName": two })),
    )
    .await?;
    // An account of another ScaleAgent, whose status this agent must not touch.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("foreign", json!({ "agentRef": "staging" })),
    )
    .await?;
    create_configmap(&client, &ns, "hello").await?;
    wait_for("the operator's config with both accounts", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        Ok((names.len() == 2).then_some(()))
    })
    .await?;
    let mut agent = LocalAgent::start(
        control_plane,
        &client,
        LocalAgentOptions {
            env: vec![(
                "RUST_LOG".into(),
                "info,scale_agent::status_writer=debug".into(),
            )],
            ..LocalAgentOptions::new(&ns, "prod-agent", dir.join("prod-agent-0"))
        },
    )
    .await?;

    // What a provisioning pipeline runs.
    let waited = kubectl(
        control_plane,
        &[
            "-n",
            &ns,
            "wait",
            "--for=condition=Connected",
            "agentaccount/one",
            "--timeout=90s",
        ],
    )?;
    assert!(waited.contains("condition met"), "{waited}");
    let account = get_account(&client, &ns, "one").await?;
    let status = account.status.clone().expect("a status");
    let (state, reason, message) = connected(&status.conditions).expect("Connected");
    assert_eq!((state.as_str(), reason.as_str()), ("True", "Streaming"));
    assert!(message.contains(agent.pod_name()), "{message}");
    // The operator's conditions are still there, next to the agent's.
    assert!(
        find_condition(&status.conditions, ACCEPTED).is_some(),
        "{status:?}"
    );
    let hub_view = wait_for("the account's hub status with objects", || async {
        let status = get_account(&client, &ns, "one").await?.status;
        Ok(status.and_then(|s| s.hub).filter(|h| {
            h.objects_streamed > 0
                && h.state.as_deref() == Some("ACTIVE")
                && h.last_event_time.is_some()
        }))
    })
    .await?;
    assert_eq!(hub_view.replica, agent.pod_name());
    assert!(
        hub_view.kinds_watched.contains(&"configmaps".to_string()),
        "{hub_view:?}"
    );
    // Each kind asked for is reported, as watched or as forbidden with the API server's
    // message.
    assert!(
        hub_view.kinds_watched.contains(&"secrets".to_string())
            || hub_view.kinds_forbidden.iter().any(|k| k.kind == "secrets"),
        "{hub_view:?}"
    );

    // The clash: Rejected, naming the other cluster.
    let rejected = wait_for("account two to be Rejected", || async {
        let status = get_account(&client, &ns, "two").await?.status;
        Ok(status
            .and_then(|s| connected(&s.conditions))
            .filter(|(_, reason, _)| reason == "Rejected"))
    })
    .await?;
    assert_eq!(rejected.0, "False");
    assert!(rejected.2.contains(other_cluster), "{}", rejected.2);

    // kubectl shows both, with the new columns.
    let table = kubectl(control_plane, &["-n", &ns, "get", "agentaccounts"])?;
    let header = table.lines().next().unwrap_or_default();
    assert!(
        header.contains("CONNECTED") && header.contains("REASON"),
        "{table}"
    );
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert!(
        row("one").contains(&"True") && row("one").contains(&"Streaming"),
        "{table}"
    );
    assert!(
        row("two").contains(&"False") && row("two").contains(&"Rejected"),
        "{table}"
    );

    // Argo CD's health checks (manifests/argocd) on these very objects.
    let health_of_account = |name: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let account = get_account(&client, &ns, name).await?;
            Ok::<_, anyhow::Error>(argocd::health(
                "AgentAccount",
                &serde_json::to_value(&account)?,
            )?)
        }
    };
    let (health, message) = health_of_account("one").await?;
    assert_eq!(health, "Healthy", "{message}");
    assert!(message.starts_with("Streaming: "), "{message}");
    let (health, message) = health_of_account("two").await?;
    assert_eq!(health, "Degraded", "{message}");
    assert!(
        message.starts_with("Rejected: ") && message.contains(other_cluster),
        "{message}"
    );
    wait_for("the operator to refuse the foreign account", || async {
        let status = get_account(&client, &ns, "foreign").await?.status;
        Ok(status.filter(|s| !s.accepted && s.observed_generation.is_some()))
    })
    .await?;
    let (health, message) = health_of_account("foreign").await?;
    assert_eq!(health, "Degraded", "{message}");
    assert!(message.starts_with("AgentNotFound: "), "{message}");

    // The ScaleAgent counts the connected replicas.
    let scale_agent_status = wait_for("the ScaleAgent's connected replicas", || async {
        let status = get_agent(&client, &ns, "prod").await?.status;
        Ok(status.filter(|s| s.connected == Some(1)))
    })
    .await?;
    assert_eq!(scale_agent_status.connected_replicas, [agent.pod_name()]);
    let (state, reason, _) = connected(&scale_agent_status.conditions).expect("Connected");
    assert_eq!((state.as_str(), reason.as_str()), ("True", "Connected"));
    let sca = kubectl(control_plane, &["-n", &ns, "get", "scaleagents", "prod"])?;
    assert!(sca.contains("CONNECTED"), "{sca}");
    // No kubelet here: the agent's pod is never available, so the rollout goes on.
    let (health, message) = argocd::health(
        "ScaleAgent",
        &serde_json::to_value(get_agent(&client, &ns, "prod").await?)?,
    )?;
    assert_eq!(health, "Progressing", "{message}");
    assert!(message.starts_with("RollingOut: "), "{message}");

    // The agent's own token: its statuses only.
    let kubeconfig =
        kube::config::Kubeconfig::read_from(agent.kubeconfig().expect("a kubeconfig"))?;
    let agent_client = Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    let patch = |kind: &str| {
        json!({
            "apiVersion": "scaleagent.dev/v1alpha1",
            "kind": kind,
            "status": { "conditions": [{
                "type": "Connected", "status": "True", "reason": "Forged",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]},
        })
    };
    let params = PatchParams::apply("e2e-forger").force();
    let accounts_as_agent = Api::<AgentAccount>::namespaced(agent_client.clone(), &ns);
    let denied = accounts_as_agent
        .patch_status("foreign", &params, &Patch::Apply(&patch("AgentAccount")))
        .await;
    assert_eq!(api_code(&denied), Some(403), "{denied:?}");
    let denied = Api::<ScaleAgent>::namespaced(agent_client.clone(), &ns)
        .patch_status("staging", &params, &Patch::Apply(&patch("ScaleAgent")))
        .await;
    assert_eq!(api_code(&denied), Some(403), "{denied:?}");
    // Nor the spec of its own account: status only.
    let denied = accounts_as_agent
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "kinds": ["Secret"] } })),
        )
        .await;
    assert_eq!(api_code(&denied), Some(403), "{denied:?}");
    // The operator reconciling again leaves the agent's condition alone.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "one",
            json!({ "agentRef": "prod", "accountName": one, "podMetrics": true }),
        ),
    )
    .await?;
    wait_for("the operator to observe the change", || async {
        let account = get_account(&client, &ns, "one").await?;
        Ok(account
            .status
            .filter(|s| s.observed_generation == account.metadata.generation)
            .map(|_| ()))
    })
    .await?;
    let status = get_account(&client, &ns, "one")
        .await?
        .status
        .expect("status");
    assert_eq!(
        connected(&status.conditions).map(|c| c.1),
        Some("Streaming".to_string())
    );

    // The hub goes away: HubUnreachable, with the error.
    drop(impostor_tx);
    hub.shutdown().await?;
    let unreachable = wait_for("account one to be HubUnreachable", || async {
        let status = get_account(&client, &ns, "one").await?.status;
        Ok(status
            .and_then(|s| connected(&s.conditions))
            .filter(|(_, reason, _)| reason == "HubUnreachable"))
    })
    .await?;
    assert_eq!(unreachable.0, "False");
    assert!(unreachable.2.contains(&hub_address), "{}", unreachable.2);
    let scale_agent_status = wait_for("the ScaleAgent to be HubUnreachable", || async {
        let status = get_agent(&client, &ns, "prod").await?.status;
        Ok(status.filter(|s| connected(&s.conditions).is_some_and(|c| c.1 == "HubUnreachable")))
    })
    .await?;
    assert_eq!(scale_agent_status.connected, Some(0));
    let (health, message) = argocd::health(
        "ScaleAgent",
        &serde_json::to_value(get_agent(&client, &ns, "prod").await?)?,
    )?;
    assert_eq!(health, "Degraded", "{message}");
    assert!(message.starts_with("HubUnreachable: "), "{message}");
    let (health, message) = argocd::health(
        "AgentAccount",
        &serde_json::to_value(get_account(&client, &ns, "one").await?)?,
    )?;
    assert_eq!(health, "Degraded", "{message}");
    assert!(message.starts_with("HubUnreachable: "), "{message}");
    agent.ensure_running()?;

    agent.stop();
    operator.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
