//! Certificates for agents: the Enroll RPC (a one-time enrolment token and a CSR, or a
//! renewal by the client certificate the agent presents) and RenewCertificate on an
//! authenticated stream. The checks and signing are the auth crate's
//! ([`scale_agent_hub_auth::agent_ca`], [`scale_agent_hub_auth::agent_renewal`]); this is
//! their gRPC side.

use scale_agent_hub_auth::{
    agent_auth::{Authenticated, CertificateOrigin},
    agent_ca::Issued,
    agent_renewal,
    agent_tokens::AgentTokenKind,
    identity_states,
};
use scale_agent_hub_model::{error::Chain, identity::identity_from_der, store_op::StoreOp};
use scale_agent_hub_replicas::sync;
use scale_agent_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::GrpcState;

/// Answers Enroll: a certificate for an enrolment token, or for the client certificate
/// presented with no token (a renewal).
pub(super) async fn answer(
    grpc: &GrpcState,
    request: Request<pb::EnrollRequest>,
) -> Result<Response<pb::EnrollResponse>, Status> {
    let peer = request
        .remote_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let peer_certs = request.peer_certs();
    let request = request.into_inner();
    // An empty token with a client certificate is a renewal (item 9 of the contract).
    let result = match peer_certs.as_deref().filter(|chain| !chain.is_empty()) {
        Some(chain) if request.token.is_empty() => {
            renew_by_certificate(grpc, chain, &request.csr_pem).await
        }
        _ => enroll(grpc, request).await,
    };
    match &result {
        Ok((issued, serial)) => {
            tracing::info!(%peer, identity = %issued.identity, %serial, not_after = issued.not_after_unix, "certificate issued (enrolment or renewal by certificate)");
        }
        Err(status) => {
            tracing::warn!(%peer, code = ?status.code(), reason = status.message(), "enrolment or renewal refused");
        }
    }
    result.map(|(certificate, _)| {
        Response::new(pb::EnrollResponse {
            certificate: Some(certificate),
        })
    })
}

/// Replicas sharing a store: `identity`'s state (disabled, certificates denied) and
/// enrolment as the store holds them now, in place of this replica's, before a stream,
/// an enrolment or a renewal of it is decided. A read that fails refuses (issue 28, F7):
/// the hub cannot tell whether an admin disabled the identity.
pub(super) async fn refresh_identity(grpc: &GrpcState, identity: &str) -> Result<(), Status> {
    let Some(shared) = &grpc.replicas.shared else {
        return Ok(());
    };
    let unavailable = |e: scale_agent_hub_model::HubError| {
        Status::unavailable(format!(
            // troubleshooting: an agent's stream, enrolment or renewal refused: gRPC `UNAVAILABLE`
            // With several replicas the hub reads an identity's state (disabled, denied
            // certificates) from PostgreSQL before admitting it, and refuses when it cannot; the
            // agent retries. Check the store's health.
            "the hub cannot read the state of agent identity {identity:?} from its shared store \
             ({}), and refuses rather than admit an identity an admin may have disabled; the \
             agent tries again",
            Chain(&e)
        ))
    };
    let state = shared
        .find_identity_state(identity)
        .await
        .map_err(unavailable)?;
    grpc.auth.identity_states().learn(identity, state);
    if let Some(enrolled) = shared.find_enrolled(identity).await.map_err(unavailable)? {
        grpc.auth.agent_tokens().learn_enrolled(enrolled);
    }
    Ok(())
}

/// Enroll with no token and a client certificate: a certificate for the certificate's
/// identity, if its state, serial and enrolment allow a renewal.
async fn renew_by_certificate(
    grpc: &GrpcState,
    chain: &[tonic::transport::CertificateDer<'static>],
    csr_pem: &str,
) -> Result<(pb::IssuedCertificate, String), Status> {
    if let Some(identity) = chain
        .first()
        .and_then(|leaf| identity_from_der(leaf.as_ref()).ok())
    {
        refresh_identity(grpc, &identity).await?;
    }
    agent_renewal::renew_by_certificate(
        grpc.auth.client_certificates().as_deref(),
        grpc.auth.agent_ca(),
        grpc.settings.renewal_policy(),
        chain,
        csr_pem,
        |identity| {
            (
                grpc.auth.identity_states().get(identity).cloned(),
                grpc.auth.agent_tokens().enrolled(identity).cloned(),
            )
        },
    )
    .map(|issued| {
        let serial = issued.serial.clone();
        (issued_certificate(grpc, issued), serial)
    })
}

/// Checks an enrolment token and a CSR, issues the certificate, and marks the token used
/// (stored durably) before answering.
async fn enroll(
    grpc: &GrpcState,
    request: pb::EnrollRequest,
) -> Result<(pb::IssuedCertificate, String), Status> {
    if request.token.is_empty() {
        return Err(Status::unauthenticated(
            "Enroll needs a one-time enrolment token (`scale-agent-hub agent-token create \
             --identity <id> --accounts <pattern> --ttl 1h --once`)",
        ));
    }
    // The token is learnt from the shared store and checked before the store lock: an
    // unknown or spent token (anyone reaching the port may send one, review F10) never
    // waits for the lock nor holds up the commits and enrolments queued behind it.
    sync::learn_agent_token(&grpc.replicas, &grpc.auth, &request.token, true).await;
    let record = check_enrolment_token(grpc, &request.token)?;
    // A disabled identity enrols with no token (a token issued before the admin disabled
    // it, or one issued by mistake since).
    refresh_identity(grpc, &record.identity).await?;
    // The store lock is held from the re-check to the durable commit, so two enrolments
    // with one token cannot both succeed: the one that takes the lock second finds the
    // token used in memory.
    let mut store = grpc.store.lock().await;
    let record = check_enrolment_token(grpc, &request.token)?;
    let now = jiff::Timestamp::now().as_second();
    identity_states::check(
        grpc.auth.identity_states().get(&record.identity),
        &record.identity,
        None,
    )
    .map_err(Status::permission_denied)?;
    let issued = grpc
        .auth
        .agent_ca()
        .issue(
            &request.csr_pem,
            &record.identity,
            grpc.settings.agent_cert_lifetime,
        )
        .map_err(Status::invalid_argument)?;
    let ops = grpc.auth.agent_tokens().consume(&record.id, now);
    // Once across replicas: the token is marked used in the store only if no replica did
    // first (the store's lock above serializes this replica's enrolments only).
    if let Some(shared) = &grpc.replicas.shared {
        let used = ops.iter().find_map(|op| match op {
            StoreOp::PutAgentToken { record } => Some(record.clone()),
            _ => None,
        });
        if let Some(used) = used {
            let claimed = shared.claim_enrolment(&used).await.map_err(|e| {
                Status::unavailable(format!(
                    "the hub could not store the enrolment: {}",
                    Chain(&e)
                ))
            })?;
            if !claimed {
                return Err(Status::permission_denied(format!(
                    "enrolment token {} was already used through another hub replica (an                      enrolment token works once); ask the hub's admin for a new one                      (`scale-agent-hub agent-token create --once`)",
                    record.id
                )));
            }
        }
    }
    store.commit(ops).await.map_err(|e| {
        Status::internal(format!(
            "the hub could not store the enrolment: {}",
            Chain(&e)
        ))
    })?;
    let serial = issued.serial.clone();
    Ok((issued_certificate(grpc, issued), serial))
}

/// The enrolment token's record if `token` is an enrolment token this replica holds,
/// unused and unexpired now; the refusal saying why not otherwise.
fn check_enrolment_token(
    grpc: &GrpcState,
    token: &str,
) -> Result<scale_agent_hub_model::records::AgentTokenRecord, Status> {
    let now = jiff::Timestamp::now().as_second();
    grpc.auth
        .agent_tokens()
        .check(token, AgentTokenKind::Enrolment, now)
        .cloned()
        .map_err(|r| r.to_status())
}

/// The answer carrying a certificate the agent CA issued.
fn issued_certificate(grpc: &GrpcState, issued: Issued) -> pb::IssuedCertificate {
    pb::IssuedCertificate {
        certificate_chain_pem: issued.certificate_pem,
        ca_pem: grpc.auth.agent_ca().cert_pem().to_string(),
        identity: issued.identity,
        not_after_unix: issued.not_after,
    }
}

/// Answers a RenewCertificate (sent on a stream): a certificate for the stream's identity,
/// for a stream that a certificate of the hub authenticated, presented by its holder (not
/// forwarded by a proxy trusted by address only: F5), whose identity is enabled, whose
/// certificate is not denied and whose enrolment is younger than the maximum age (F4).
pub(super) async fn renew(
    grpc: &GrpcState,
    auth: &Authenticated,
    csr_pem: &str,
) -> pb::CertificateRenewal {
    let refused = |reason: String| {
        tracing::warn!(identity = %auth.identity, %reason, "certificate renewal refused");
        pb::CertificateRenewal {
            certificate: None,
            refused: reason,
        }
    };
    if auth.certificate != Some(CertificateOrigin::Hub) {
        return refused(format!(
            // troubleshooting: certificate renewal on the stream refused: `CertificateRenewal.refused`
            // The agent authenticated with a bearer token or an operator-signed certificate, so
            // there is no hub-issued certificate to renew.
            "identity {:?} authenticated with {}, not with a certificate this hub issued: \
             renewal extends hub-issued certificates only; enrol with a one-time token \
             (clouddriver.auth.enrolmentTokenFile) to get one",
            auth.identity, auth.via
        ));
    }
    if !auth.key_proven() {
        return refused(format!(
            // troubleshooting: certificate renewal on the stream refused: `CertificateRenewal.refused`
            // Behind a TLS-terminating proxy trusted by address only, the forwarded certificate
            // proves nothing of the agent holding its key, so the hub renews nothing on that
            // stream.
            "the certificate of identity {:?} reached the hub in a header from a proxy trusted \
             by its address only, which proves nothing of the agent holding the key: the hub \
             renews no certificate on such a stream; trust the proxy by its client certificate \
             (--trusted-proxy-identity with --trusted-proxy-ca; the chart's \
             hub.grpcProxy.trustedProxyIdentities) or renew by Enroll directly",
            auth.identity
        ));
    }
    if let Err(status) = refresh_identity(grpc, &auth.identity).await {
        return refused(status.message().to_string());
    }
    let lifetime = agent_renewal::renewal_lifetime(
        &auth.identity,
        auth.serial.as_deref(),
        grpc.auth.identity_states().get(&auth.identity),
        grpc.auth.agent_tokens().enrolled(&auth.identity),
        grpc.settings.renewal_policy(),
        jiff::Timestamp::now().as_second(),
    );
    let lifetime = match lifetime {
        Ok(lifetime) => lifetime,
        Err(status) => return refused(status.message().to_string()),
    };
    match grpc
        .auth
        .agent_ca()
        .issue(csr_pem, &auth.identity, lifetime)
    {
        Ok(issued) => {
            tracing::info!(identity = %auth.identity, serial = %issued.serial, not_after = issued.not_after, "agent certificate renewed");
            pb::CertificateRenewal {
                certificate: Some(issued_certificate(grpc, issued)),
                refused: String::new(),
            }
        }
        Err(reason) => refused(reason),
    }
}
