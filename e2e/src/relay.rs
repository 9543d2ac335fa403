//! A TCP relay on loopback that a test can cut, to stage a network outage between one agent
//! and its hub while both processes keep running: [`Relay::cut`] closes every relayed
//! connection and refuses new ones (accepted, then closed at once, as a failing load
//! balancer does) until [`Relay::restore`]. [`Relay::blackhole`] is a silent partition
//! instead: nothing is relayed any more but no connection is closed, and new ones are
//! accepted and never answered, as when packets are dropped on the way. [`Balancer`] stands in front of several
//! targets, as a Kubernetes Service in front of a Deployment's pods; [`TlsFront`] terminates
//! TLS in front of a plaintext listener.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

/// Relays connections from [`Relay::addr`] to a target until dropped.
pub struct Relay {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    /// Bumped by each cut; every relayed connection ends when it changes.
    cuts: watch::Sender<u64>,
    /// True while partitioned silently ([`Relay::blackhole`]).
    silent: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and relays each connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0u64);
        let (silent, _) = watch::channel(false);
        let task = tokio::spawn(accept(
            listener,
            target,
            open.clone(),
            cuts.clone(),
            silent.clone(),
        ));
        Ok(Relay {
            addr,
            open,
            cuts,
            silent,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every relayed connection, and refuses new ones until [`Self::restore`].
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Relays new connections again (after a blackhole: closes the connections it held, as
    /// TCP gives up on the far side of a healed partition).
    pub fn restore(&self) {
        if *self.silent.borrow() {
            self.cuts.send_modify(|n| *n += 1);
        }
        self.silent.send_replace(false);
        self.open.store(true, Ordering::SeqCst);
    }

    /// A silent partition: stops relaying bytes either way without closing anything, and
    /// holds new connections unanswered, until [`Self::restore`] or [`Self::cut`].
    pub fn blackhole(&self) {
        self.silent.send_replace(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    open: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
    silent: watch::Sender<bool>,
) {
    while let Ok((client, _)) = listener.accept().await {
        if !open.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let mut cut = cuts.subscribe();
        let mut quiet = silent.subscribe();
        tokio::spawn(async move {
            let mut client = client;
            let silent_now = *quiet.borrow_and_update();
            if silent_now {
                // Accepted, never answered, until the partition ends.
                let _ = cut.changed().await;
                return;
            }
            let Ok(mut server) = TcpStream::connect(target).await else {
                return;
            };
            let partitioned = tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
                _ = cut.changed() => false,
                result = quiet.wait_for(|silent| *silent) => result.is_ok(),
            };
            if partitioned {
                // Both sockets stay open and silent until the partition ends.
                let _ = cut.changed().await;
            }
            // Dropping both ends closes them: each side sees its connection end.
        });
    }
}

/// Spreads connections over several targets, as a Kubernetes Service spreads them over the
/// ready pods of a Deployment: each new connection goes to the next target in turn, and a
/// target that refuses it (its process is dead) is passed over for the next, so that clients
/// reconnecting after a target died land on the live ones. Relays until dropped.
pub struct Balancer {
    addr: SocketAddr,
    targets: Vec<SocketAddr>,
    /// Connections relayed to each target (by index in `targets`).
    relayed: Arc<Vec<AtomicUsize>>,
    task: JoinHandle<()>,
}

impl Balancer {
    /// Listens on a free loopback port and spreads each connection over `targets`.
    pub async fn start(targets: Vec<SocketAddr>) -> std::io::Result<Balancer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let relayed: Arc<Vec<AtomicUsize>> =
            Arc::new(targets.iter().map(|_| AtomicUsize::new(0)).collect());
        let task = tokio::spawn(spread(listener, targets.clone(), relayed.clone()));
        Ok(Balancer {
            addr,
            targets,
            relayed,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections went to `target` so far.
    pub fn relayed_to(&self, target: SocketAddr) -> usize {
        self.targets
            .iter()
            .position(|t| *t == target)
            .map_or(0, |i| self.relayed[i].load(Ordering::SeqCst))
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn spread(listener: TcpListener, targets: Vec<SocketAddr>, relayed: Arc<Vec<AtomicUsize>>) {
    let mut next = 0;
    while let Ok((mut client, _)) = listener.accept().await {
        let first = next;
        next = (next + 1) % targets.len().max(1);
        let targets = targets.clone();
        let relayed = relayed.clone();
        tokio::spawn(async move {
            for i in (0..targets.len()).map(|k| (first + k) % targets.len()) {
                let Ok(mut server) = TcpStream::connect(targets[i]).await else {
                    continue;
                };
                relayed[i].fetch_add(1, Ordering::SeqCst);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                return;
            }
            // No target is up: the client's connection closes at once.
        });
    }
}

/// Terminates TLS in front of a plaintext target, as an ingress or a TLS sidecar does, for
/// clients that send credentials only over TLS (kubectl drops a kubeconfig's token on an
/// `http://` server). Bytes are relayed as they are after the handshake, so upgraded
/// connections (exec, port-forward) cross. Offers HTTP/1.1 only. Relays until dropped.
pub struct TlsFront {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Listens on a free loopback port with the certificate chain and key (PEM) given, and
    /// relays each connection to `target` in plaintext.
    pub async fn start(
        target: SocketAddr,
        cert_pem: &str,
        key_pem: &str,
    ) -> std::io::Result<TlsFront> {
        let mut config = scale_agent_testkit::tls::server_config(cert_pem, key_pem)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut client) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Ok(TlsFront { addr, task })
    }

    /// Where clients connect (with TLS).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server; returns its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).await?;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn a_cut_ends_live_connections_and_refuses_new_ones_until_restored() {
        let relay = Relay::start(echo().await).await.unwrap();
        assert_eq!(round_trip(relay.addr()).await.unwrap(), b"ping");
        let mut live = TcpStream::connect(relay.addr()).await.unwrap();
        live.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        live.read_exact(&mut buf).await.unwrap();

        relay.cut();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            live.read_to_end(&mut rest),
        )
        .await
        .expect("the live connection ends at the cut");
        assert!(read.is_err() || rest.is_empty(), "{read:?} {rest:?}");
        assert!(round_trip(relay.addr()).await.is_err());

        relay.restore();
        assert_eq!(round_trip(relay.addr()).await.unwrap(), b"ping");
    }

    #[tokio::test]
    async fn a_balancer_takes_turns_and_passes_over_a_dead_target() {
        let (one, two) = (echo().await, echo().await);
        // A port nothing listens on: a target whose process died.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let balancer = Balancer::start(vec![one, dead, two]).await.unwrap();
        for _ in 0..6 {
            assert_eq!(round_trip(balancer.addr()).await.unwrap(), b"ping");
        }
        assert_eq!(balancer.relayed_to(dead), 0);
        assert_eq!(balancer.relayed_to(one) + balancer.relayed_to(two), 6);
        assert!(balancer.relayed_to(one) >= 2 && balancer.relayed_to(two) >= 2);
    }
}
