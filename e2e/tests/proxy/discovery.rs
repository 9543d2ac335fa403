//! Discovery is answered by the hub, not the API server.

use super::*;

/// Discovery requests (`/api`, `/apis`) kubectl sent that the API server received, as the
/// agent's ServiceAccount.
fn discovery_seen_by_the_api_server(user: &str) -> anyhow::Result<usize> {
    Ok(control_plane()?
        .audit_events()?
        .iter()
        .filter(|e| e.user.username == user && e.user_agent.starts_with("kubectl/"))
        .filter(|e| {
            let path = e.request_uri.split('?').next().unwrap_or("");
            path == "/api" || path == "/apis"
        })
        .count())
}

#[tokio::test]
async fn discovery_is_answered_by_the_hub_not_the_api_server() -> anyhow::Result<()> {
    let account = account_name("discovery");
    let setup = Setup::new("discovery", &[&account]).await?;
    let proxied = setup.kubeconfig(&account, "discovery").await?;
    let namespace = control_plane()?
        .namespace(&setup.admin, "discovery")
        .await?;
    let user = {
        // The agent's identity, as the API server names it.
        let text = std::fs::read_to_string(&setup.direct)?;
        let home = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("namespace: "))
            .map(str::to_string);
        match home {
            Some(ns) => format!("system:serviceaccount:{ns}:agent"),
            None => {
                let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    Api::all(setup.admin.clone());
                let sa = accounts
                    .list(&ListParams::default().fields("metadata.name=agent"))
                    .await?
                    .items
                    .into_iter()
                    .find(|sa| {
                        sa.metadata
                            .namespace
                            .as_deref()
                            .is_some_and(|ns| ns.starts_with("proxy-discovery"))
                    })
                    .ok_or_else(|| anyhow::anyhow!("the agent's ServiceAccount is missing"))?;
                format!(
                    "system:serviceaccount:{}:agent",
                    sa.metadata.namespace.unwrap_or_default()
                )
            }
        }
    };
    let list = args(&[
        "get",
        "configmaps",
        "-o",
        "name",
        &format!("--namespace={namespace}"),
    ]);
    // A fresh HOME each time: kubectl's own discovery cache is empty, so every run asks.
    let run = |kubeconfig: PathBuf, i: usize, side: &'static str| {
        let kubectl = Kubectl::new(
            control_plane()
                .map(|c| c.binaries().kubectl())
                .unwrap_or_default(),
            setup.dir.join(format!("home-{side}-{i}")),
        );
        let list = list.clone();
        async move { kubectl.run(&kubeconfig, &list, None, KUBECTL_TIMEOUT).await }
    };

    // Control: straight to the API server, every run reaches it.
    let before = discovery_seen_by_the_api_server(&user)?;
    for i in 0..3 {
        ensure_ok(
            "kubectl direct",
            &run(setup.direct.clone(), i, "direct").await?,
        )?;
    }
    let direct = discovery_seen_by_the_api_server(&user)? - before;
    assert!(
        direct >= 6,
        "three direct runs sent {direct} discovery requests as {user}, not 3 x 2"
    );

    // Through the proxy, the first run fills the hub's cache; the API server sees nothing
    // of the next two.
    let before = discovery_seen_by_the_api_server(&user)?;
    for i in 0..3 {
        ensure_ok(
            "kubectl through the proxy",
            &run(proxied.clone(), i, "proxy").await?,
        )?;
    }
    let proxied_count = discovery_seen_by_the_api_server(&user)? - before;
    assert_eq!(
        proxied_count, 2,
        "three runs through the proxy: the API server should see /api and /apis once"
    );
    let hit = setup
        .hub
        .call("GET", &format!("/clusters/{account}/api"))
        .bearer(&proxy_token(&proxied)?)
        .header(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )
        // What Go's transport adds: the cached document is kept as the server encoded it.
        .header("accept-encoding", "gzip")
        .send()
        .await?;
    assert_eq!(hit.header("x-scale-agent-cache"), Some("hit"));
    setup.stop().await
}
