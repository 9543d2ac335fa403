//! The operator's own allow list (issue 28, F1), against a real control plane with RBAC and
//! without the admission policies (the operator's limit must hold whatever admission let
//! through): a ScaleAgent whose `spec.scope.namespaces` names kube-system, the operator's own
//! namespace and a namespace nobody listed gets Roles only in its own namespace and the
//! listed one, and says why in its status and a Warning Event; an AgentAccount that names a
//! kube-system controller to impersonate is not accepted and gets no Role. The agent's
//! ServiceAccount is asked of the API server (SubjectAccessReview), not of the operator.

use k8s_openapi::api::{authorization::v1::ResourceAttributes, rbac::v1::Role};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use scale_agent_crds::{
    AgentAccount, ScaleAgent,
    conditions::{ACCEPTED, DEGRADED, find_condition},
};
use scale_agent_e2e::{
    ControlPlane, ControlPlaneOptions, crds,
    operator::{self, Operator, wait_for_event},
    wait::wait_for,
};
use scale_agent_operator::policy::Grants;
use serde_json::json;

fn control_plane() -> anyhow::Result<&'static ControlPlane> {
    Ok(ControlPlane::shared_with(ControlPlaneOptions::default)?)
}

/// Whether the API server lets ServiceAccount `namespace/name` do `verb` on `resource`
/// (named `resource_name`, if any) in `in_namespace`.
async fn service_account_may(
    admin: &Client,
    service_account: (&str, &str),
    verb: &str,
    resource: &str,
    in_namespace: &str,
    resource_name: Option<&str>,
) -> anyhow::Result<bool> {
    let attributes = ResourceAttributes {
        namespace: Some(in_namespace.into()),
        verb: Some(verb.into()),
        resource: Some(resource.into()),
        name: resource_name.map(str::to_owned),
        ..Default::default()
    };
    operator::service_account_may(admin, service_account, attributes).await
}

/// The operator's Roles for ScaleAgent `ns/prod` in `namespace`.
async fn roles_in(client: &Client, namespace: &str, ns: &str) -> anyhow::Result<Vec<String>> {
    let roles = Api::<Role>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(roles
        .items
        .into_iter()
        .filter_map(|r| r.metadata.name)
        .filter(|n| n.starts_with(&format!("scale-agent:{ns}:prod")))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_and_impersonation_stay_inside_the_operator_allow_list() -> anyhow::Result<()> {
    scale_agent_e2e::fixtures::init_logs("error");
    let control_plane = control_plane()?;
    let client = control_plane.client().await?;
    crds::install(&client, &crds::read_crds(&crds::manifests_dir())?).await?;
    let ns = control_plane.namespace(&client, "grants").await?;
    let listed = control_plane.namespace(&client, "grants-listed").await?;
    let unlisted = control_plane.namespace(&client, "grants-unlisted").await?;
    // Stands for the operator's own namespace (the command takes its pod's).
    let operator_ns = control_plane.namespace(&client, "grants-operator").await?;

    let post = PostParams::default();
    let agent: ScaleAgent = serde_json::from_value(json!({
        "apiVersion": "scaleagent.dev/v1alpha1",
        "kind": "ScaleAgent",
        "metadata": { "name": "prod" },
        "spec": {
            // No certificate to plan: the only problem is the one under test.
            "hub": { "address": "hub.spinnaker.example.com:9091", "tls": { "insecurePlaintext": true } },
            "scope": { "type": "Namespaces", "namespaces": [ns, listed, unlisted, "kube-system", operator_ns] },
        },
    }))?;
    Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .create(&post, &agent)
        .await?;
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), &ns);
    // Both accounts read ConfigMaps in the own and the listed namespace.
    let account = |name: &str, target_ns: &str, target: &str| -> anyhow::Result<AgentAccount> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "scaleagent.dev/v1alpha1",
            "kind": "AgentAccount",
            "metadata": { "name": name },
            "spec": {
                "agentRef": "prod",
                "accountName": format!("{ns}-{name}"),
                "namespaces": [ns, listed],
                "kinds": ["ConfigMap"],
                "impersonateServiceAccount": { "namespace": target_ns, "name": target },
            },
        }))?)
    };
    accounts
        .create(
            &post,
            &account("pivot", "kube-system", "replicaset-controller")?,
        )
        .await?;
    accounts
        .create(&post, &account("own", &ns, "deployer")?)
        .await?;

    let config = scale_agent_operator::Config {
        grants: Grants::parse(
            std::slice::from_ref(&listed),
            &[],
            Some(operator_ns.clone()),
        )
        .map_err(anyhow::Error::msg)?,
        ..Operator::config(&ns)
    };
    let operator = Operator::start(client.clone(), config);

    // The refusal, in the status and an Event, says what to change.
    let agents = Api::<ScaleAgent>::namespaced(client.clone(), &ns);
    let degraded = wait_for("ScaleAgent Degraded with NamespaceNotGrantable", || async {
        let agent = agents.get("prod").await?;
        Ok(agent
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, DEGRADED))
            .filter(|c| c.reason == "NamespaceNotGrantable")
            .cloned())
    })
    .await?;
    for part in [
        // Sorted: grants-operator-…, grants-unlisted-…, kube-system.
        format!("spec.scope.namespaces names {operator_ns}, {unlisted}, kube-system,"),
        format!("the operator's namespace {operator_ns}"),
        "--grantable-namespaces".to_owned(),
    ] {
        assert!(
            degraded.message.contains(&part),
            "{part:?} missing: {}",
            degraded.message
        );
    }
    let event = wait_for_event(&client, &ns, "NamespaceNotGrantable", "ScaleAgent", "prod").await?;
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    let pivot = wait_for("AgentAccount pivot refused", || async {
        let account = accounts.get("pivot").await?;
        Ok(account
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, ACCEPTED))
            .filter(|c| c.status == "False")
            .cloned())
    })
    .await?;
    assert_eq!(pivot.reason, "ImpersonationNotAllowed", "{}", pivot.message);
    assert!(
        pivot
            .message
            .contains("names kube-system/replicaset-controller")
            && pivot.message.contains("--impersonable-service-accounts"),
        "{}",
        pivot.message
    );

    // The legitimate grants: its own namespace, the listed one, its own ServiceAccount.
    wait_for("Roles in the own and the listed namespace", || async {
        let own = roles_in(&client, &ns, &ns).await?;
        let there = roles_in(&client, &listed, &ns).await?;
        Ok((own.iter().any(|r| r.ends_with(":impersonate")) && !there.is_empty()).then_some(()))
    })
    .await?;
    for namespace in [&unlisted, "kube-system", &operator_ns] {
        assert!(
            roles_in(&client, namespace, &ns).await?.is_empty(),
            "a Role in {namespace}"
        );
    }

    // From the API server's side, for the agent's ServiceAccount.
    let agent_sa = (ns.as_str(), "prod-agent");
    for (namespace, expected) in [
        (ns.as_str(), true),
        (listed.as_str(), true),
        (unlisted.as_str(), false),
        ("kube-system", false),
        (operator_ns.as_str(), false),
    ] {
        assert_eq!(
            service_account_may(&client, agent_sa, "list", "configmaps", namespace, None).await?,
            expected,
            "agent lists ConfigMaps in {namespace}"
        );
    }
    assert!(
        !service_account_may(
            &client,
            agent_sa,
            "impersonate",
            "serviceaccounts",
            "kube-system",
            Some("replicaset-controller"),
        )
        .await?,
        "the agent may impersonate a kube-system controller"
    );
    assert!(
        service_account_may(
            &client,
            agent_sa,
            "impersonate",
            "serviceaccounts",
            &ns,
            Some("deployer"),
        )
        .await?,
        "the agent may not impersonate its own namespace's deployer"
    );
    operator.stop().await
}
