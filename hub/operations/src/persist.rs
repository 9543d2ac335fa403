//! Operations submitted with a client id, kept in the store for the retention period, so a
//! hub restart does not forget which ids ran: a resubmitted id answers its recorded outcome
//! instead of running again. The outcome is kept without its objects and text (they can be
//! read again from the cluster; the status says what happened). An id that was running when
//! the hub stopped answers that whether it ran is unknown.

use std::time::{Duration, Instant};

use scale_agent_hub_model::error::Chain;
use scale_agent_hub_store as store;
use serde::{Deserialize, Serialize};

use super::{Driver, OperationResponse, Operations, Owner, State, Status};

/// Writes between two sweeps of expired rows from the store.
const SWEEP_EVERY: u64 = 128;

/// One stored record.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    /// When it was recorded, milliseconds since the Unix epoch.
    at_unix_millis: i64,
    /// The HTTP code when finished; absent while running.
    code: Option<u16>,
    body: OperationResponse,
}

/// A record's key in the store: account, submitter and id, so that a client id is claimed
/// per caller across replicas too (F18). Rows of hubs before that have no submitter: they
/// are restored as nobody's (only an admin sees them), and claim no caller's id.
fn key(owner: Owner<'_>, id: &str) -> String {
    format!("{}\0{}\0{id}", owner.account, owner.submitter)
}

/// The owner and id of a stored key ([`key`], or an older `account\0id`).
fn parse_key(key: &str) -> Option<(Owner<'_>, &str)> {
    let (account, rest) = key.split_once('\0')?;
    let (submitter, id) = rest.split_once('\0').unwrap_or(("", rest));
    Some((Owner { account, submitter }, id))
}

/// Whether a stored row is past `retention` (a running row is kept as long as a finished one,
/// counting from when it started: nothing runs longer than the longest timeout).
fn expired(bytes: &[u8], retention: Duration, now: i64) -> bool {
    let Ok(row) = serde_json::from_slice::<Row>(bytes) else {
        return true;
    };
    let longest = retention + super::MAX_TIMEOUT + super::DEADLINE_GRACE;
    let limit = if row.code.is_some() {
        retention
    } else {
        longest
    };
    now.saturating_sub(row.at_unix_millis) > i64::try_from(limit.as_millis()).unwrap_or(i64::MAX)
}

/// Stores the state of a client-id operation: running (`code` `None`, before it is sent) or
/// finished. A store that fails is logged, not fatal: the record in memory still keeps the
/// id from running twice while this hub runs.
pub(crate) async fn save(
    driver: &Driver,
    owner: Owner<'_>,
    id: &str,
    code: Option<u16>,
    body: &OperationResponse,
) {
    let Some(bytes) = row_bytes(code, body) else {
        return;
    };
    let Some(records) = driver.store.lock().await.operation_records() else {
        return;
    };
    let key = key(owner, id);
    let retention = driver.settings.retention;
    let sweep = driver.operations.count_write().is_multiple_of(SWEEP_EVERY);
    let now = jiff::Timestamp::now().as_millisecond();
    let past: Option<Box<store::Expired>> =
        sweep.then(|| Box::new(move |bytes: &[u8]| expired(bytes, retention, now)) as _);
    if let Err(error) = records.write(key, Some(bytes), past).await {
        tracing::warn!(error = %Chain(&error), "cannot store the operation's record; a hub restart will forget the id")
    }
}

/// What the shared store holds for a client id this replica's registry did not know.
pub(crate) enum Stored {
    /// Nothing (or an expired record): this submission claimed the id and runs it.
    Claimed,
    /// Another submission (on any replica, also one since stopped) finished it: its answer.
    Finished(u16, Box<OperationResponse>),
    /// Another submission claimed it and has not finished: it runs on another replica, or
    /// ran on one that stopped before it could record the outcome.
    Running,
}

/// Claims a client id in the store before anything is sent, so that it runs once across
/// replicas: with PostgreSQL the claim is one insert only one replica wins, and a retry on
/// another replica (the owner killed, the agents moved) finds the first submission's record
/// ([`store::OperationRecords::claim`]). A store that fails is logged and the id is run: the
/// registry in memory still keeps it from running twice on this replica (as [`save`]).
pub(crate) async fn claim(
    driver: &Driver,
    owner: Owner<'_>,
    id: &str,
    running: &OperationResponse,
) -> Stored {
    let Some(bytes) = row_bytes(None, running) else {
        return Stored::Claimed;
    };
    let Some(records) = driver.store.lock().await.operation_records() else {
        return Stored::Claimed;
    };
    let key = key(owner, id);
    let existing = match records.clone().claim(key.clone(), bytes.clone()).await {
        Ok(existing) => existing,
        Err(error) => {
            tracing::warn!(error = %Chain(&error), "cannot claim the operation id in the store; running it (a retry on another replica could run it again)");
            return Stored::Claimed;
        }
    };
    let Some(existing) = existing else {
        return Stored::Claimed;
    };
    let now = jiff::Timestamp::now().as_millisecond();
    match serde_json::from_slice::<Row>(&existing) {
        Ok(row) if !expired(&existing, driver.settings.retention, now) => match row.code {
            Some(code) => Stored::Finished(code, Box::new(row.body)),
            None => Stored::Running,
        },
        // Past its retention (not swept yet) or unreadable: the id is free again.
        _ => {
            if let Err(error) = records.write(key, Some(bytes), None).await {
                tracing::warn!(error = %Chain(&error), "cannot store the operation's record; a hub restart will forget the id");
            }
            Stored::Claimed
        }
    }
}

/// The stored outcome of a client id another replica runs (or ran), once it has one.
pub(crate) async fn stored_outcome(
    driver: &Driver,
    owner: Owner<'_>,
    id: &str,
) -> Option<(u16, OperationResponse)> {
    let records = driver.store.lock().await.operation_records()?;
    let bytes = records.read(key(owner, id)).await.ok()??;
    let row = serde_json::from_slice::<Row>(&bytes).ok()?;
    Some((row.code?, row.body))
}

/// The stored bytes of a record.
fn row_bytes(code: Option<u16>, body: &OperationResponse) -> Option<Vec<u8>> {
    let mut body = body.clone();
    body.objects = body.objects.map(|_| Vec::new());
    body.text = body.text.map(|_| String::new());
    let row = Row {
        at_unix_millis: jiff::Timestamp::now().as_millisecond(),
        code,
        body,
    };
    serde_json::to_vec(&row).ok()
}

/// Puts the stored records of a previous run, still within `retention`, into `operations`.
pub fn restore(operations: &Operations, rows: Vec<(String, Vec<u8>)>, retention: Duration) {
    let now = jiff::Timestamp::now().as_millisecond();
    let mut rows: Vec<(String, Row)> = rows
        .into_iter()
        .filter(|(_, bytes)| !expired(bytes, retention, now))
        .filter_map(|(key, bytes)| Some((key, serde_json::from_slice::<Row>(&bytes).ok()?)))
        .collect();
    // Oldest first, as the registry keeps them.
    rows.sort_by_key(|(_, row)| row.at_unix_millis);
    let mut restored = 0;
    for (key, row) in rows {
        let Some((owner, id)) = parse_key(&key) else {
            continue;
        };
        let account = owner.account;
        let age = Duration::from_millis(u64::try_from(now - row.at_unix_millis).unwrap_or(0));
        let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let (code, body) = match row.code {
            Some(code) => {
                let mut body = row.body;
                let note = "recorded before the hub restarted; its objects and text were not kept";
                body.message = Some(match body.message.take() {
                    Some(m) if !m.is_empty() => format!("{m}; {note}"),
                    _ => note.to_string(),
                });
                (code, body)
            }
            None => {
                let message = format!(
                    "the hub restarted while operation {id:?} of account {account} ran: whether \
                     it ran is unknown; check the cluster (e.g. with a get) before submitting it \
                     again under a new id"
                );
                let mut body = row.body;
                body.state = State::Failed;
                body.executed = Some(true);
                body.status = Some(Status::new(503, "ServiceUnavailable", message.clone()));
                body.message = Some(message);
                (503, body)
            }
        };
        operations.restore(owner, id, code, body, at, retention);
        restored += 1;
    }
    if restored > 0 {
        tracing::info!(restored, "operation records of client ids restored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Subject;

    #[test]
    fn rows_expire_after_the_retention() {
        let retention = Duration::from_secs(60);
        let row = |age_ms: i64, code: Option<u16>| {
            serde_json::to_vec(&Row {
                at_unix_millis: 1_000_000_000 - age_ms,
                code,
                body: OperationResponse::running(
                    Subject {
                        id: "x",
                        account: "a",
                        op_type: "create",
                    },
                    "",
                    0,
                ),
            })
            .unwrap()
        };
        let now = 1_000_000_000;
        assert!(!expired(&row(59_000, Some(201)), retention, now));
        assert!(expired(&row(61_000, Some(201)), retention, now));
        // A running row outlives the longest operation.
        assert!(!expired(&row(61_000, None), retention, now));
        assert!(expired(&row(61_000 + 700_000, None), retention, now));
        assert!(expired(b"not json", retention, now));
    }

    #[test]
    fn an_id_running_when_the_hub_stopped_is_restored_as_unknown() {
        let running = OperationResponse::running(
            Subject {
                id: "deploy-1",
                account: "prod",
                op_type: "create",
            },
            "agent/pod-1",
            1,
        );
        let row = Row {
            at_unix_millis: jiff::Timestamp::now().as_millisecond() - 1_000,
            code: None,
            body: running,
        };
        let ops = Operations::default();
        let ci = Owner {
            account: "prod",
            submitter: "api:ci",
        };
        let rows = vec![
            (key(ci, "deploy-1"), serde_json::to_vec(&row).unwrap()),
            // A row of a hub before submitters were kept: nobody's.
            (
                "prod\0deploy-2".to_string(),
                serde_json::to_vec(&row).unwrap(),
            ),
        ];
        restore(&ops, rows, Duration::from_secs(60));
        let retention = Duration::from_secs(60);
        let free = |ops: &Operations, id| {
            matches!(
                ops.claim(
                    ci,
                    id,
                    OperationResponse::bad_request(String::new()),
                    retention
                ),
                super::super::Claim::New
            )
        };
        assert!(free(&ops, "deploy-2"), "an older row claims no caller's id");
        let other = Owner {
            account: "prod",
            submitter: "api:other",
        };
        assert!(matches!(
            ops.claim(
                other,
                "deploy-1",
                OperationResponse::bad_request(String::new()),
                retention
            ),
            super::super::Claim::New
        ));
        let claimed = ops.claim(
            ci,
            "deploy-1",
            OperationResponse::bad_request(String::new()),
            retention,
        );
        let super::super::Claim::Finished(code, body) = claimed else {
            panic!("not restored as finished: {claimed:?}")
        };
        assert_eq!(code, 503);
        assert_eq!(body.state, State::Failed);
        assert_eq!(body.executed, Some(true));
        assert!(body.message.unwrap().contains("whether it ran is unknown"));
    }
}
