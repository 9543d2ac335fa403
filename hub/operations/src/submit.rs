//! The driver of one submitted operation: picks a replica of the account, sends the
//! operation, waits up to the deadline, and tries another replica when the chosen one
//! cannot run it or leaves before answering (only when sending again is safe).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use scale_agent_hub_model::{auth::Submitter, records::SessionId};
use scale_agent_hub_state::{Live, dispatch};
use scale_agent_hub_store::Store;
use scale_agent_proto::v1 as pb;
use tokio::{sync::oneshot, time::error::Elapsed};

use super::{
    DEADLINE_GRACE, MAX_ATTEMPTS, OperationMetrics, OperationRequest, OperationResponse,
    OperationSettings, Operations, Outcome, State, Status, Subject, idempotent,
    registry::{Claim, Owner},
};

/// What the driver works with, handed over by the hub's wiring: the registry, the live state
/// it picks replicas from and sends operations through, the store it keeps client ids in
/// (see `persist`), its metrics and its settings. Cheap to clone: clones share all of it.
#[derive(Clone)]
pub struct Driver {
    pub operations: Arc<Operations>,
    pub live: Arc<Live>,
    /// The store, locked only to write the record of a client id.
    pub store: Arc<tokio::sync::Mutex<Store>>,
    pub metrics: OperationMetrics,
    pub settings: OperationSettings,
}

/// Milliseconds since the Unix epoch of `now + d`.
pub fn deadline_millis(d: Duration) -> i64 {
    let now = jiff::Timestamp::now();
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(jiff::Timestamp::MAX)
        .as_millisecond()
}

/// The least time left with which an operation is sent to an agent.
const MIN_OPERATION: Duration = Duration::from_millis(scale_agent_proto::MIN_OPERATION_MILLIS);

/// How often a client id another replica runs is looked up in the store.
const STORED_POLL: Duration = Duration::from_millis(250);

/// What to do after one attempt.
enum Step {
    /// The operation's answer, with its HTTP code.
    Done(u16, OperationResponse),
    /// Try another replica. `note` says why this one gave no answer (for the body if none
    /// does); `fallback` is an answer to give if no other replica is left.
    TryNext {
        note: String,
        fallback: Option<(u16, OperationResponse)>,
    },
}

/// One submission: what every attempt and body of it shares.
struct Submission<'a> {
    driver: &'a Driver,
    /// The id the client gave (per account), or one the hub made.
    id: String,
    /// The id on the wire: unique in the hub, since client ids are only unique per account.
    wire_id: String,
    account: &'a str,
    /// Who submitted it ([`Submitter::key`]): its id is theirs.
    submitter: &'a str,
    kind: &'static str,
    idempotent: bool,
    timeout: Duration,
    deadline: Instant,
}

impl Submission<'_> {
    fn owner(&self) -> Owner<'_> {
        Owner {
            account: self.account,
            submitter: self.submitter,
        }
    }

    fn subject(&self) -> Subject<'_> {
        Subject {
            id: &self.id,
            account: self.account,
            op_type: self.kind,
        }
    }

    /// A body the hub answers on its own.
    fn hub_made(
        &self,
        state: State,
        executed: bool,
        status: Status,
        attempts: usize,
    ) -> OperationResponse {
        OperationResponse::hub_made(self.subject(), state, executed, status, attempts)
    }

    /// No replica (left) to try until the deadline: why, from what each attempt ran into.
    fn no_agent(&self, notes: &[String], attempts: usize) -> (u16, OperationResponse) {
        let account = self.account;
        let waited = self.timeout.as_secs_f64();
        let message = if notes.is_empty() {
            format!(
                "no agent connected for account {account} within the operation's {waited:.0} s: \
                 wait for an agent replica to connect, or check the agents with GET /api/v1/agents"
            )
        } else {
            format!(
                "no agent connected for account {account} within the operation's {waited:.0} s: {}",
                notes.join("; ")
            )
        };
        let status = Status::new(503, "ServiceUnavailable", message);
        (503, self.hub_made(State::NoAgent, false, status, attempts))
    }

    /// The deadline leaves less than an operation needs to reach the cluster
    /// (`scale_agent_proto::MIN_OPERATION_MILLIS`): nothing is sent, so the answer is 504
    /// with `executed: false`, a retry with more time being safe. `None` while there is time
    /// enough.
    fn too_late(&self, attempts: usize) -> Option<(u16, OperationResponse)> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left >= MIN_OPERATION {
            return None;
        }
        let message = format!(
            "the {} operation's deadline ({:.3} s) left {} ms when it was to be sent to an \
             agent of account {}, less than the {} ms it needs to reach the cluster: it was \
             not sent and did not run, so retrying it is safe (with a longer timeoutSeconds)",
            self.kind,
            self.timeout.as_secs_f64(),
            left.as_millis(),
            self.account,
            MIN_OPERATION.as_millis(),
        );
        let status = Status::new(504, "Timeout", message);
        Some((504, self.hub_made(State::TimedOut, false, status, attempts)))
    }

    /// The replica left (or the attempt was dropped) before answering: resend when safe.
    fn dropped(&self, sent: bool, replica: &str, attempts: usize) -> Step {
        let (account, kind) = (self.account, self.kind);
        self.driver.metrics.retries.inc();
        if sent && !self.idempotent {
            let message = format!(
                "replica {replica} of account {account} disconnected before answering a \
                 {kind} operation it had been sent; it is not safe to resend, so whether \
                 it ran is unknown: check the cluster (e.g. with a get) before retrying"
            );
            let status = Status::new(503, "ServiceUnavailable", message);
            return Step::Done(503, self.hub_made(State::Failed, true, status, attempts));
        }
        tracing::info!(%replica, sent, "replica left before answering; trying another");
        Step::TryNext {
            note: format!(
                "replica {replica} disconnected before answering{}",
                if sent { "" } else { " (operation not sent)" }
            ),
            fallback: None,
        }
    }

    /// Turns what waiting on `replica` (the `attempts`th try) produced into the next step.
    fn interpret(
        &self,
        heard: Result<Result<Outcome, oneshot::error::RecvError>, Elapsed>,
        replica: &str,
        attempts: usize,
    ) -> Step {
        let account = self.account;
        match heard {
            Ok(Ok(Outcome::Result(result))) => {
                let code = result
                    .status
                    .as_ref()
                    .and_then(|s| u16::try_from(s.code).ok())
                    .filter(|c| (100..600).contains(c))
                    .unwrap_or(if result.ok { 200 } else { 500 });
                let body = OperationResponse::finished(self.subject(), &result, attempts);
                if !result.executed && code == 503 {
                    // The replica could not run it at all (its credentials are still
                    // loading, ...): another replica may.
                    let why = result
                        .status
                        .as_ref()
                        .map(|s| s.message.clone())
                        .unwrap_or_default();
                    return Step::TryNext {
                        note: format!("replica {replica}: {why}"),
                        fallback: Some((code, body)),
                    };
                }
                Step::Done(code, body)
            }
            Ok(Ok(Outcome::TooLarge { message })) => {
                // Not resent: the same result would be as large from any replica.
                let message = format!("account {account}, replica {replica}: {message}");
                let status = Status::new(413, "RequestEntityTooLarge", message);
                Step::Done(413, self.hub_made(State::Failed, true, status, attempts))
            }
            Ok(Ok(Outcome::Dropped { sent })) => self.dropped(sent, replica, attempts),
            // The attempt was dropped without a word: whether it was sent is unknown, so
            // it counts as sent (resent only when that is safe).
            Ok(Err(_)) => self.dropped(true, replica, attempts),
            Err(_) => {
                let sent = self.driver.operations.forget(&self.wire_id);
                let message = format!(
                    "account {account}: no result from replica {replica} within {:.0} s{}",
                    self.timeout.as_secs_f64(),
                    if sent {
                        "; the operation was sent, so it may have run"
                    } else {
                        ""
                    }
                );
                let status = Status::new(504, "Timeout", message);
                Step::Done(504, self.hub_made(State::TimedOut, sent, status, attempts))
            }
        }
    }

    /// Claims the client id in the store (see `persist::claim`); `Some` answer when another
    /// submission, on any replica, claimed it first: its outcome, waited for up to this
    /// submission's deadline while it runs. One still running then (on another replica,
    /// or on one that stopped before recording it) answers 503: whether it ran is unknown.
    async fn claimed_elsewhere(
        &self,
        waiting: &OperationResponse,
    ) -> Option<(u16, OperationResponse)> {
        use super::persist::{Stored, claim, stored_outcome};
        let (driver, account, id) = (self.driver, self.account, self.id.as_str());
        match claim(driver, self.owner(), id, waiting).await {
            Stored::Claimed => return None,
            Stored::Finished(code, body) => {
                tracing::info!(
                    code,
                    "client id already finished (stored): its first outcome, not run again"
                );
                return Some((code, *body));
            }
            Stored::Running => {}
        }
        let until = self.deadline + DEADLINE_GRACE;
        while Instant::now() < until {
            tokio::time::sleep(STORED_POLL).await;
            if let Some(answer) = stored_outcome(driver, self.owner(), id).await {
                return Some(answer);
            }
        }
        let message = format!(
            "operation {id:?} of account {account} was submitted before (possibly through \
             another hub replica, or one that stopped) and has no recorded outcome: whether \
             it ran is unknown, so it is not run again; check the cluster (e.g. with a get) \
             before submitting it again under a new id"
        );
        let status = Status::new(503, "ServiceUnavailable", message);
        Some((503, self.hub_made(State::Failed, true, status, 0)))
    }

    /// Picks a replica not in `tried` and queues the operation on its stream, both under
    /// the registry's read guard ([`dispatch::pick_and_queue`], as the proxy's requests):
    /// a draining replica gets it before the Ack of its UnregisterAccount, or is not picked
    /// (issue 27). The attempt is registered (and counts as sent) under that guard too, so
    /// its result, or the stream's end, is heard. The operation carries the time left when
    /// it is queued; with less than it needs to reach the cluster it is not sent (declined).
    /// Sent: the replica's `identity/replica` label and the attempt's receiver.
    async fn pick_and_queue(
        &self,
        operation: &pb::Operation,
        tried: &[SessionId],
    ) -> dispatch::Queued<(String, oneshot::Receiver<Outcome>), ()> {
        let pick = dispatch::Pick {
            account: self.account,
            tried,
            tunnel_only: false,
        };
        let operations = &self.driver.operations;
        dispatch::pick_and_queue(&self.driver.live, pick, |picked| {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left < MIN_OPERATION {
                return Err(());
            }
            let mut operation = operation.clone();
            operation.timeout_millis = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
            operation.deadline_unix_millis = deadline_millis(left);
            let replica = picked.registry.replica_label(picked.session);
            let rx = operations.register(&self.wire_id, picked.session);
            operations.mark_sent(&self.wire_id);
            let message = pb::HubMessage {
                kind: Some(pb::hub_message::Kind::Operation(operation)),
            };
            Ok((Ok(message), (replica, rx)))
        })
        .await
    }

    /// Whether the account has a replica not in `tried` (without advancing the rotation).
    fn has_untried_replica(&self, tried: &[SessionId]) -> bool {
        self.driver
            .live
            .registry_read()
            .replicas(self.account)
            .iter()
            .any(|s| !tried.contains(s))
    }

    /// Sends the operation to one replica after another until one answers (or none is
    /// left, or sending again is not safe), recording each attempt as running. With no
    /// replica to try, waits for one to connect until the deadline (Armory retries the
    /// same way), so a rolling restart or the hub's own restart does not fail the operation.
    async fn run(&self, operation: &pb::Operation) -> (u16, OperationResponse) {
        let retention = self.driver.settings.retention;
        let mut tried: Vec<SessionId> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        // An answer "could not run here" kept while other replicas are tried.
        let mut fallback: Option<(u16, OperationResponse)> = None;
        loop {
            let attempts = tried.len();
            if attempts >= MAX_ATTEMPTS {
                break fallback
                    .take()
                    .unwrap_or_else(|| self.no_agent(&notes, attempts));
            }
            let (session, replica, rx) = match self.pick_and_queue(operation, &tried).await {
                dispatch::Queued::Sent {
                    session,
                    made: (replica, rx),
                    ..
                } => (session, replica, rx),
                dispatch::Queued::NoAgent => {
                    if let Some(answer) = fallback.take() {
                        break answer;
                    }
                    let came = self
                        .driver
                        .live
                        .wait_for_replicas(self.deadline, || self.has_untried_replica(&tried))
                        .await;
                    if came {
                        continue;
                    }
                    break self.no_agent(&notes, attempts);
                }
                dispatch::Queued::Declined(..) => {
                    // Too little time left to send it (see `too_late`).
                    let answer = self
                        .too_late(attempts)
                        .unwrap_or_else(|| self.no_agent(&notes, attempts));
                    break fallback.take().unwrap_or(answer);
                }
                dispatch::Queued::Gone(session) => {
                    tried.push(session);
                    notes.push(format!(
                        "a replica (session {session}) left before the operation was sent"
                    ));
                    continue;
                }
            };
            tried.push(session);
            let running = OperationResponse::running(self.subject(), &replica, tried.len());
            self.driver
                .operations
                .record(self.owner(), &self.id, running, None, retention);
            let wait = self.deadline.saturating_duration_since(Instant::now()) + DEADLINE_GRACE;
            let heard = tokio::time::timeout(wait, rx).await;
            match self.interpret(heard, &replica, tried.len()) {
                Step::Done(code, body) => break (code, body),
                Step::TryNext { note, fallback: f } => {
                    notes.push(note);
                    if f.is_some() {
                        fallback = f;
                    }
                }
            }
        }
    }
}

/// Runs a submitted operation to its end: claims its id, picks a replica (waiting for one
/// up to the deadline), waits, retries when safe. Returns the HTTP status and the response
/// body (also recorded for lookups). A resubmitted id is not run again: a finished one
/// answers what it answered, a running one waits for that answer up to this submission's
/// deadline (202 with its running state when it has none by then).
///
/// The operation is `submitter`'s: a client id is claimed for them (the same id from another
/// caller is another operation), and lookups by another caller do not find it.
///
/// Its span names the account and, once known, the operation's id (the client's, or the
/// hub's) and the id on the wire.
#[tracing::instrument(name = "operation", skip_all, fields(%account, id = tracing::field::Empty, wire_id = tracing::field::Empty))]
pub async fn submit(
    driver: &Driver,
    account: &str,
    submitter: &Submitter,
    request: OperationRequest,
) -> (u16, OperationResponse) {
    let retention = driver.settings.retention;
    let checked = request.to_op().and_then(|op| Ok((op, request.timeout()?)));
    let (op, timeout) = match checked {
        Ok(checked) => checked,
        Err(message) => return (400, OperationResponse::bad_request(message)),
    };
    let started = Instant::now();
    let wire_id = driver.operations.new_id();
    let client_id = request.id.is_some();
    let submission = Submission {
        driver,
        id: request.id.clone().unwrap_or_else(|| wire_id.clone()),
        wire_id,
        account,
        submitter: &submitter.key,
        kind: op.name(),
        idempotent: idempotent(&op),
        timeout,
        deadline: started + timeout,
    };
    let id = submission.id.as_str();
    let span = tracing::Span::current();
    span.record("id", tracing::field::display(id));
    span.record("wire_id", tracing::field::display(&submission.wire_id));
    if !driver.live.registry_read().accounts.contains_key(account) {
        let message = format!(
            "no account {account:?}: no agent has registered it (or it was removed after \
             its grace period)"
        );
        let status = Status::new(404, "NotFound", message);
        return (404, submission.hub_made(State::NoAgent, false, status, 0));
    }
    let waiting = OperationResponse::running(submission.subject(), "", 0);
    let owner = submission.owner();
    match driver
        .operations
        .claim(owner, id, waiting.clone(), retention)
    {
        Claim::New => {
            // A client id is claimed in the store before anything is sent, so that after a
            // hub restart, or on another replica, the id is known (and, if it was still
            // running, not run again blindly).
            if client_id && let Some(answer) = submission.claimed_elsewhere(&waiting).await {
                driver
                    .operations
                    .record(owner, id, answer.1.clone(), Some(answer.0), retention);
                return answer;
            }
        }
        Claim::Finished(code, body) => return (code, body),
        Claim::Running(body) => {
            // Another submission runs this id: its answer is this one's too.
            let until = submission.deadline + DEADLINE_GRACE;
            return match driver.operations.wait_finished(owner, id, until).await {
                Some(answer) => answer,
                None => (202, body),
            };
        }
    }
    let operation = pb::Operation {
        id: submission.wire_id.clone(),
        account: account.to_string(),
        // Both set again when the operation is written to the stream (see `service`).
        deadline_unix_millis: deadline_millis(timeout),
        timeout_millis: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        list_continue: request.continue_token.clone().unwrap_or_default(),
        op: Some(op),
    };
    let (code, body) = submission.run(&operation).await;
    let (kind, state) = (submission.kind, body.state.as_str());
    driver.metrics.finished(kind, state);
    driver.metrics.took(kind, state, started.elapsed());
    tracing::info!(
        r#type = kind,
        state,
        code,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "operation finished"
    );
    driver
        .operations
        .record(owner, id, body.clone(), Some(code), retention);
    if client_id {
        super::persist::save(driver, owner, id, Some(code), &body).await;
    }
    (code, body)
}
