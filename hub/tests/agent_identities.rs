//! Agent identities that can die (issue 28: F4, F17): disabling an identity, denying a
//! certificate, the maximum age of an enrolment, deleting an orphaned account, the levers
//! from the CLI and their audit lines, each as the review's attack against the hub's real
//! gRPC listener (real TLS, hub-issued certificates from real enrolments, tokens from the
//! admin API) with the protocol-level fake agent, refused with a message that says why,
//! beside the legitimate path. Failing closed (F5, F6, F7, F24): tests/agent_fail_closed.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod identity;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use identity::*;
use scale_agent_hub::GrpcSecurity;
use scale_agent_proto::v1::account_assignment::Role;
use tonic::Code;

/// F4/F17: a stolen agent key is no longer a perpetual credential. The admin disables the
/// identity: its live stream ends at once; the certificate, a bearer token and a new
/// enrolment token of the identity are all refused, and renewal by certificate too; the
/// decision survives a restart of the hub; enabling the identity lets the agent back in.
#[tokio::test]
async fn a_disabled_identity_is_cut_off_and_refused_everywhere_until_enabled() {
    let pki = Pki::new();
    let dir = data_dir("identity-disable");
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let (client, _) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod-*").await;
    let bearer = agent_token(&http, &admin, "identity=prod-agent&accounts=prod-*&ttl=1h").await;
    let mut a = connect(&hub, &pki, Some(client.clone()), None, "pod-1")
        .await
        .unwrap();
    assert_eq!(
        a.register("prod-eu", HOST).await.role,
        Role::Streaming as i32
    );

    // Only admins pull the lever.
    let reply = http
        .with_token(
            "POST",
            "/api/v1/agent-identities/prod-agent/disable",
            "not-a-token",
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 401, "{}", reply.text());

    let (status, body) = post(
        &http,
        &admin,
        "/api/v1/agent-identities/prod-agent/disable?reason=node%20compromised",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["disconnected"], 1, "{body}");
    assert_eq!(body["reason"], "node compromised", "{body}");
    // The live stream ends at once, saying why.
    let ended = tokio::time::timeout(Duration::from_secs(5), a.error())
        .await
        .expect("the stream was not ended");
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("disabled"), "{ended:?}");

    let why = ["disabled", "node compromised", "agent enable prod-agent"];
    refused(
        connect(&hub, &pki, Some(client.clone()), None, "pod-1").await,
        Code::PermissionDenied,
        &why,
    );
    refused(
        connect(&hub, &pki, None, Some(&bearer), "pod-1").await,
        Code::PermissionDenied,
        &why,
    );
    let (_, csr_pem) = csr();
    refused(
        enroll(&hub, &pki, Some(client.clone()), "", &csr_pem).await,
        Code::PermissionDenied,
        &why,
    );
    // A new enrolment token (issued by mistake, or before the decision) enrols nothing.
    let token = agent_token(
        &http,
        &admin,
        "identity=prod-agent&accounts=prod-*&ttl=1h&once=true",
    )
    .await;
    refused(
        enroll(&hub, &pki, None, &token, &csr_pem).await,
        Code::PermissionDenied,
        &why,
    );
    // Other identities are not touched.
    let (other, _) = enrolled(&hub, &pki, &http, &admin, "dev-agent", "dev").await;
    let mut b = connect(&hub, &pki, Some(other), None, "dev-1")
        .await
        .unwrap();
    assert_eq!(b.register("dev", HOST).await.role, Role::Streaming as i32);

    let listed = http
        .get("/api/v1/agent-identities", Some(&admin))
        .await
        .json();
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["identity"] == "prod-agent")
        .unwrap()
        .clone();
    assert!(row["disabled"].is_string(), "{listed}");
    assert_eq!(row["accounts"], "prod-*", "{listed}");

    // Across a restart: the decision is in the store.
    drop(b);
    hub.shutdown().await.unwrap();
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    refused(
        connect(&hub, &pki, Some(client.clone()), None, "pod-1").await,
        Code::PermissionDenied,
        &why,
    );

    // Enabled again: the same certificate gets in and serves its account.
    let (status, body) = post(&http, &admin, "/api/v1/agent-identities/prod-agent/enable").await;
    assert_eq!(status, 200, "{body}");
    let mut a = connect(&hub, &pki, Some(client), None, "pod-1")
        .await
        .unwrap();
    assert_eq!(
        a.register("prod-eu", HOST).await.role,
        Role::Streaming as i32
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// F4: one certificate denied by serial. The stream presenting it ends, it opens no stream
/// and renews nothing; a certificate renewed before with another key still works, and so
/// does a fresh enrolment.
#[tokio::test]
async fn a_denied_certificate_is_refused_and_cannot_renew_itself() {
    let pki = Pki::new();
    let dir = data_dir("identity-deny-serial");
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let (stolen, stolen_serial) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod-*").await;
    let mut a = connect(&hub, &pki, Some(stolen.clone()), None, "pod-1")
        .await
        .unwrap();
    // The agent renews on its stream (a new key): the hub's serials are random, one per
    // certificate.
    let (new_key, csr_pem) = csr();
    let renewal = renew_on_stream(&mut a, &csr_pem).await;
    assert_eq!(renewal.refused, "");
    let renewed = renewal.certificate.unwrap();
    assert_ne!(serial_of(&renewed.certificate_chain_pem), stolen_serial);
    let renewed = (renewed.certificate_chain_pem, new_key.serialize_pem());

    // The serial as openssl prints it (upper case, any leading zeros) is understood.
    let (status, body) = post(
        &http,
        &admin,
        &format!(
            "/api/v1/agent-identities/prod-agent/deny-certificate?serial={}",
            stolen_serial.to_uppercase()
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deniedSerials"][0], stolen_serial.as_str(), "{body}");
    let ended = tokio::time::timeout(Duration::from_secs(5), a.error())
        .await
        .expect("the stream was not ended");
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");

    let why = [
        format!("serial {stolen_serial}"),
        "denied".to_string(),
        "--once".to_string(),
    ];
    let why: Vec<&str> = why.iter().map(String::as_str).collect();
    refused(
        connect(&hub, &pki, Some(stolen.clone()), None, "pod-1").await,
        Code::PermissionDenied,
        &why,
    );
    let (_, csr_pem) = csr();
    refused(
        enroll(&hub, &pki, Some(stolen.clone()), "", &csr_pem).await,
        Code::PermissionDenied,
        &why,
    );
    // The legitimate agent's renewed certificate is another serial: it streams and renews.
    let mut b = connect(&hub, &pki, Some(renewed.clone()), None, "pod-1")
        .await
        .unwrap();
    assert_eq!(
        b.register("prod-eu", HOST).await.role,
        Role::Streaming as i32
    );
    let (_, csr_pem) = csr();
    enroll(&hub, &pki, Some(renewed), "", &csr_pem)
        .await
        .unwrap();
    // A malformed serial says what a serial looks like.
    let (status, body) = post(
        &http,
        &admin,
        "/api/v1/agent-identities/prod-agent/deny-certificate?serial=not-hex",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("openssl x509"), "{body}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// F4: renewals are bounded by the maximum age of the enrolment: a key renews itself until
/// then, and the agent must enrol again with a one-time token after.
#[tokio::test]
async fn renewals_stop_at_the_maximum_age_of_the_enrolment() {
    let pki = Pki::new();
    let dir = data_dir("identity-max-age");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        if let GrpcSecurity::MutualTls(tls) = &mut c.agents.security {
            tls.client_ca_pem = None;
        }
        c.agents.agent_cert_lifetime = Duration::from_secs(30);
        // A renewal needs a minute left: this enrolment is renewable for 3 seconds at most.
        c.agents.agent_max_enrolment_age = Duration::from_secs(63);
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    let (client, _) = enrolled(&hub, &pki, &http, &admin, "edge-agent", "edge").await;
    let (_, csr_pem) = csr();
    let renewed = enroll(&hub, &pki, Some(client.clone()), "", &csr_pem)
        .await
        .unwrap();
    assert!(
        renewed.not_after_unix - jiff::Timestamp::now().as_second() <= 30,
        "{renewed:?}"
    );
    // Enrolment times are whole seconds: 4.2 s later at least 4 have passed.
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let status = refused(
        enroll(&hub, &pki, Some(client.clone()), "", &csr_pem).await,
        Code::PermissionDenied,
        &["--agent-max-enrolment-age", "agent-token create", "--once"],
    );
    assert!(status.message().contains("edge-agent"), "{status:?}");
    let mut a = connect(&hub, &pki, Some(client), None, "e-1")
        .await
        .unwrap();
    let renewal = renew_on_stream(&mut a, &csr_pem).await;
    assert!(renewal.certificate.is_none());
    assert!(
        renewal.refused.contains("--agent-max-enrolment-age"),
        "{}",
        renewal.refused
    );
    // Enrolling again starts a new enrolment: renewals work again.
    let (fresh, _) = enrolled(&hub, &pki, &http, &admin, "edge-agent", "edge").await;
    enroll(&hub, &pki, Some(fresh), "", &csr_pem).await.unwrap();
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// F17: an orphaned account (its cluster retired, or a name squatted) is deleted and its
/// binding released, so another identity may register the name; an account a stream serves
/// is not deleted.
#[tokio::test]
async fn an_orphaned_account_is_deleted_and_its_name_released() {
    let pki = Pki::new();
    let dir = data_dir("identity-orphan");
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let (squatter, _) = enrolled(&hub, &pki, &http, &admin, "rogue-agent", "prod-*").await;
    let (owner, _) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod-*").await;
    let mut rogue = connect(&hub, &pki, Some(squatter), None, "r-1")
        .await
        .unwrap();
    assert_eq!(
        rogue.register("prod-eu-west-10", HOST).await.role,
        Role::Streaming as i32
    );
    let reply = http
        .with_token(
            "DELETE",
            "/api/v1/accounts/prod-eu-west-10/binding",
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 409, "{}", reply.text());
    assert!(
        reply.text().contains("agent disable rogue-agent"),
        "{}",
        reply.text()
    );
    let (status, _) = post(
        &http,
        &admin,
        "/api/v1/agent-identities/rogue-agent/disable",
    )
    .await;
    assert_eq!(status, 200);
    let _ = rogue.error().await;
    // The real owner is refused while the name is bound to the squatter.
    let mut real = connect(&hub, &pki, Some(owner.clone()), None, "p-1")
        .await
        .unwrap();
    assert_eq!(
        real.register("prod-eu-west-10", HOST).await.role,
        Role::Rejected as i32
    );
    drop(real);
    wait_for("the squatter's stream to be gone", async || {
        http.with_token(
            "DELETE",
            "/api/v1/accounts/prod-eu-west-10/binding",
            &admin,
            Bytes::new(),
        )
        .await
        .status
            == 200
    })
    .await;
    let bindings = http
        .get("/api/v1/account-bindings", Some(&admin))
        .await
        .json();
    assert!(
        !bindings.to_string().contains("prod-eu-west-10"),
        "{bindings}"
    );
    let mut real = connect(&hub, &pki, Some(owner), None, "p-1").await.unwrap();
    assert_eq!(
        real.register("prod-eu-west-10", HOST).await.role,
        Role::Streaming as i32
    );
    let reply = http
        .with_token(
            "DELETE",
            "/api/v1/accounts/never-was/binding",
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 404, "{}", reply.text());
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The levers from the command line, as a real process against the running hub: `agent
/// disable`, `agent list`, `agent enable`, `account delete`.
#[tokio::test]
async fn the_levers_work_from_the_command_line() {
    let pki = Pki::new();
    let dir = data_dir("identity-cli");
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let (client, serial) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod-*").await;
    let mut a = connect(&hub, &pki, Some(client.clone()), None, "pod-1")
        .await
        .unwrap();
    assert_eq!(
        a.register("prod-eu", HOST).await.role,
        Role::Streaming as i32
    );
    let ca_file = dir.join("serving-ca.pem");
    std::fs::write(&ca_file, &pki.serving_ca_pem).unwrap();
    let access = vec![
        "--hub-url".to_string(),
        format!("https://127.0.0.1:{}", hub.http_addr.port()),
        "--ca-file".to_string(),
        ca_file.display().to_string(),
        "--admin-token-file".to_string(),
        dir.join("admin-token").display().to_string(),
    ];
    let (ok, out, err) = cli(
        &access,
        &[&["agent", "disable", "prod-agent", "--reason", "retired"]],
    )
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("disabled identity prod-agent; 1 live stream(s) ended"),
        "{out}"
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), a.error())
        .await
        .unwrap();
    assert!(ended.message().contains("retired"), "{ended:?}");
    refused(
        connect(&hub, &pki, Some(client.clone()), None, "pod-1").await,
        Code::PermissionDenied,
        &["retired"],
    );
    let (ok, out, err) = cli(
        &access,
        &[
            &["agent", "list"],
            &[
                "agent",
                "deny-certificate",
                "prod-agent",
                "--serial",
                &serial,
            ],
            &["account", "delete", "prod-eu"],
            &["agent", "enable", "prod-agent"],
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("IDENTITY") && out.contains("prod-agent") && out.contains("prod-*"),
        "{out}"
    );
    assert!(
        out.contains("deleted account prod-eu; its binding to identity prod-agent is released"),
        "{out}"
    );
    assert!(out.contains("enabled identity prod-agent"), "{out}");
    // Enabled, but that certificate stays denied.
    refused(
        connect(&hub, &pki, Some(client), None, "pod-1").await,
        Code::PermissionDenied,
        &["denied"],
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `scale-agent-hub` once per argument list (each followed by `access`), off the test's
/// runtime (the hub runs on it); whether all succeeded, their standard outputs and errors.
async fn cli(access: &[String], runs: &[&[&str]]) -> (bool, String, String) {
    let runs: Vec<Vec<String>> = runs
        .iter()
        .map(|args| {
            args.iter()
                .map(|a| a.to_string())
                .chain(access.iter().cloned())
                .collect()
        })
        .collect();
    tokio::task::spawn_blocking(move || {
        let (mut ok, mut out, mut err) = (true, String::new(), String::new());
        for args in runs {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_scale-agent-hub"))
                .args(&args)
                .env_remove("SCALE_AGENT_HUB_URL")
                .output()
                .unwrap();
            ok &= output.status.success();
            out.push_str(&String::from_utf8_lossy(&output.stdout));
            out.push('\n');
            err.push_str(&String::from_utf8_lossy(&output.stderr));
        }
        (ok, out, err)
    })
    .await
    .unwrap()
}

/// What the hub logs, for the audit test.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// F17/F15: every lever writes an `audit` line (who, verb, object, code), and so does a
/// name bound to an identity for the first time.
#[tokio::test(flavor = "current_thread")]
async fn the_levers_and_first_bindings_are_audited() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let pki = Pki::new();
    let dir = data_dir("identity-audit");
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let (client, serial) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod-*").await;
    let mut a = connect(&hub, &pki, Some(client), None, "pod-1")
        .await
        .unwrap();
    assert_eq!(
        a.register("prod-eu", HOST).await.role,
        Role::Streaming as i32
    );
    for path in [
        "/api/v1/agent-identities/prod-agent/disable?reason=audit".to_string(),
        format!("/api/v1/agent-identities/prod-agent/deny-certificate?serial={serial}"),
        "/api/v1/agent-identities/prod-agent/enable".to_string(),
    ] {
        let (status, body) = post(&http, &admin, &path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    wait_for("the stream to be gone", async || {
        http.with_token(
            "DELETE",
            "/api/v1/accounts/prod-eu/binding",
            &admin,
            Bytes::new(),
        )
        .await
        .status
            == 200
    })
    .await;
    hub.shutdown().await.unwrap();

    let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).to_string();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains(" audit: ")).collect();
    for (verb, object) in [
        ("bind", "prod-eu"),
        ("disable", "prod-agent"),
        ("deny-certificate", "prod-agent"),
        ("enable", "prod-agent"),
        ("delete-account", "prod-eu"),
    ] {
        assert!(
            audit.iter().any(|l| l.contains(&format!("verb=\"{verb}\""))
                && l.contains(&format!("object={object}"))
                && l.contains("code=200")),
            "no audit line for {verb} {object}:\n{}",
            audit.join("\n")
        );
    }
    assert!(
        audit
            .iter()
            .any(|l| l.contains("verb=\"disable\"") && l.contains("who=admin")),
        "{}",
        audit.join("\n")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// F17: disabling an identity ends what its streams carry at once: an open watch through the
/// Kubernetes API proxy ends while the (compromised) agent would happily go on.
#[tokio::test]
async fn disabling_an_identity_ends_its_proxy_sessions_at_once() {
    let pki = Pki::new();
    let dir = data_dir("identity-sessions");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let h1 = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-1").await;
    assert_eq!(a.register("prod", HOST).await.role, Role::Streaming as i32);
    let token = token_for(&h1, &admin, "prod").await;
    let request = h1
        .request(
            "GET",
            "/clusters/prod/api/v1/configmaps?watch=true&resourceVersion=5",
        )
        .header("authorization", format!("Bearer {token}"))
        .body(empty())
        .unwrap();
    let send = {
        let h1 = h1.clone();
        tokio::spawn(async move { h1.send(request).await })
    };
    let (id, _) = a.request().await;
    a.respond_head(id, 200, &[("content-type", "application/json")], false)
        .await;
    let event = b"{\"type\":\"ADDED\",\"object\":{}}\n";
    a.send_data(id, event, false).await;
    let response = send.await.unwrap();
    assert_eq!(response.status(), 200);

    let (status, body) = post(&h1, &admin, "/api/v1/agent-identities/agent-a.test/disable").await;
    assert_eq!(status, 200, "{body}");
    let (bytes, _) =
        tokio::time::timeout(Duration::from_secs(5), read_to_end(response.into_body()))
            .await
            .expect("the watch outlived the disabled identity");
    assert_eq!(bytes, event);
    // The agent (still running) was cut off by the hub.
    let ended = tokio::time::timeout(Duration::from_secs(5), a.error())
        .await
        .unwrap();
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
