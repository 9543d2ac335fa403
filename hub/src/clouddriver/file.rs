//! Atomic replacement of the dynamic-config file.
//!
//! Clouddriver (`ModifiableFilePropertySources`) watches the file's directory and re-reads the
//! file on every create, modify or delete event for its name. Writing in place would let it
//! read half a file; so the new contents go to a temporary file in the same directory
//! (events for other names are ignored), which is flushed to disk and renamed over the old
//! one (readers see the old file or the new one, never a mix), and the directory is flushed
//! so the rename survives a crash.

use std::{
    fs::{File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `contents`, atomically; the file is readable by its owner only (it
/// holds bearer tokens).
pub(crate) fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    #[test]
    fn replaces_with_a_new_inode_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("cd-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("accounts.yml");
        write_atomically(&path, b"one\n").unwrap();
        let first = std::fs::metadata(&path).unwrap();
        assert_eq!(first.permissions().mode() & 0o777, 0o600);
        write_atomically(&path, b"two\n").unwrap();
        let second = std::fs::metadata(&path).unwrap();
        assert_ne!(first.ino(), second.ino());
        assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1);
        assert!(write_atomically(&dir.join("missing/accounts.yml"), b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
