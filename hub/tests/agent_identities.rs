//! Agent identities that can die, and failing closed (issue 28: F4, F5, F6, F7, F17, F24),
//! each as the review's attack against the hub's real gRPC listener (real TLS, hub-issued
//! certificates from real enrolments, tokens from the admin API) with the protocol-level
//! fake agent, refused with a message that says why, beside the legitimate path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair};
use scale_agent_hub::{
    GrpcSecurity, ProxyHopTls, ProxyMode, RunningHub,
    agent_ca::AgentCaSource,
    forwarded::{Cidr, ForwardedFormat, ProxyTrust},
    identity::{AllowRule, certificate_serial},
};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out,
};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Code, Status,
    metadata::MetadataValue,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity},
};

const HOST: &str = "https://10.0.0.1:6443";

/// A hub that trusts only the certificates it issues (no --client-ca), with the admin API.
async fn hub_of_its_own(pki: &Pki, dir: &std::path::Path) -> (RunningHub, Https, String) {
    let hub = start_hub(pki, dir, |c| {
        serve_https(pki, c);
        if let GrpcSecurity::MutualTls(tls) = &mut c.agents.security {
            tls.client_ca_pem = None;
        }
    })
    .await;
    let http = Https::for_hub(pki, &hub, Proto::H1);
    (hub, http, admin_token(dir))
}

async fn post(http: &Https, admin: &str, path: &str) -> (u16, Value) {
    let reply = http.with_token("POST", path, admin, Bytes::new()).await;
    let status = reply.status;
    let text = reply.text();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Issues an agent token through the admin API; returns the token.
async fn agent_token(http: &Https, admin: &str, query: &str) -> String {
    let (status, body) = post(http, admin, &format!("/api/v1/agent-tokens?{query}")).await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_string()
}

/// A fresh key and a CSR for it.
fn csr() -> (KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let csr = CertificateParams::new(vec!["ignored".to_string()])
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    (key, csr)
}

/// Enroll on `hub`, with a client certificate (`client`: a renewal when `token` is empty).
async fn enroll(
    hub: &RunningHub,
    pki: &Pki,
    client: Option<(String, String)>,
    token: &str,
    csr_pem: &str,
) -> Result<pb::IssuedCertificate, Status> {
    let channel = grpc_channel(hub, &pki.ca_pem, client).await?;
    AgentHubClient::new(channel)
        .enroll(pb::EnrollRequest {
            token: token.into(),
            csr_pem: csr_pem.into(),
        })
        .await
        .map(|r| r.into_inner().certificate.unwrap())
}

/// Enrols `identity` (accounts `pattern`) with a fresh one-time token; the certificate and
/// key as a client identity, and the certificate's serial.
async fn enrolled(
    hub: &RunningHub,
    pki: &Pki,
    http: &Https,
    admin: &str,
    identity: &str,
    pattern: &str,
) -> ((String, String), String) {
    let token = agent_token(
        http,
        admin,
        &format!("identity={identity}&accounts={pattern}&ttl=1h&once=true"),
    )
    .await;
    let (key, csr_pem) = csr();
    let cert = enroll(hub, pki, None, &token, &csr_pem).await.unwrap();
    let serial = serial_of(&cert.certificate_chain_pem);
    ((cert.certificate_chain_pem, key.serialize_pem()), serial)
}

fn serial_of(pem: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    certificate_serial(&pem.contents).unwrap()
}

async fn connect(
    hub: &RunningHub,
    pki: &Pki,
    client: Option<(String, String)>,
    bearer: Option<&str>,
    replica: &str,
) -> Result<FakeAgent, Status> {
    let mut a = open_stream_with_token(hub, &pki.ca_pem, client, bearer).await?;
    a.hello(replica, &[], "").await?;
    Ok(a)
}

fn refused<T>(result: Result<T, Status>, code: Code, needles: &[&str]) -> Status {
    let Err(status) = result else {
        panic!("the hub accepted what it should refuse");
    };
    assert_eq!(status.code(), code, "{}", status.message());
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{:?} lacks {needle:?}",
            status.message()
        );
    }
    status
}

/// Asks for a certificate on the stream; the hub's answer.
async fn renew_on_stream(a: &mut FakeAgent, csr_pem: &str) -> pb::CertificateRenewal {
    a.send(Msg::RenewCertificate(pb::RenewCertificate {
        csr_pem: csr_pem.into(),
    }))
    .await;
    while a.renewals.is_empty() {
        a.pump().await.unwrap();
    }
    a.renewals.pop_front().unwrap()
}

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
        // A renewal needs a minute left: this enrolment is renewable for 3 seconds.
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
    tokio::time::sleep(Duration::from_millis(3500)).await;
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

/// A stream through a proxy: the hub's gRPC port over plaintext (`hop`: `None`) or over a
/// mutual-TLS hop presenting `hop`, with the agent's certificate in `x-ssl-client-cert`.
async fn forwarded_stream(
    hub: &RunningHub,
    pki: &Pki,
    hop: Option<&(String, String)>,
    agent_cert_pem: &str,
) -> Result<FakeAgentRaw, Status> {
    let endpoint = match hop {
        None => Endpoint::from_shared(format!("http://{}", hub.grpc_addr)).unwrap(),
        Some((cert, key)) => {
            Endpoint::from_shared(format!("https://127.0.0.1:{}", hub.grpc_addr.port()))
                .unwrap()
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
                        .domain_name("localhost")
                        .identity(Identity::from_pem(cert, key)),
                )
                .unwrap()
        }
    };
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("connect: {e:?}")))?;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let encoded =
        percent_encoding::utf8_percent_encode(agent_cert_pem, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    request.metadata_mut().insert(
        "x-ssl-client-cert",
        MetadataValue::try_from(encoded).unwrap(),
    );
    let inbound = AgentHubClient::new(channel)
        .session(request)
        .await?
        .into_inner();
    let mut raw = FakeAgentRaw {
        tx,
        inbound,
        seq: 0,
    };
    raw.send(Msg::Hello(pb::Hello {
        replica: "r".into(),
        agent_version: "test".into(),
        ..Default::default()
    }))
    .await;
    loop {
        if let Out::Welcome(_) = raw.next().await? {
            return Ok(raw);
        }
    }
}

/// A stream as a bare protocol client (for streams through a proxy).
struct FakeAgentRaw {
    tx: tokio::sync::mpsc::Sender<pb::AgentMessage>,
    inbound: tonic::Streaming<pb::HubMessage>,
    seq: u64,
}

impl FakeAgentRaw {
    async fn send(&mut self, kind: Msg) {
        self.seq += 1;
        self.tx
            .send(pb::AgentMessage {
                seq: self.seq,
                kind: Some(kind),
            })
            .await
            .unwrap();
    }

    async fn next(&mut self) -> Result<Out, Status> {
        loop {
            let message = tokio::time::timeout(WAIT, self.inbound.message())
                .await
                .expect("nothing from the hub")?
                .expect("the stream ended");
            if let Some(kind) = message.kind {
                return Ok(kind);
            }
        }
    }

    async fn renew(&mut self, csr_pem: &str) -> pb::CertificateRenewal {
        self.send(Msg::RenewCertificate(pb::RenewCertificate {
            csr_pem: csr_pem.into(),
        }))
        .await;
        loop {
            if let Out::CertificateRenewal(renewal) = self.next().await.unwrap() {
                return renewal;
            }
        }
    }
}

/// F5: behind a proxy trusted by its address, anyone in the range can send any agent's
/// (public) certificate in the header. The hub still names the agent (that is what address
/// trust means), but renews nothing on such a stream, so no key-backed certificate comes
/// out of a copied one. A proxy trusted by its own client certificate (which checked the
/// agent's key in its handshake) gets the renewal.
#[tokio::test]
async fn certificates_forwarded_by_an_address_trusted_proxy_are_never_renewed() {
    let pki = Pki::new();
    let dir = data_dir("identity-forwarded");
    // The agent enrols at a hub whose CA files the proxied hubs share.
    let (hub, http, admin) = hub_of_its_own(&pki, &dir).await;
    let ((agent_cert, _key), _) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod-*").await;
    hub.shutdown().await.unwrap();
    let agent_ca = AgentCaSource::Files {
        cert: dir.join("agent-ca.crt"),
        key: dir.join("agent-ca.key"),
    };
    let hub_ca_pem = std::fs::read(dir.join("agent-ca.crt")).unwrap();

    // By address: 127.0.0.1 is the trusted range, the hop is plaintext.
    let trust = ProxyTrust::new(
        ForwardedFormat::EscapedPem,
        None,
        &hub_ca_pem,
        vec![Cidr::parse("127.0.0.1/32").unwrap()],
        Vec::new(),
    )
    .unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        c.agents.agent_ca = agent_ca.clone();
        c.agents.security = GrpcSecurity::TrustedProxy(ProxyMode {
            trust,
            client_ca_pem: hub_ca_pem.clone(),
            hop_tls: None,
        });
    })
    .await;
    // The attacker holds the certificate only, and its own key.
    let mut stolen = forwarded_stream(&hub, &pki, None, &agent_cert)
        .await
        .unwrap();
    let (_, attacker_csr) = csr();
    let renewal = stolen.renew(&attacker_csr).await;
    assert!(renewal.certificate.is_none(), "{renewal:?}");
    assert!(
        renewal.refused.contains("trusted by its address only")
            && renewal.refused.contains("--trusted-proxy-identity"),
        "{}",
        renewal.refused
    );
    drop(stolen);
    hub.shutdown().await.unwrap();

    // By certificate, on a mutual-TLS hop: the renewal is given.
    let proxies = ca("scale-agent-proxies");
    let proxy = leaf(
        &proxies,
        &["grpc-proxy.spinnaker"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let trust = ProxyTrust::new(
        ForwardedFormat::EscapedPem,
        None,
        &hub_ca_pem,
        Vec::new(),
        vec!["grpc-proxy.spinnaker".into()],
    )
    .unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        c.agents.agent_ca = agent_ca.clone();
        c.agents.security = GrpcSecurity::TrustedProxy(ProxyMode {
            trust,
            client_ca_pem: hub_ca_pem.clone(),
            hop_tls: Some(ProxyHopTls {
                cert_pem: pki.server_cert_pem.clone().into_bytes(),
                key_pem: pki.server_key_pem.clone().into_bytes(),
                proxy_ca_pem: Some(proxies.pem().into_bytes()),
            }),
        });
    })
    .await;
    let mut proxied = forwarded_stream(&hub, &pki, Some(&proxy), &agent_cert)
        .await
        .unwrap();
    let (_, csr_pem) = csr();
    let renewal = proxied.renew(&csr_pem).await;
    assert_eq!(renewal.refused, "");
    assert_eq!(renewal.certificate.unwrap().identity, "prod-agent");
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// F6 and F7: failing closed. A certificate of the external CA (--client-ca) registers only
/// what an --allow rule names, and may not take an identity the hub enrolled (the R8 standby
/// hijack in operator-signed mode); a certificate of the hub's CA that this hub holds no
/// enrolment of (another hub sharing the CA) registers nothing.
#[tokio::test]
async fn external_and_unenrolled_certificates_get_no_accounts_unless_granted() {
    let pki = Pki::new();
    let dir = data_dir("identity-fail-closed");
    let hub = start_hub(&pki, &dir, |c| {
        serve_https(&pki, c);
        c.agents.allow = vec![AllowRule::parse("agent-b.test=shared").unwrap()];
    })
    .await;
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let admin = admin_token(&dir);

    // An external identity no rule names: nothing.
    let mut a = connect(&hub, &pki, Some(pki.client("agent-a.test")), None, "a-1")
        .await
        .unwrap();
    let rejected = a.register("prod", HOST).await;
    assert_eq!(rejected.role, Role::Rejected as i32);
    assert!(
        rejected.reason.contains("no --allow rule matches"),
        "{}",
        rejected.reason
    );
    // The rule's identity and name: granted.
    let mut b = connect(&hub, &pki, Some(pki.client("agent-b.test")), None, "b-1")
        .await
        .unwrap();
    assert_eq!(
        b.register("shared", HOST).await.role,
        Role::Streaming as i32
    );

    // The hub enrols prod-agent; an operator-signed certificate naming prod-agent is refused.
    let (_, _) = enrolled(&hub, &pki, &http, &admin, "prod-agent", "prod").await;
    refused(
        connect(&hub, &pki, Some(pki.client("prod-agent")), None, "x").await,
        Code::PermissionDenied,
        &["belongs to this hub", "external CA (--client-ca)"],
    );
    hub.shutdown().await.unwrap();

    // Without any --allow rule, an external identity registers nothing, and is told what
    // rule would let it.
    let dir2 = data_dir("identity-fail-closed-2");
    let shared_ca = AgentCaSource::Files {
        cert: dir.join("agent-ca.crt"),
        key: dir.join("agent-ca.key"),
    };
    let hub = start_hub(&pki, &dir2, |c| {
        serve_https(&pki, c);
        c.agents.allow = Vec::new();
        c.agents.agent_ca = shared_ca;
    })
    .await;
    let mut a = connect(&hub, &pki, Some(pki.client("agent-a.test")), None, "a-1")
        .await
        .unwrap();
    let rejected = a.register("prod", HOST).await;
    assert_eq!(rejected.role, Role::Rejected as i32);
    assert!(
        rejected.reason.contains("--allow 'agent-a.test=prod'"),
        "{}",
        rejected.reason
    );
    // A certificate of this hub's CA (shared with the first hub) that this hub never
    // enrolled: it connects, and registers nothing.
    let http = Https::for_hub(&pki, &hub, Proto::H1);
    let first_hub_token = {
        // Enrolled at the first hub: issue the certificate from the shared CA directly.
        let ca = scale_agent_hub::agent_ca::AgentCa::load(
            &AgentCaSource::Files {
                cert: dir.join("agent-ca.crt"),
                key: dir.join("agent-ca.key"),
            },
            &dir,
        )
        .unwrap();
        let (key, csr_pem) = csr();
        let issued = ca
            .issue(&csr_pem, "staging-agent", Duration::from_secs(3600))
            .unwrap();
        (issued.certificate_pem, key.serialize_pem())
    };
    let mut s = connect(&hub, &pki, Some(first_hub_token.clone()), None, "s-1")
        .await
        .unwrap();
    let rejected = s.register("staging", HOST).await;
    assert_eq!(rejected.role, Role::Rejected as i32);
    assert!(
        rejected.reason.contains("holds no enrolment") && rejected.reason.contains("--once"),
        "{}",
        rejected.reason
    );
    let (_, csr_pem) = csr();
    refused(
        enroll(&hub, &pki, Some(first_hub_token), "", &csr_pem).await,
        Code::PermissionDenied,
        &["no enrolment"],
    );
    let _ = http;
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

/// F24: under --insecure-plaintext every agent is `anonymous`, which registers only what an
/// `--allow anonymous=...` rule names.
#[tokio::test]
async fn anonymous_agents_register_only_what_a_rule_names() {
    for (rules, granted) in [(Vec::new(), false), (vec!["anonymous=dev"], true)] {
        let dir = data_dir("identity-anonymous");
        let mut config = scale_agent_hub::Config::new(GrpcSecurity::InsecurePlaintext, &dir);
        config.listeners.grpc_addr = "127.0.0.1:0".parse().unwrap();
        config.listeners.http_addr = "127.0.0.1:0".parse().unwrap();
        config.agents.allow = rules.iter().map(|r| AllowRule::parse(r).unwrap()).collect();
        let hub = scale_agent_hub::start(config).await.unwrap();
        let channel = Endpoint::from_shared(format!("http://{}", hub.grpc_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let inbound = AgentHubClient::new(channel)
            .session(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut raw = FakeAgentRaw {
            tx,
            inbound,
            seq: 0,
        };
        raw.send(Msg::Hello(pb::Hello {
            replica: "r".into(),
            ..Default::default()
        }))
        .await;
        raw.send(Msg::RegisterAccount(pb::RegisterAccount {
            account: "dev".into(),
            cluster: Some(pb::ClusterInfo {
                api_server_host: HOST.into(),
                ca_fingerprint: "0a".into(),
                kubernetes_version: "v1.37.1".into(),
            }),
            ..Default::default()
        }))
        .await;
        let assignment = loop {
            if let Out::Assignment(a) = raw.next().await.unwrap() {
                break a;
            }
        };
        if granted {
            assert_eq!(assignment.role, Role::Streaming as i32, "{assignment:?}");
        } else {
            assert_eq!(assignment.role, Role::Rejected as i32);
            assert!(
                assignment.reason.contains("--allow 'anonymous=dev'"),
                "{}",
                assignment.reason
            );
        }
        hub.shutdown().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
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
