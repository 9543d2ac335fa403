//! The examples and the kustomize manifests, with the operator under its own RBAC.

use super::*;

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
