//! Armory's documented agent configurations (`tests/fixtures/armory/`, copied from the
//! reference) load as Armory's agent reads them; keys Scale Agent refuses stop it with a
//! message naming the key and what to use instead; `scale-agent migrate` turns them into
//! resources. The end-to-end half (the resources applied to a real API server and rendered
//! back by the operator) is `e2e/tests/migrate.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use scale_agent::{Options, migrate};
use scale_agent_testkit::{http, wait};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/armory")
        .join(name)
}

fn load(name: &str) -> scale_agent::config::ParsedConfig {
    let loaded = Options::for_config(fixture(name))
        .load()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!loaded.missing);
    let parsed = loaded.parsed;
    assert!(
        parsed.unknown_keys.is_empty() && parsed.without_effect.is_empty(),
        "{name}: {:?} {:?}",
        parsed.unknown_keys,
        parsed.without_effect
    );
    parsed
}

#[test]
fn the_complete_manifests_config_is_one_service_account_account_over_plaintext() {
    let config = load("complete-manifest.armory-agent.yml").config;
    assert_eq!(config.clouddriver.grpc, "spin-clouddriver-grpc:9091");
    assert!(config.clouddriver.plaintext());
    let [account] = config.kubernetes.accounts.as_slice() else {
        panic!("{:?}", config.kubernetes.accounts)
    };
    assert_eq!(account.name, "agentAccount");
    assert!(account.service_account);
    assert!(account.kubeconfig_file.is_none());
    // Armory's defaults for what the file leaves out.
    assert_eq!(config.tasks.total_budget, 1000);
    assert_eq!(config.tasks.budget_per_account, 50);
    assert_eq!(config.server.port, 8082);
}

#[test]
fn the_mtls_example_is_tls_with_a_client_certificate_and_verification() {
    let config = load("mtls.armory-agent.yml").config;
    assert_eq!(config.clouddriver.grpc, "<host>:443");
    assert!(!config.clouddriver.plaintext());
    assert_eq!(
        config.clouddriver.tls.client_cert_file.as_deref(),
        Some("...")
    );
    assert_eq!(
        config.clouddriver.tls.client_key_file.as_deref(),
        Some("...")
    );
    assert!(config.kubernetes.accounts.is_empty());
}

#[test]
fn the_list_form_of_permissions_gives_read_and_write_roles() {
    let config = load("permissions.armory-agent.yml").config;
    let account = &config.kubernetes.accounts[0];
    assert_eq!(account.name, "my-k8s-account");
    assert_eq!(account.permissions["READ"], ["role1", "role2"]);
    assert_eq!(account.permissions["WRITE"], ["role3", "role4"]);
    assert_eq!(account.permissions.len(), 2);
}

#[test]
fn the_vault_overlay_is_read_and_its_secret_engine_references_are_refused() {
    let err = Options::for_config(fixture("vault/armory-agent.yml"))
        .load()
        .unwrap_err()
        .to_string();
    // Both accounts come from armory-agent-local.yml: the overlay was read.
    for index in [0, 1] {
        assert!(
            err.contains(&format!("kubernetes.accounts[{index}].kubeconfigFile is not supported: secret-engine references (encryptedFile:vault!…, encryptedFile:k8s!…) are not resolved: mount the kubeconfig as a file")),
            "{err}"
        );
    }
    assert!(
        err.contains("secrets.vault.enabled is not supported: Vault references are not resolved"),
        "{err}"
    );
}

/// Every refused key, each alone: the message names it and says what to do instead.
#[test]
fn every_refused_key_names_itself_and_what_to_use_instead() {
    let cases = [
        (
            "certFile: /c.pem\n",
            "certFile",
            "set clouddriver.tls.clientCertFile",
        ),
        (
            "clouddriver:\n  tls:\n    insecureSkipVerify: true\n",
            "clouddriver.tls.insecureSkipVerify",
            "set clouddriver.tls.cacertFile",
        ),
        (
            "clouddriver:\n  tls:\n    clientKeyFilePassword: secret\n",
            "clouddriver.tls.clientKeyFilePassword",
            "openssl pkcs8 -topk8 -nocrypt",
        ),
        (
            "clouddriver:\n  tls:\n    clientKeyPassword: secret\n",
            "clouddriver.tls.clientKeyPassword",
            "point clientKeyFile at it",
        ),
        (
            "clouddriver:\n  auth:\n    tokenCommand:\n      command: aws\n      args: [token]\n",
            "clouddriver.auth.tokenCommand",
            "set clouddriver.auth.tokenFile",
        ),
        (
            "kubernetes:\n  accounts:\n    - name: a\n      kubeconfigFile: /k\n      insecure: true\n",
            "kubernetes.accounts[0].insecure",
            "certificate-authority-data",
        ),
        (
            "kubernetes:\n  accounts:\n    - name: a\n      kubeConfigFile: 'encryptedFile:k8s!n:kubeconfig!k:config!ns:spinnaker'\n",
            "kubernetes.accounts[0].kubeConfigFile",
            "set kubeconfigFile to its path",
        ),
        (
            "server:\n  ssl:\n    enabled: true\n",
            "server.ssl.enabled",
            "terminate TLS in front of it",
        ),
        (
            "secrets:\n  vault:\n    enabled: true\n",
            "secrets.vault.enabled",
            "set kubeconfigFile to their paths",
        ),
        (
            "hub:\n  connection:\n    grpc: x:443\n",
            "hub.connection",
            "set clouddriver.grpc",
        ),
        (
            "hub:\n  auth:\n    armory:\n      clientId: x\n",
            "hub.auth.armory",
            "use clouddriver.auth.tokenFile",
        ),
    ];
    let options = Options::for_config("armory-agent.yml");
    for (yaml, key, hint) in cases {
        let err = options.parse_text(yaml).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{key} is not supported: ")),
            "{key}: {err}"
        );
        assert!(err.contains(hint), "{key}: {err}");
        assert!(
            err.starts_with("the config file armory-agent.yml is not valid"),
            "{err}"
        );
    }
    // The harmless values of the same keys are what Scale Agent does anyway.
    let fine = options
        .parse_text(
            "clouddriver:\n  tls:\n    insecureSkipVerify: false\n    clientKeyFilePassword: ''\nkubernetes:\n  accounts:\n    - name: a\n      insecure: false\n      kubeconfigFile: /kubeconfigfiles/a\nserver:\n  ssl:\n    enabled: false\n",
        )
        .unwrap();
    let warned: Vec<String> = fine
        .without_effect
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        warned,
        ["server.ssl has no effect: TLS on the admin port is not supported; remove the key"]
    );
}

fn agent_binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_scale-agent"));
    for (name, _) in std::env::vars() {
        if name.starts_with("SCALE_AGENT_") {
            command.env_remove(name);
        }
    }
    command
}

#[test]
fn the_agent_does_not_start_on_a_refused_key_and_says_why() {
    let output = agent_binary()
        .arg("--config")
        .arg(fixture("vault/armory-agent.yml"))
        .args(["--admin-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("kubernetes.accounts[0].kubeconfigFile is not supported"),
        "{stderr}"
    );
    assert!(
        stderr.contains("set kubeconfigFile to its path"),
        "{stderr}"
    );
}

#[test]
fn migrate_prints_the_resources_with_a_comment_on_what_has_no_equivalent() {
    let output = agent_binary()
        .arg("migrate")
        .arg(fixture("kubectl/manifests.yaml"))
        .args(["--name", "armory"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        "# Generated by `scale-agent migrate` from ConfigMap armory-agent-config key armory-agent.yml.",
        "#   - image armory/agent-k8s:1.0.44: not carried over; the operator runs the Scale Agent image",
        "#   - tasks: 0 (no limit) is written as the largest limit",
        "#   - ServiceAccount spin-sa: not carried over",
        "#   - name: \"agentAccount\" is not a lowercase DNS label",
        "kind: ScaleAgent",
        "  namespace: spinnaker",
        "  mode: Infrastructure",
        "  replicas: 1",
        "  access: Deploy",
        "      name: kubeconfigs-secret",
        "      key: prod",
        "      context: prod-admin",
        "  - kind: ServiceMonitor",
        "    group: monitoring.coreos.com",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} missing from\n{stdout}"
        );
    }
    assert_eq!(stdout.matches("kind: AgentAccount").count(), 2, "{stdout}");

    let missing = agent_binary()
        .args(["migrate", "/nonexistent/armory-agent.yml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot read Armory file /nonexistent/armory-agent.yml"),
        "{stderr}"
    );
}

#[test]
fn a_migration_renders_back_to_the_same_settings_or_says_what_differs() {
    let input = migrate::read_input(&[fixture("kubectl/manifests.yaml")]).unwrap();
    let options = migrate::MigrateOptions {
        name: "armory".into(),
        namespace: None,
        hub_address: None,
    };
    let migration = migrate::migrate(&input, &options).unwrap();
    let (armory, _) =
        scale_agent_crds::agent_config::AgentConfig::from_value_reporting_unknown(input.config)
            .unwrap();
    // The differences check can fail: a changed kind list is reported.
    let mut changed = armory.clone();
    changed.kubernetes.accounts[0]
        .kinds
        .push("configMap".into());
    let found = migrate::differences(&armory, &changed);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("account agentAccount: "), "{found:?}");
    assert_eq!(migration.accounts.len(), 2);
}

/// A running agent reads the local overlay beside its config and reloads it when it
/// changes: a key with no effect is reported on `/accounts`, and a refused one keeps the
/// previous config and says why. No hub is needed for what the agent reports about its file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_agent_reloads_the_local_overlay_and_reports_its_armory_keys() {
    let dir = std::env::temp_dir().join(format!("scale-agent-overlay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let main = dir.join("armory-agent.yml");
    // No account: nothing needs a cluster; the hub address answers nothing.
    std::fs::write(
        &main,
        "clouddriver:\n  grpc: 127.0.0.1:9\n  insecure: true\n",
    )
    .unwrap();
    let mut options = Options::for_config(&main);
    options.admin_addr = Some("127.0.0.1:0".parse().unwrap());
    let agent = scale_agent::start(options).await.unwrap();
    assert!(agent.view().config.without_effect.is_empty());

    let overlay = dir.join("armory-agent-local.yml");
    write_whole(&overlay, "kubernetes:\n  retries:\n    maxRetries: 5\n").unwrap();
    eventually("the overlay to be applied", || {
        agent.metrics().config_reloads.get() == 1 && !agent.view().config.without_effect.is_empty()
    })
    .await;
    let without_effect = agent.view().config.without_effect;
    assert_eq!(without_effect.len(), 1, "{without_effect:?}");
    assert!(
        without_effect[0].starts_with("kubernetes.retries has no effect: not configurable"),
        "{without_effect:?}"
    );
    let accounts = http::get(agent.admin_addr(), "/accounts")
        .await
        .unwrap()
        .body;
    assert!(
        accounts.contains("\"withoutEffect\":[\"kubernetes.retries has no effect"),
        "{accounts}"
    );

    write_whole(
        &overlay,
        "clouddriver:\n  tls:\n    insecureSkipVerify: true\n",
    )
    .unwrap();
    eventually("the refused overlay to be reported", || {
        agent.view().config.problem.is_some()
    })
    .await;
    let problem = agent.view().config.problem.unwrap_or_default();
    assert!(
        problem.contains("clouddriver.tls.insecureSkipVerify is not supported: the hub's certificate is always verified"),
        "{problem}"
    );
    assert!(problem.contains("keeping the previous config"), "{problem}");
    assert_eq!(agent.metrics().config_reloads.get(), 1);

    agent.stop().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Replaces `path` with `text` in one step (a file beside it, renamed over it), as a
/// ConfigMap volume's update does: the agent polls its files, and a poll between
/// `std::fs::write`'s create and its write would read an empty overlay, a valid config of
/// its own (seen once in CI: a reload that applied nothing).
fn write_whole(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let next = path.with_extension("next");
    std::fs::write(&next, text)?;
    std::fs::rename(&next, path)
}

/// Polls `condition` every 100 ms for up to a minute (generous: CI shares two cores).
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let (timeout, every) = (Duration::from_secs(60), Duration::from_millis(100));
    wait::eventually(what, timeout, every, async || condition()).await;
}
