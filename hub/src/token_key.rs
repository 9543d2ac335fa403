//! Where the key that derives the Clouddriver tokens lives (review F11). By default it is
//! kept in the store's metadata (`token-derivation-key`), next to the token records: whoever
//! reads the store (a DBA, a backup, a snapshot of the volume) computes every account's
//! Clouddriver token. With `--token-key-file` the key comes from a file (a Secret) and the
//! store does not hold it:
//! - a store without a key, or holding the same one (a migration: the store's key copied
//!   into the Secret), works on, and the store's copy is blanked (an empty value, which
//!   [`Tokens::load`](crate::tokens::Tokens::load) treats as none);
//! - a store holding another key is refused, since the tokens Clouddriver uses now were
//!   derived with it, unless `--token-key-replaces-stored` says to derive new ones.

use std::path::Path;

use scale_agent_hub_auth::tokens::DERIVATION_KEY;

use crate::{
    error::{HubError, Result},
    store::StoreOp,
};

/// The key read from `--token-key-file`, as 64 hex characters.
#[derive(Clone)]
pub struct TokenKeyFile {
    hex: String,
    /// `--token-key-replaces-stored`.
    replaces_stored: bool,
}

impl std::fmt::Debug for TokenKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKeyFile")
            .field("hex", &"<redacted>")
            .field("replaces_stored", &self.replaces_stored)
            .finish()
    }
}

impl TokenKeyFile {
    /// Reads and checks `--token-key-file`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| HubError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(&text)
            .map_err(|why| HubError::Config(format!("--token-key-file {}: {why}", path.display())))
    }

    /// A key from its text: 64 hex characters (32 bytes), surrounding whitespace ignored.
    pub fn new(text: &str) -> std::result::Result<Self, String> {
        let hex = text.trim().to_ascii_lowercase();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(
                "must hold 32 bytes as 64 hex characters, e.g. from `openssl rand -hex 32`".into(),
            );
        }
        Ok(Self {
            hex,
            replaces_stored: false,
        })
    }

    /// The same key, with `--token-key-replaces-stored`.
    pub fn replacing_stored(mut self, replaces: bool) -> Self {
        self.replaces_stored = replaces;
        self
    }
}

/// The derivation key to load the tokens with, and what to write to the store for it:
/// `file` from `--token-key-file`, `stored` the store's metadata value.
pub fn derivation_key(
    file: Option<&TokenKeyFile>,
    stored: Option<&str>,
) -> Result<(Option<String>, Vec<StoreOp>)> {
    let stored = stored.map(str::trim).filter(|s| !s.is_empty());
    let Some(file) = file else {
        tracing::warn!(
            "the key that derives the Clouddriver tokens is kept in the store: whoever reads \
             the store can compute them; give it in a file from a Secret (--token-key-file)"
        );
        return Ok((stored.map(str::to_string), Vec::new()));
    };
    let blank = vec![StoreOp::PutMeta {
        key: DERIVATION_KEY.into(),
        value: String::new(),
    }];
    match stored {
        None => Ok((Some(file.hex.clone()), Vec::new())),
        Some(stored) if stored.eq_ignore_ascii_case(&file.hex) => {
            tracing::info!(
                "the token derivation key is now only in --token-key-file: removed from the store"
            );
            Ok((Some(file.hex.clone()), blank))
        }
        Some(_) if file.replaces_stored => {
            tracing::warn!(
                "--token-key-replaces-stored: the store's token derivation key is removed; every \
                 Clouddriver token is derived anew with --token-key-file's key (the registrar \
                 registers the new kubeconfigs; kubeconfigs handed out by hand must be fetched again)"
            );
            Ok((Some(file.hex.clone()), blank))
        }
        Some(_) => Err(HubError::Config(format!(
            "--token-key-file holds another key than the one in the store, which derived the \
             Clouddriver tokens in use. To keep those tokens, put the store's key in the file: \
             it is the value of {DERIVATION_KEY:?} in the store's meta table (PostgreSQL: \
             SELECT value FROM meta WHERE key = '{DERIVATION_KEY}'); the hub then removes it \
             from the store. To derive new tokens with the file's key instead, start once with \
             --token-key-replaces-stored"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_key_moves_out_of_the_store_and_another_is_refused() {
        let key = "ab".repeat(32);
        let file = TokenKeyFile::new(&format!("{key}\n")).unwrap();
        assert!(TokenKeyFile::new("short").is_err());
        // No key in the store: the file's.
        let (hex, ops) = derivation_key(Some(&file), None).unwrap();
        assert_eq!(hex.as_deref(), Some(key.as_str()));
        assert!(ops.is_empty());
        // The same key in the store: blanked there.
        let (hex, ops) = derivation_key(Some(&file), Some(&key.to_uppercase())).unwrap();
        assert_eq!(hex.as_deref(), Some(key.as_str()));
        assert!(matches!(&ops[..], [StoreOp::PutMeta { value, .. }] if value.is_empty()));
        // A blanked store key counts as none.
        let (_, ops) = derivation_key(Some(&file), Some("")).unwrap();
        assert!(ops.is_empty());
        // Another key: refused, saying how to migrate, unless replacing.
        let other = "cd".repeat(32);
        let err = derivation_key(Some(&file), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SELECT value FROM meta") && err.contains("--token-key-replaces-stored"),
            "{err}"
        );
        let replacing = file.clone().replacing_stored(true);
        let (hex, ops) = derivation_key(Some(&replacing), Some(&other)).unwrap();
        assert_eq!(hex.as_deref(), Some(key.as_str()));
        assert_eq!(ops.len(), 1);
        // Without the file: the store's, as before.
        let (hex, ops) = derivation_key(None, Some(&other)).unwrap();
        assert_eq!(hex.as_deref(), Some(other.as_str()));
        assert!(ops.is_empty());
    }
}
