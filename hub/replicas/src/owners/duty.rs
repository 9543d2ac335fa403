//! The ownership task of a replica that shares its accounts with others: acquires the
//! accounts whose agents stand by here, reloading each from the store before its first
//! standby streams it; releases those no agent serves here any more; and, when every
//! ownership was lost at once, ends the streams of the accounts it owned.

use std::time::Duration;

use scale_agent_hub_model::error::Chain;
use scale_agent_hub_state::{Control, Live};
use scale_agent_hub_store::{StoreOp, writer::Commits};
use tokio::sync::watch;

use super::{AccountSource, Claim};
use crate::Replicas;

/// How often accounts owned elsewhere are tried again: the time a standby waits, at most,
/// after its owner died (the lock frees when the owner's database session ends).
pub const POLL: Duration = Duration::from_secs(1);

/// Runs until `shutdown` says the hub stops (which releases everything once the store is
/// flushed). Ownership comes from `replicas`; the standbys and owned accounts are `live`'s
/// registry; what an account taken over was registered with is queued in `commits`;
/// `source` loads an account taken over.
pub async fn run(
    replicas: &Replicas,
    live: &Live,
    commits: &Commits,
    source: &dyn AccountSource,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut losses = replicas.ownership.losses();
    loop {
        let to_acquire = live.registry().to_acquire();
        if to_acquire.is_empty() && commits.is_unreachable() {
            // Nothing to take that would find out: the probe says whether the store answers.
            match replicas.ownership.probe().await {
                Ok(()) => commits.reachable(),
                Err(e) => commits.unreachable(format!(
                    "the ownership's probe of the store failed: {}",
                    Chain(&e)
                )),
            }
        }
        for account in to_acquire {
            acquire(replicas, live, commits, source, &account).await;
        }
        let to_release = live.registry().to_release();
        for account in to_release {
            release(replicas, live, commits, &account).await;
        }
        tokio::select! {
            () = live.owners_wake().notified() => {}
            () = tokio::time::sleep(POLL) => {}
            changed = losses.changed() => {
                if changed.is_ok() {
                    lost_all(live);
                    commits.unreachable(
                        "the connection to PostgreSQL that holds the accounts' ownership broke"
                            .into(),
                    );
                }
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    break;
                }
            }
        }
    }
}

/// Tries to take `account`; on success loads it and promotes its first standby here.
#[tracing::instrument(name = "acquire", skip_all, fields(%account))]
async fn acquire(
    replicas: &Replicas,
    live: &Live,
    commits: &Commits,
    source: &dyn AccountSource,
    account: &str,
) {
    let claim = replicas.ownership.try_acquire(account).await;
    match &claim {
        Ok(_) => commits.reachable(),
        // Not naming the account: the reason shows on every account's reads.
        Err(e) => commits.unreachable(format!("cannot take accounts' ownership: {}", Chain(e))),
    }
    let epoch = match claim {
        Ok(Claim::Acquired { epoch }) => epoch,
        Ok(Claim::HeldElsewhere(owner)) => {
            tracing::trace!(owner = ?owner.map(|o| o.replica), "account owned by another replica");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot acquire the account; trying again");
            return;
        }
    };
    let snapshot = match source.load_account(account).await {
        Ok(snapshot) => snapshot,
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot load the account taken over; releasing it");
            if let Err(e) = replicas.ownership.release(account).await {
                tracing::warn!(error = %Chain(&e), "cannot release the account");
            }
            return;
        }
    };
    let promotion = {
        let mut registry = live.registry();
        if let Some(snapshot) = snapshot {
            live.cache().insert_account(account, snapshot.cache);
        }
        let promotion = registry.acquired(account);
        // What the standbys' registrations here said, written now that this replica may
        // write the account (queued in this critical section, in order with the streams').
        let mut ops = Vec::new();
        if let Some(a) = registry.accounts.get(account) {
            ops.push(StoreOp::PutAccount {
                account: account.to_string(),
                record: a.record.clone(),
            });
        }
        if let Some(binding) = registry.bindings.get(account) {
            ops.push(StoreOp::PutBinding {
                account: account.to_string(),
                binding: binding.clone(),
            });
        }
        commits.enqueue(ops);
        promotion
    };
    live.account_forgotten(account);
    live.cache_advanced();
    tracing::info!(
        epoch,
        promoted = promotion.is_some(),
        "account owned by this replica"
    );
    live.deliver(promotion.into_iter().collect());
    live.observe_states();
}

/// Gives `account` up once what was queued for it is stored, so that the next owner loads
/// it.
#[tracing::instrument(name = "release", skip_all, fields(%account))]
async fn release(replicas: &Replicas, live: &Live, commits: &Commits, account: &str) {
    live.registry().released(account);
    let ticket = commits.last_ticket();
    if let Err(failure) = commits.committed_or_failing(ticket).await {
        tracing::warn!(%failure, "releasing an account whose last changes are not stored yet; its next owner resumes from older resume points");
    }
    match replicas.ownership.release(account).await {
        Ok(()) => tracing::info!("account released: no agent of it is connected here"),
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot release the account")
        }
    }
    live.observe_states();
}

/// Every ownership was lost at once: the streams of those accounts end, so their agents
/// reconnect (to whichever replica owns the account next).
fn lost_all(live: &Live) {
    let sessions = live.registry().lost_all();
    tracing::warn!(
        streams = sessions.len(),
        "this replica lost the ownership of its accounts (its connection to the ownership \
         store broke); ending their streams so their agents reconnect"
    );
    for session in sessions {
        live.control(
            session,
            Control::Close(tonic::Status::unavailable(
                "this hub replica lost the ownership of an account this stream streamed; \
                 reconnect",
            )),
        );
    }
    live.observe_states();
}
