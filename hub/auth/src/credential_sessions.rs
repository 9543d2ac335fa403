//! What each revocable credential holds open right now, so that revoking it ends them
//! (issue 28, F17): the agent streams that authenticated with an agent bearer token, and the
//! proxy's watches, followed logs and upgraded connections (exec, attach, port-forward)
//! opened with a token the hub issued. A request or stream takes a [`Lease`] on its
//! credential for as long as it runs and waits on [`Lease::ended`]; [`CredentialSessions::end`]
//! ends every lease of one credential at once.
//!
//! Revoking a credential on this replica ends its leases here at once (the admin routes);
//! the other replicas sharing a store end theirs when they next read the tokens from the
//! store (`--replica-sync-period`), by asking which of their open credentials are no
//! longer valid ([`crate::AuthBook::end_revoked_sessions`]).
//!
//! The map is touched when a long-running request or an agent stream starts and ends, and
//! on revocation: never on the ingest path nor by short requests.

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::watch;

/// A credential that can be revoked, by its id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Credential {
    /// A token the hub issued ([`crate::tokens`]: a person's, a pipeline's, Clouddriver's).
    Token(String),
    /// An agent bearer token ([`crate::agent_tokens`]).
    AgentToken(String),
}

impl Credential {
    /// What it is, for logs and answers.
    pub fn kind(&self) -> &'static str {
        match self {
            Credential::Token(_) => "token",
            Credential::AgentToken(_) => "agent token",
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Credential::Token(id) | Credential::AgentToken(id) => id,
        }
    }
}

/// The open leases, by credential.
#[derive(Default)]
pub struct CredentialSessions {
    open: Mutex<HashMap<Credential, HashMap<u64, watch::Sender<bool>>>>,
    next: AtomicU64,
}

impl std::fmt::Debug for CredentialSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSessions")
            .field("credentials", &self.lock().len())
            .finish_non_exhaustive()
    }
}

impl CredentialSessions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Credential, HashMap<u64, watch::Sender<bool>>>> {
        // A poisoned lock is taken over: each critical section leaves the map consistent.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A lease on `credential` for one stream or request; it ends when the credential is
    /// revoked ([`Self::end`]) and is released when its last clone is dropped.
    pub fn open(self: &Arc<Self>, credential: Credential) -> Lease {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(false);
        self.lock()
            .entry(credential.clone())
            .or_default()
            .insert(n, tx);
        Lease(Arc::new(LeaseInner {
            sessions: self.clone(),
            credential,
            n,
            ended: rx,
        }))
    }

    /// Ends every lease of `credential`; returns how many there were.
    pub fn end(&self, credential: &Credential) -> usize {
        let Some(leases) = self.lock().remove(credential) else {
            return 0;
        };
        for tx in leases.values() {
            let _ = tx.send(true);
        }
        leases.len()
    }

    /// The credentials that hold at least one lease.
    pub fn credentials(&self) -> Vec<Credential> {
        self.lock().keys().cloned().collect()
    }

    /// How many leases `credential` holds.
    pub fn count(&self, credential: &Credential) -> usize {
        self.lock().get(credential).map_or(0, HashMap::len)
    }
}

struct LeaseInner {
    sessions: Arc<CredentialSessions>,
    credential: Credential,
    n: u64,
    ended: watch::Receiver<bool>,
}

impl Drop for LeaseInner {
    fn drop(&mut self) {
        let mut open = self.sessions.lock();
        if let Some(leases) = open.get_mut(&self.credential) {
            leases.remove(&self.n);
            if leases.is_empty() {
                open.remove(&self.credential);
            }
        }
    }
}

/// One stream's or request's hold on its credential. Clones share it (a request's body and
/// its upgraded connection); it is released when the last one is dropped.
#[derive(Clone)]
pub struct Lease(Arc<LeaseInner>);

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("credential", &self.0.credential)
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub fn credential(&self) -> &Credential {
        &self.0.credential
    }

    /// Whether the credential was revoked since the lease was taken.
    pub fn is_ended(&self) -> bool {
        *self.0.ended.borrow()
    }

    /// Resolves when the credential is revoked. The future holds the lease, so a lease
    /// dropped elsewhere meanwhile does not end it.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        let keep = self.clone();
        let mut ended = self.0.ended.clone();
        async move {
            let _ = ended.wait_for(|ended| *ended).await;
            drop(keep);
        }
    }
}

/// Resolves when `lease`'s credential is revoked; never without a lease (a stream or request
/// its credential cannot revoke: a certificate, an OIDC ID token).
pub async fn revoked(lease: Option<Lease>) {
    match lease {
        Some(lease) => lease.ended().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ending_a_credential_ends_its_leases_only() {
        let sessions = Arc::new(CredentialSessions::default());
        let a1 = sessions.open(Credential::Token("a".into()));
        let a2 = sessions.open(Credential::Token("a".into()));
        let b = sessions.open(Credential::AgentToken("a".into()));
        assert_eq!(sessions.count(&Credential::Token("a".into())), 2);
        let waiting = tokio::spawn(a1.ended());
        assert_eq!(sessions.end(&Credential::Token("a".into())), 2);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("the lease ended")
            .unwrap();
        assert!(a2.is_ended() && !b.is_ended());
        assert_eq!(
            sessions.credentials(),
            vec![Credential::AgentToken("a".into())]
        );
        drop(b);
        assert!(sessions.credentials().is_empty());
        // A lease released normally leaves nothing behind, and ending nothing counts 0.
        let c = sessions.open(Credential::Token("c".into()));
        let c2 = c.clone();
        drop(c);
        assert_eq!(sessions.count(&Credential::Token("c".into())), 1);
        drop(c2);
        assert_eq!(sessions.end(&Credential::Token("c".into())), 0);
    }
}
