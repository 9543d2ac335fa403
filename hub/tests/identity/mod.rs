//! What the agent identity tests share (tests/agent_identities.rs,
//! tests/agent_fail_closed.rs): a hub that trusts only what it issues, enrolments through
//! the admin API, streams and refusals, and a bare protocol client.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use bytes::Bytes;
use rcgen::{CertificateParams, KeyPair};
use scale_agent_hub::{GrpcSecurity, RunningHub, identity::certificate_serial};
use scale_agent_proto::v1::{
    self as pb, agent_hub_client::AgentHubClient, agent_message::Kind as Msg,
    hub_message::Kind as Out,
};
use serde_json::Value;
use tonic::{Code, Status};

use super::common::*;

pub const HOST: &str = "https://10.0.0.1:6443";

/// A hub that trusts only the certificates it issues (no --client-ca), with the admin API.
pub async fn hub_of_its_own(pki: &Pki, dir: &std::path::Path) -> (RunningHub, Https, String) {
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

pub async fn post(http: &Https, admin: &str, path: &str) -> (u16, Value) {
    let reply = http.with_token("POST", path, admin, Bytes::new()).await;
    let status = reply.status;
    let text = reply.text();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Issues an agent token through the admin API; returns the token.
pub async fn agent_token(http: &Https, admin: &str, query: &str) -> String {
    let (status, body) = post(http, admin, &format!("/api/v1/agent-tokens?{query}")).await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_string()
}

/// A fresh key and a CSR for it.
pub fn csr() -> (KeyPair, String) {
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
pub async fn enroll(
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
pub async fn enrolled(
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

pub fn serial_of(pem: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    certificate_serial(&pem.contents).unwrap()
}

pub async fn connect(
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

pub fn refused<T>(result: Result<T, Status>, code: Code, needles: &[&str]) -> Status {
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
pub async fn renew_on_stream(a: &mut FakeAgent, csr_pem: &str) -> pb::CertificateRenewal {
    a.send(Msg::RenewCertificate(pb::RenewCertificate {
        csr_pem: csr_pem.into(),
    }))
    .await;
    while a.renewals.is_empty() {
        a.pump().await.unwrap();
    }
    a.renewals.pop_front().unwrap()
}

/// A stream as a bare protocol client (for streams through a proxy).
pub struct FakeAgentRaw {
    pub tx: tokio::sync::mpsc::Sender<pb::AgentMessage>,
    pub inbound: tonic::Streaming<pb::HubMessage>,
    pub seq: u64,
}

impl FakeAgentRaw {
    pub async fn send(&mut self, kind: Msg) {
        self.seq += 1;
        self.tx
            .send(pb::AgentMessage {
                seq: self.seq,
                kind: Some(kind),
            })
            .await
            .unwrap();
    }

    pub async fn next(&mut self) -> Result<Out, Status> {
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

    pub async fn renew(&mut self, csr_pem: &str) -> pb::CertificateRenewal {
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
