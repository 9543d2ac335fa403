//! What replicas sharing a PostgreSQL store keep in step (issue 16): every replica holds
//! the small tables in memory (proxy and API tokens, agent tokens and enrolled identities,
//! account bindings, dynamic accounts) and
//! - reads them again every `--replica-sync-period` ([`run`]), so that what another
//!   replica issued, revoked, rebound, released or changed takes effect here within that
//!   period;
//! - looks a credential (or an account's record and binding) it does not know up in the
//!   store before refusing it ([`learn_token`], [`learn_agent_token`], [`learn_enrolled`],
//!   [`learn_accounts`]), so that a token issued on another replica works here at once;
//! - says it is alive (`hub_replicas`), for the listings that ask every replica
//!   (the hub's `fleet`);
//! - ends the agent streams, watches and exec sessions of tokens revoked or rotated on
//!   another replica, once it read them gone ([`AuthBook::end_revoked_sessions`]);
//! - sweeps the accounts no replica has owned for the grace period out of the store
//!   ([`SharedStore::sweep_orphans`]: once, under each account's lock).
//!
//! With the embedded store (one replica) none of this runs: the hub reads its store at
//! start-up only, as it always did, and nothing polls.

use std::time::Duration;

use scale_agent_hub_auth::AuthBook;
use scale_agent_hub_model::{Result, error::Chain};
use scale_agent_hub_state::{Control, Live};
use scale_agent_hub_store::{SharedStore, Store, writer::Commits};
use tokio::sync::watch;

use crate::Replicas;

/// A replica silent for this long is forgotten from `hub_replicas`.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The replicas asked by the listings: those that said they were alive within this many
/// sync periods (and at least [`MIN_ALIVE`]).
const ALIVE_PERIODS: u32 = 5;
const MIN_ALIVE: Duration = Duration::from_secs(10);

/// How recently a replica must have said it was alive to be asked by the listings.
pub fn alive_within(period: Duration) -> Duration {
    (period * ALIVE_PERIODS).max(MIN_ALIVE)
}

/// Runs until `shutdown` says the hub stops; nothing with one replica (no shared store).
/// What it reads goes into `live` (bindings, dynamic accounts) and `auth` (tokens), under
/// `writers`, the store's lock that this replica's writers of those tables hold; `commits`
/// says when this replica's own changes are stored.
pub async fn run(
    replicas: &Replicas,
    live: &Live,
    auth: &AuthBook,
    commits: &Commits,
    writers: &tokio::sync::Mutex<Store>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(store) = &replicas.shared else {
        return;
    };
    let mut interval = tokio::time::interval(replicas.settings.sync_period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    return;
                }
            }
        }
        if let Err(e) = sync(replicas, live, auth, commits, writers, store).await {
            tracing::warn!(error = %Chain(&e), "cannot read what the other replicas wrote to the shared store; trying again");
        }
    }
}

/// One round: alive, the small tables read again, the orphans swept.
async fn sync(
    replicas: &Replicas,
    live: &Live,
    auth: &AuthBook,
    commits: &Commits,
    writers: &tokio::sync::Mutex<Store>,
    store: &SharedStore,
) -> Result<()> {
    let replica = &replicas.replica;
    store
        .heartbeat(&replica.id, &replica.address, FORGET_AFTER)
        .await?;
    refresh(live, auth, commits, writers, store).await?;
    let grace_period = replicas.settings.grace_period;
    for account in store.sweep_orphans(grace_period).await? {
        tracing::info!(%account, ?grace_period, "account removed from the shared store: no replica owned it within the grace period (its binding stays)");
    }
    Ok(())
}

/// Reads the small tables again and puts them in place of what this replica holds.
async fn refresh(
    live: &Live,
    auth: &AuthBook,
    commits: &Commits,
    writers: &tokio::sync::Mutex<Store>,
    store: &SharedStore,
) -> Result<()> {
    // Bindings the store no longer has were released (an admin deleted an orphaned account
    // through another replica): dropped here too, or this replica would refuse the name to
    // every other identity until it restarts. But a binding made here may not be stored
    // yet: its change is queued for the store in the critical section that made it, so
    // the bindings held now are all stored once the last change queued now is. Taken
    // together, in one critical section; a binding that differs from this snapshot when the
    // store's rows are applied was made since, and stays until the next round.
    let (before, queued) = {
        let registry = live.registry();
        (registry.bindings.clone(), commits.last_ticket())
    };
    let settled = match commits.committed_or_failing(queued).await {
        Ok(()) => true,
        Err(failure) => {
            tracing::debug!(%failure, "changes not stored yet; no binding is dropped this round");
            false
        }
    };
    // Under the store's lock: the writers of these tables hold it from their change in
    // memory to their commit, so a read here never undoes a change of this replica that is
    // not stored yet.
    let (evicted, identities) = {
        let _writers = writers.lock().await;
        let tables = store.tables().await?;
        auth.tokens().replace_records(tables.tokens);
        auth.agent_tokens()
            .replace(tables.agent_tokens, tables.enrolled);
        let identities = live.dynamic_accounts().replace(tables.dynamic_accounts);
        let mut evicted = Vec::new();
        let mut registry = live.registry();
        let stored: std::collections::BTreeSet<String> = tables
            .bindings
            .iter()
            .map(|(account, _)| account.clone())
            .collect();
        for (account, binding) in tables.bindings {
            let moved = registry
                .bindings
                .get(&account)
                .is_some_and(|b| b.identity != binding.identity);
            if moved {
                for session in registry.sessions_of_others(&account, &binding.identity) {
                    evicted.push((session, account.clone(), binding.identity.clone()));
                }
            }
            registry.set_binding(account, binding);
        }
        if settled {
            let released: Vec<(String, String)> = registry
                .bindings
                .iter()
                .filter(|(account, binding)| {
                    !stored.contains(*account)
                        && before.get(*account) == Some(*binding)
                        // One made here for an account another replica owns is stored by
                        // the owner (or by this replica once it owns the account): kept
                        // while the stream that made it is here.
                        && !registry.has_stream_of(account, &binding.identity)
                })
                .map(|(account, binding)| (account.clone(), binding.identity.clone()))
                .collect();
            for (account, identity) in released {
                tracing::info!(%account, %identity, "account binding released on another replica; released here too");
                registry.remove_binding(&account);
            }
        }
        (evicted, identities)
    };
    for (session, account, identity) in evicted {
        tracing::info!(%account, %identity, "account rebound on another replica; ending the stream of another identity here");
        live.control(
            session,
            Control::Close(tonic::Status::permission_denied(format!(
                "account {account:?} was rebound to identity {identity:?} by an admin; this \
                 agent's identity may no longer serve it"
            ))),
        );
    }
    for identity in identities {
        scale_agent_hub_state::dynamic_accounts::push(live, &identity);
    }
    // Tokens revoked or rotated through another replica: what they hold open here ends now
    // (F17), within one sync period of the revocation.
    let ended = auth.end_revoked_sessions();
    if ended > 0 {
        tracing::info!(
            ended,
            "streams and sessions of tokens revoked on another replica ended"
        );
    }
    live.observe_states();
    Ok(())
}

/// Reads every token record again from the shared store, when there is one: before a
/// Clouddriver token is derived or rotated, because another replica may have rotated or
/// revoked it since the last refresh, and deriving from a stale record would hand out a
/// replaced token (issue 28, F2). Call it holding the store's lock, as [`refresh`] does.
pub async fn refresh_tokens(replicas: &Replicas, auth: &AuthBook) -> Result<()> {
    if let Some(store) = &replicas.shared {
        let tables = store.tables().await?;
        auth.tokens().replace_records(tables.tokens);
    }
    Ok(())
}

/// A proxy or API token (`sat_…`) this replica does not know is looked up in the shared
/// store, and kept when found: issued on another replica since the last refresh.
pub async fn learn_token(replicas: &Replicas, auth: &AuthBook, token: &str) {
    let Some(store) = &replicas.shared else {
        return;
    };
    if !token.starts_with(scale_agent_hub_auth::tokens::TOKEN_PREFIX) || auth.tokens().knows(token)
    {
        return;
    }
    let hash = scale_agent_hub_auth::tokens::sha256_hex(token);
    let remember = replicas.settings.sync_period;
    if !replicas.unknown.may_look_up(&hash, remember) {
        return;
    }
    match store.find_token(&hash).await {
        Ok(Some(record)) => {
            tracing::debug!(id = %record.id, "token issued on another replica, found in the shared store");
            auth.tokens().learn(record);
        }
        Ok(None) => replicas.unknown.missed(&hash, remember),
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot look a token up in the shared store")
        }
    }
}

/// [`learn_token`] of the bearer token in `headers`, if any.
pub async fn learn_bearer(replicas: &Replicas, auth: &AuthBook, headers: &axum::http::HeaderMap) {
    if let Some(token) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(scale_agent_hub_auth::tokens::bearer)
    {
        learn_token(replicas, auth, token).await;
    }
}

/// An agent token (`saa_…`) this replica does not know, or (`fresh`) every agent token
/// presented, is looked up in the shared store and kept when found. `fresh`: enrolment,
/// whose token another replica may have used a moment ago.
pub async fn learn_agent_token(replicas: &Replicas, auth: &AuthBook, token: &str, fresh: bool) {
    let Some(store) = &replicas.shared else {
        return;
    };
    if !token.starts_with(scale_agent_hub_auth::agent_tokens::AGENT_TOKEN_PREFIX) {
        return;
    }
    let known = auth.agent_tokens().find(token).is_some();
    if known && !fresh {
        return;
    }
    let hash = scale_agent_hub_auth::tokens::sha256_hex(token);
    let remember = replicas.settings.sync_period;
    // A known token is always looked up when fresh (its revocation elsewhere must be
    // seen); an unknown one within the guard's bounds (review F10).
    if !known && !replicas.unknown.may_look_up(&hash, remember) {
        return;
    }
    match store.find_agent_token(&hash).await {
        Ok(Some(record)) => auth.agent_tokens().learn(record),
        Ok(None) if !known => replicas.unknown.missed(&hash, remember),
        Ok(None) => {
            // Revoked through another replica since the last refresh.
            let mut tokens = auth.agent_tokens();
            if let Some(id) = tokens.find(token).map(|r| r.id.clone()) {
                tokens.revoke(&id);
            }
        }
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot look an agent token up in the shared store")
        }
    }
}

/// The enrolment of `identity` (its account pattern), when this replica knows none: it may
/// have enrolled through another replica. Returns whether one was found.
pub async fn learn_enrolled(replicas: &Replicas, auth: &AuthBook, identity: &str) -> bool {
    let Some(store) = &replicas.shared else {
        return false;
    };
    if auth.agent_tokens().enrolled(identity).is_some() {
        return false;
    }
    match store.find_enrolled(identity).await {
        Ok(Some(enrolled)) => {
            auth.agent_tokens().learn_enrolled(enrolled);
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot look an enrolled identity up in the shared store");
            false
        }
    }
}

/// Before registrations of `accounts` are checked: the record (its cluster) and binding of
/// each one this replica has neither of, from the shared store, so that a name bound or
/// registered through another replica is held to the same identity and cluster here
/// (in `live`'s registry).
pub async fn learn_accounts(replicas: &Replicas, live: &Live, accounts: &[String]) {
    let Some(store) = &replicas.shared else {
        return;
    };
    for account in accounts {
        let known = {
            let registry = live.registry();
            registry.accounts.contains_key(account) && registry.bindings.contains_key(account)
        };
        if known {
            continue;
        }
        match store.find_account(account).await {
            Ok((record, binding)) => {
                let mut registry = live.registry();
                if let Some(record) = record
                    && !registry.accounts.contains_key(account)
                {
                    registry.load(account.clone(), record, scale_agent_hub_model::time::now());
                }
                if let Some(binding) = binding {
                    registry.set_binding_if_none(account, binding);
                }
            }
            Err(e) => {
                tracing::warn!(error = %Chain(&e), %account, "cannot look an account up in the shared store")
            }
        }
    }
}
