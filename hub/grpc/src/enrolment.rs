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
};
use scale_agent_hub_model::{error::Chain, store_op::StoreOp};
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
        Some(chain) if request.token.is_empty() => agent_renewal::renew_by_certificate(
            grpc.auth.client_certificates().as_deref(),
            grpc.auth.agent_ca(),
            grpc.settings.agent_cert_lifetime,
            chain,
            &request.csr_pem,
        )
        .map(|issued| issued_certificate(grpc, issued)),
        _ => enroll(grpc, request).await,
    };
    match &result {
        Ok(issued) => {
            tracing::info!(%peer, identity = %issued.identity, not_after = issued.not_after_unix, "certificate issued (enrolment or renewal by certificate)");
        }
        Err(status) => {
            tracing::warn!(%peer, code = ?status.code(), reason = status.message(), "enrolment or renewal refused");
        }
    }
    result.map(|certificate| {
        Response::new(pb::EnrollResponse {
            certificate: Some(certificate),
        })
    })
}

/// Checks an enrolment token and a CSR, issues the certificate, and marks the token used
/// (stored durably) before answering.
async fn enroll(
    grpc: &GrpcState,
    request: pb::EnrollRequest,
) -> Result<pb::IssuedCertificate, Status> {
    if request.token.is_empty() {
        return Err(Status::unauthenticated(
            "Enroll needs a one-time enrolment token (`scale-agent-hub agent-token create \
             --identity <id> --accounts <pattern> --ttl 1h --once`)",
        ));
    }
    // The store lock is held from the check to the durable commit, so two enrolments with
    // one token cannot both succeed.
    let mut store = grpc.store.lock().await;
    // Replicas sharing a store: the token as the store holds it now (issued, used or
    // revoked through another replica).
    sync::learn_agent_token(&grpc.replicas, &grpc.auth, &request.token, true).await;
    let now = jiff::Timestamp::now().as_second();
    let record = grpc
        .auth
        .agent_tokens()
        .check(&request.token, AgentTokenKind::Enrolment, now)
        .map_err(|r| r.to_status())?
        .clone();
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
    Ok(issued_certificate(grpc, issued))
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

/// Answers a RenewCertificate (sent on a stream): a certificate for the stream's identity, for a stream that a
/// certificate of the hub authenticated.
pub(super) fn renew(
    grpc: &GrpcState,
    auth: &Authenticated,
    csr_pem: &str,
) -> pb::CertificateRenewal {
    if auth.certificate != Some(CertificateOrigin::Hub) {
        return pb::CertificateRenewal {
            certificate: None,
            refused: format!(
                "identity {:?} authenticated with {}, not with a certificate this hub issued: \
                 renewal extends hub-issued certificates only; enrol with a one-time token \
                 (clouddriver.auth.enrolmentTokenFile) to get one",
                auth.identity, auth.via
            ),
        };
    }
    match grpc
        .auth
        .agent_ca()
        .issue(csr_pem, &auth.identity, grpc.settings.agent_cert_lifetime)
    {
        Ok(issued) => {
            tracing::info!(identity = %auth.identity, not_after = issued.not_after, "agent certificate renewed");
            pb::CertificateRenewal {
                certificate: Some(issued_certificate(grpc, issued)),
                refused: String::new(),
            }
        }
        Err(reason) => {
            tracing::warn!(identity = %auth.identity, %reason, "certificate renewal refused");
            pb::CertificateRenewal {
                certificate: None,
                refused: reason,
            }
        }
    }
}
