//! [`AdminTokenFile`]: the admin token, read again from its file by content (issue 28, F25).
//! A rotated token works at the next read and the one before stops at once (an admin token
//! has one holder, the one who rotates it: no overlap is needed); a file deleted for
//! [`crate::watched_file::MISSING_GRACE`] leaves the hub with no admin token until one is
//! written there again. An empty file (a write caught half done) keeps the token in use.

use std::{
    path::Path,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use scale_agent_hub_model::time::reload_every;

use crate::{
    tokens::AdminToken,
    watched_file::{Change, WatchedFile},
};

/// The admin token and the file it comes from.
#[derive(Debug)]
pub struct AdminTokenFile {
    file: Mutex<WatchedFile>,
    /// The token in use; `None` once the file is gone.
    token: RwLock<Option<AdminToken>>,
}

impl AdminTokenFile {
    /// The file at `path` holding `token`, read there at start as `content` (the bytes,
    /// newline included, so that only a later change counts).
    pub fn new(path: &Path, token: &str, content: Vec<u8>) -> Self {
        AdminTokenFile {
            file: Mutex::new(WatchedFile::new(path, Some(content))),
            token: RwLock::new(Some(AdminToken::new(token))),
        }
    }

    /// Whether `presented` is the admin token now.
    pub fn matches(&self, presented: &str) -> bool {
        self.token
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|token| token.matches(presented))
    }

    /// Whether the hub has an admin token now.
    pub fn present(&self) -> bool {
        self.token
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Reads the file again and takes its token when it changed.
    pub fn reload(&self) {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let path = file.path().display().to_string();
        let token = match file.read() {
            Change::Unchanged => return,
            Change::Gone => {
                tracing::warn!(%path, "the admin token file is gone: the admin token no longer works (write a new token there, or restart the hub to create one)");
                None
            }
            Change::Unreadable(error) => {
                tracing::error!(%path, %error, "cannot read the admin token file; keeping the admin token in use");
                return;
            }
            Change::Changed(content) => {
                let text = String::from_utf8_lossy(&content);
                if text.trim().is_empty() {
                    tracing::warn!(%path, "the admin token file is empty; keeping the admin token in use until a token is written there");
                    return;
                }
                tracing::info!(%path, "admin token file changed: the new admin token works, the previous one no longer does");
                Some(AdminToken::new(&text))
            }
        };
        *self.token.write().unwrap_or_else(|e| e.into_inner()) = token;
    }

    /// Re-reads the file every `period` until shutdown.
    pub async fn watch(
        self: Arc<Self>,
        period: Duration,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        reload_every(period, shutdown, move || self.reload()).await;
    }
}
