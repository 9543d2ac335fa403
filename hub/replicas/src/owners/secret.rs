//! The secret replicas present to each other (`--replica-secret-file`), read again by
//! content and rotated without a restart (issue 28, F25).
//!
//! Every replica reads the file on its own, so during a rotation some replicas hold the new
//! secret while others still hold the old one: the kubelet refreshes a mounted Secret on
//! each node at its own time (its sync period plus its cache's TTL, a minute each by
//! default), and a replica notices within its reload period. For [`ROTATION_OVERLAP`] after
//! a replica sees the secret change, it
//! - still accepts the previous secret (a replica that has not seen the change sends it), and
//! - offers the previous secret beside the new one ([`PREVIOUS_HEADER`]), so that a replica
//!   that has not seen the change yet admits it.
//!
//! So two replicas forward to each other throughout as long as both see the change within
//! the overlap of each other. Past it, the previous secret opens nothing. A replica started
//! during the rotation knows only the secret it read; the others reach it once they see the
//! same file.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use scale_agent_hub_auth::watched_file::{Change, WatchedFile};
use scale_agent_hub_model::{HubError, Result, time::reload_every};

/// How long the previous secret stays valid after a replica reads a new one: twice the
/// kubelet's default propagation of a Secret's change to every node (up to about two
/// minutes: the sync period plus the cache's TTL) with the reload period on top, and short
/// enough that a retired secret stops opening the internal routes within minutes.
pub const ROTATION_OVERLAP: Duration = Duration::from_secs(300);

/// Carries the previous secret beside the current one (the `Authorization` header) during a
/// rotation's overlap.
pub const PREVIOUS_HEADER: &str = "x-scale-agent-replica-secret-previous";

/// The secret the replicas share (`--replica-secret-file`); never printed.
#[derive(Clone)]
pub struct ReplicaSecret {
    value: String,
    /// The file it was read from, read again to follow rotations; `None`: fixed.
    path: Option<PathBuf>,
}

impl std::fmt::Debug for ReplicaSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplicaSecret(<redacted>)")
    }
}

impl ReplicaSecret {
    /// At least 32 characters (e.g. `openssl rand -hex 32`), so it cannot be guessed.
    pub fn new(secret: &str) -> Result<Self> {
        let secret = secret.trim();
        if secret.len() < 32 || secret.contains(char::is_whitespace) {
            return Err(HubError::Config(
                "the replica secret (--replica-secret-file) must be one word of at least 32 \
                 characters, e.g. from `openssl rand -hex 32`"
                    .into(),
            ));
        }
        Ok(ReplicaSecret {
            value: secret.to_string(),
            path: None,
        })
    }

    /// Reads `--replica-secret-file`, which is read again while the hub runs.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| HubError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        let mut secret = Self::new(&text)?;
        secret.path = Some(path.to_path_buf());
        Ok(secret)
    }
}

/// Compares in constant time (of digests: the time says nothing about the secret).
fn same(secret: &str, presented: &str) -> bool {
    let digest = |t: &str| ring::digest::digest(&ring::digest::SHA256, t.as_bytes());
    digest(secret).as_ref() == digest(presented).as_ref()
}

/// The secrets in use.
struct Held {
    current: String,
    /// The secret before the last change, and until when it is still good.
    previous: Option<(String, Instant)>,
}

impl Held {
    fn previous_at(&self, now: Instant) -> Option<&str> {
        self.previous
            .as_ref()
            .filter(|(_, until)| now < *until)
            .map(|(secret, _)| secret.as_str())
    }
}

/// The replica secret as it is now, following its file.
pub struct RotatingSecret {
    file: Option<Mutex<WatchedFile>>,
    held: RwLock<Held>,
    overlap: Duration,
}

impl RotatingSecret {
    /// `secret`, followed in its file (if it came from one) with `overlap` for rotations.
    pub fn new(secret: &ReplicaSecret, overlap: Duration) -> Self {
        let file = secret.path.as_deref().map(|path| {
            let content = std::fs::read(path).ok();
            Mutex::new(WatchedFile::new(path, content))
        });
        RotatingSecret {
            file,
            held: RwLock::new(Held {
                current: secret.value.clone(),
                previous: None,
            }),
            overlap,
        }
    }

    fn held(&self) -> std::sync::RwLockReadGuard<'_, Held> {
        self.held.read().unwrap_or_else(|e| e.into_inner())
    }

    /// What this replica sends: the current secret, and the previous one during the
    /// overlap.
    pub fn offered(&self) -> (String, Option<String>) {
        let held = self.held();
        (
            held.current.clone(),
            held.previous_at(Instant::now()).map(str::to_string),
        )
    }

    /// Whether any of `presented` is the current secret, or the previous one during the
    /// overlap.
    pub fn accepts<'a>(&self, presented: impl IntoIterator<Item = &'a str>) -> bool {
        let held = self.held();
        let previous = held.previous_at(Instant::now());
        presented
            .into_iter()
            .any(|p| same(&held.current, p) || previous.is_some_and(|previous| same(previous, p)))
    }

    /// Reads the file again; a new valid secret becomes current, the one before stays
    /// accepted for the overlap. A file missing or broken keeps the secret in use: the
    /// replicas could not forward without one, and a replica secret is retired by rotating
    /// it, not by deleting it.
    pub fn reload(&self) {
        let Some(file) = &self.file else {
            return;
        };
        let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
        let path = file.path().display().to_string();
        let content = match file.read() {
            Change::Unchanged => return,
            Change::Changed(content) => content,
            Change::Gone => {
                tracing::warn!(%path, "the replica secret file is gone; keeping the secret in use (rotate it by writing a new one)");
                return;
            }
            Change::Unreadable(error) => {
                tracing::error!(%path, %error, "cannot read the replica secret file; keeping the secret in use");
                return;
            }
        };
        let secret = match ReplicaSecret::new(&String::from_utf8_lossy(&content)) {
            Ok(secret) => secret,
            Err(error) => {
                tracing::error!(%path, %error, "the replica secret file is broken; keeping the secret in use");
                return;
            }
        };
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        if held.current == secret.value {
            return;
        }
        let previous = std::mem::replace(&mut held.current, secret.value);
        held.previous = Some((previous, Instant::now() + self.overlap));
        tracing::info!(%path, overlap = ?self.overlap, "replica secret rotated: the previous one is still accepted and offered for the overlap");
    }

    /// Re-reads the file every `period` until shutdown; nothing for a fixed secret.
    pub async fn watch(
        self: Arc<Self>,
        period: Duration,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        if self.file.is_none() {
            return;
        }
        reload_every(period, shutdown, move || self.reload()).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_rotation_accepts_and_offers_the_previous_secret_for_the_overlap() {
        let dir = std::env::temp_dir().join(format!("replica-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        let (old, new) = ("a".repeat(32), "b".repeat(32));
        std::fs::write(&path, &old).unwrap();
        let secret = RotatingSecret::new(
            &ReplicaSecret::read(&path).unwrap(),
            Duration::from_millis(300),
        );
        assert_eq!(secret.offered(), (old.clone(), None));
        assert!(secret.accepts([old.as_str()]) && !secret.accepts([new.as_str()]));
        std::fs::write(&path, "too short").unwrap();
        secret.reload();
        assert_eq!(secret.offered(), (old.clone(), None), "broken: kept");
        std::fs::write(&path, format!("{new}\n")).unwrap();
        secret.reload();
        assert_eq!(secret.offered(), (new.clone(), Some(old.clone())));
        assert!(secret.accepts([old.as_str()]) && secret.accepts([new.as_str()]));
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(secret.offered(), (new.clone(), None));
        assert!(!secret.accepts([old.as_str()]) && secret.accepts(["x", new.as_str()]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
