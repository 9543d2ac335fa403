//! Reads while the hub's store is down carry a warning and their age; writes say why not.

use super::*;

/// `GET <path>` through the proxy until `check` holds for the reply, within [`WAIT`].
async fn get_until(
    setup: &Setup,
    path: &str,
    what: &str,
    check: impl Fn(&scale_agent_e2e::http::Response) -> bool,
) -> anyhow::Result<scale_agent_e2e::http::Response> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let reply = setup.get(path, None).await?;
        if check(&reply) {
            return Ok(reply);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: never; last {} {:?} {:?}",
            reply.status,
            reply.header("warning"),
            reply.header("x-scale-agent-cache")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Degraded modes say what they are, as kubectl shows them: while the store cannot commit
/// (a failing commit hook) and then while the account's agent is away (its cache held for
/// the grace period), reads are answered from the cache with a `Warning` header (kubectl
/// prints `Warning: ...`) and `x-scale-agent-cache-age`; writes answer 503 with the reason;
/// `scale_agent_hub_proxy_stale_reads_total` counts them. After the store recovers nothing
/// is lost and the warning is gone.
#[tokio::test]
async fn degraded_reads_carry_a_warning_and_writes_say_why_not() -> anyhow::Result<()> {
    let mut setup = Setup::new("degraded", |_, _, _| async { Ok(()) }).await?;
    let ns = setup.stack.namespace.clone();
    let path = format!("/api/v1/namespaces/{ns}/configmaps");
    let proxy = setup.kubectl("proxy")?;
    let kubectl = |args: &[&str]| {
        let args = args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let proxy = &proxy;
        let proxied = setup.stack.proxied.clone();
        async move { proxy.run(&proxied, &args, None, KUBECTL_TIMEOUT).await }
    };
    let fresh = setup.get(&path, None).await?;
    assert_eq!(fresh.header("x-scale-agent-cache"), Some("hit"));
    assert_eq!(
        fresh.header("warning"),
        None,
        "fresh answers carry no warning"
    );

    // 1. The store cannot commit: the next change the agent streams fails to commit.
    setup
        .stack
        .hub
        .hub
        .set_store_commit_hook(Some(std::sync::Arc::new(|_| {
            Err("injected: the volume is full".to_string())
        })))
        .await;
    let direct = client_for(&setup.stack.direct).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(direct, &ns);
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "during-outage"}}))?,
        )
        .await?;
    let stale = get_until(&setup, &path, "a stale-flagged read", |r| {
        r.header("warning")
            .is_some_and(|w| w.contains("store has not committed"))
    })
    .await?;
    assert_eq!(stale.status, 200);
    assert_eq!(stale.header("x-scale-agent-cache"), Some("hit"));
    assert!(
        stale
            .header("x-scale-agent-cache-age")
            .is_some_and(|a| a.parse::<u64>().is_ok()),
        "{:?}",
        stale.header("x-scale-agent-cache-age")
    );
    // JSON, as Clouddriver asks: a table (a person's plain `get`) is tunnelled, fresh.
    let read = kubectl(&["get", "configmaps", "-n", &ns, "-o", "json"]).await?;
    ensure_ok("kubectl get while the store fails", &read)?;
    assert!(
        read.stderr.contains("Warning:") && read.stderr.contains("store has not committed"),
        "kubectl prints the warning: {}",
        read.stderr
    );
    assert!(read.stderr.contains("volume is full"), "{}", read.stderr);
    let write = kubectl(&["create", "configmap", "refused-store", "-n", &ns]).await?;
    assert!(!write.success(), "a write while the store fails: {write:?}");
    assert!(
        write
            .messages()
            .contains("writes are refused until the store commits again"),
        "{}",
        write.messages()
    );

    // The account's state says the same.
    let account_path = format!("/api/v1/accounts/{}", setup.stack.account);
    let view = setup
        .stack
        .hub
        .api("GET", &account_path)
        .send()
        .await?
        .json_or_null();
    assert!(
        view["cacheStale"]
            .as_str()
            .is_some_and(|s| s.contains("volume is full")),
        "{view}"
    );

    // The store recovers: nothing lost, no warning.
    setup.stack.hub.hub.set_store_commit_hook(None).await;
    let recovered = get_until(
        &setup,
        &path,
        "a fresh read after the store recovered",
        |r| r.header("warning").is_none() && r.body.contains("during-outage"),
    )
    .await?;
    assert_eq!(recovered.header("x-scale-agent-cache-age"), None);
    let view = setup
        .stack
        .hub
        .api("GET", &account_path)
        .send()
        .await?
        .json_or_null();
    assert_eq!(view["cacheStale"], Value::Null, "{view}");

    // 2. The agent goes away: reads from the held cache, flagged; writes 503.
    if let Some(agent) = setup.stack.agent.take() {
        agent.stop().await?;
    }
    let away = get_until(
        &setup,
        &path,
        "a read flagged as the agent being away",
        |r| {
            r.header("warning")
                .is_some_and(|w| w.contains("no agent of account"))
        },
    )
    .await?;
    assert_eq!(away.status, 200, "not 503 within the grace period");
    assert!(away.body.contains("during-outage"), "{}", away.body);
    let read = kubectl(&["get", "configmaps", "-n", &ns, "-o", "json"]).await?;
    ensure_ok("kubectl get with the agent away", &read)?;
    assert!(read.stdout.contains("\"during-outage\""), "{}", read.stdout);
    assert!(
        read.stderr.contains("Warning:") && read.stderr.contains("no agent of account"),
        "kubectl prints the warning: {}",
        read.stderr
    );
    let write = kubectl(&["create", "configmap", "refused-away", "-n", &ns]).await?;
    assert!(!write.success(), "a write with the agent away: {write:?}");
    assert!(
        write.messages().contains("writes need a connected agent"),
        "{}",
        write.messages()
    );

    let metrics = setup.stack.hub.api("GET", "/metrics").send().await?.body;
    for line in [
        "scale_agent_hub_proxy_stale_reads_total{reason=\"store_failing\"}",
        "scale_agent_hub_proxy_stale_reads_total{reason=\"agent_away\"}",
        "scale_agent_hub_proxy_refused_writes_total{reason=\"store_failing\"}",
        "scale_agent_hub_proxy_refused_writes_total{reason=\"agent_away\"}",
    ] {
        assert!(metrics.contains(line), "{line} missing in {metrics}");
    }
    setup.stop().await
}
