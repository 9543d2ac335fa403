//! Failing closed (issue 28: F5, F6, F7, F24), each as the review's attack against the
//! hub's real gRPC listener with real TLS and hub-issued certificates: no renewal of a
//! certificate an address-trusted proxy forwarded; certificates of --client-ca and the
//! `anonymous` identity get no accounts without an --allow rule, and cannot take an
//! identity the hub enrolled; a hub-CA certificate without an enrolment here gets nothing;
//! an `escaped-pem` header sent twice (a proxy that appends) refuses the stream (F22).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod identity;

use std::time::Duration;

use common::*;
use identity::*;
use rcgen::ExtendedKeyUsagePurpose;
use scale_agent_hub::{
    GrpcSecurity, ProxyHopTls, ProxyMode, RunningHub,
    agent_ca::AgentCaSource,
    forwarded::{Cidr, ForwardedFormat, ProxyTrust},
    identity::AllowRule,
};
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_hub_client::AgentHubClient,
    agent_message::Kind as Msg, hub_message::Kind as Out,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{
    Code, Status,
    metadata::MetadataValue,
    transport::{Certificate, ClientTlsConfig, Endpoint, Identity},
};

/// A stream through a proxy: the hub's gRPC port over plaintext (`hop`: `None`) or over a
/// mutual-TLS hop presenting `hop`, with the agent's certificate in `x-ssl-client-cert`
/// (one header line per certificate given: a proxy that appends sends two).
async fn forwarded_stream(
    hub: &RunningHub,
    pki: &Pki,
    hop: Option<&(String, String)>,
    agent_cert_pems: &[&str],
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
    for pem in agent_cert_pems {
        let encoded =
            percent_encoding::utf8_percent_encode(pem, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
        request.metadata_mut().append(
            "x-ssl-client-cert",
            MetadataValue::try_from(encoded).unwrap(),
        );
    }
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
    let mut stolen = forwarded_stream(&hub, &pki, None, &[&agent_cert])
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
    let mut proxied = forwarded_stream(&hub, &pki, Some(&proxy), &[&agent_cert])
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

/// F22: behind a proxy that appends its `x-ssl-client-cert` line to one the client sent,
/// the hub used to join the lines and take the first certificate, the client's choice. In
/// escaped-pem mode two values now refuse the stream, naming the header, whichever comes
/// first; one value still names its agent.
#[tokio::test]
async fn an_escaped_pem_header_sent_twice_refuses_the_stream() {
    let pki = Pki::new();
    let dir = data_dir("identity-escaped-pem-twice");
    let trust = ProxyTrust::new(
        ForwardedFormat::EscapedPem,
        None,
        pki.ca_pem.as_bytes(),
        vec![Cidr::parse("127.0.0.1/32").unwrap()],
        Vec::new(),
    )
    .unwrap();
    let hub = start_hub(&pki, &dir, |c| {
        c.agents.security = GrpcSecurity::TrustedProxy(ProxyMode {
            trust,
            client_ca_pem: pki.ca_pem.clone().into_bytes(),
            hop_tls: None,
        });
    })
    .await;
    let (chosen, _) = pki.client("agent-chosen.test");
    let (real, _) = pki.client("agent-real.test");
    for lines in [[&chosen, &real], [&real, &chosen]] {
        let lines = [lines[0].as_str(), lines[1].as_str()];
        let Err(status) = forwarded_stream(&hub, &pki, None, &lines).await else {
            panic!("two x-ssl-client-cert lines were accepted");
        };
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
        assert!(
            status.message().contains("x-ssl-client-cert") && status.message().contains("2 values"),
            "{}",
            status.message()
        );
    }
    let one = forwarded_stream(&hub, &pki, None, &[&real]).await;
    assert!(
        one.is_ok(),
        "one line is a proxy that replaces: {:?}",
        one.err()
    );
    drop(one);
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
