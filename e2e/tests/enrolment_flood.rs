//! Review F10, enrolment: anyone who reaches the hub's gRPC port may call `Enroll` with a
//! made-up token, and a replica sharing a PostgreSQL store looks a token it does not know
//! up there. Such a call must not take the store's lock: that lock is what every commit of
//! the hub (tokens issued, bindings, enrolments) waits for. The test makes the lookups
//! slow on purpose (a transaction of its own holds `agent_tokens` locked, so every lookup
//! of an agent token waits in PostgreSQL), sends 20 made-up enrolments at once, and shows
//! that an admin's token issuance, which commits under the store's lock, still completes
//! at once; once the table is free, the made-up enrolments are refused with a message
//! saying what to do, a real enrolment token enrols, and two enrolments with one token
//! (sent together) enrol once.

// Test code: a failed set-up should panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use scale_agent_e2e::{http::Call, postgres::PostgresServer};
use scale_agent_hub::{
    Config, GrpcSecurity, RunningHub, owners::OwnershipSource, owners::forward::ReplicaSecret,
};
use scale_agent_proto::v1::{self as pb, agent_hub_client::AgentHubClient};
use tonic::Code;

const SECRET: &str = "replica-secret-of-the-enrolment-flood-0123456789";

/// A replica on the PostgreSQL at `url`, whose own refresh of the shared tables (which
/// takes the store's lock and reads `agent_tokens`) does not run again within the test.
async fn start_replica(url: &str, dir: &std::path::Path) -> (RunningHub, String) {
    let port = scale_agent_e2e::local_agent::free_port().unwrap();
    let mut config = Config::new(GrpcSecurity::InsecurePlaintext, dir);
    config.listeners.grpc_addr = "127.0.0.1:0".parse().unwrap();
    config.listeners.http_addr = format!("127.0.0.1:{port}").parse().unwrap();
    config.replicas.id = "hub-flood".into();
    config.replicas.address = Some(format!("http://127.0.0.1:{port}"));
    config.replicas.secret = Some(ReplicaSecret::new(SECRET).unwrap());
    config.replicas.sync_period = Duration::from_secs(600);
    let options = scale_agent_hub::store::PostgresOptions::new(url);
    config.replicas.ownership = OwnershipSource::Postgres {
        options: options.clone(),
    };
    config.store.backend = scale_agent_hub::store::Backend::Postgres(options);
    let hub = scale_agent_hub::start(config).await.unwrap();
    let admin = std::fs::read_to_string(hub.admin_token_file().unwrap())
        .unwrap()
        .trim()
        .to_string();
    (hub, admin)
}

/// Enroll with `token` and a fresh CSR: the identity issued, or the refusal.
async fn enroll(hub: &RunningHub, token: &str) -> Result<String, tonic::Status> {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr_pem = rcgen::CertificateParams::new(vec!["edge-agent".to_string()])
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let mut client = AgentHubClient::connect(format!("http://{}", hub.grpc_addr))
        .await
        .unwrap();
    client
        .enroll(pb::EnrollRequest {
            token: token.into(),
            csr_pem,
        })
        .await
        .map(|r| r.into_inner().certificate.unwrap().identity)
}

/// Issues a one-time enrolment token through the admin API.
async fn enrolment_token(hub: &RunningHub, admin: &str) -> String {
    let issued = Call::new(
        "POST",
        format!(
            "http://{}/api/v1/agent-tokens?identity=edge-agent&accounts=edge-*&ttl=1h&once=true",
            hub.http_addr
        ),
    )
    .bearer(admin)
    .send()
    .await
    .unwrap();
    assert_eq!(issued.status, 201, "{}", issued.body);
    issued.json_or_null()["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn made_up_enrolment_tokens_do_not_hold_the_store_lock_and_a_token_enrols_once() {
    let server = PostgresServer::start().await.unwrap();
    let dir = scale_agent_e2e::fixtures::temp_dir("scale-agent-enrolment-flood").unwrap();
    let (hub, admin) = start_replica(&server.url(), &dir).await;
    let token = enrolment_token(&hub, &admin).await;

    // Every lookup of an agent token now waits in PostgreSQL.
    let mut locker = server.connect().await.unwrap();
    let holding = locker.transaction().await.unwrap();
    holding
        .batch_execute("LOCK TABLE agent_tokens IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let flood: Vec<_> = (0..20)
        .map(|i| {
            let hub_grpc = hub.grpc_addr;
            tokio::spawn(async move {
                let started = Instant::now();
                let mut client = AgentHubClient::connect(format!("http://{hub_grpc}"))
                    .await
                    .unwrap();
                let refused = client
                    .enroll(pb::EnrollRequest {
                        token: format!("saa_made-up-{i}"),
                        csr_pem: String::new(),
                    })
                    .await
                    .unwrap_err();
                (refused, started.elapsed())
            })
        })
        .collect();
    // Let the made-up enrolments reach their lookups.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // An admin's token issuance commits under the store's lock: it completes at once.
    let started = Instant::now();
    let created = tokio::time::timeout(
        Duration::from_secs(10),
        Call::new("POST", format!("http://{}/api/v1/tokens", hub.http_addr))
            .bearer(&admin)
            .json(&serde_json::json!({"name": "ci", "role": "reader"}))
            .send(),
    )
    .await
    .expect("a token issuance waited 10 s for the store's lock behind made-up enrolments")
    .unwrap();
    let issuance = started.elapsed();
    assert_eq!(created.status, 200, "{}", created.body);
    eprintln!("[F10] token issued in {issuance:?} while 20 made-up enrolments wait on PostgreSQL");
    assert!(issuance < Duration::from_secs(3), "{issuance:?}");

    // The table free again: each made-up enrolment is refused, saying what to do.
    holding.rollback().await.unwrap();
    for call in flood {
        let (refused, took) = call.await.unwrap();
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "{}",
            refused.message()
        );
        assert!(
            refused.message().contains("not one this hub issued")
                && refused.message().contains("agent-token create"),
            "{}",
            refused.message()
        );
        assert!(
            took > Duration::from_millis(400),
            "{took:?}: no lookup waited"
        );
    }

    // A real token enrols, within a bound.
    let started = Instant::now();
    assert_eq!(enroll(&hub, &token).await.unwrap(), "edge-agent");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // Two enrolments with one token, sent together: one wins, the other is told why.
    let once = enrolment_token(&hub, &admin).await;
    let (first, second) = tokio::join!(enroll(&hub, &once), enroll(&hub, &once));
    let (won, lost): (Vec<_>, Vec<_>) = [first, second].into_iter().partition(Result::is_ok);
    assert_eq!((won.len(), lost.len()), (1, 1), "{won:?} {lost:?}");
    let lost = lost.into_iter().next().unwrap().unwrap_err();
    assert_eq!(lost.code(), Code::PermissionDenied, "{}", lost.message());
    assert!(
        lost.message().contains("already used"),
        "{}",
        lost.message()
    );

    hub.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
