//! A rolling update of an identity's agents, at the protocol level: one replica drains the
//! way the agent does on SIGTERM (UnregisterAccount for its account, then it finishes the
//! operations it was sent, then ends its stream) while operations are submitted in a loop;
//! none fails, the other replica takes the account over, and what the drained replica
//! answered after unregistering still reaches the hub's cache (read-your-writes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::*;
use scale_agent_proto::v1::{
    self as pb, account_assignment::Role, agent_message::Kind as Msg,
    object_event::Type as EventType,
};
use tokio::sync::oneshot;

/// How long a fake replica holds an operation before answering it, so that some are in
/// flight when the replica starts draining.
const HOLD: Duration = Duration::from_millis(60);
/// Submitters running at once.
const SUBMITTERS: usize = 4;

/// What a fake replica did.
#[derive(Default, Debug)]
struct Answered {
    /// Operations answered in all.
    total: usize,
    /// Operations that had arrived before the replica unregistered, answered after it did.
    in_flight_at_drain: usize,
    /// Operations that arrived after the hub acknowledged the unregistration.
    after_ack: usize,
    /// Names of the objects the replica answered after unregistering.
    written_after_unregister: Vec<String>,
    /// Roles the hub assigned it after its registration.
    roles: Vec<Role>,
}

/// A replica that answers every create it is sent, `HOLD` after it arrived, with the object
/// made; on `drain` it drains (as the agent does on SIGTERM) and returns, or stops answering
/// when `stop` is set.
async fn serve(
    mut agent: FakeAgent,
    replica: &'static str,
    mut drain: Option<oneshot::Receiver<()>>,
    stop: Arc<AtomicBool>,
) -> (FakeAgent, Answered) {
    let mut answered = Answered::default();
    let mut held: Vec<(Instant, pb::Operation)> = Vec::new();
    // Seq of the UnregisterAccount, once sent.
    let mut unregistered: Option<u64> = None;
    let mut made = 0u64;
    let mut drain_asked = false;
    loop {
        if let Some(rx) = drain.as_mut()
            && rx.try_recv().is_ok()
        {
            drain_asked = true;
            drain = None;
        }
        // The drain starts with an operation in flight, the case a drain is for.
        if drain_asked && unregistered.is_none() && !held.is_empty() {
            let seq = agent
                .send(Msg::UnregisterAccount(pb::UnregisterAccount {
                    account: "prod".into(),
                }))
                .await;
            unregistered = Some(seq);
            answered.in_flight_at_drain = held.len() + agent.operations.len();
        }
        let _ = tokio::time::timeout(Duration::from_millis(10), agent.pump()).await;
        while let Some(assignment) = agent.assignments.pop_front() {
            answered.roles.push(role(&assignment));
        }
        let acked = unregistered.is_some_and(|seq| agent.acked >= seq);
        while let Some(op) = agent.operations.pop_front() {
            if acked {
                answered.after_ack += 1;
            }
            held.push((Instant::now(), op));
        }
        let now = Instant::now();
        let (due, kept): (Vec<_>, Vec<_>) = held
            .into_iter()
            .partition(|(at, _)| now.duration_since(*at) >= HOLD || unregistered.is_some());
        held = kept;
        for (_, op) in due {
            made += 1;
            let name = format!("{replica}-{made}");
            let Msg::Object(object) =
                cm_event("prod", EventType::Applied, &name, &made.to_string(), "web")
            else {
                unreachable!()
            };
            agent
                .send(Msg::OperationResult(pb::OperationResult {
                    id: op.id,
                    ok: true,
                    status: Some(pb::OperationStatus {
                        code: 201,
                        ..Default::default()
                    }),
                    objects_json: vec![object.object_json],
                    object_kinds: vec![configmaps()],
                    executed: true,
                    replica: replica.into(),
                    account: "prod".into(),
                    ..Default::default()
                }))
                .await;
            answered.total += 1;
            if unregistered.is_some() {
                answered.written_after_unregister.push(name);
            }
        }
        if acked && held.is_empty() {
            // Everything answered is applied before the stream ends (the agent closes its
            // side and waits for the hub's).
            agent.synced().await;
            return (agent, answered);
        }
        if stop.load(Ordering::SeqCst) {
            return (agent, answered);
        }
    }
}

/// Creates ConfigMaps one after another until `stop`; every answer, in order.
async fn submit_until(http: Api, stop: Arc<AtomicBool>, n: usize) -> Vec<(u16, String)> {
    let mut answers = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let (code, body) = post_json(
            &http,
            "/api/v1/accounts/prod/operations",
            &serde_json::json!({"type": "create", "manifest": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("s{n}-{i}")}}}),
        )
        .await;
        answers.push((code, body.to_string()));
    }
    answers
}

#[tokio::test]
async fn a_draining_replica_loses_no_operation_and_hands_the_account_over() {
    let pki = Pki::new();
    let dir = data_dir("agent-drain");
    let hub = start_hub(&pki, &dir, |_| {}).await;
    let http = api(&hub);
    let mut a = agent(&hub, &pki, "agent-a.test", "pod-old").await;
    assert_eq!(
        role(&a.register("prod", "https://h:6443").await),
        Role::Streaming
    );
    a.snapshot("prod", &[], "100").await;
    a.synced().await;
    let mut b = agent(&hub, &pki, "agent-a.test", "pod-new").await;
    assert_eq!(
        role(&b.register("prod", "https://h:6443").await),
        Role::Standby
    );

    let stop_agents = Arc::new(AtomicBool::new(false));
    let (drain_tx, drain_rx) = oneshot::channel();
    let old = tokio::spawn(serve(a, "pod-old", Some(drain_rx), stop_agents.clone()));
    let new = tokio::spawn(serve(b, "pod-new", None, stop_agents.clone()));
    let stop_submitting = Arc::new(AtomicBool::new(false));
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|n| tokio::spawn(submit_until(http.clone(), stop_submitting.clone(), n)))
        .collect();

    // Both replicas serve for a while, then the old one drains under the load.
    tokio::time::sleep(Duration::from_millis(800)).await;
    drain_tx.send(()).unwrap();
    let (a, old) = tokio::time::timeout(WAIT, old).await.unwrap().unwrap();
    drop(a);
    // The operations go on with the new replica alone.
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop_submitting.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for submitter in submitters {
        answers.extend(submitter.await.unwrap());
    }
    stop_agents.store(true, Ordering::SeqCst);
    let (_b, new) = new.await.unwrap();

    let failed: Vec<_> = answers.iter().filter(|(code, _)| *code != 201).collect();
    assert!(
        failed.is_empty(),
        "{} of {} operations failed during the drain: {failed:?}",
        failed.len(),
        answers.len()
    );
    assert_eq!(
        old.total + new.total,
        answers.len(),
        "every operation answered once: {old:?} {new:?}"
    );
    assert!(
        old.total > 0 && new.total > 0,
        "both replicas served: {old:?} {new:?}"
    );
    assert!(
        old.in_flight_at_drain > 0,
        "the drain began with operations in flight (HOLD keeps some): {old:?}"
    );
    assert_eq!(
        old.after_ack, 0,
        "the hub routed nothing to the replica once it applied the unregistration"
    );
    assert_eq!(
        new.roles,
        [Role::Streaming],
        "the standby took the account over when the old replica unregistered"
    );
    // Read-your-writes for what the drained replica answered after unregistering.
    let cached = object_names(&hub, "prod/objects").await;
    for name in &old.written_after_unregister {
        assert!(cached.contains(name), "{name} not in the cache: {cached:?}");
    }
    eprintln!(
        "{} operations: {} by the draining replica ({} in flight when it unregistered), {} by the new one",
        answers.len(),
        old.total,
        old.in_flight_at_drain,
        new.total
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
