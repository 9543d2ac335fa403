//! The admission policies shipped in `manifests/policy` on the real API server: ScaleAgents
//! with `scope.type: Cluster` or `access: Deploy`, and changes of a privileged one's hub,
//! enrolment, certificate, image or scope, only for members of `scale-agent-admins`; scope
//! namespaces, Secret references, AgentAccount impersonation targets and namespaces only
//! where the author holds those rights already (issue 28, F1/F9); AgentAccounts'
//! `callers: impersonate` and whom it names only for the admin group (issue 31). The users are impersonated
//! by the admin client; RBAC lets both write ScaleAgents and AgentAccounts in the test's
//! namespace and read its Secrets like a namespace `edit` user, so every refusal here is the
//! policy's.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use scale_agent_crds::{AgentAccount, ScaleAgent};
use scale_agent_e2e::{ControlPlane, ControlPlaneOptions, crds};
use serde_json::{Value, json};

const ADMIN_GROUP: &str = "scale-agent-admins";

/// The Secrets of the test's namespace the users may `get` (others, e.g. another team's
/// enrolment token, they may not).
const READABLE_SECRETS: &[&str] = &["agent-ca", "own-enrolment", "own-kubeconfig"];

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(ControlPlaneOptions::default)?)
}

/// A client acting as `user` in `groups` (impersonated by the admin).
async fn acting_as(
    control_plane: &ControlPlane,
    user: &str,
    groups: &[&str],
) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(control_plane.kubeconfig_path())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups =
        (!groups.is_empty()).then(|| groups.iter().map(|g| g.to_string()).collect());
    Ok(Client::try_from(config)?)
}

fn scale_agent(name: &str, spec: Value) -> anyhow::Result<ScaleAgent> {
    let mut base = json!({
        "hub": { "address": "hub.spinnaker.example.com:9091" },
        "clientCertificate": { "issuerSecretRef": { "name": "agent-ca" } },
    });
    if let (Some(base), Some(extra)) = (base.as_object_mut(), spec.as_object()) {
        // Enrolment or an operator-signed certificate, not both (the CRD's rule).
        if extra.contains_key("enrolment") {
            base.remove("clientCertificate");
        }
        base.extend(extra.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": name },
        "spec": base,
    }))?)
}

/// Creates `agent` (a dry run unless `keep`): Ok, or the API server's status code and
/// message.
async fn create<K>(
    client: &Client,
    namespace: &str,
    object: &K,
    keep: bool,
) -> anyhow::Result<Result<(), (u16, String)>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let params = PostParams {
        dry_run: !keep,
        ..Default::default()
    };
    match Api::<K>::namespaced(client.clone(), namespace)
        .create(&params, object)
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => Ok(Err((status.code, status.message))),
        Err(other) => Err(other.into()),
    }
}

/// Lets users `alice` and `bob` create, get and patch ScaleAgents and AgentAccounts in
/// `namespace`, list its Secrets and get those named in [`READABLE_SECRETS`], and
/// impersonate its ServiceAccounts: a tenant with (about) namespace `edit`.
async fn may_write_scale_agents(admin: &Client, namespace: &str) -> anyhow::Result<()> {
    let meta = ObjectMeta {
        name: Some("scaleagent-writers".into()),
        ..Default::default()
    };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta.clone(),
                rules: Some(vec![
                    PolicyRule {
                        api_groups: Some(vec!["scaleagent.dev".into()]),
                        resources: Some(vec!["scaleagents".into(), "agentaccounts".into()]),
                        verbs: vec!["create".into(), "get".into(), "patch".into()],
                        ..Default::default()
                    },
                    PolicyRule {
                        api_groups: Some(vec!["".into()]),
                        resources: Some(vec!["secrets".into()]),
                        verbs: vec!["list".into()],
                        ..Default::default()
                    },
                    PolicyRule {
                        api_groups: Some(vec!["".into()]),
                        resources: Some(vec!["secrets".into()]),
                        verbs: vec!["get".into()],
                        resource_names: Some(
                            READABLE_SECRETS.iter().map(|s| s.to_string()).collect(),
                        ),
                        ..Default::default()
                    },
                    PolicyRule {
                        api_groups: Some(vec!["".into()]),
                        resources: Some(vec!["serviceaccounts".into()]),
                        verbs: vec!["impersonate".into()],
                        ..Default::default()
                    },
                ]),
            },
        )
        .await?;
    let user = |name: &str| Subject {
        kind: "User".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "scaleagent-writers".into(),
                },
                subjects: Some(vec![user("alice"), user("bob")]),
            },
        )
        .await?;
    Ok(())
}

/// `kubectl apply -k manifests/policy`, as an operator of the cluster would.
fn install_policy(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/policy");
    let applied = std::process::Command::new(control_plane.binaries().kubectl())
        .arg(format!(
            "--kubeconfig={}",
            control_plane.kubeconfig_path().display()
        ))
        .args(["apply", "--server-side", "-k", policy])
        .output()?;
    anyhow::ensure!(
        applied.status.success(),
        "kubectl apply -k manifests/policy: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    Ok(())
}

fn assert_refused(outcome: Result<(), (u16, String)>, what: &str) {
    let Err((code, message)) = outcome else {
        panic!("{what} was allowed");
    };
    assert_eq!(code, 403, "{what}: {message}");
    assert!(
        message.contains("scale-agent-scaleagent-privileges")
            && message.contains(&format!("reserved to members of group {ADMIN_GROUP}"))
            && message.contains("Set spec.scope.type: Namespaces"),
        "{what}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scope_and_deploy_access_are_reserved_to_the_admin_group() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&admin, "admission").await?;
    may_write_scale_agents(&admin, &namespace).await?;
    install_policy(control_plane)?;

    let bob = acting_as(control_plane, "bob", &[]).await?;
    let alice = acting_as(control_plane, "alice", &[ADMIN_GROUP]).await?;
    let cluster_wide = scale_agent("wide", json!({}))?;
    // The API server takes a moment to load a new policy.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let outcome = create(&bob, &namespace, &cluster_wide, false).await?;
        if outcome.is_err() || tokio::time::Instant::now() > deadline {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_refused(refused, "bob: scope Cluster (the default)");
    let namespaced_deploy = scale_agent(
        "deployer",
        json!({ "scope": { "type": "Namespaces", "namespaces": [namespace] }, "access": "Deploy" }),
    )?;
    assert_refused(
        create(&bob, &namespace, &namespaced_deploy, false).await?,
        "bob: access Deploy",
    );
    let namespaced_reader = scale_agent(
        "reader",
        json!({ "scope": { "type": "Namespaces", "namespaces": [namespace] } }),
    )?;
    assert_eq!(
        create(&bob, &namespace, &namespaced_reader, true).await?,
        Ok(()),
        "bob: namespace scope, read-only"
    );
    let everything = scale_agent("everything", json!({ "access": "Deploy" }))?;
    assert_eq!(
        create(&alice, &namespace, &everything, true).await?,
        Ok(()),
        "alice, in {ADMIN_GROUP}: scope Cluster, access Deploy"
    );

    // Updates: leaving scope and access alone is fine for anyone (the operator's finalizer,
    // a replica count); widening them is not.
    let agents = Api::<ScaleAgent>::namespaced(bob.clone(), &namespace);
    let params = PatchParams::default();
    agents
        .patch(
            "everything",
            &params,
            &Patch::Merge(json!({ "spec": { "replicas": 3 } })),
        )
        .await?;
    agents
        .patch(
            "reader",
            &params,
            &Patch::Merge(json!({ "spec": { "replicas": 3 } })),
        )
        .await?;
    let widened = agents
        .patch(
            "reader",
            &params,
            &Patch::Merge(json!({ "spec": { "access": "Deploy" } })),
        )
        .await;
    match widened {
        Err(kube::Error::Api(status)) => {
            assert_refused(Err((status.code, status.message)), "bob: widening access")
        }
        other => panic!("bob widened access: {other:?}"),
    }
    Ok(())
}

fn agent_account(name: &str, spec: Value) -> anyhow::Result<AgentAccount> {
    let mut base = json!({ "agentRef": "reader" });
    if let (Some(base), Some(extra)) = (base.as_object_mut(), spec.as_object()) {
        base.extend(extra.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "AgentAccount",
        "metadata": { "name": name },
        "spec": base,
    }))?)
}

/// A 403 from `policy` whose message says `why`.
fn assert_refused_by(outcome: Result<(), (u16, String)>, policy: &str, why: &str, what: &str) {
    let Err((code, message)) = outcome else {
        panic!("{what} was allowed");
    };
    assert_eq!(code, 403, "{what}: {message}");
    assert!(
        message.contains(policy) && message.contains(why),
        "{what}: expected {policy:?} and {why:?} in: {message}"
    );
}

const SCALEAGENT_POLICY: &str = "scale-agent-scaleagent-privileges";
const AGENTACCOUNT_POLICY: &str = "scale-agent-agentaccount-privileges";

/// Issue 28, F1/F9: a tenant (bob: namespace `edit`-like rights, not in the admin group)
/// tries each escalation the review describes; the API server refuses each with a message
/// that says why and what to do, and the legitimate use (a namespace-scoped read-only agent
/// over its own namespace, with an account there impersonating a ServiceAccount of it) passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_escalate_through_scale_agents_or_agent_accounts() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&admin, "escalation").await?;
    let elsewhere = control_plane.namespace(&admin, "escalation-other").await?;
    may_write_scale_agents(&admin, &namespace).await?;
    install_policy(control_plane)?;
    let bob = acting_as(control_plane, "bob", &[]).await?;
    let alice = acting_as(control_plane, "alice", &[ADMIN_GROUP]).await?;

    // Scope over a namespace bob cannot read (kube-system, another team's).
    let into_kube_system = scale_agent(
        "spy",
        json!({ "scope": { "type": "Namespaces", "namespaces": [namespace, "kube-system", elsewhere] } }),
    )?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let outcome = create(&bob, &namespace, &into_kube_system, false).await?;
        if outcome.is_err() || tokio::time::Instant::now() > deadline {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_refused_by(
        refused,
        SCALEAGENT_POLICY,
        "names kube-system in spec.scope.namespaces, where you may not list Secrets yourself",
        "bob: scope over kube-system",
    );

    // A Secret bob may not read, named for the operator to use (another team's token).
    let foreign_token = scale_agent(
        "deputy",
        json!({
            "scope": { "type": "Namespaces", "namespaces": [namespace] },
            "enrolment": { "tokenSecretRef": { "name": "team-b-enrolment" } },
        }),
    )?;
    assert_refused_by(
        create(&bob, &namespace, &foreign_token, false).await?,
        SCALEAGENT_POLICY,
        "names Secret team-b-enrolment (namespace",
        "bob: another team's enrolment token",
    );

    // The legitimate use: read-only, over its own namespace, with Secrets it may read.
    let reader = scale_agent(
        "reader",
        json!({
            "scope": { "type": "Namespaces", "namespaces": [namespace] },
            "enrolment": { "tokenSecretRef": { "name": "own-enrolment" } },
        }),
    )?;
    assert_eq!(
        create(&bob, &namespace, &reader, true).await?,
        Ok(()),
        "bob: namespace-scoped read-only agent over its own namespace"
    );

    // Dynamic accounts: the agent would load kubeconfig Secrets the hub names (F13).
    let pivot = scale_agent(
        "pivot",
        json!({
            "scope": { "type": "Namespaces", "namespaces": [namespace] },
            "dynamicAccounts": { "enabled": true, "kubeconfigSecrets": ["capi-system/*"] },
        }),
    )?;
    assert_refused_by(
        create(&bob, &namespace, &pivot, false).await?,
        SCALEAGENT_POLICY,
        "sets spec.dynamicAccounts: serving the accounts the hub pushes",
        "bob: dynamic accounts",
    );
    assert_eq!(
        create(&alice, &namespace, &pivot, false).await?,
        Ok(()),
        "alice: dynamic accounts"
    );

    // A privileged agent alice made: bob may not point it elsewhere or re-arm it.
    let prod = scale_agent("prod", json!({ "access": "Deploy" }))?;
    assert_eq!(create(&alice, &namespace, &prod, true).await?, Ok(()));
    let agents = Api::<ScaleAgent>::namespaced(bob.clone(), &namespace);
    let params = PatchParams::default();
    for (field, patch) in [
        (
            "spec.hub",
            json!({ "spec": { "hub": { "address": "evil.example.com:9091" } } }),
        ),
        (
            "spec.clientCertificate",
            json!({ "spec": { "clientCertificate": { "issuerSecretRef": { "name": "own-enrolment" } } } }),
        ),
        (
            "spec.image",
            json!({ "spec": { "image": "ghcr.io/scale-agent/agent:evil" } }),
        ),
        (
            "spec.defaults",
            json!({ "spec": { "defaults": { "kinds": ["*"] } } }),
        ),
    ] {
        match agents.patch("prod", &params, &Patch::Merge(patch)).await {
            Err(kube::Error::Api(status)) => assert_refused_by(
                Err((status.code, status.message)),
                SCALEAGENT_POLICY,
                "changing its spec.hub, spec.enrolment, spec.clientCertificate, spec.image",
                &format!("bob: {field} of a privileged agent"),
            ),
            other => panic!("bob changed {field} of a privileged agent: {other:?}"),
        }
    }
    agents
        .patch(
            "prod",
            &params,
            &Patch::Merge(json!({ "spec": { "replicas": 2 } })),
        )
        .await?;
    Api::<ScaleAgent>::namespaced(alice.clone(), &namespace)
        .patch(
            "prod",
            &params,
            &Patch::Merge(json!({ "spec": { "hub": { "address": "hub-2.example.com:9091" } } })),
        )
        .await?;

    // AgentAccounts: impersonating a controller of kube-system, another team's kubeconfig,
    // every namespace, deployKinds, Secret data through the proxy.
    let cases = [
        (
            json!({ "namespaces": [namespace], "impersonateServiceAccount": { "namespace": "kube-system", "name": "replicaset-controller" } }),
            "names impersonateServiceAccount kube-system/replicaset-controller, which you may not impersonate yourself",
        ),
        (
            json!({ "namespaces": [namespace], "credentials": { "type": "Kubeconfig", "kubeconfigSecretRef": { "name": "team-b-kubeconfig" } } }),
            "names Secret team-b-kubeconfig",
        ),
        (json!({}), "sets no spec.namespaces"),
        (
            json!({ "namespaces": [elsewhere] }),
            &*format!("names {elsewhere} in spec.namespaces, where you may not list Secrets"),
        ),
        (
            json!({ "namespaces": [namespace], "deployKinds": ["ClusterRoleBinding"] }),
            "sets spec.deployKinds",
        ),
        (
            json!({ "namespaces": [namespace], "allowSecretData": true }),
            "sets spec.allowSecretData",
        ),
    ];
    for (spec, why) in cases {
        let account = agent_account("escalate", spec.clone())?;
        assert_refused_by(
            create(&bob, &namespace, &account, false).await?,
            AGENTACCOUNT_POLICY,
            why,
            &format!("bob: AgentAccount {spec}"),
        );
    }
    let own = agent_account(
        "own",
        json!({
            "namespaces": [namespace],
            "impersonateServiceAccount": { "namespace": namespace, "name": "deployer" },
        }),
    )?;
    assert_eq!(
        create(&bob, &namespace, &own, true).await?,
        Ok(()),
        "bob: an account over its own namespace impersonating its own ServiceAccount"
    );
    // With Kubeconfig credentials the kubeconfig's identity impersonates (often in another
    // cluster): a Secret bob may read is all it takes.
    let remote = agent_account(
        "remote",
        json!({
            "namespaces": [namespace],
            "credentials": { "type": "Kubeconfig", "kubeconfigSecretRef": { "name": "own-kubeconfig" } },
            "impersonateServiceAccount": { "namespace": "spinnaker", "name": "deployer" },
        }),
    )?;
    assert_eq!(
        create(&bob, &namespace, &remote, false).await?,
        Ok(()),
        "bob: a kubeconfig account with a Secret it may read"
    );
    let wide = agent_account(
        "wide",
        json!({ "deployKinds": ["Deployment"], "allowSecretData": true }),
    )?;
    assert_eq!(
        create(&alice, &namespace, &wide, false).await?,
        Ok(()),
        "alice, in {ADMIN_GROUP}: every namespace, deployKinds, Secret data"
    );
    Ok(())
}

/// Issue 31 (issue 28's policy, extended): `callers: impersonate` makes the agent impersonate
/// `scale-agent:<user>` and `scale-agent:<group>` for the people an AgentAccount lists, with
/// whatever the cluster's RoleBindings give those names. A tenant (bob) may not turn it on or
/// change whom it names; an admin (alice) may; bob's unrelated edit of alice's account
/// passes, and turning it off (back to `agent`) narrows and passes. The API server's stored
/// object proves a refused change left nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonating_callers_are_reserved_to_the_admin_group() -> anyhow::Result<()> {
    let control_plane = control_plane()?;
    let admin = control_plane.client().await?;
    crds::install(&admin, &crds::read_crds(&crds::manifests_dir())?).await?;
    let namespace = control_plane.namespace(&admin, "callers").await?;
    may_write_scale_agents(&admin, &namespace).await?;
    install_policy(control_plane)?;
    let bob = acting_as(control_plane, "bob", &[]).await?;
    let alice = acting_as(control_plane, "alice", &[ADMIN_GROUP]).await?;

    let people = agent_account(
        "people",
        json!({
            "namespaces": [namespace],
            "callers": "impersonate",
            "callerUsers": ["alice", "bob"],
            "callerGroups": ["team-a"],
        }),
    )?;
    // The API server takes a moment to load a new policy.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let outcome = create(&bob, &namespace, &people, false).await?;
        if outcome.is_err() || tokio::time::Instant::now() > deadline {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_refused_by(
        refused,
        AGENTACCOUNT_POLICY,
        &format!(
            "sets spec.callers: impersonate, which makes the agent impersonate the users and groups of spec.callerUsers and spec.callerGroups (with callerPrefix) in its cluster: reserved to members of group {ADMIN_GROUP}. Remove spec.callers (or set it to agent), or ask a cluster administrator"
        ),
        "bob: callers impersonate",
    );
    // Only the prefix, on an account that impersonates: still the admin's.
    let prefixed = agent_account(
        "prefixed",
        json!({
            "namespaces": [namespace],
            "callers": "impersonate",
            "callerUsers": ["bob"],
            "callerPrefix": "scale-agent-bob:",
        }),
    )?;
    assert_refused_by(
        create(&bob, &namespace, &prefixed, false).await?,
        AGENTACCOUNT_POLICY,
        "sets spec.callers: impersonate",
        "bob: callers impersonate with his own prefix",
    );
    // callerUsers without callers: impersonate impersonates no one.
    let dormant = agent_account(
        "dormant",
        json!({ "namespaces": [namespace], "callerUsers": ["bob"] }),
    )?;
    assert_eq!(
        create(&bob, &namespace, &dormant, false).await?,
        Ok(()),
        "bob: callerUsers with callers agent (the default)"
    );
    assert_eq!(
        create(&alice, &namespace, &people, true).await?,
        Ok(()),
        "alice, in {ADMIN_GROUP}: callers impersonate"
    );

    let accounts = Api::<AgentAccount>::namespaced(bob.clone(), &namespace);
    let params = PatchParams::default();
    accounts
        .patch(
            "people",
            &params,
            &Patch::Merge(json!({
                "metadata": { "labels": { "team": "a" } },
                "spec": { "kinds": ["Deployment", "ConfigMap"] },
            })),
        )
        .await?;
    for (field, patch) in [
        (
            "callerUsers",
            json!({ "spec": { "callerUsers": ["alice", "bob", "mallory"] } }),
        ),
        (
            "callerGroups",
            json!({ "spec": { "callerGroups": ["admins"] } }),
        ),
        (
            "callerPrefix",
            json!({ "spec": { "callerPrefix": "scale-agent-x:" } }),
        ),
    ] {
        match accounts
            .patch("people", &params, &Patch::Merge(patch))
            .await
        {
            Err(kube::Error::Api(status)) => assert_refused_by(
                Err((status.code, status.message)),
                AGENTACCOUNT_POLICY,
                &format!(
                    "changes spec.callerUsers, spec.callerGroups or spec.callerPrefix while spec.callers is impersonate, which changes whom the agent impersonates: reserved to members of group {ADMIN_GROUP}. Leave callerUsers, callerGroups and callerPrefix as they were, or ask a cluster administrator to change them"
                ),
                &format!("bob: {field} of an impersonating account"),
            ),
            other => panic!("bob changed {field} of an impersonating account: {other:?}"),
        }
    }
    // The API server's view: bob's edit landed, his refused changes did not.
    let stored = Api::<AgentAccount>::namespaced(admin.clone(), &namespace)
        .get("people")
        .await?;
    assert_eq!(stored.spec.kinds, ["Deployment", "ConfigMap"]);
    assert_eq!(stored.spec.caller_users, ["alice", "bob"]);
    assert_eq!(stored.spec.caller_groups, ["team-a"]);
    assert_eq!(stored.spec.caller_prefix, None);

    // alice may change whom it names; bob may turn it off (the agent then impersonates no one).
    Api::<AgentAccount>::namespaced(alice.clone(), &namespace)
        .patch(
            "people",
            &params,
            &Patch::Merge(json!({ "spec": { "callerUsers": ["alice", "bob", "carol"] } })),
        )
        .await?;
    accounts
        .patch(
            "people",
            &params,
            &Patch::Merge(json!({ "spec": { "callers": "agent" } })),
        )
        .await?;
    let stored = Api::<AgentAccount>::namespaced(admin.clone(), &namespace)
        .get("people")
        .await?;
    assert_eq!(stored.spec.caller_users, ["alice", "bob", "carol"]);
    assert!(stored.spec.callers.is_agent(), "{stored:?}");
    Ok(())
}
