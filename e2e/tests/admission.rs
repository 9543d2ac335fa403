//! The admission policy shipped in `manifests/policy` on the real API server: ScaleAgents
//! with `scope.type: Cluster` or `access: Deploy` only for members of `scale-agent-admins`.
//! The users are impersonated by the admin client; RBAC lets both create ScaleAgents in the
//! test's namespace, so every refusal here is the policy's.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use scale_agent_crds::ScaleAgent;
use scale_agent_e2e::{ControlPlane, ControlPlaneOptions, crds};
use serde_json::{Value, json};

const ADMIN_GROUP: &str = "scale-agent-admins";

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
async fn create(
    client: &Client,
    namespace: &str,
    agent: &ScaleAgent,
    keep: bool,
) -> anyhow::Result<Result<(), (u16, String)>> {
    let params = PostParams {
        dry_run: !keep,
        ..Default::default()
    };
    match Api::<ScaleAgent>::namespaced(client.clone(), namespace)
        .create(&params, agent)
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => Ok(Err((status.code, status.message))),
        Err(other) => Err(other.into()),
    }
}

/// Lets users `alice` and `bob` create, get and patch ScaleAgents in `namespace`.
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
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["scaleagent.dev".into()]),
                    resources: Some(vec!["scaleagents".into()]),
                    verbs: vec!["create".into(), "get".into(), "patch".into()],
                    ..Default::default()
                }]),
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
