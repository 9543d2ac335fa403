//! The hub behind a TLS-terminating gRPC proxy that it trusts by the proxy's own client
//! certificate (`--trusted-proxy-identity` on a mutual-TLS hop): the hub in-process on
//! 127.0.0.1 with real TLS, and test clients playing the proxy, forwarding an agent's
//! certificate in Envoy's `x-forwarded-client-cert`. (The address-range mode runs behind a
//! real nginx in e2e/tests/grpc_proxy.rs.)

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use rcgen::ExtendedKeyUsagePurpose;
use scale_agent_hub::{
    GrpcSecurity, ProxyHopTls, ProxyMode, RunningHub,
    forwarded::{ForwardedFormat, ProxyTrust},
};
use scale_agent_proto::v1::{
    self as pb, agent_hub_client::AgentHubClient, agent_message::Kind as Msg,
    hub_message::Kind as Out,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Code, Status,
    metadata::MetadataValue,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity},
};

const XFCC: &str = "x-forwarded-client-cert";

/// Opens a stream as a proxy presenting `proxy_cert` (or none), forwarding `xfcc` (if any);
/// returns the identity in the hub's Welcome, or the refusal.
async fn hello(
    hub: &RunningHub,
    pki: &Pki,
    proxy_cert: Option<&(String, String)>,
    xfcc: Option<String>,
) -> Result<String, Status> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = proxy_cert {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", hub.grpc_addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("connect: {e:?}")))?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::AgentMessage {
        seq: 1,
        kind: Some(Msg::Hello(pb::Hello {
            replica: "r".into(),
            agent_version: "test".into(),
            capabilities: Vec::new(),
            session_token: String::new(),
            heartbeat_period_seconds: 0,
        })),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(value) = xfcc {
        request
            .metadata_mut()
            .insert(XFCC, MetadataValue::try_from(value).unwrap());
    }
    let mut stream = tokio::time::timeout(WAIT, AgentHubClient::new(channel).session(request))
        .await
        .expect("no response head")?
        .into_inner();
    loop {
        let message = tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("no Welcome")?
            .expect("the stream ended before Welcome");
        if let Some(Out::Welcome(welcome)) = message.kind {
            return Ok(welcome.identity);
        }
    }
}

/// An XFCC element as Envoy writes it with `set_current_client_cert_details: {cert: true}`.
fn xfcc_element(cert_pem: &str) -> String {
    format!(
        "By=spiffe://cluster.local/ns/spinnaker/sa/scale-agent-hub;\
         Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;\
         Cert=\"{}\";Subject=\"CN=agent\";DNS=agent",
        utf8_percent_encode(cert_pem, NON_ALPHANUMERIC)
    )
}

#[tokio::test]
async fn a_proxy_is_trusted_by_its_client_certificate() {
    let pki = Pki::new();
    let proxies = ca("scale-agent-proxies");
    let dir = data_dir("grpc-proxy-identity");
    let trust = ProxyTrust::new(
        ForwardedFormat::Xfcc,
        None,
        pki.ca_pem.as_bytes(),
        Vec::new(),
        vec!["grpc-proxy.spinnaker".into()],
    )
    .unwrap();
    let proxy_ca_pem = proxies.pem().into_bytes();
    let hub = start_hub(&pki, &dir, |config| {
        config.agents.security = GrpcSecurity::TrustedProxy(ProxyMode {
            trust,
            client_ca_pem: pki.ca_pem.clone().into_bytes(),
            hop_tls: Some(ProxyHopTls {
                cert_pem: pki.server_cert_pem.clone().into_bytes(),
                key_pem: pki.server_key_pem.clone().into_bytes(),
                proxy_ca_pem: Some(proxy_ca_pem),
            }),
        });
    })
    .await;
    let proxy = leaf(
        &proxies,
        &["grpc-proxy.spinnaker"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let other = leaf(
        &proxies,
        &["sidecar.spinnaker"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let (agent_cert, _) = pki.client("agent-a.test");

    // The trusted proxy forwards the agent's certificate: the hub names the agent.
    let identity = hello(&hub, &pki, Some(&proxy), Some(xfcc_element(&agent_cert)))
        .await
        .unwrap();
    assert_eq!(identity, "agent-a.test");

    // Elements appended before the proxy's own are the proxy's clients' word: ignored.
    let (forged_cert, _) = pki.client("agent-b.test");
    let chain = format!(
        "{},{}",
        xfcc_element(&forged_cert),
        xfcc_element(&agent_cert)
    );
    let identity = hello(&hub, &pki, Some(&proxy), Some(chain)).await.unwrap();
    assert_eq!(identity, "agent-a.test");

    // Another certificate of the proxies' CA is not a trusted proxy.
    let status = hello(&hub, &pki, Some(&other), Some(xfcc_element(&agent_cert)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains(XFCC) && status.message().contains("--trusted-proxy-identity"),
        "{status:?}"
    );

    // The trusted proxy without the header: it is misconfigured.
    let status = hello(&hub, &pki, Some(&proxy), None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("set_current_client_cert_details"),
        "{status:?}"
    );

    // An agent's own certificate is not a proxy's: it is signed by another CA, and only
    // proxy identities are trusted, so the TLS hop itself refuses it.
    let agent = pki.client("agent-a.test");
    let refused = hello(&hub, &pki, Some(&agent), Some(xfcc_element(&agent_cert))).await;
    assert!(refused.is_err(), "accepted: {refused:?}");
    let refused = hello(&hub, &pki, None, Some(xfcc_element(&agent_cert))).await;
    assert!(
        refused.is_err(),
        "accepted without a certificate: {refused:?}"
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
