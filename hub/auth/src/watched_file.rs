//! [`WatchedFile`]: a credential file read again by content, the way the TLS reloader reads
//! certificates (issue 28, F25). Whoever holds the credential polls it and is told what
//! changed: new content, or that the file is gone.
//!
//! A file missing at one read is not gone yet: it counts as gone only once it has been
//! missing for [`MISSING_GRACE`]. A Secret mounted in a pod changes by an atomic swap of
//! the `..data` symlink, and a reader racing the swap can find the old target already
//! removed; editors and `kubectl cp` write by delete-and-create. Both last milliseconds. A
//! file missing for seconds was deleted (the Secret, or its key, is gone), and what it held
//! must stop working.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How long a file must stay missing to count as deleted: many times longer than a Secret
/// volume's symlink swap or an editor's delete-and-write, and short enough that a deleted
/// Secret's credentials end within seconds.
pub const MISSING_GRACE: Duration = Duration::from_secs(5);

/// What a read of a [`WatchedFile`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Same content as the last read (or missing, within the grace).
    Unchanged,
    /// New content (or the file appeared).
    Changed(Vec<u8>),
    /// Missing for [`MISSING_GRACE`] (reported once).
    Gone,
    /// Not readable for another reason; what it held stays.
    Unreadable(String),
}

/// A file whose content is compared with the last read.
#[derive(Debug)]
pub struct WatchedFile {
    path: PathBuf,
    /// The content last read; `None` before the first read and once the file is gone.
    content: Option<Vec<u8>>,
    /// Since when the file has been missing.
    missing_since: Option<Instant>,
    grace: Duration,
}

impl WatchedFile {
    /// `path`, whose content `initial` (if any) is what the holder read at start.
    pub fn new(path: &Path, initial: Option<Vec<u8>>) -> Self {
        WatchedFile {
            path: path.to_path_buf(),
            content: initial,
            missing_since: None,
            grace: MISSING_GRACE,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file now ([`Self::read_at`] with the current time).
    pub fn read(&mut self) -> Change {
        self.read_at(Instant::now())
    }

    /// Reads the file as of `now`: what changed since the last read.
    pub fn read_at(&mut self, now: Instant) -> Change {
        match std::fs::read(&self.path) {
            Ok(content) => {
                self.missing_since = None;
                if self.content.as_deref() == Some(content.as_slice()) {
                    return Change::Unchanged;
                }
                self.content = Some(content.clone());
                Change::Changed(content)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if self.content.is_none() {
                    // Gone already (or never there): nothing to take away.
                    return Change::Unchanged;
                }
                let since = *self.missing_since.get_or_insert(now);
                if now.saturating_duration_since(since) < self.grace {
                    return Change::Unchanged;
                }
                self.content = None;
                self.missing_since = None;
                Change::Gone
            }
            Err(e) => Change::Unreadable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_missing_file_is_gone_only_after_the_grace() {
        let dir = std::env::temp_dir().join(format!("watched-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, b"one").unwrap();
        let mut file = WatchedFile::new(&path, Some(b"one".to_vec()));
        let start = Instant::now();
        assert_eq!(file.read_at(start), Change::Unchanged);
        std::fs::write(&path, b"two").unwrap();
        assert_eq!(file.read_at(start), Change::Changed(b"two".to_vec()));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.read_at(start), Change::Unchanged, "within the grace");
        // Back within the grace, same content: nothing happened.
        std::fs::write(&path, b"two").unwrap();
        assert_eq!(file.read_at(start + MISSING_GRACE * 2), Change::Unchanged);
        std::fs::remove_file(&path).unwrap();
        let later = start + MISSING_GRACE * 3;
        assert_eq!(
            file.read_at(later),
            Change::Unchanged,
            "the grace starts again"
        );
        assert_eq!(file.read_at(later + MISSING_GRACE), Change::Gone);
        assert_eq!(
            file.read_at(later + MISSING_GRACE * 2),
            Change::Unchanged,
            "once"
        );
        std::fs::write(&path, b"two").unwrap();
        assert_eq!(
            file.read_at(later + MISSING_GRACE * 2),
            Change::Changed(b"two".to_vec())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
