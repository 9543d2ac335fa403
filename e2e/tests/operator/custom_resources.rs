//! Custom resources get RBAC for what the cluster serves.

use super::*;

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
