//! The PostgreSQL harness (`scale_agent_e2e::postgres`) on Debian's real server: data
//! survives a SIGKILL and a restart, a stopped server restarts, servers run side by side,
//! and a dropped one leaves no process and no data behind.

use std::time::Duration;

use scale_agent_e2e::postgres::{self, PostgresServer};

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    match client.query_one(sql, &[]).await {
        Ok(row) => row.get(0),
        Err(error) => panic!("{sql}: {}", scale_agent_e2e::error::postgres_text(&error)),
    }
}

#[tokio::test]
async fn committed_rows_survive_a_kill_and_a_restart() {
    let mut server = PostgresServer::start().await.unwrap();
    let client = server.connect().await.unwrap();
    let (user, database, superuser): (String, String, bool) = {
        let row = client
            .query_one(
                "SELECT current_user::text, current_database()::text, \
                 (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        (user.as_str(), database.as_str(), superuser),
        (postgres::USER, postgres::DATABASE, false)
    );
    let admin = postgres::connect(&server.superuser_url()).await.unwrap();
    let row = admin
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "superuser_url() is not a superuser");

    // PostgreSQL refuses root, so as root the harness runs it as nobody.
    let postmaster = server.pid().unwrap();
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    if unsafe { libc::geteuid() } == 0 {
        let status = std::fs::read_to_string(format!("/proc/{postmaster}/status")).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid.split_whitespace().skip(1).all(|id| id == "65534"),
            "{uid}"
        );
    }

    client
        .batch_execute("CREATE TABLE kept (id int PRIMARY KEY, v text NOT NULL)")
        .await
        .unwrap();
    client
        .execute("INSERT INTO kept VALUES (1, 'before the kill')", &[])
        .await
        .unwrap();
    let port = server.port();

    server.kill();
    assert!(server.pid().is_none());
    assert!(!scale_agent_e2e::process::is_alive(postmaster));
    // The sessions died with it, as in a crash of the database server.
    assert!(client.simple_query("SELECT 1").await.is_err());
    assert!(admin.simple_query("SELECT 1").await.is_err());

    server.restart().await.unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(postmaster));
    let client = server.connect().await.unwrap();
    let row = client
        .query_one("SELECT v FROM kept WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "before the kill");
    let log = std::fs::read_to_string(server.log()).unwrap();
    assert!(
        log.contains("was interrupted") || log.contains("not properly shut down"),
        "the restart did not recover from a crash; log {}:\n{log}",
        server.log().display()
    );

    // A clean stop and start keep it too.
    client
        .execute("INSERT INTO kept VALUES (2, 'before the stop')", &[])
        .await
        .unwrap();
    server.stop().await;
    assert!(server.pid().is_none());
    server.restart().await.unwrap();
    let client = server.connect().await.unwrap();
    assert_eq!(count(&client, "SELECT count(*) FROM kept").await, 2);
}

#[tokio::test]
async fn servers_run_side_by_side_and_leave_nothing_behind() {
    let (a, b) = tokio::join!(PostgresServer::start(), PostgresServer::start());
    let (mut a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.port(), b.port());
    assert_ne!(a.data_dir(), b.data_dir());
    let (ca, cb) = (a.connect().await.unwrap(), b.connect().await.unwrap());
    ca.batch_execute("CREATE TABLE only_in_a (v int); INSERT INTO only_in_a VALUES (1)")
        .await
        .unwrap();
    assert_eq!(count(&ca, "SELECT count(*) FROM only_in_a").await, 1);
    let missing = cb
        .simple_query("SELECT * FROM only_in_a")
        .await
        .unwrap_err();
    assert_eq!(
        missing.code(),
        Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE),
        "{}",
        scale_agent_e2e::error::postgres_text(&missing)
    );

    // One going away leaves the other serving.
    a.stop().await;
    assert_eq!(count(&cb, "SELECT 1::bigint").await, 1);
    a.restart().await.unwrap();

    let (dir, pid) = (b.data_dir().to_path_buf(), b.pid().unwrap());
    let workers = scale_agent_e2e::process::children_of(pid);
    assert!(
        !workers.is_empty(),
        "postgres {pid} has no worker processes"
    );
    drop(cb);
    drop(b);
    assert!(!dir.exists(), "{} is still there", dir.display());
    for process in workers.iter().chain([&pid]) {
        assert!(
            !scale_agent_e2e::process::is_alive(*process),
            "process {process} of a dropped server is alive"
        );
    }
    tokio::time::timeout(Duration::from_secs(10), a.connect())
        .await
        .unwrap()
        .unwrap();
}
