//! Enrolment for hub-issued certificates, the operator-signed opt-in, and the hub's verdict
//! in the status.

use super::*;

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
