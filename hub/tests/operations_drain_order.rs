//! A draining agent loses no operation (issue 27, as `proxy_drain_order` for tunnelled
//! requests): the agent unregisters its account while operations are being picked for it,
//! waits for the hub's Ack, finishes what it received and leaves. Every operation the hub
//! sends it must arrive before that Ack: one after the Ack reaches an agent that believes
//! nothing more will come, and its submitter waits for an answer that never comes.
//!
//! The race is made likely on every round: just before it unregisters, the agent sends a
//! burst of object events of another account it streams, so the hub's stream is busy applying them while operations are
//! picked for the agent. An operation picked before the unregistration must not be sent
//! after its Ack: the stream used to send operations from its loop, which could read the
//! UnregisterAccount (and acknowledge it) before the operations waiting for it. Two fake
//! agents speak the real protocol over mutual TLS; operations are submitted through the
//! hub's HTTPS API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use common::*;
use scale_agent_proto::v1::{
    self as pb, agent_message::Kind as Msg, object_event::Type as EventType, tunnel_frame::Frame,
};
use tokio::task::JoinSet;

/// Unregister/register rounds.
const ROUNDS: usize = 20;
/// Object events the agent sends right before it unregisters.
const EVENTS: usize = 1000;
/// Operations submitted, one every [`OP_EVERY`], while the agent unregisters.
const OPS: usize = 40;
/// Time between two operations.
const OP_EVERY: Duration = Duration::from_millis(2);

/// Answers what arrived: tunnelled requests as `proxy_drain_order` does, and operations
/// with a result.
async fn answer(agent: &mut FakeAgent, bodies: &mut HashSet<u64>, replica: &str) {
    while let Some(frame) = agent.tunnel.pop_front() {
        match frame.frame {
            Some(Frame::Request(head)) if head.end_of_body => {
                agent.respond(frame.exchange, 200, &[], b"{}").await;
            }
            Some(Frame::Request(_)) => {
                bodies.insert(frame.exchange);
            }
            Some(Frame::Data(data)) if data.end_of_body && bodies.remove(&frame.exchange) => {
                agent.respond(frame.exchange, 201, &[], b"{}").await;
            }
            _ => {}
        }
    }
    while let Some(op) = agent.operations.pop_front() {
        agent
            .send(Msg::OperationResult(pb::OperationResult {
                id: op.id,
                ok: true,
                status: Some(pb::OperationStatus {
                    code: 200,
                    ..Default::default()
                }),
                executed: true,
                replica: replica.into(),
                account: "prod".into(),
                ..Default::default()
            }))
            .await;
    }
}

/// The standby replica: answers everything until `stop`.
async fn serve(mut agent: FakeAgent, stop: Arc<AtomicBool>) -> FakeAgent {
    let mut bodies = HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        let _ = tokio::time::timeout(Duration::from_millis(5), agent.pump()).await;
        answer(&mut agent, &mut bodies, "pod-new").await;
    }
    agent
}

#[tokio::test]
async fn every_operation_reaches_a_draining_agent_before_the_ack_of_its_unregistration() {
    let pki = Pki::new();
    let dir = data_dir("operations-drain-order");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-old").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    // Another account the agent streams alone: its events keep the stream busy.
    a.register("other", "https://10.0.0.2:6443").await;
    a.snapshot("other", &[], "1000").await;
    let mut b = tunnel_agent(&hub, &pki, "agent-a.test", "pod-new").await;
    b.register("prod", "https://10.0.0.1:6443").await;
    let stop = Arc::new(AtomicBool::new(false));
    let standby = tokio::spawn(serve(b, stop.clone()));

    let mut ops_after_ack = Vec::new();
    let mut statuses = Vec::new();
    // Operations that reached the draining agent after its UnregisterAccount was sent.
    let mut ops_after_unregister = 0;
    for round in 0..ROUNDS {
        let mut clients = JoinSet::new();
        // Operations one after another while the agent unregisters: some are picked just
        // before the hub handles the UnregisterAccount.
        {
            let (http, admin) = (http.clone(), admin.clone());
            clients.spawn(async move {
                let mut ops = JoinSet::new();
                for n in 0..OPS {
                    let (http, admin) = (http.clone(), admin.clone());
                    ops.spawn(async move {
                        let body = serde_json::json!({
                            "type": "get", "kind": "ConfigMap", "namespace": format!("r{round}"),
                            "name": format!("g{n}"), "timeoutSeconds": 20,
                        });
                        http.with_token(
                            "POST",
                            "/api/v1/accounts/prod/operations",
                            &admin,
                            body.to_string(),
                        )
                        .await
                        .status
                    });
                    tokio::time::sleep(OP_EVERY).await;
                }
                let mut worst = 200;
                while let Some(status) = ops.join_next().await {
                    let status = status.unwrap();
                    if !(200..300).contains(&status) {
                        worst = status;
                    }
                }
                worst
            });
        }
        tokio::time::sleep(OP_EVERY * (OPS as u32) / 3).await;
        // A burst of events of `other` keeps the stream busy; the UnregisterAccount of `prod`
        // follows at once.
        for n in 0..EVENTS {
            let name = format!("cm-{n}");
            let rv = format!("{}", 1000 + round * EVENTS + n);
            a.send(cm_event("other", EventType::Applied, &name, &rv, "web"))
                .await;
        }
        let unregistered = a
            .send(Msg::UnregisterAccount(pb::UnregisterAccount {
                account: "prod".into(),
            }))
            .await;
        let mut bodies = HashSet::new();
        // One message at a time, so that what came before and after the Ack is known.
        while a.acked < unregistered || !clients.is_empty() {
            let acked_before = a.acked >= unregistered;
            let known = a.operations.len();
            tokio::select! {
                pumped = a.pump() => pumped.unwrap(),
                done = clients.join_next(), if !clients.is_empty() => {
                    statuses.push(done.unwrap().unwrap());
                    continue;
                }
            }
            for op in a.operations.iter().skip(known) {
                ops_after_unregister += 1;
                if acked_before {
                    ops_after_ack.push((round, op.id.clone()));
                }
            }
            // The draining agent still answers what it received (a real one would drop
            // what comes after the Ack; answering keeps the rounds going).
            answer(&mut a, &mut bodies, "pod-old").await;
        }
        a.register("prod", "https://10.0.0.1:6443").await;
    }
    stop.store(true, Ordering::SeqCst);
    let _b = standby.await.unwrap();

    assert!(
        ops_after_ack.is_empty(),
        "{} operations reached the draining agent after the Ack of its UnregisterAccount \
         (round, wire id): {ops_after_ack:?}",
        ops_after_ack.len()
    );
    let failed: Vec<_> = statuses
        .iter()
        .filter(|s| !(200..300).contains(*s))
        .collect();
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    assert_eq!(statuses.len(), ROUNDS);
    // The race was run: operations picked for the draining agent were still on their way
    // when it unregistered.
    eprintln!(
        "{ops_after_unregister} operations reached the draining agent after it sent UnregisterAccount, all before the Ack"
    );
    assert!(
        ops_after_unregister >= ROUNDS,
        "only {ops_after_unregister} operations reached the draining agent after it \
         unregistered: the rounds did not race"
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
