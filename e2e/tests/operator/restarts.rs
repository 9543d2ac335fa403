//! A restarted operator converges; test 6, the full flow with an agent process and a hub.

use super::*;

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
