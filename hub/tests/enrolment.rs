//! Agent identity end to end over the hub's real gRPC listener (real TLS, real tokens issued
//! through the admin API): enrolment with one-time tokens, certificates the hub did not
//! issue, bearer tokens, session tokens, accounts bound to identities, and renewal over the
//! stream. Every refusal is checked for its code and for a message that says what to do.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use rcgen::{CertificateParams, KeyPair};
use scale_agent_hub::RunningHub;
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg,
};
use serde_json::Value;
use tonic::Code;

/// A hub that trusts only the certificates it issues (no --client-ca), with the admin API.
async fn hub_without_external_ca(pki: &Pki, name: &str) -> (RunningHub, Https, String) {
    let dir = data_dir(name);
    let hub = start_hub(pki, &dir, |c| {
        serve_https(pki, c);
        if let scale_agent_hub::GrpcSecurity::MutualTls(tls) = &mut c.agents.security {
            tls.client_ca_pem = None;
        }
    })
    .await;
    let http = Https::for_hub(pki, &hub, Proto::H1);
    (hub, http, admin_token(&dir))
}

/// Issues an agent token through the admin API; returns the answer.
async fn create_token(http: &Https, admin: &str, query: &str) -> Value {
    let reply = http
        .with_token(
            "POST",
            &format!("/api/v1/agent-tokens?{query}"),
            admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    reply.json()
}

/// A fresh key and a CSR for it naming `claimed` (which the hub must ignore).
fn csr(claimed: &str) -> (KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let csr = CertificateParams::new(vec![claimed.to_string()])
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    (key, csr)
}

async fn enroll(
    hub: &RunningHub,
    pki: &Pki,
    token: &str,
    csr_pem: &str,
) -> Result<pb::IssuedCertificate, tonic::Status> {
    let channel = grpc_channel(hub, &pki.ca_pem, None).await?;
    AgentHubClient::new(channel)
        .enroll(pb::EnrollRequest {
            token: token.into(),
            csr_pem: csr_pem.into(),
        })
        .await
        .map(|r| r.into_inner().certificate.unwrap())
}

/// Opens a stream and says Hello; the status when the hub refuses it.
async fn connect(
    hub: &RunningHub,
    pki: &Pki,
    client: Option<(String, String)>,
    bearer: Option<&str>,
    replica: &str,
    session_token: &str,
) -> Result<FakeAgent, tonic::Status> {
    let mut a = open_stream_with_token(hub, &pki.ca_pem, client, bearer).await?;
    a.hello(replica, &[], session_token).await?;
    Ok(a)
}

fn assert_refused(result: Result<FakeAgent, tonic::Status>, code: Code, needles: &[&str]) {
    let status = match result {
        Ok(_) => panic!("the hub accepted a stream it should refuse"),
        Err(status) => status,
    };
    assert_eq!(status.code(), code, "{}", status.message());
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
}

#[tokio::test]
async fn an_agent_enrols_once_streams_with_its_certificate_and_renews_it() {
    let pki = Pki::new();
    let (hub, http, admin) = hub_without_external_ca(&pki, "enrol").await;
    let issued = create_token(
        &http,
        &admin,
        "identity=prod-agent&accounts=prod-*&ttl=1h&once=true",
    )
    .await;
    let token = issued["token"].as_str().unwrap().to_string();
    assert_eq!(issued["kind"], "enrolment");

    // The CSR claims another name: the certificate carries the token's identity.
    let (key, csr_pem) = csr("admin.evil");
    let cert = enroll(&hub, &pki, &token, &csr_pem).await.unwrap();
    assert_eq!(cert.identity, "prod-agent");
    assert!(!cert.ca_pem.is_empty());
    let lifetime = cert.not_after_unix - jiff::Timestamp::now().as_second();
    assert!(
        (30 * 24 * 3600 - 60..=30 * 24 * 3600).contains(&lifetime),
        "{lifetime}"
    );
    let client = (cert.certificate_chain_pem.clone(), key.serialize_pem());

    // The token worked once.
    let (_, other_csr) = csr("prod-agent");
    let reused = enroll(&hub, &pki, &token, &other_csr).await.unwrap_err();
    assert_eq!(reused.code(), Code::PermissionDenied);
    assert!(
        reused.message().contains("already used")
            && reused.message().contains(
                "scale-agent-hub agent-token create --identity prod-agent --accounts 'prod-*' \
                 --ttl 1h --once"
            ),
        "{}",
        reused.message()
    );
    let listed = http.get("/api/v1/agent-tokens", Some(&admin)).await.json();
    assert!(listed[0]["used"].is_string(), "{listed}");
    assert!(listed[0].get("token").is_none(), "{listed}");

    // The hub-issued certificate authenticates the stream, with the token's account pattern.
    let mut a = connect(&hub, &pki, Some(client.clone()), None, "pod-1", "")
        .await
        .unwrap();
    assert_eq!(a.welcome.as_ref().unwrap().identity, "prod-agent");
    assert_eq!(
        a.register("prod-eu", "https://10.0.0.1:6443").await.role,
        Role::Streaming as i32
    );
    let outside = a.register("dev", "https://10.0.0.1:6443").await;
    assert_eq!(outside.role, Role::Rejected as i32);
    assert!(
        outside.reason.contains("prod-*") && outside.reason.contains("--accounts"),
        "{}",
        outside.reason
    );

    // Renewal over the stream: a certificate for the stream's identity, whatever the CSR says.
    let (new_key, renew_csr) = csr("someone-else");
    a.send(Msg::RenewCertificate(pb::RenewCertificate {
        csr_pem: renew_csr,
    }))
    .await;
    while a.renewals.is_empty() {
        a.pump().await.unwrap();
    }
    let renewal = a.renewals.pop_front().unwrap();
    assert_eq!(renewal.refused, "");
    let renewed = renewal.certificate.unwrap();
    assert_eq!(renewed.identity, "prod-agent");
    assert_ne!(renewed.certificate_chain_pem, cert.certificate_chain_pem);
    // The new certificate (with the new key) is good for the next connection.
    let b = connect(
        &hub,
        &pki,
        Some((renewed.certificate_chain_pem, new_key.serialize_pem())),
        None,
        "pod-2",
        "",
    )
    .await
    .unwrap();
    assert_eq!(b.welcome.as_ref().unwrap().identity, "prod-agent");

    hub.shutdown().await.unwrap();
}

#[tokio::test]
async fn expired_tokens_and_certificates_the_hub_did_not_issue_are_refused() {
    let pki = Pki::new();
    let (hub, http, admin) = hub_without_external_ca(&pki, "enrol-refusals").await;

    let issued = create_token(
        &http,
        &admin,
        "identity=edge-agent&accounts=edge-*&ttl=1s&once=true",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (_, csr_pem) = csr("edge-agent");
    let expired = enroll(&hub, &pki, issued["token"].as_str().unwrap(), &csr_pem)
        .await
        .unwrap_err();
    assert_eq!(expired.code(), Code::PermissionDenied);
    assert!(
        expired.message().contains("expired") && expired.message().contains("agent-token create"),
        "{}",
        expired.message()
    );
    let unknown = enroll(&hub, &pki, "saa_made-up", &csr_pem)
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::Unauthenticated);
    assert!(
        unknown.message().contains("agent-token create"),
        "{}",
        unknown.message()
    );
    let fresh = create_token(
        &http,
        &admin,
        "identity=edge-agent&accounts=edge-*&ttl=1h&once=true",
    )
    .await;
    let bad_csr = enroll(&hub, &pki, fresh["token"].as_str().unwrap(), "not a CSR")
        .await
        .unwrap_err();
    assert_eq!(bad_csr.code(), Code::InvalidArgument);
    assert!(
        bad_csr.message().contains("PKCS#10"),
        "{}",
        bad_csr.message()
    );

    // A certificate of the test CA: this hub did not issue it and has no --client-ca.
    assert_refused(
        connect(&hub, &pki, Some(pki.client("agent-a.test")), None, "p", "").await,
        Code::Unauthenticated,
        &[
            "not issued by this hub",
            "agent-token create --once",
            "--client-ca",
        ],
    );
    // Nothing at all.
    assert_refused(
        connect(&hub, &pki, None, None, "p", "").await,
        Code::Unauthenticated,
        &["clouddriver.auth.tokenFile", "agent-token create"],
    );
    // An enrolment token is not a bearer token.
    assert_refused(
        connect(&hub, &pki, None, fresh["token"].as_str(), "p", "").await,
        Code::PermissionDenied,
        &["not a bearer token"],
    );

    hub.shutdown().await.unwrap();
}

#[tokio::test]
async fn bearer_token_agents_stream_and_session_tokens_cannot_be_stolen() {
    let pki = Pki::new();
    let (hub, http, admin) = hub_without_external_ca(&pki, "bearer").await;
    let bearer = create_token(&http, &admin, "identity=token-agent&accounts=*&ttl=1h").await;
    assert_eq!(bearer["kind"], "bearer");
    let bearer = bearer["token"].as_str().unwrap().to_string();

    let mut a = connect(&hub, &pki, None, Some(&bearer), "pod-1", "")
        .await
        .unwrap();
    assert_eq!(a.welcome.as_ref().unwrap().identity, "token-agent");
    let first_token = a.session_token();
    assert!(first_token.len() >= 40, "{first_token}");
    assert_eq!(
        a.register("shared", "https://10.0.0.1:6443").await.role,
        Role::Streaming as i32
    );

    // Another connection with the same identity and replica, with a token it was not given
    // (or none): refused, and the live stream goes on.
    assert_refused(
        connect(&hub, &pki, None, Some(&bearer), "pod-1", "guessed").await,
        Code::PermissionDenied,
        &["session token", "distinct replica names"],
    );
    assert_refused(
        connect(&hub, &pki, None, Some(&bearer), "pod-1", "").await,
        Code::PermissionDenied,
        &["session token"],
    );
    a.send(Msg::Heartbeat(pb::Heartbeat::default())).await;
    a.synced().await;

    // The agent itself, reconnecting with its token, replaces its stream.
    let b = connect(&hub, &pki, None, Some(&bearer), "pod-1", &first_token)
        .await
        .unwrap();
    assert_eq!(a.error().await.code(), Code::Aborted);
    assert_ne!(b.session_token(), first_token);

    // A renewal on a token-authenticated stream is refused: it extends hub-issued
    // certificates only.
    let mut b = b;
    let (_, renew_csr) = csr("token-agent");
    b.send(Msg::RenewCertificate(pb::RenewCertificate {
        csr_pem: renew_csr,
    }))
    .await;
    while b.renewals.is_empty() {
        b.pump().await.unwrap();
    }
    let refused = b.renewals.pop_front().unwrap();
    assert!(refused.certificate.is_none());
    assert!(
        refused.refused.contains("enrolmentTokenFile"),
        "{}",
        refused.refused
    );

    // Certificate and token of different identities: refused.
    let enrol = create_token(
        &http,
        &admin,
        "identity=cert-agent&accounts=*&ttl=1h&once=true",
    )
    .await;
    let (key, csr_pem) = csr("cert-agent");
    let cert = enroll(&hub, &pki, enrol["token"].as_str().unwrap(), &csr_pem)
        .await
        .unwrap();
    assert_refused(
        connect(
            &hub,
            &pki,
            Some((cert.certificate_chain_pem, key.serialize_pem())),
            Some(&bearer),
            "pod-9",
            "",
        )
        .await,
        Code::PermissionDenied,
        &["\"cert-agent\"", "\"token-agent\"", "one identity"],
    );

    // A revoked bearer token no longer opens streams.
    let listed = http.get("/api/v1/agent-tokens", Some(&admin)).await.json();
    let id = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "bearer")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let revoked = http
        .with_token(
            "DELETE",
            &format!("/api/v1/agent-tokens/{id}"),
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(revoked.status, 200, "{}", revoked.text());
    assert_refused(
        connect(&hub, &pki, None, Some(&bearer), "pod-2", "").await,
        Code::Unauthenticated,
        &["not one this hub issued"],
    );

    hub.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_second_identity_cannot_claim_a_bound_account_until_an_admin_rebinds_it() {
    let pki = Pki::new();
    // The operator-signed mode (--client-ca): both identities hold certificates of the
    // same external CA, as two target clusters of one operator would.
    let dir = data_dir("bindings");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);

    let mut owner = agent(&hub, &pki, "owner.test", "pod-1").await;
    assert_eq!(
        owner.register("prod", "https://10.0.0.1:6443").await.role,
        Role::Streaming as i32
    );
    // Same API server host and CA fingerprint (both are public), other identity, as standby.
    let mut rogue = agent(&hub, &pki, "rogue.test", "pod-1").await;
    let refused = rogue.register("prod", "https://10.0.0.1:6443").await;
    assert_eq!(refused.role, Role::Rejected as i32);
    assert!(
        refused
            .reason
            .contains("bound to agent identity \"owner.test\"")
            && refused
                .reason
                .contains("scale-agent-hub account rebind prod --identity rogue.test"),
        "{}",
        refused.reason
    );
    let account = http.get("/api/v1/accounts/prod", Some(&admin)).await.json();
    assert!(
        account["standbys"].as_array().is_none_or(Vec::is_empty),
        "{account}"
    );
    let bindings = http
        .get("/api/v1/account-bindings", Some(&admin))
        .await
        .json();
    assert_eq!(bindings[0]["account"], "prod");
    assert_eq!(bindings[0]["identity"], "owner.test");

    // Rebinding needs role admin: an unknown token is told which role it needs.
    let denied = http
        .with_token(
            "POST",
            "/api/v1/accounts/prod/rebind?identity=rogue.test",
            "wrong",
            Bytes::new(),
        )
        .await;
    assert_eq!(denied.status, 401, "{}", denied.text());
    assert!(
        denied.text().contains("needs role admin"),
        "{}",
        denied.text()
    );
    // An admin moves the account: the old identity's stream is ended, the new one may serve.
    let moved = http
        .with_token(
            "POST",
            "/api/v1/accounts/prod/rebind?identity=rogue.test",
            &admin,
            Bytes::new(),
        )
        .await;
    assert_eq!(moved.status, 200, "{}", moved.text());
    assert_eq!(moved.json()["identity"], "rogue.test");
    let ended = owner.error().await;
    assert_eq!(ended.code(), Code::PermissionDenied);
    assert!(ended.message().contains("rebound"), "{}", ended.message());
    assert_eq!(
        rogue.register("prod", "https://10.0.0.1:6443").await.role,
        Role::Streaming as i32
    );

    // The binding is stored: after a restart the first identity is still refused.
    hub.shutdown().await.unwrap();
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let mut owner = agent(&hub, &pki, "owner.test", "pod-1").await;
    let refused = owner.register("prod", "https://10.0.0.1:6443").await;
    assert_eq!(refused.role, Role::Rejected as i32);
    assert!(
        refused.reason.contains("\"rogue.test\""),
        "{}",
        refused.reason
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
