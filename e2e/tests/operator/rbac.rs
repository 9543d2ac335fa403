//! Test 2: the agent's RBAC is real (the API server's answers) and minimal.

use super::*;

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
