//! The operator is not an escalation path.

use super::*;

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
