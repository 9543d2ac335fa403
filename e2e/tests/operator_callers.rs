//! The operator's grant for `callers: impersonate` (issue 31), against a real control plane
//! with RBAC: the agent's ServiceAccount may impersonate exactly the prefixed users and
//! groups its AgentAccount admits, asked of the API server (SubjectAccessReview), not of the
//! operator; every user name (and still exactly the listed groups) once the account admits
//! by `callerGroups`; nothing once the account goes back to `callers: agent`. The CRD itself
//! refuses `callers: impersonate` without `callerUsers` or `callerGroups`, and a prefix that
//! could name the cluster's own groups.

use k8s_openapi::api::{authorization::v1::ResourceAttributes, rbac::v1::ClusterRole};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use scale_agent_crds::{AgentAccount, ScaleAgent};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    operator::{self, Operator},
    wait::wait_for,
};
use serde_json::json;

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(ControlPlaneOptions::default)?)
}

/// Whether ServiceAccount `namespace/name` may impersonate `resource` (`users` or `groups`)
/// named `target`: cluster-wide, as the API server checks impersonation.
async fn may_impersonate(
    admin: &Client,
    service_account: (&str, &str),
    resource: &str,
    target: &str,
) -> anyhow::Result<bool> {
    let attributes = ResourceAttributes {
        verb: Some("impersonate".into()),
        resource: Some(resource.into()),
        name: Some(target.into()),
        ..Default::default()
    };
    operator::service_account_may(admin, service_account, attributes).await
}

fn account(name: &str, spec: serde_json::Value) -> anyhow::Result<AgentAccount> {
    let mut full = json!({ "agentRef": "prod", "kinds": ["ConfigMap"] });
    for (key, value) in spec.as_object().into_iter().flatten() {
        full[key] = value.clone();
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "AgentAccount",
        "metadata": { "name": name },
        "spec": full,
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_may_impersonate_exactly_the_people_its_account_admits() -> anyhow::Result<()> {
    scale_agent_e2e::fixtures::init_logs("error");
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let ns = control_plane.namespace(&client, "callers-grant").await?;
    let post = PostParams::default();
    let agent: ScaleAgent = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": "prod" },
        "spec": {
            "hub": { "address": "hub.spinnaker.example.com:9091", "tls": { "insecurePlaintext": true } },
            "scope": { "type": "Namespaces", "namespaces": [ns] },
        },
    }))?;
    Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .create(&post, &agent)
        .await?;
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), &ns);

    // The CRD refuses what would grant too little to work or too much to be safe.
    let no_users = accounts
        .create(
            &post,
            &account("no-users", json!({ "callers": "impersonate" }))?,
        )
        .await;
    let message = format!("{no_users:?}");
    assert!(
        no_users.is_err() && message.contains("callerUsers or callerGroups"),
        "{message}"
    );
    let masters = accounts
        .create(
            &post,
            &account(
                "masters",
                json!({ "callers": "impersonate", "callerPrefix": "system:", "callerUsers": ["x"], "callerGroups": ["masters"] }),
            )?,
        )
        .await;
    let message = format!("{masters:?}");
    assert!(
        masters.is_err() && message.contains("callerPrefix"),
        "{message}"
    );

    accounts
        .create(
            &post,
            &account(
                "people",
                json!({ "callers": "impersonate", "callerUsers": ["alice"] }),
            )?,
        )
        .await?;
    let operator = Operator::start(client.clone(), Operator::config(&ns));
    let role_name = format!("scale-agent:{ns}:prod:callers");
    let cluster_roles = Api::<ClusterRole>::all(client.clone());
    let role = wait_for("the callers ClusterRole", || async {
        Ok(cluster_roles.get_opt(&role_name).await?)
    })
    .await?;
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1, "{rules:?}");
    for rule in &rules {
        assert_eq!(rule.verbs, ["impersonate"], "{rule:?}");
    }

    let agent_sa = (ns.as_str(), "prod-agent");
    wait_for("the agent may impersonate scale-agent:alice", || async {
        Ok(
            may_impersonate(&client, agent_sa, "users", "scale-agent:alice")
                .await?
                .then_some(()),
        )
    })
    .await?;
    for (resource, target, expected) in [
        ("users", "scale-agent:alice", true),
        ("users", "scale-agent:bob", false),
        ("users", "alice", false),
        ("groups", "scale-agent:team-a", false),
        ("groups", "system:masters", false),
        ("serviceaccounts", "default", false),
    ] {
        assert_eq!(
            may_impersonate(&client, agent_sa, resource, target).await?,
            expected,
            "impersonate {resource}/{target}"
        );
    }

    // Admitting team-a's members: the group, and every user name (the members' names are
    // not known in advance; RBAC has no prefixes), never another group.
    accounts
        .patch(
            "people",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "callerGroups": ["team-a"] } })),
        )
        .await?;
    wait_for(
        "the agent may impersonate group scale-agent:team-a",
        || async {
            Ok(
                may_impersonate(&client, agent_sa, "groups", "scale-agent:team-a")
                    .await?
                    .then_some(()),
            )
        },
    )
    .await?;
    for (resource, target, expected) in [
        ("users", "scale-agent:carol", true),
        ("groups", "team-a", false),
        ("groups", "system:masters", false),
        ("serviceaccounts", "default", false),
    ] {
        assert_eq!(
            may_impersonate(&client, agent_sa, resource, target).await?,
            expected,
            "impersonate {resource}/{target} with callerGroups"
        );
    }

    // Back to `callers: agent`: the grant goes.
    accounts
        .patch(
            "people",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "callers": "agent" } })),
        )
        .await?;
    wait_for("the callers ClusterRole gone", || async {
        Ok(cluster_roles
            .get_opt(&role_name)
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    assert!(!may_impersonate(&client, agent_sa, "users", "scale-agent:alice").await?);
    operator.stop().await
}
