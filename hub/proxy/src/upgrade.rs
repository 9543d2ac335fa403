//! An upgraded connection (exec, attach, port-forward) after the API server's 101: the
//! exchange carries the connection's bytes both ways, within the agent's credit one way and
//! returning credit as the client's side is written the other.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use scale_agent_hub_state::tunnel::{self, BodyEvent};
use scale_agent_proto::v1::{self as pb, tunnel_frame::Frame};

use scale_agent_hub_auth::credential_sessions::Lease;

use super::forward::ExchangeGuard;

/// An upgraded connection (exec, attach, port-forward) carried by an exchange: the client's
/// bytes go to the agent within its credit, the agent's to the client, returning credit as
/// they are written.
pub(crate) struct Upgraded {
    pub(crate) events: tokio::sync::mpsc::UnboundedReceiver<BodyEvent>,
    pub(crate) unconsumed: Arc<AtomicU64>,
    pub(crate) credit: Arc<tokio::sync::Semaphore>,
    pub(crate) window: u64,
    pub(crate) guard: ExchangeGuard,
    /// The hold on the token the connection was opened with: revoking it ends the
    /// connection (F17).
    pub(crate) lease: Option<Lease>,
}

impl Upgraded {
    pub(crate) async fn run(self, on_upgrade: hyper::upgrade::OnUpgrade) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let Upgraded {
            mut events,
            unconsumed,
            credit,
            window,
            guard,
            lease,
        } = self;
        let revoked = scale_agent_hub_auth::credential_sessions::revoked(lease);
        tokio::pin!(revoked);
        let io = match on_upgrade.await {
            Ok(upgraded) => hyper_util::rt::TokioIo::new(upgraded),
            Err(error) => {
                tracing::debug!(%error, "the client's connection did not upgrade");
                return;
            }
        };
        let (mut from_client, mut to_client) = tokio::io::split(io);
        let (id, tx) = (guard.id, guard.tx.clone());
        // Client to agent, never beyond the agent's credit.
        let upstream = tokio::spawn(async move {
            let mut buf = vec![0u8; tunnel::MAX_FRAME_BYTES];
            loop {
                // A read error ends the client's side like an end of stream.
                let n: usize = from_client.read(&mut buf).await.unwrap_or_default();
                if n > 0 {
                    let Ok(permits) = credit.acquire_many(n as u32).await else {
                        return;
                    };
                    permits.forget();
                }
                let frame = Frame::Data(pb::TunnelData {
                    data: buf[..n].to_vec(),
                    end_of_body: n == 0,
                });
                if !tunnel::send_frame(&tx, id, frame).await || n == 0 {
                    return;
                }
            }
        });
        // Agent to client; the connection ends when the API server's side does.
        let mut consumed = 0u64;
        loop {
            let event = tokio::select! {
                event = events.recv() => event,
                () = &mut revoked => {
                    tracing::info!("the token of an upgraded connection was revoked; the connection ends");
                    break;
                }
            };
            let Some(event) = event else {
                break;
            };
            match event {
                BodyEvent::Data(bytes) => {
                    if to_client.write_all(&bytes).await.is_err() {
                        break;
                    }
                    consumed += bytes.len() as u64;
                    if consumed >= window / 4 {
                        unconsumed.fetch_sub(consumed, Ordering::AcqRel);
                        let update =
                            Frame::WindowUpdate(u32::try_from(consumed).unwrap_or(u32::MAX));
                        consumed = 0;
                        if !tunnel::send_frame(&guard.tx, guard.id, update).await {
                            break;
                        }
                    }
                }
                BodyEvent::End | BodyEvent::Failed(_) => break,
            }
        }
        let _ = to_client.shutdown().await;
        upstream.abort();
        // Dropping the guard resets the exchange if the agent's side is still open.
        drop(guard);
    }
}
