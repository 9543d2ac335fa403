//! exec and port-forward through the proxy.

use super::*;

#[tokio::test]
async fn exec_and_port_forward_work_through_the_proxy() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let account = account_name("exec");
    let setup = Setup::new("exec", &[&account]).await?;
    let proxied = setup.kubeconfig(&account, "exec").await?;
    let control_plane = control_plane()?;
    let namespace = control_plane.namespace(&setup.admin, "exec").await?;
    run_logger(&setup.admin, &namespace).await?;
    let ns = format!("--namespace={namespace}");

    // exec: kubectl 1.37 speaks WebSocket (v5.channel.k8s.io), 1.29 SPDY; kwok runs the
    // command on this host.
    for (label, binary) in [
        ("current", control_plane.binaries().kubectl()),
        ("1.29", control_plane.binaries().kubectl_client(29)),
    ] {
        let kubectl = Kubectl::new(binary, setup.dir.join(format!("home-exec-{label}")));
        let exec = args(&[
            "exec",
            "logger",
            "-c",
            "main",
            &ns,
            "--",
            "echo",
            "hello-from-exec",
        ]);
        let direct = kubectl
            .run(&setup.direct, &exec, None, KUBECTL_TIMEOUT)
            .await?;
        ensure_ok(&format!("kubectl {label} exec directly"), &direct)?;
        let through = kubectl.run(&proxied, &exec, None, KUBECTL_TIMEOUT).await?;
        ensure_ok(&format!("kubectl {label} exec through the proxy"), &through)?;
        assert_eq!(through.stdout.trim(), "hello-from-exec");
        assert_eq!(through.stdout, direct.stdout);
        // stdin crosses too. (`head -n 1`, not `cat`: kwok's local exec does not pass on
        // the end of stdin, directly or not, so `cat` would never exit.)
        let head = args(&[
            "exec", "-i", "logger", "-c", "main", &ns, "--", "head", "-n", "1",
        ]);
        let direct = kubectl
            .run(
                &setup.direct,
                &head,
                Some("typed into stdin\n"),
                KUBECTL_TIMEOUT,
            )
            .await?;
        ensure_ok(&format!("kubectl {label} exec -i directly"), &direct)?;
        let echoed = kubectl
            .run(&proxied, &head, Some("typed into stdin\n"), KUBECTL_TIMEOUT)
            .await?;
        ensure_ok(
            &format!("kubectl {label} exec -i through the proxy"),
            &echoed,
        )?;
        assert_eq!(echoed.stdout, "typed into stdin\n");
        assert_eq!(echoed.stdout, direct.stdout);
    }

    // port-forward: kwok echoes every forwarded port.
    let kubectl = Kubectl::new(
        control_plane.binaries().kubectl(),
        setup.dir.join("home-pf"),
    );
    let mut forward = Follower::start(
        &kubectl,
        &proxied,
        &args(&["port-forward", "pod/logger", ":8080", &ns]),
    )
    .await?;
    // "Forwarding from 127.0.0.1:43211 -> 8080"
    let line = forward.line("Forwarding from 127.0.0.1:").await?;
    let port: u16 = line
        .trim_start_matches("Forwarding from 127.0.0.1:")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .parse()?;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(b"ping through the hub\n").await?;
    let mut echoed = vec![0u8; "ping through the hub\n".len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut echoed)).await??;
    assert_eq!(echoed, b"ping through the hub\n");
    drop(stream);
    drop(forward);
    setup.stop().await
}
