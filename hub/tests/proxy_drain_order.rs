//! A draining agent loses no tunnelled request (issue 27): the agent unregisters its account
//! while requests are being picked for it, waits for the hub's Ack, finishes what it
//! received and leaves. Every request head the hub sends it must arrive before that Ack:
//! a head after the Ack reaches an agent that believes nothing more will come, and the
//! client gets 503.
//!
//! The race is made likely on every round: request bodies of a full window fill the agent's
//! tunnel queue, so the GETs picked for it wait for room there while its UnregisterAccount
//! is handled (the Ack goes on the stream's other queue). Two fake agents speak the real
//! protocol over mutual TLS; clients go through the hub's HTTPS proxy.

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

use bytes::Bytes;
use common::*;
use scale_agent_proto::v1::{self as pb, agent_message::Kind as Msg, tunnel_frame::Frame};
use tokio::task::JoinSet;

/// Unregister/register rounds.
const ROUNDS: usize = 50;
/// Request bodies of a full window sent at the start of a round (some land on each replica).
const POSTS: usize = 4;
/// GETs sent, one every [`GET_EVERY`], while the agent unregisters.
const GETS: usize = 60;
/// Time between two GETs.
const GET_EVERY: Duration = Duration::from_millis(2);

/// Answers what arrived: a request without a body at once (200), one with a body when its
/// body ended (201). `bodies` holds the exchanges whose body is still coming.
async fn answer(agent: &mut FakeAgent, bodies: &mut HashSet<u64>) {
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
}

/// The standby replica: answers everything until `stop`.
async fn serve(mut agent: FakeAgent, stop: Arc<AtomicBool>) -> FakeAgent {
    let mut bodies = HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        let _ = tokio::time::timeout(Duration::from_millis(5), agent.pump()).await;
        answer(&mut agent, &mut bodies).await;
    }
    agent
}

#[tokio::test]
async fn every_request_head_reaches_a_draining_agent_before_the_ack_of_its_unregistration() {
    let pki = Pki::new();
    let dir = data_dir("proxy-drain-order");
    let hub = start_hub(&pki, &dir, |c| serve_https(&pki, c)).await;
    let http = Https::for_hub(&pki, &hub, Proto::H2);
    let admin = admin_token(&dir);
    let mut a = tunnel_agent(&hub, &pki, "agent-a.test", "pod-old").await;
    a.register("prod", "https://10.0.0.1:6443").await;
    let mut b = tunnel_agent(&hub, &pki, "agent-a.test", "pod-new").await;
    b.register("prod", "https://10.0.0.1:6443").await;
    let token = token_for(&http, &admin, "prod").await;
    let window = a.welcome.as_ref().unwrap().tunnel_window_bytes as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let standby = tokio::spawn(serve(b, stop.clone()));

    let mut heads_after_ack = Vec::new();
    let mut statuses = Vec::new();
    // Request heads that reached the draining agent after its UnregisterAccount was sent.
    let mut heads_after_unregister = 0;
    for round in 0..ROUNDS {
        let mut clients = JoinSet::new();
        for n in 0..POSTS {
            let (http, token) = (http.clone(), token.clone());
            let body = Bytes::from(vec![b'x'; window]);
            clients.spawn(async move {
                let request = http
                    .request(
                        "POST",
                        &format!("/clusters/prod/api/v1/namespaces/r{round}/configmaps?p={n}"),
                    )
                    .header("authorization", format!("Bearer {token}"))
                    .header("content-type", "application/json")
                    .body(full(body))
                    .unwrap();
                http.call(request).await.status
            });
        }
        // The request bodies are on their way: the GETs follow, and the agent drains.
        let mut bodies = HashSet::new();
        loop {
            a.pump().await.unwrap();
            if a.tunnel
                .iter()
                .any(|f| matches!(f.frame, Some(Frame::Data(_))))
            {
                break;
            }
        }
        // GETs one after another while the agent unregisters: some are picked just before
        // the hub handles the UnregisterAccount.
        {
            let (http, token) = (http.clone(), token.clone());
            clients.spawn(async move {
                let mut gets = JoinSet::new();
                for n in 0..GETS {
                    let (http, token) = (http.clone(), token.clone());
                    gets.spawn(async move {
                        let path = format!("/clusters/prod/api/v1/namespaces/r{round}-g{n}");
                        http.get(&path, Some(&token)).await.status
                    });
                    tokio::time::sleep(GET_EVERY).await;
                }
                let mut worst = 200;
                while let Some(status) = gets.join_next().await {
                    let status = status.unwrap();
                    if !(200..300).contains(&status) {
                        worst = status;
                    }
                }
                worst
            });
        }
        tokio::time::sleep(GET_EVERY * (GETS as u32) / 3).await;
        let unregistered = a
            .send(Msg::UnregisterAccount(pb::UnregisterAccount {
                account: "prod".into(),
            }))
            .await;
        // One message at a time, so that what came before and after the Ack is known.
        while a.acked < unregistered || !clients.is_empty() {
            let acked_before = a.acked >= unregistered;
            let known = a.tunnel.len();
            tokio::select! {
                pumped = a.pump() => pumped.unwrap(),
                done = clients.join_next(), if !clients.is_empty() => {
                    statuses.push(done.unwrap().unwrap());
                    continue;
                }
            }
            for frame in a.tunnel.iter().skip(known) {
                if let Some(Frame::Request(head)) = &frame.frame {
                    heads_after_unregister += 1;
                    if acked_before {
                        heads_after_ack.push((
                            round,
                            head.method.clone(),
                            head.path_and_query.clone(),
                        ));
                    }
                }
            }
            answer(&mut a, &mut bodies).await;
        }
        assert!(
            bodies.is_empty(),
            "round {round}: bodies unfinished: {bodies:?}"
        );
        a.register("prod", "https://10.0.0.1:6443").await;
    }
    stop.store(true, Ordering::SeqCst);
    let _b = standby.await.unwrap();

    assert!(
        heads_after_ack.is_empty(),
        "{} request heads reached the draining agent after the Ack of its \
         UnregisterAccount (round, method, path): {heads_after_ack:?}",
        heads_after_ack.len()
    );
    let failed: Vec<_> = statuses
        .iter()
        .filter(|s| !(200..300).contains(*s))
        .collect();
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    assert_eq!(statuses.len(), ROUNDS * (POSTS + 1));
    // The race was run: requests picked for the draining agent were still on their way
    // when it unregistered.
    eprintln!(
        "{heads_after_unregister} request heads reached the draining agent after it sent UnregisterAccount, all before the Ack"
    );
    assert!(
        heads_after_unregister >= ROUNDS,
        "only {heads_after_unregister} request heads reached the draining agent after it \
         unregistered: the rounds did not race"
    );
    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
