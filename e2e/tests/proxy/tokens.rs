//! Tokens are checked for real clients.

use super::*;

/// `scale-agent-hub <args>` (the admin commands) against the test's hub.
async fn hub_cli(hub: &TlsHub, list: &[&str]) -> anyhow::Result<Outcome> {
    let output = tokio::process::Command::new(HUB)
        .args(list)
        .arg(format!("--hub-url={}", hub.url))
        .arg(format!("--ca-file={}", hub.ca_file.display()))
        .arg(format!(
            "--admin-token-file={}",
            hub.admin_token_file.display()
        ))
        .kill_on_drop(true)
        .output()
        .await?;
    Ok(Outcome {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

#[tokio::test]
async fn tokens_are_checked_for_real_clients() -> anyhow::Result<()> {
    let prod = account_name("tok-prod");
    let staging = account_name("tok-staging");
    let setup = Setup::new("tokens", &[&prod, &staging]).await?;
    let kubectl = Kubectl::new(
        control_plane()?.binaries().kubectl(),
        setup.dir.join("home"),
    );
    let get = args(&["get", "namespaces", "-o", "name"]);

    // A kubeconfig from the command line works.
    let file = setup.dir.join("prod-cli.kubeconfig");
    let issued = hub_cli(
        &setup.hub,
        &[
            "kubeconfig",
            "--account",
            &prod,
            "--token-name",
            "alice",
            "-o",
            &file.display().to_string(),
        ],
    )
    .await?;
    ensure_ok("scale-agent-hub kubeconfig", &issued)?;
    ensure_ok(
        "kubectl with the CLI's kubeconfig",
        &kubectl.run(&file, &get, None, KUBECTL_TIMEOUT).await?,
    )?;

    // Another account's token: Forbidden, naming both accounts.
    let text = std::fs::read_to_string(&file)?;
    let other = setup.dir.join("wrong-account.kubeconfig");
    std::fs::write(
        &other,
        text.replace(
            &format!("/clusters/{prod}"),
            &format!("/clusters/{staging}"),
        ),
    )?;
    let refused = kubectl.run(&other, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(
        refused.stderr.contains("(Forbidden)")
            && refused.stderr.contains(&prod)
            && refused.stderr.contains(&staging),
        "{}",
        refused.stderr
    );

    // An account the hub does not know: NotFound.
    let unknown = setup.dir.join("unknown.kubeconfig");
    let issued = hub_cli(
        &setup.hub,
        &[
            "kubeconfig",
            "--account",
            "nobody-here",
            "-o",
            &unknown.display().to_string(),
        ],
    )
    .await?;
    ensure_ok("kubeconfig for an account with no agent", &issued)?;
    let refused = kubectl.run(&unknown, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(refused.stderr.contains("(NotFound)"), "{}", refused.stderr);

    // A wrong token and no token: Unauthorized.
    let wrong = setup.dir.join("wrong-token.kubeconfig");
    let token_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .ok_or_else(|| anyhow::anyhow!("no token in {text}"))?;
    std::fs::write(
        &wrong,
        text.replace(token_line, "    token: sat_not-a-token"),
    )?;
    let refused = kubectl.run(&wrong, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(
        refused
            .stderr
            .contains("You must be logged in to the server"),
        "{}",
        refused.stderr
    );
    // No token: kubectl would prompt for credentials, so ask over HTTP.
    let response = setup
        .hub
        .call("GET", &format!("/clusters/{prod}/api/v1/namespaces"))
        .send()
        .await?;
    assert_eq!(response.status, 401, "{}", response.body);
    assert_eq!(response.json_or_null()["reason"], "Unauthorized");
    assert!(
        response
            .body
            .contains("scale-agent-hub kubeconfig --account"),
        "{}",
        response.body
    );

    // Revoked: the CLI lists the token, revokes it, and kubectl is refused at once.
    let listed = hub_cli(&setup.hub, &["token", "list"]).await?;
    ensure_ok("scale-agent-hub token list", &listed)?;
    let id = listed
        .stdout
        .lines()
        .find(|l| l.contains(&prod) && l.contains("alice"))
        .and_then(|l| l.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("alice's token is not listed:\n{}", listed.stdout))?
        .to_string();
    ensure_ok(
        "scale-agent-hub token revoke",
        &hub_cli(&setup.hub, &["token", "revoke", &id]).await?,
    )?;
    let refused = kubectl.run(&file, &get, None, KUBECTL_TIMEOUT).await?;
    assert!(
        refused
            .stderr
            .contains("You must be logged in to the server"),
        "{}",
        refused.stderr
    );

    // The admin commands need the admin token.
    let forged = setup.dir.join("forged-admin-token");
    std::fs::write(&forged, "sat_forged")?;
    let output = tokio::process::Command::new(HUB)
        .args(["token", "list"])
        .arg(format!("--hub-url={}", setup.hub.url))
        .arg(format!("--ca-file={}", setup.hub.ca_file.display()))
        .arg(format!("--admin-token-file={}", forged.display()))
        .output()
        .await?;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("401") && stderr.contains("not an API token of this hub"),
        "{stderr}"
    );
    setup.stop().await
}
