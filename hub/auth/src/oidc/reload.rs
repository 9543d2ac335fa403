//! [`OidcFiles`]: `--authentication-config` and `--oidc-access`, read again by content
//! (issue 28, F25), the way the TLS files and the other credential files are. A change to
//! either builds the issuers and rules anew from both files' current texts; a file that does
//! not parse, or is missing, keeps what is in use (logged): people keep signing in while a
//! Secret is half updated, and a deleted file is more likely a mistake than a revocation
//! (remove the rule in `--oidc-access` to take access away).

use std::{path::Path, sync::Mutex};

use crate::{
    oidc::Oidc,
    watched_file::{Change, WatchedFile},
};

/// The two files and their last texts.
pub struct OidcFiles {
    state: Mutex<State>,
}

struct State {
    config: WatchedFile,
    access: Option<WatchedFile>,
    config_text: String,
    access_text: Option<String>,
}

fn text(content: Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(&content.unwrap_or_default()).into_owned()
}

impl OidcFiles {
    /// The files `config` and `access` as they are now (what [`Oidc::open`] read).
    pub fn new(config: &Path, access: Option<&Path>) -> Self {
        let config_content = std::fs::read(config).ok();
        let access_content = access.map(|path| std::fs::read(path).ok());
        OidcFiles {
            state: Mutex::new(State {
                config: WatchedFile::new(config, config_content.clone()),
                access: access
                    .zip(access_content.clone())
                    .map(|(path, content)| WatchedFile::new(path, content)),
                config_text: text(config_content),
                access_text: access_content.map(text),
            }),
        }
    }

    /// Reads both files again: the issuers and rules to use from now on when either
    /// changed and both parse; `None` otherwise (what is in use stays).
    pub fn reload(&self) -> Option<Oidc> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let State {
            config,
            access,
            config_text,
            access_text,
        } = &mut *state;
        let mut changed = false;
        let mut read = |file: &mut WatchedFile, flag: &str, into: &mut String| {
            let path = file.path().display().to_string();
            match file.read() {
                Change::Unchanged => {}
                Change::Changed(content) => {
                    *into = text(Some(content));
                    changed = true;
                }
                Change::Gone => {
                    tracing::warn!(%path, %flag, "the file is gone; keeping the OIDC issuers and access rules in use");
                }
                Change::Unreadable(error) => {
                    tracing::error!(%path, %flag, %error, "cannot read the file; keeping the OIDC issuers and access rules in use");
                }
            }
        };
        read(config, "--authentication-config", config_text);
        if let (Some(file), Some(text)) = (access.as_mut(), access_text.as_mut()) {
            read(file, "--oidc-access", text);
        }
        if !changed {
            return None;
        }
        match Oidc::from_texts(config_text, access_text.as_deref()) {
            Ok(oidc) => {
                tracing::info!(path = %config.path().display(), "OIDC issuers and access rules reloaded");
                Some(oidc)
            }
            Err(error) => {
                tracing::error!(path = %config.path().display(), %error, "--authentication-config or --oidc-access is broken; keeping the OIDC issuers and access rules in use");
                None
            }
        }
    }
}
