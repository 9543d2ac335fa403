//! TLS from the hub to a real PostgreSQL with `ssl=on` and a certificate made by
//! `scale_agent_e2e::pki`: libpq's `sslmode` and `sslrootcert` (or `--postgres-ca`) on the
//! store's connections and on account ownership's, checked from the server's side
//! (`pg_stat_ssl`), and the refusals with what to change and no password.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use scale_agent_e2e::postgres::{PostgresServer, ServerTls};
use scale_agent_hub::{
    owners::{Ownership, ReplicaIdentity, postgres::PostgresOwnership},
    store::{PostgresOptions, Store, StoreOp},
};

/// `url` with a query added.
fn with(url: &str, query: &str) -> String {
    format!("{url}?{query}")
}

/// The hub's sessions as the server sees them: application name, TLS or not, TLS version.
async fn hub_sessions(server: &PostgresServer) -> Vec<(String, bool, Option<String>)> {
    let sql = server.connect_to(&server.superuser_url()).await.unwrap();
    sql.query(
        "SELECT a.application_name, s.ssl, s.version FROM pg_stat_ssl s \
         JOIN pg_stat_activity a ON a.pid = s.pid \
         WHERE a.application_name LIKE 'scale-agent-hub%' ORDER BY 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|row| (row.get(0), row.get(1), row.get(2)))
    .collect()
}

fn password_of(url: &str) -> String {
    let userinfo = url
        .trim_start_matches("postgres://")
        .split('@')
        .next()
        .unwrap();
    userinfo.split(':').nth(1).unwrap().to_string()
}

fn replica(id: &str) -> ReplicaIdentity {
    ReplicaIdentity {
        id: id.into(),
        address: format!("http://{id}.invalid:8080"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_right_ca_encrypts_every_connection_of_the_hub() {
    let server = PostgresServer::start_with_tls(ServerTls::new(true).unwrap())
        .await
        .unwrap();
    let ca = server.ca_file().unwrap();
    // The CA in the URL, as libpq takes it.
    let url = with(
        &server.url(),
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    let mut store = Store::open_postgres(&PostgresOptions::new(&url))
        .await
        .unwrap();
    store
        .commit(vec![StoreOp::PutMeta {
            key: "tls-test".into(),
            value: "written over TLS".into(),
        }])
        .await
        .unwrap();
    assert_eq!(
        store
            .load()
            .await
            .unwrap()
            .meta
            .get("tls-test")
            .map(String::as_str),
        Some("written over TLS")
    );
    // The CA by flag (--postgres-ca), for ownership's dedicated connection.
    let options = PostgresOptions {
        url: with(&server.url(), "sslmode=verify-full"),
        ca_file: Some(ca.clone()),
    };
    let ownership = PostgresOwnership::connect(&options, replica("hub-a"))
        .await
        .unwrap();
    ownership.try_acquire("prod").await.unwrap();

    let sessions = hub_sessions(&server).await;
    let names: Vec<&str> = sessions.iter().map(|(n, _, _)| n.as_str()).collect();
    assert!(names.contains(&"scale-agent-hub"), "{sessions:?}");
    assert!(
        names.contains(&"scale-agent-hub hub-a ownership"),
        "{sessions:?}"
    );
    for (name, ssl, version) in &sessions {
        assert!(ssl, "{name} is not encrypted: {sessions:?}");
        assert!(
            version.as_deref().is_some_and(|v| v.starts_with("TLSv1.")),
            "{name}: {version:?}"
        );
    }
    ownership.close().await;
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_with_what_to_change() {
    let server = PostgresServer::start_with_tls(ServerTls::new(true).unwrap())
        .await
        .unwrap();
    let dir = std::env::temp_dir().join(format!("pg-tls-wrong-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other = scale_agent_e2e::pki::CertificateAuthority::new("another-ca").unwrap();
    let wrong = dir.join("other-ca.pem");
    std::fs::write(&wrong, &other.cert_pem).unwrap();
    for mode in ["verify-full", "verify-ca", "require"] {
        let url = with(&server.url(), &format!("sslmode={mode}"));
        let options = PostgresOptions {
            url,
            ca_file: Some(wrong.clone()),
        };
        let error = Store::open_postgres(&options).await.err().unwrap();
        let text = scale_agent_hub::error::Chain(&error).to_string();
        eprintln!("sslmode={mode}, wrong CA: {text}");
        assert!(text.contains("invalid peer certificate"), "{mode}: {text}");
        assert!(
            text.contains("set sslrootcert (or --postgres-ca) to the CA that signed"),
            "{mode}: {text}"
        );
        assert!(
            text.contains(&wrong.display().to_string()),
            "{mode}: {text}"
        );
        assert!(
            !text.contains(&password_of(&server.url())),
            "{mode}: {text}"
        );
        let error = PostgresOwnership::connect(&options, replica("hub-b"))
            .await
            .err()
            .unwrap();
        let text = scale_agent_hub::error::Chain(&error).to_string();
        assert!(text.contains("set sslrootcert"), "{mode}: {text}");
    }
    // Without any CA, verify-full cannot even start.
    let error = Store::open_postgres(&PostgresOptions::new(with(
        &server.url(),
        "sslmode=verify-full",
    )))
    .await
    .err()
    .unwrap();
    let text = error.to_string();
    assert!(text.contains("needs the CA"), "{text}");
    assert!(!text.contains(&password_of(&server.url())), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_is_refused_by_a_tls_only_server_with_postgres_own_message() {
    let server = PostgresServer::start_with_tls(ServerTls::new(true).unwrap())
        .await
        .unwrap();
    let error = Store::open_postgres(&PostgresOptions::new(with(
        &server.url(),
        "sslmode=disable",
    )))
    .await
    .err()
    .unwrap();
    let text = scale_agent_hub::error::Chain(&error).to_string();
    eprintln!("sslmode=disable against hostssl only: {text}");
    // PostgreSQL's own words, then what to change.
    assert!(text.contains("no pg_hba.conf entry"), "{text}");
    assert!(text.contains("no encryption"), "{text}");
    assert!(
        text.contains("the server accepts only TLS connections from here"),
        "{text}"
    );
    assert!(text.contains("sslmode=disable"), "{text}");
    assert!(!text.contains(&password_of(&server.url())), "{text}");

    // libpq's default, prefer, takes TLS when offered: it connects, encrypted, unverified.
    let mut store = Store::open_postgres(&PostgresOptions::new(server.url()))
        .await
        .unwrap();
    let sessions = hub_sessions(&server).await;
    assert!(
        !sessions.is_empty() && sessions.iter().all(|(_, ssl, _)| *ssl),
        "{sessions:?}"
    );
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_says_so() {
    let server = PostgresServer::start().await.unwrap();
    let error = Store::open_postgres(&PostgresOptions::new(with(
        &server.url(),
        "sslmode=require",
    )))
    .await
    .err()
    .unwrap();
    let text = scale_agent_hub::error::Chain(&error).to_string();
    assert!(text.contains("does not offer TLS"), "{text}");
    assert!(!text.contains(&password_of(&server.url())), "{text}");
    // prefer falls back to plaintext, as libpq does.
    let mut store = Store::open_postgres(&PostgresOptions::new(server.url()))
        .await
        .unwrap();
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_checks_the_ca_and_verify_full_the_host_name_too() {
    let server = PostgresServer::start_with_tls(ServerTls::ip_only(true).unwrap())
        .await
        .unwrap();
    let ca = server.ca_file().unwrap();
    // The certificate names 127.0.0.1, not localhost.
    let by_name = server.url().replace("@127.0.0.1:", "@localhost:");
    let error = Store::open_postgres(&PostgresOptions {
        url: with(&by_name, "sslmode=verify-full"),
        ca_file: Some(ca.clone()),
    })
    .await
    .err()
    .unwrap();
    let text = scale_agent_hub::error::Chain(&error).to_string();
    eprintln!("verify-full, another name: {text}");
    assert!(text.contains("not valid for name"), "{text}");
    assert!(
        text.contains("does not name the host of the URL") && text.contains("verify-ca"),
        "{text}"
    );
    assert!(!text.contains(&password_of(&server.url())), "{text}");
    // verify-ca: the CA is checked, the name is not (libpq's meaning).
    let mut store = Store::open_postgres(&PostgresOptions {
        url: with(&by_name, "sslmode=verify-ca"),
        ca_file: Some(ca.clone()),
    })
    .await
    .unwrap();
    store.close().await.unwrap();
    // verify-full by the name it holds.
    let mut store = Store::open_postgres(&PostgresOptions {
        url: with(&server.url(), "sslmode=verify-full"),
        ca_file: Some(ca),
    })
    .await
    .unwrap();
    store.close().await.unwrap();
}

/// The hub as a process, on PostgreSQL with `verify-full` and `--postgres-ca`, registering in
/// Clouddriver: every session it opens (store, operation records, account ownership, the
/// registrar's lock) is encrypted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_session_of_a_hub_process_is_encrypted() {
    use scale_agent_e2e::fleet::HubProcess;
    let server = PostgresServer::start_with_tls(ServerTls::new(true).unwrap())
        .await
        .unwrap();
    let dir = scale_agent_e2e::fixtures::temp_dir("pg-tls-hub").unwrap();
    let url_file = dir.join("postgres-url");
    std::fs::write(&url_file, with(&server.url(), "sslmode=verify-full")).unwrap();
    let secret_file = dir.join("replica-secret");
    std::fs::write(&secret_file, "0123456789abcdef0123456789abcdef-tls").unwrap();
    let flags = [
        "--store=postgres".to_string(),
        format!("--postgres-url-file={}", url_file.display()),
        format!("--postgres-ca={}", server.ca_file().unwrap().display()),
        "--replica-id=hub-t".into(),
        "--replica-address=http://{http}".into(),
        format!("--replica-secret-file={}", secret_file.display()),
        "--public-url=https://hub.example:8443".into(),
        // Nobody answers there: the registrar takes its lock all the same.
        "--clouddriver-url=http://127.0.0.1:9".into(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let hub = HubProcess::start(&dir.join("hub"), &flags).await.unwrap();
    let wanted = [
        "scale-agent-hub",
        "scale-agent-hub hub-t clouddriver-registrar",
        "scale-agent-hub hub-t ownership",
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let sessions = loop {
        let sessions = hub_sessions(&server).await;
        let mut names: Vec<&str> = sessions.iter().map(|(n, _, _)| n.as_str()).collect();
        names.dedup();
        if names == wanted {
            break sessions;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sessions:?}\n{}",
            hub.log_tail(30)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(sessions.iter().all(|(_, ssl, _)| *ssl), "{sessions:?}");
    drop(hub);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Review F11: below `verify-full` (here `require`, TLS without checking the server's
/// certificate) the hub process refuses to start, saying which flag accepts it; with
/// `--postgres-insecure-tls` it starts, warns, and its sessions are still encrypted. The
/// `verify-full` process above needs no flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_process_refuses_sslmode_require_unless_told_to_accept_it() {
    use scale_agent_e2e::fleet::HubProcess;
    let server = PostgresServer::start_with_tls(ServerTls::new(true).unwrap())
        .await
        .unwrap();
    let dir = scale_agent_e2e::fixtures::temp_dir("pg-tls-insecure").unwrap();
    let url_file = dir.join("postgres-url");
    std::fs::write(&url_file, with(&server.url(), "sslmode=require")).unwrap();
    let mut flags = vec![
        "--store=postgres".to_string(),
        format!("--postgres-url-file={}", url_file.display()),
    ];
    let refused = {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let error = HubProcess::start(&dir.join("refused"), &flags).await;
        assert!(
            error.is_err(),
            "sslmode=require without --postgres-insecure-tls must not start"
        );
        // The hub's own words, from its log (the error's tail may be its backtrace).
        let mut log = String::new();
        for entry in std::fs::read_dir(dir.join("refused")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "log") {
                log.push_str(&std::fs::read_to_string(path).unwrap());
            }
        }
        log
    };
    assert!(
        refused.contains("sslmode is require")
            && refused.contains("sslmode=verify-full")
            && refused.contains("--postgres-insecure-tls"),
        "{refused}"
    );
    assert!(!refused.contains(&password_of(&server.url())), "{refused}");
    assert!(hub_sessions(&server).await.is_empty());

    flags.push("--postgres-insecure-tls".into());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let hub = HubProcess::start(&dir.join("accepted"), &flags)
        .await
        .unwrap();
    let log = hub.log_tail(200);
    assert!(
        log.contains("--postgres-insecure-tls: PostgreSQL connections below sslmode=verify-full")
            && log.contains("require"),
        "{log}"
    );
    let sessions = hub_sessions(&server).await;
    assert!(
        !sessions.is_empty() && sessions.iter().all(|(_, ssl, _)| *ssl),
        "{sessions:?}"
    );
    drop(hub);
    let _ = std::fs::remove_dir_all(&dir);
}
