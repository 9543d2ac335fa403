//! The agent's client certificate for one reconcile: none over plaintext, enrolled with
//! (and renewed by) the hub, or signed by the operator. Apart from the reconcile, which
//! only stores the Secret planned here: this is the part that talks to the hub and handles
//! private keys.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use scale_agent_crds::{
    ScaleAgent,
    conditions::{DEGRADED, STATUS_TRUE},
    v1alpha1::{ClientCertificate, Enrolment},
};
use scale_agent_proto::v1::IssuedCertificate;

use crate::{
    controller::Context,
    desired, enrol,
    error::{Error, Result, kube_err},
    pki::{self, Ca, Decision},
    status::{self, CertificateState, Problem},
};

/// The certificate outcome of one reconcile.
pub(super) struct CertificatePlan {
    pub(super) state: CertificateState,
    pub(super) secret: Option<Secret>,
    pub(super) issued: Option<&'static str>,
    /// The identity in the certificate, for status.
    pub(super) identity: Option<String>,
    /// The enrolment token version presented to the hub in this reconcile, for status.
    pub(super) token_version: Option<String>,
}

impl CertificatePlan {
    fn without_secret(state: CertificateState) -> Self {
        Self {
            state,
            secret: None,
            issued: None,
            identity: None,
            token_version: None,
        }
    }
}

async fn get_secret(secrets: &Api<Secret>, name: String) -> Result<Option<Secret>> {
    secrets.get_opt(&name).await.map_err(kube_err(format!(
        "get Secret {}/{name}",
        secrets.namespace().unwrap_or_default()
    )))
}

/// A field of a Secret as UTF-8 text.
fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
}

/// A step of planning the certificate: its outcome, or the problem that fails the plan.
type Step<T> = std::result::Result<T, Problem>;

/// Records a certificate problem; the plan applies no Secret.
fn failed_plan(
    problems: &mut Vec<Problem>,
    reason: &'static str,
    message: String,
) -> CertificatePlan {
    problems.push(Problem {
        reason,
        message: message.clone(),
    });
    CertificatePlan::without_secret(CertificateState::Failed(message))
}

/// The agent's client certificate for this reconcile: none over plaintext, else the
/// hub-issued one (`spec.enrolment`), else one the operator signs (`spec.clientCertificate`,
/// when the operator allows it).
pub(super) async fn plan_certificate(
    agent: &ScaleAgent,
    ctx: &Context,
    secrets: &Api<Secret>,
    now: i64,
    problems: &mut Vec<Problem>,
) -> Result<CertificatePlan> {
    if agent.spec.hub.tls.insecure_plaintext {
        return Ok(CertificatePlan::without_secret(
            CertificateState::NotRequired,
        ));
    }
    if let Some(enrolment) = &agent.spec.enrolment {
        return plan_enrolment(agent, enrolment, secrets, now, problems).await;
    }
    let Some(spec) = &agent.spec.client_certificate else {
        return Ok(failed_plan(
            problems,
            "EnrolmentMissing",
            "spec.enrolment is required: set enrolment.tokenSecretRef.name to a Secret holding \
             a one-time enrolment token from the hub (`scale-agent-hub agent-token create \
             --once`)"
                .into(),
        ));
    };
    if !ctx.config.allow_operator_signed_certificates {
        return Ok(failed_plan(
            problems,
            "OperatorSignedCertificatesNotAllowed",
            // troubleshooting: ScaleAgent `Degraded=True`, reason `OperatorSignedCertificatesNotAllowed`
            // The ScaleAgent asks the operator to sign its agents' certificate, and the operator
            // runs without the opt-in: enrol through the hub with a one-time token instead.
            "spec.clientCertificate (a certificate the operator signs with a CA key held in \
             this cluster, for an identity chosen here) is refused: this operator runs without \
             --allow-operator-signed-certificates. Replace spec.clientCertificate with \
             spec.enrolment.tokenSecretRef naming a Secret with a one-time token from the hub \
             (`scale-agent-hub agent-token create --once`), or start the operator with \
             --allow-operator-signed-certificates (SCALE_AGENT_OPERATOR_ALLOW_OPERATOR_SIGNED_CERTIFICATES=true) \
             and trust its CA on the hub with --client-ca"
                .into(),
        ));
    }
    plan_operator_signed(agent, ctx, spec, secrets, now, problems).await
}

/// `spec.clientCertificate`: keeps the stored certificate while the issuer CA's decision
/// allows, else signs a new one with the issuer CA.
async fn plan_operator_signed(
    agent: &ScaleAgent,
    ctx: &Context,
    spec: &ClientCertificate,
    secrets: &Api<Secret>,
    now: i64,
    problems: &mut Vec<Problem>,
) -> Result<CertificatePlan> {
    let namespace = agent.namespace().unwrap_or_default();
    let Some(identity) = agent.client_identity() else {
        return Err(Error::MissingField("metadata.name"));
    };
    let lifetime = match ctx.config.certificate_lifetime_override {
        Some(lifetime) => lifetime,
        None => match spec.lifetime() {
            Ok(lifetime) => lifetime,
            Err(e) => return Ok(failed_plan(problems, "InvalidLifetime", e.to_string())),
        },
    };
    let ca = match read_issuer(agent, spec, secrets).await? {
        Ok(ca) => ca,
        Err(problem) => return Ok(failed_plan(problems, problem.reason, problem.message)),
    };
    let existing = secrets
        .get_opt(&desired::tls_secret_name(agent))
        .await
        .map_err(kube_err(format!(
            "get Secret {namespace}/{}",
            desired::tls_secret_name(agent)
        )))?;
    let existing_cert = existing.as_ref().and_then(|s| secret_text(s, "tls.crt"));
    let existing_key = existing.as_ref().and_then(|s| secret_text(s, "tls.key"));
    let decision = pki::decide(
        &ca,
        existing_cert.as_deref(),
        existing_key.as_deref(),
        &identity,
        now,
    );
    let (cert_pem, key_pem, info, issued) = match (decision, existing_cert, existing_key) {
        (Decision::Keep(info), Some(cert), Some(key)) => (cert, key, info, None),
        (decision, _, _) => {
            let reason = match decision {
                Decision::Issue(reason) => reason,
                Decision::Keep(_) => "NoCertificate",
            };
            let issued = ca
                .issue(&identity, lifetime, now)
                .map_err(Error::Certificate)?;
            (issued.cert_pem, issued.key_pem, issued.info, Some(reason))
        }
    };
    Ok(CertificatePlan {
        state: CertificateState::Valid {
            not_after: info.not_after,
            renew_at: info.renew_at(),
        },
        secret: Some(desired::tls_secret(
            agent,
            &cert_pem,
            &key_pem,
            &ca.cert_pem,
        )?),
        issued,
        identity: Some(identity),
        token_version: None,
    })
}

/// The issuer CA of `spec.clientCertificate`, from its Secret (certificate and PKCS#8 key).
async fn read_issuer(
    agent: &ScaleAgent,
    spec: &ClientCertificate,
    secrets: &Api<Secret>,
) -> Result<Step<Ca>> {
    let namespace = agent.namespace().unwrap_or_default();
    let issuer = &spec.issuer_secret_ref;
    let Some(issuer_secret) = secrets
        .get_opt(&issuer.name)
        .await
        .map_err(kube_err(format!("get Secret {namespace}/{}", issuer.name)))?
    else {
        return Ok(Err(Problem {
            // troubleshooting: ScaleAgent `Degraded=True`
            // In the operator-signed mode (`spec.clientCertificate`), the CA Secret that signs the
            // agent's certificate is missing.
            reason: "IssuerSecretNotFound",
            message: format!(
                "issuer Secret {} not found in namespace {namespace}: create it with the CA \
                 certificate under {} and its PKCS#8 private key under {} (a kubernetes.io/tls \
                 Secret fits), or fix spec.clientCertificate.issuerSecretRef",
                issuer.name, issuer.cert_key, issuer.key_key
            ),
        }));
    };
    let (Some(ca_cert), Some(ca_key)) = (
        secret_text(&issuer_secret, &issuer.cert_key),
        secret_text(&issuer_secret, &issuer.key_key),
    ) else {
        return Ok(Err(Problem {
            reason: "IssuerSecretInvalid",
            message: format!(
                // troubleshooting: ScaleAgent `Degraded=True`, reason `IssuerSecretInvalid`
                // The issuer Secret lacks the CA certificate or its key under the keys
                // `spec.clientCertificate.issuerSecretRef` names.
                "issuer Secret {} in namespace {namespace} lacks key {} or {}: add the PEM CA \
                 certificate and its PKCS#8 private key under them",
                issuer.name, issuer.cert_key, issuer.key_key
            ),
        }));
    };
    Ok(Ca::from_pem(&ca_cert, &ca_key).map_err(|reason| Problem {
        reason: "IssuerSecretInvalid",
        message: format!(
            "issuer Secret {} in namespace {namespace} cannot sign: {reason}",
            issuer.name
        ),
    }))
}

/// `spec.enrolment`: keeps the hub-issued certificate, renews it by certificate from 2/3 of
/// its lifetime, or enrols with the token (each version of the token Secret once).
async fn plan_enrolment(
    agent: &ScaleAgent,
    enrolment: &Enrolment,
    secrets: &Api<Secret>,
    now: i64,
    problems: &mut Vec<Problem>,
) -> Result<CertificatePlan> {
    let hub = match hub_endpoint(agent, secrets).await? {
        Ok(hub) => hub,
        Err(problem) => return Ok(failed_plan(problems, problem.reason, problem.message)),
    };
    let stored = StoredCertificate::read(agent, secrets).await?;
    match enrol::decide(&stored.current(), now) {
        enrol::Decision::Keep(info) => stored.kept(agent, &info),
        enrol::Decision::Renew(info) => {
            renew(agent, enrolment, &hub, &stored, &info, now, problems).await
        }
        enrol::Decision::Enrol(reason) => {
            enrol_with_token(agent, enrolment, &hub, secrets, reason, now, problems).await
        }
    }
}

/// The hub to enrol with; the CA of its serving certificate comes from
/// `spec.hub.tls.caSecretRef` when that is set, and must be there.
async fn hub_endpoint(
    agent: &ScaleAgent,
    secrets: &Api<Secret>,
) -> Result<Step<enrol::HubEndpoint>> {
    let namespace = agent.namespace().unwrap_or_default();
    let hub_ca_pem = match &agent.spec.hub.tls.ca_secret_ref {
        None => None,
        Some(r) => match get_secret(secrets, r.name.clone())
            .await?
            .and_then(|s| secret_text(&s, &r.key))
        {
            Some(pem) => Some(pem),
            None => {
                return Ok(Err(Problem {
                    // troubleshooting: ScaleAgent `Degraded=True`
                    // The operator checks the hub's serving certificate when it enrols the agent,
                    // with the CA of `spec.hub.tls.caSecretRef`; that Secret or key is missing.
                    reason: "HubCaSecretNotFound",
                    message: format!(
                        "Secret {} with key {} (spec.hub.tls.caSecretRef) not found in \
                         namespace {namespace}: create it with the CA of the hub's serving \
                         certificate, which the operator needs to enrol the agent",
                        r.name, r.key
                    ),
                }));
            }
        },
    };
    Ok(Ok(enrol::HubEndpoint {
        address: agent.spec.hub.address.clone(),
        server_name: agent.spec.hub.tls.server_name.clone(),
        ca_pem: hub_ca_pem,
    }))
}

/// The agent's certificate Secret as it is stored: its PEM fields, and whether the hub
/// issued it (only a hub-issued certificate is kept or renewed).
struct StoredCertificate {
    cert: Option<String>,
    key: Option<String>,
    ca: Option<String>,
    hub_issued: bool,
}

impl StoredCertificate {
    async fn read(agent: &ScaleAgent, secrets: &Api<Secret>) -> Result<Self> {
        let existing = get_secret(secrets, desired::tls_secret_name(agent)).await?;
        let field = |key: &str| existing.as_ref().and_then(|s| secret_text(s, key));
        Ok(Self {
            cert: field("tls.crt"),
            key: field("tls.key"),
            ca: field("ca.crt"),
            hub_issued: existing.as_ref().is_some_and(|s| {
                s.annotations()
                    .get(enrol::ISSUED_BY_ANNOTATION)
                    .map(String::as_str)
                    == Some(enrol::ISSUED_BY_HUB)
            }),
        })
    }

    fn current(&self) -> enrol::Current<'_> {
        enrol::Current {
            cert_pem: self.cert.as_deref(),
            key_pem: self.key.as_deref(),
            ca_pem: self.ca.as_deref(),
            hub_issued: self.hub_issued,
        }
    }

    /// The plan that keeps this certificate, valid as `info` says.
    fn kept(&self, agent: &ScaleAgent, info: &pki::CertificateInfo) -> Result<CertificatePlan> {
        Ok(CertificatePlan {
            state: valid(info),
            secret: Some(hub_secret(
                agent,
                self.cert.as_deref().unwrap_or_default(),
                self.key.as_deref().unwrap_or_default(),
                self.ca.as_deref().unwrap_or_default(),
            )?),
            issued: None,
            identity: info.common_name.clone(),
            token_version: None,
        })
    }
}

fn valid(info: &pki::CertificateInfo) -> CertificateState {
    CertificateState::Valid {
        not_after: info.not_after,
        renew_at: info.renew_at(),
    }
}

/// The certificate Secret of a hub-issued certificate, annotated as such so that later
/// reconciles keep and renew it.
fn hub_secret(agent: &ScaleAgent, cert: &str, key: &str, ca: &str) -> Result<Secret> {
    let mut secret = desired::tls_secret(agent, cert, key, ca)?;
    secret.annotations_mut().insert(
        enrol::ISSUED_BY_ANNOTATION.into(),
        enrol::ISSUED_BY_HUB.into(),
    );
    Ok(secret)
}

/// The plan that stores the certificate the hub just issued for `key`.
fn issued_plan(
    agent: &ScaleAgent,
    issued: IssuedCertificate,
    key: &str,
    reason: &'static str,
    token_version: Option<String>,
    now: i64,
) -> Result<CertificatePlan> {
    let not_before = pki::parse(&issued.certificate_chain_pem)
        .map(|i| i.not_before)
        .unwrap_or(now);
    let info = pki::CertificateInfo {
        common_name: Some(issued.identity.clone()),
        dns_names: vec![issued.identity.clone()],
        not_before,
        not_after: issued.not_after_unix,
    };
    Ok(CertificatePlan {
        state: valid(&info),
        secret: Some(hub_secret(
            agent,
            &issued.certificate_chain_pem,
            key,
            &issued.ca_pem,
        )?),
        issued: Some(reason),
        identity: Some(issued.identity),
        token_version,
    })
}

/// Renews by certificate (the stored one is the TLS client identity, no token needed).
async fn renew(
    agent: &ScaleAgent,
    enrolment: &Enrolment,
    hub: &enrol::HubEndpoint,
    stored: &StoredCertificate,
    info: &pki::CertificateInfo,
    now: i64,
    problems: &mut Vec<Problem>,
) -> Result<CertificatePlan> {
    let (new_key, csr) = enrol::key_and_csr(&agent.name_any()).map_err(Error::Certificate)?;
    let client = (
        stored.cert.as_deref().unwrap_or_default(),
        stored.key.as_deref().unwrap_or_default(),
    );
    match enrol::enroll(hub, "", &csr, Some(client)).await {
        Ok(issued) => issued_plan(agent, issued, &new_key, "Renewal", None, now),
        Err(failure) => {
            // The current certificate still works: keep it, report, retry.
            problems.push(Problem {
                // troubleshooting: ScaleAgent `Degraded=True`
                // Renewing the hub-issued certificate failed; the current certificate still works
                // and the operator retries. The message carries the hub's reason (a disabled
                // identity, an enrolment past `--agent-max-enrolment-age`, the hub unreachable) and
                // what to do.
                reason: "CertificateRenewalFailed",
                message: format!(
                    "renewing the agent certificate (valid until {}) failed: {}",
                    status::rfc3339(info.not_after),
                    enrol::failure_message(
                        &failure,
                        &hub.address,
                        &agent.namespace().unwrap_or_default(),
                        &enrolment.token_secret_ref.name,
                        &enrolment.token_secret_ref.key,
                    )
                ),
            });
            stored.kept(agent, info)
        }
    }
}

/// Enrols with the token, because of `reason` (no certificate, or one the hub can no longer
/// renew). A refusal records the token's version when the hub saw the token, so that the
/// same version is never presented again.
async fn enrol_with_token(
    agent: &ScaleAgent,
    enrolment: &Enrolment,
    hub: &enrol::HubEndpoint,
    secrets: &Api<Secret>,
    reason: &'static str,
    now: i64,
    problems: &mut Vec<Problem>,
) -> Result<CertificatePlan> {
    let (token, version) = match read_token(agent, enrolment, secrets, reason).await? {
        Ok(token) => token,
        Err(problem) => return Ok(failed_plan(problems, problem.reason, problem.message)),
    };
    let (new_key, csr) = enrol::key_and_csr(&agent.name_any()).map_err(Error::Certificate)?;
    match enrol::enroll(hub, &token, &csr, None).await {
        Ok(issued) => issued_plan(agent, issued, &new_key, reason, Some(version), now),
        Err(failure) => {
            let token_ref = &enrolment.token_secret_ref;
            let message = enrol::failure_message(
                &failure,
                &hub.address,
                &agent.namespace().unwrap_or_default(),
                &token_ref.name,
                &token_ref.key,
            );
            let mut plan = failed_plan(problems, "EnrolmentRefused", message);
            if failure.token_seen() {
                plan.token_version = Some(version);
            }
            Ok(plan)
        }
    }
}

/// The enrolment token and its version, unless its Secret or key is missing or this version
/// was presented to the hub already.
async fn read_token(
    agent: &ScaleAgent,
    enrolment: &Enrolment,
    secrets: &Api<Secret>,
    reason: &'static str,
) -> Result<Step<(String, String)>> {
    let namespace = agent.namespace().unwrap_or_default();
    let token_ref = &enrolment.token_secret_ref;
    let Some(token_secret) = get_secret(secrets, token_ref.name.clone()).await? else {
        return Ok(Err(Problem {
            // troubleshooting: ScaleAgent `Degraded=True`
            // The agent has no hub-issued certificate yet and the Secret that should hold its
            // one-time enrolment token (`spec.enrolment.tokenSecretRef`) does not exist. Issue a
            // token on the hub (`scale-agent-hub agent-token create --identity … --accounts '…'
            // --ttl 1h --once`) and put it in that Secret.
            reason: "EnrolmentTokenSecretNotFound",
            message: format!(
                "enrolment token Secret {} not found in namespace {namespace} \
                 (spec.enrolment.tokenSecretRef): {}",
                token_ref.name,
                new_token_hint(agent, enrolment)
            ),
        }));
    };
    let Some(token) = secret_text(&token_secret, &token_ref.key)
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
    else {
        return Ok(Err(Problem {
            // troubleshooting: ScaleAgent `Degraded=True`
            // The enrolment token Secret exists but holds no token under the key
            // `spec.enrolment.tokenSecretRef` names.
            reason: "EnrolmentTokenMissing",
            message: format!(
                "Secret {namespace}/{} has no key {} with an enrolment token: {}",
                token_ref.name,
                token_ref.key,
                new_token_hint(agent, enrolment)
            ),
        }));
    };
    let version = enrol::token_version(&token_secret);
    if let Some(problem) = token_presented(agent, enrolment, &version, reason) {
        return Ok(Err(problem));
    }
    Ok(Ok((token, version)))
}

/// The problem when this version of the token was presented to the hub before: never
/// twice. The hub's earlier refusal stays as it was (reason and message), so the conditions
/// do not flip between reconciles; otherwise: the token is spent.
fn token_presented(
    agent: &ScaleAgent,
    enrolment: &Enrolment,
    version: &str,
    reason: &str,
) -> Option<Problem> {
    let presented = agent
        .status
        .as_ref()
        .and_then(|s| s.enrolment_token_version.as_deref());
    if presented != Some(version) {
        return None;
    }
    let previous = agent
        .status
        .as_ref()
        .and_then(|s| status::condition(&s.conditions, DEGRADED))
        .filter(|c| c.status == STATUS_TRUE && c.reason == "EnrolmentRefused")
        .map(|c| c.message.clone());
    Some(match previous {
        Some(message) => Problem {
            reason: "EnrolmentRefused",
            message,
        },
        None => Problem {
            // troubleshooting: ScaleAgent `Degraded=True`
            // An enrolment token works once, and this one was presented already; the agent needs a
            // new certificate (a new identity, an expired or lost certificate). Put a new one-time
            // token in the Secret.
            reason: "EnrolmentTokenUsed",
            message: format!(
                "the agent needs a new certificate ({reason}) but the enrolment token in \
                 Secret {}/{} was already presented to the hub: {}",
                agent.namespace().unwrap_or_default(),
                enrolment.token_secret_ref.name,
                new_token_hint(agent, enrolment)
            ),
        },
    })
}

/// What to do for a new token, for messages: the agent's identity once it has one.
fn new_token_hint(agent: &ScaleAgent, enrolment: &Enrolment) -> String {
    let identity = agent
        .status
        .as_ref()
        .and_then(|s| s.identity.clone())
        .unwrap_or_else(|| "<identity>".into());
    let token_ref = &enrolment.token_secret_ref;
    enrol::new_token_hint(
        &agent.namespace().unwrap_or_default(),
        &token_ref.name,
        &token_ref.key,
        &identity,
    )
}
