//! A TCP relay on loopback that a test can cut, to stage a network outage between one agent
//! and its hub while both processes keep running: [`Relay::cut`] closes every relayed
//! connection and refuses new ones (accepted, then closed at once, as a failing load
//! balancer does) until [`Relay::restore`].

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
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
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and relays each connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0u64);
        let task = tokio::spawn(accept(listener, target, open.clone(), cuts.clone()));
        Ok(Relay {
            addr,
            open,
            cuts,
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

    /// Relays new connections again.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
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
) {
    while let Ok((client, _)) = listener.accept().await {
        if !open.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let mut cut = cuts.subscribe();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(target).await else {
                return;
            };
            let mut client = client;
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = cut.changed() => {}
            }
            // Dropping both ends closes them: each side sees its connection end.
        });
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
}
