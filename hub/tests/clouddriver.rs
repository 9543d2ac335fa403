//! Tests of the Clouddriver registrar against a contract server, and of its dynamic-config
//! file.
//!
//! THE SERVER IS NOT CLOUDDRIVER: it is a contract written from Clouddriver's source, each
//! rule with where it comes from, in `testkit/src/contract.rs`.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    collections::BTreeMap,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::{
    contract::{HUB, Seen, start_contract, start_tls_contract},
    wait_for,
};
use scale_agent_hub::clouddriver::{
    Backoff, ClouddriverSettings, DesiredAccount, Ledger, MemoryLedger, Registrar,
    RegistrationStatus, body,
};
use scale_agent_testkit::http::Call;
use serde_json::{Map, Value, json};
use tokio::{sync::watch, task::JoinHandle};

const WAIT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------ helpers

fn kubeconfig(account: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: {HUB}/clusters/{account}\n    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\nusers:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: {account}\n  context:\n    cluster: hub\n    user: {account}\ncurrent-context: {account}\n"
    )
}

fn account(name: &str, token: &str, properties: Value) -> DesiredAccount {
    DesiredAccount {
        name: name.into(),
        kubeconfig: kubeconfig(name, token),
        properties,
    }
}

fn two_accounts() -> Vec<DesiredAccount> {
    vec![
        account(
            "prod-eu",
            "tok-prod-eu-1",
            json!({
                "name": "prod-eu",
                "permissions": {"READ": ["dev", "ops"], "WRITE": ["ops"]},
                "namespaces": ["web", "db"],
                "kinds": ["deployments", "Service"],
                "serviceAccount": true,
                "onlyNamespacedResources": true,
            }),
        ),
        account(
            "staging",
            "tok-staging-1",
            json!({"omitNamespaces": ["kube-system"], "omitKinds": ["Event"]}),
        ),
    ]
}

fn settings(api_url: Option<String>, accounts_file: Option<PathBuf>) -> ClouddriverSettings {
    ClouddriverSettings {
        api_url,
        accounts_file,
        account_defaults:
            json!({"kubectlExecutable": "kubectl-1.29", "checkPermissionsOnStartup": false})
                .as_object()
                .cloned()
                .unwrap(),
        request_timeout: Duration::from_secs(2),
        backoff: Backoff {
            initial: Duration::from_millis(50),
            factor: 2,
            max: Duration::from_secs(1),
        },
        rejected_retry: Duration::from_secs(3600),
        ..ClouddriverSettings::default()
    }
}

struct Running {
    registrar: Arc<Registrar>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    fn start(settings: ClouddriverSettings, ledger: Arc<dyn Ledger>) -> Self {
        let registrar = Arc::new(Registrar::new(settings, ledger).unwrap());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(registrar.clone().run(stopped));
        Running {
            registrar,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
    }

    fn status(&self, name: &str) -> RegistrationStatus {
        self.registrar
            .status()
            .into_iter()
            .find(|s| s.account == name)
            .unwrap_or_else(|| panic!("no status for {name}"))
    }

    /// Waits until every account is in sync on every configured target.
    async fn in_sync(&self) {
        wait_for("all accounts in sync", async || {
            self.registrar.status().iter().all(|s| {
                s.api.as_ref().is_none_or(|t| t.in_sync)
                    && s.file.as_ref().is_none_or(|t| t.in_sync)
            })
        })
        .await;
    }
}

fn puts(seen: &[Seen]) -> Vec<&Seen> {
    seen.iter().filter(|s| s.method == "PUT").collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clouddriver-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ------------------------------------------------------------------ the API

#[tokio::test]
async fn an_account_set_registers_with_one_put_each() {
    let (contract, url) = start_contract().await;
    let ledger = Arc::new(MemoryLedger::default());
    let run = Running::start(settings(Some(url), None), ledger.clone());
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;

    let seen = contract.seen();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for s in &seen {
        assert_eq!(
            (s.method, s.path.as_str(), s.status),
            ("PUT", "/credentials", 200)
        );
        assert_eq!(s.refusal, None);
        assert_eq!(s.user, None, "no X-SPINNAKER-USER unless configured");
    }
    let accounts = contract.accounts();
    let prod = &accounts["prod-eu"];
    assert_eq!(prod["type"], "kubernetes");
    assert_eq!(
        prod["permissions"],
        json!({"READ": ["dev", "ops"], "WRITE": ["ops"]})
    );
    assert_eq!(prod["namespaces"], json!(["web", "db"]));
    assert_eq!(prod["kubectlExecutable"], "kubectl-1.29");
    assert_eq!(prod["checkPermissionsOnStartup"], false);
    for absent in [
        "kinds",
        "omitKinds",
        "serviceAccount",
        "onlyNamespacedResources",
    ] {
        assert!(prod.get(absent).is_none(), "{absent} must not be sent");
    }
    assert_eq!(
        accounts["staging"]["omitNamespaces"],
        json!(["kube-system"])
    );

    let recorded = ledger.load().unwrap();
    assert_eq!(recorded.keys().collect::<Vec<_>>(), ["prod-eu", "staging"]);
    let status = run.status("prod-eu");
    let api = status.api.unwrap();
    assert!(status.desired && api.registered && api.in_sync);
    assert_eq!((api.attempts, api.consecutive_failures), (1, 0));
    assert!(api.last_attempt.is_some() && api.last_success.is_some() && api.last_error.is_none());
    assert_eq!(status.file, None);
    assert_eq!(run.registrar.metrics().accounts_registered.get(), 2);
    wait_for("no account pending", async || {
        run.registrar.metrics().accounts_pending.get() == 0
    })
    .await;
    run.stop().await;
}

#[tokio::test]
async fn the_same_set_again_sends_nothing() {
    let (contract, url) = start_contract().await;
    let run = Running::start(settings(Some(url), None), Arc::new(MemoryLedger::default()));
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;
    run.registrar.set_desired(two_accounts());
    run.registrar
        .set_desired(two_accounts().into_iter().rev().collect());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(contract.seen().len(), 2);
    run.stop().await;
}

#[tokio::test]
async fn a_changed_account_is_put_again() {
    let (contract, url) = start_contract().await;
    let run = Running::start(settings(Some(url), None), Arc::new(MemoryLedger::default()));
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;

    // The hub rotated prod-eu's token.
    let mut accounts = two_accounts();
    accounts[0].kubeconfig = kubeconfig("prod-eu", "tok-prod-eu-2");
    run.registrar.set_desired(accounts.clone());
    wait_for("the second PUT", async || contract.seen().len() == 3).await;
    run.in_sync().await;
    let stored = contract.accounts()["prod-eu"]["kubeconfigContents"].clone();
    assert!(stored.as_str().unwrap().contains("tok-prod-eu-2"));

    // New permissions on the agent.
    accounts[1].properties = json!({"permissions": {"READ": ["qa"]}});
    run.registrar.set_desired(accounts);
    wait_for("the third PUT", async || contract.seen().len() == 4).await;
    run.in_sync().await;
    assert_eq!(
        contract.accounts()["staging"]["permissions"],
        json!({"READ": ["qa"]})
    );
    assert!(
        contract.accounts()["staging"]
            .get("omitNamespaces")
            .is_none()
    );
    assert!(contract.seen().iter().all(|s| s.status == 200));
    run.stop().await;
}

#[tokio::test]
async fn a_removed_account_is_deleted_and_forgotten() {
    let (contract, url) = start_contract().await;
    let ledger = Arc::new(MemoryLedger::default());
    let run = Running::start(settings(Some(url), None), ledger.clone());
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;
    run.registrar.set_desired(two_accounts().split_off(1));
    wait_for("the DELETE", async || contract.seen().len() == 3).await;
    run.in_sync().await;

    let last = contract.seen().pop().unwrap();
    assert_eq!(
        (last.method, last.path.as_str()),
        ("DELETE", "/credentials/prod-eu")
    );
    assert_eq!(contract.accounts().keys().collect::<Vec<_>>(), ["staging"]);
    assert_eq!(
        ledger.load().unwrap().keys().collect::<Vec<_>>(),
        ["staging"]
    );
    assert!(
        run.registrar
            .status()
            .iter()
            .all(|s| s.account != "prod-eu")
    );
    assert_eq!(run.registrar.metrics().accounts_registered.get(), 1);
    run.stop().await;
}

#[tokio::test]
async fn failures_are_retried_with_backoff_until_they_succeed() {
    let (contract, url) = start_contract().await;
    contract.drops.store(1, Ordering::SeqCst);
    contract.state().faults.extend([500, 503, 429]);
    let run = Running::start(settings(Some(url), None), Arc::new(MemoryLedger::default()));
    let started = Instant::now();
    run.registrar
        .set_desired(vec![account("prod-eu", "tok-1", json!({}))]);
    run.in_sync().await;

    assert_eq!(contract.dropped.load(Ordering::SeqCst), 1);
    let seen = contract.seen();
    let statuses: Vec<u16> = seen.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [500, 503, 429, 200]);
    // Backoff 50 ms × 2^n, ±20%: after the drop ~50 ms, then ~100, ~200, ~400 ms.
    let first = seen[0].at.duration_since(started);
    assert!(first >= Duration::from_millis(40), "{first:?}");
    let gaps: Vec<Duration> = seen
        .windows(2)
        .map(|w| w[1].at.duration_since(w[0].at))
        .collect();
    for (gap, expected) in gaps.iter().zip([100u64, 200, 400]) {
        assert!(
            *gap >= Duration::from_millis(expected * 8 / 10 - 5),
            "gap {gap:?} shorter than ~{expected} ms: {gaps:?}"
        );
    }
    let api = run.status("prod-eu").api.unwrap();
    assert_eq!((api.attempts, api.consecutive_failures), (5, 0));
    assert!(api.last_error.is_none());

    let metrics = run.registrar.metrics();
    let count = |result| {
        metrics
            .requests
            .get_or_create(&[("method", "PUT"), ("result", result)])
            .get()
    };
    assert_eq!(
        (
            count("unreachable"),
            count("retry"),
            count("success"),
            count("rejected")
        ),
        (1, 3, 1, 0)
    );
    run.stop().await;
}

#[tokio::test]
async fn a_restart_deletes_what_the_ledger_still_has() {
    let (contract, url) = start_contract().await;
    let settings = settings(Some(url), None);
    let keep = account("keep", "tok-keep", json!({"namespaces": ["a"]}));
    let keep_hash = body::body_hash(&body::api_body(&keep, &settings.account_defaults).unwrap());
    // As a previous run of the hub left it: "keep" registered as it still is, "gone" no
    // longer wanted.
    let ledger = Arc::new(MemoryLedger::with_entries(BTreeMap::from([
        ("gone".to_string(), "0123".to_string()),
        ("keep".to_string(), keep_hash),
    ])));
    let run = Running::start(settings, ledger.clone());
    run.registrar.set_desired(vec![keep]);
    run.in_sync().await;

    let seen = contract.seen();
    assert_eq!(seen.len(), 1, "only the DELETE: {seen:#?}");
    assert_eq!(
        (seen[0].method, seen[0].path.as_str()),
        ("DELETE", "/credentials/gone")
    );
    assert_eq!(ledger.load().unwrap().keys().collect::<Vec<_>>(), ["keep"]);
    run.stop().await;
}

#[tokio::test]
async fn a_refused_account_is_reported_retried_slowly_and_at_once_when_changed() {
    let (contract, url) = start_contract().await;
    contract.state().locked_out.push("locked".into());
    let run = Running::start(settings(Some(url), None), Arc::new(MemoryLedger::default()));
    let mut accounts = vec![
        account(
            "locked",
            "tok-l",
            json!({"permissions": {"WRITE": ["nobody"]}}),
        ),
        account("fine", "tok-f", json!({})),
    ];
    run.registrar.set_desired(accounts.clone());
    wait_for("the refusal", async || {
        run.status("locked").api.unwrap().last_error.is_some()
    })
    .await;
    wait_for("fine", async || run.status("fine").api.unwrap().in_sync).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let api = run.status("locked").api.unwrap();
    let error = api.last_error.unwrap();
    assert!(
        error.contains("Cannot save account without granting permissions"),
        "{error}"
    );
    assert!(error.contains("--clouddriver-user"), "the hint: {error}");
    assert!(!error.contains("tok-l"), "no secret in {error}");
    assert_eq!(
        (api.attempts, api.registered, api.in_sync),
        (1, false, false)
    );
    assert_eq!(run.registrar.metrics().accounts_pending.get(), 1);

    // Fixed on the agent: sent at once, without waiting for the slow retry.
    contract.state().locked_out.clear();
    accounts[0].properties = json!({"permissions": {"WRITE": ["ops"]}});
    run.registrar.set_desired(accounts);
    run.in_sync().await;
    assert_eq!(puts(&contract.seen()).len(), 3);
    run.stop().await;
}

#[tokio::test]
async fn the_spinnaker_user_header_is_sent() {
    let (contract, url) = start_contract().await;
    let mut settings = settings(Some(url), None);
    settings.user = Some("scale-agent-hub".into());
    let run = Running::start(settings, Arc::new(MemoryLedger::default()));
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;
    run.registrar.set_desired(Vec::new());
    run.in_sync().await;
    let seen = contract.seen();
    assert_eq!(seen.len(), 4);
    assert!(
        seen.iter()
            .all(|s| s.user.as_deref() == Some("scale-agent-hub")),
        "{seen:#?}"
    );
    run.stop().await;
}

#[tokio::test]
async fn https_with_a_ca_file() {
    let (contract, url, ca_pem) = start_tls_contract().await;
    let dir = temp_dir("https");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();

    // Without the CA, the certificate is unknown: retried, never registered.
    let run = Running::start(
        settings(Some(url.clone()), None),
        Arc::new(MemoryLedger::default()),
    );
    run.registrar.set_desired(two_accounts());
    wait_for("a TLS failure", async || {
        run.status("staging").api.unwrap().last_error.is_some()
    })
    .await;
    let error = run.status("staging").api.unwrap().last_error.unwrap();
    assert!(error.contains("cannot reach Clouddriver"), "{error}");
    assert!(contract.seen().is_empty());
    run.stop().await;

    let mut with_ca = settings(Some(url), None);
    with_ca.ca_file = Some(ca_file);
    let run = Running::start(with_ca, Arc::new(MemoryLedger::default()));
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;
    assert_eq!(contract.seen().len(), 2);
    run.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn bad_settings_fail_at_start() {
    let cases = [
        (Some("spin-clouddriver:7002".to_string()), json!({})),
        (
            Some("http://cd:7002".to_string()),
            json!({"serviceAccount": true}),
        ),
        (
            Some("http://cd:7002".to_string()),
            json!({"cacheIntervalSecs": 30}),
        ),
    ];
    for (api_url, defaults) in cases {
        let settings = ClouddriverSettings {
            api_url,
            account_defaults: defaults.as_object().cloned().unwrap(),
            ..ClouddriverSettings::default()
        };
        assert!(Registrar::new(settings, Arc::new(MemoryLedger::default())).is_err());
    }
    let settings = ClouddriverSettings {
        api_url: Some("https://cd:7002".into()),
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..ClouddriverSettings::default()
    };
    let err = Registrar::new(settings, Arc::new(MemoryLedger::default()))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("cannot read"), "{err}");

    let dir = temp_dir("defaults");
    let path = dir.join("defaults.yml");
    std::fs::write(
        &path,
        "kubectlExecutable: kubectl-1.29\ncacheIntervalSeconds: 60\n",
    )
    .unwrap();
    let defaults = scale_agent_hub::clouddriver::load_account_defaults(&path).unwrap();
    assert_eq!(defaults["cacheIntervalSeconds"], 60);
    std::fs::write(&path, "kubeconfigFile: /etc/kube\n").unwrap();
    assert!(scale_agent_hub::clouddriver::load_account_defaults(&path).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The contract has teeth: bodies Clouddriver would refuse are refused.
#[tokio::test]
async fn the_contract_refuses_what_clouddriver_would() {
    let (contract, url) = start_contract().await;
    let good = body::api_body(&account("prod-eu", "tok", json!({})), &Map::new()).unwrap();
    let send = |body: String, content_type: &'static str| {
        let mut call =
            Call::new("PUT", format!("{url}/credentials")).header("content-type", content_type);
        call.body = Some(body.into_bytes());
        async move {
            let response = call.send().await.unwrap();
            (response.status, response.json_or_null())
        }
    };
    let with = |f: &dyn Fn(&mut Map<String, Value>)| {
        let mut b = good.clone();
        f(&mut b);
        Value::Object(b).to_string()
    };
    let cases: Vec<(String, &str, u16)> = vec![
        (with(&|_| {}), "application/json", 200),
        (with(&|_| {}), "text/plain", 415),
        (
            with(&|b| {
                b.remove("type");
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("type".into(), json!("aws"));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("kind".into(), json!("x"));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("cacheThreads".into(), json!("2"));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("permissions".into(), json!({"ADMIN": ["x"]}));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("namespaces".into(), json!(["a"]));
                b.insert("omitNamespaces".into(), json!(["b"]));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("kinds".into(), json!(["pod"]));
                b.insert("omitKinds".into(), json!(["job"]));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("name".into(), json!(""));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert("name".into(), json!("prod.eu"));
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert(
                    "kubeconfigContents".into(),
                    json!(kubeconfig("other", "tok")),
                );
            }),
            "application/json",
            400,
        ),
        (
            with(&|b| {
                b.insert(
                    "kubeconfigContents".into(),
                    json!(kubeconfig("prod-eu", "''")),
                );
            }),
            "application/json",
            400,
        ),
        ("[1]".into(), "application/json", 400),
    ];
    for (i, (body, content_type, expected)) in cases.into_iter().enumerate() {
        let (status, answer) = send(body, content_type).await;
        assert_eq!(status, expected, "case {i}: {answer}");
        if expected != 200 {
            assert!(
                answer["message"].is_string(),
                "case {i}: kork error body {answer}"
            );
        }
    }
    // DELETE of an account that does not exist: 200, like AccountDefinitionService.
    let deleted = Call::new("DELETE", format!("{url}/credentials/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status, 200);
    assert_eq!(contract.accounts().len(), 1);
}

// ------------------------------------------------------------------ the file

fn read_accounts(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: Value = serde_saphyr::from_str(&text).unwrap();
    doc["kubernetes"]["accounts"].as_array().unwrap().clone()
}

#[tokio::test]
async fn the_file_holds_the_same_accounts_and_is_rewritten_only_on_change() {
    let dir = temp_dir("file");
    let path = dir.join("clouddriver-accounts.yml");
    let settings = settings(None, Some(path.clone()));
    let defaults = settings.account_defaults.clone();
    let run = Running::start(settings.clone(), Arc::new(MemoryLedger::default()));
    run.registrar.set_desired(two_accounts());
    run.in_sync().await;

    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# Written by scale-agent-hub"), "{text}");
    assert!(
        text.contains("kubernetes:\n  accounts:\n  - name: prod-eu\n    kubeconfigContents: |\n"),
        "{text}"
    );
    let expected: Vec<Value> = two_accounts()
        .iter()
        .map(|a| Value::Object(body::managed_account(a, &defaults).unwrap()))
        .collect();
    assert_eq!(read_accounts(&path), expected);
    assert_eq!(
        expected[0]["kubeconfigContents"],
        kubeconfig("prod-eu", "tok-prod-eu-1")
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let status = run.status("staging");
    let file = status.file.unwrap();
    assert!(file.registered && file.in_sync && status.api.is_none());

    // Nothing changed: nothing written.
    run.registrar.set_desired(two_accounts());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (again.ino(), again.mtime_nsec()),
        (meta.ino(), meta.mtime_nsec())
    );
    let writes = run
        .registrar
        .metrics()
        .file_writes
        .get_or_create(&[("result", "success")])
        .get();
    assert_eq!(writes, 1);

    // A removal: a new file (a new inode) without the account.
    run.registrar.set_desired(two_accounts().split_off(1));
    wait_for("the rewrite", async || read_accounts(&path).len() == 1).await;
    run.in_sync().await;
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), meta.ino());
    assert!(
        run.registrar
            .status()
            .iter()
            .all(|s| s.account == "staging")
    );
    run.stop().await;

    // A restart with the same accounts keeps the file as it is.
    let before = std::fs::metadata(&path).unwrap();
    let run = Running::start(settings, Arc::new(MemoryLedger::default()));
    run.registrar.set_desired(two_accounts().split_off(1));
    run.in_sync().await;
    let after = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (after.ino(), after.mtime_nsec()),
        (before.ino(), before.mtime_nsec())
    );
    assert_eq!(
        run.registrar
            .metrics()
            .file_writes
            .get_or_create(&[("result", "success")])
            .get(),
        0
    );
    run.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_sees_a_partial_file() {
    let dir = temp_dir("atomic");
    let path = dir.join("accounts.yml");
    let run = Running::start(
        settings(None, Some(path.clone())),
        Arc::new(MemoryLedger::default()),
    );
    // Twenty accounts make a file of some kilobytes: a torn read would show.
    let set = |round: usize| -> Vec<DesiredAccount> {
        (0..20)
            .map(|i| {
                account(
                    &format!("acct-{i:02}"),
                    &format!("tok-{round}-{i}-{}", "x".repeat(200)),
                    json!({"namespaces": ["a", "b"]}),
                )
            })
            .collect()
    };
    run.registrar.set_desired(set(0));
    run.in_sync().await;

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || {
            let (mut reads, mut bad) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match std::fs::read_to_string(&path) {
                    Ok(text) => {
                        reads += 1;
                        let parsed: Result<Value, _> = serde_saphyr::from_str(&text);
                        let ok = parsed.is_ok_and(|doc| {
                            doc["kubernetes"]["accounts"]
                                .as_array()
                                .is_some_and(|a| a.len() == 20)
                        });
                        if !ok {
                            bad.push(text.len());
                        }
                    }
                    Err(_) => bad.push(0),
                }
            }
            (reads, bad)
        })
    };
    let mut inode = std::fs::metadata(&path).unwrap().ino();
    for round in 1..=100 {
        run.registrar.set_desired(set(round));
        let marker = format!("tok-{round}-19-");
        wait_for("the rewrite", async || {
            std::fs::read_to_string(&path).is_ok_and(|t| t.contains(&marker))
        })
        .await;
        // A new file each time (the file system may reuse an older, freed inode number,
        // never the one still in place).
        let now = std::fs::metadata(&path).unwrap().ino();
        assert_ne!(now, inode, "round {round} rewrote the file in place");
        inode = now;
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, bad) = reader.join().unwrap();
    assert!(
        bad.is_empty(),
        "{} torn or unreadable reads out of {reads}",
        bad.len()
    );
    assert!(reads > 100, "the reader ran ({reads} reads)");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, ["accounts.yml"]);
    run.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_two_targets_are_independent() {
    let (contract, url) = start_contract().await;
    contract.state().faults.extend([503; 8]);
    let dir = temp_dir("both");
    let path = dir.join("accounts.yml");
    let run = Running::start(
        settings(Some(url), Some(path.clone())),
        Arc::new(MemoryLedger::default()),
    );
    run.registrar.set_desired(two_accounts());
    // The file is written while Clouddriver's API keeps failing...
    wait_for("the file", async || {
        run.registrar
            .status()
            .iter()
            .all(|s| s.file.as_ref().is_some_and(|f| f.in_sync))
    })
    .await;
    assert_eq!(read_accounts(&path).len(), 2);
    let api = run.status("prod-eu").api.unwrap();
    assert!(!api.registered, "{api:?}");
    // ...and the API catches up when it recovers.
    run.in_sync().await;
    assert_eq!(contract.accounts().len(), 2);
    run.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Replicas sharing a store: a registrar that is not the active one sends nothing, even with
/// no accounts and a ledger full of another replica's registrations (it would DELETE them
/// all); activated, it reads the ledger again and sends nothing unchanged.
#[tokio::test]
async fn an_inactive_registrar_sends_nothing_and_taking_over_resends_nothing_unchanged() {
    let (contract, url) = start_contract().await;
    let ledger = Arc::new(MemoryLedger::default());
    let first = Running::start(settings(Some(url.clone()), None), ledger.clone());
    first.registrar.set_desired(two_accounts());
    first.in_sync().await;
    first.stop().await;
    assert_eq!(contract.seen().len(), 2);

    // The second replica's registrar starts inactive: it knows no accounts yet.
    let registrar = Arc::new(Registrar::new(settings(Some(url), None), ledger.clone()).unwrap());
    registrar.set_active(false);
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(registrar.clone().run(stopped));
    registrar.set_desired(Vec::new());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(contract.seen().len(), 2, "{:?}", contract.seen());
    assert!(!registrar.is_active());

    // It takes over: the accounts first, then active.
    registrar.set_desired(two_accounts());
    registrar.set_active(true);
    let second = Running {
        registrar,
        stop,
        task,
    };
    second.in_sync().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(contract.seen().len(), 2, "{:?}", contract.seen());
    assert_eq!(contract.accounts().len(), 2);
    second.stop().await;
}
