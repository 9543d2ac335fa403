//! The audit file (`--audit-log-path`): every audit line (tracing target `audit`: proxied
//! requests, operations, account changes, admin levers) also written to a file of its own,
//! one JSON object per line, in the shape `--log-format json` gives them in the hub's log
//! (`{"timestamp", "level", "fields": {...}, "target": "audit"}`), so a log shipper or an
//! auditor reads one file whatever the log's format and `RUST_LOG` say.
//!
//! Rotation by size, like the API server's `--audit-log-maxsize`/`--audit-log-maxbackup`:
//! before a line would take the file past `--audit-log-max-size` MiB, `<path>` becomes
//! `<path>.1` (`.1` becomes `.2`, and so on), and only `--audit-log-max-backups` old files
//! are kept. Numbered names rather than the API server's time stamps: the order is in the
//! name, and a shipper's glob (`audit.log*`) is the same. No compression and no age limit:
//! size and count bound the disk, which is what a volume needs.
//!
//! It is a tracing layer ([`AuditFileLayer`]) the binary installs beside the log's own
//! before the hub starts; tests install the same layer.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use serde_json::{Map, Value, json};
use tracing::{Event, Level, Subscriber, field::Field};
use tracing_subscriber::{
    Layer,
    filter::{Filtered, Targets},
    layer::Context,
};

use crate::audit::TARGET;

/// Default `--audit-log-max-size`, MiB: the API server's habitual 100 MB.
pub const DEFAULT_MAX_SIZE_MIB: u64 = 100;
/// Default `--audit-log-max-backups`.
pub const DEFAULT_MAX_BACKUPS: usize = 5;

/// Where and how the audit file is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditLogOptions {
    pub path: PathBuf,
    /// Rotate before the file would grow past this many bytes; 0: never.
    pub max_bytes: u64,
    /// Old files kept (`<path>.1` .. `<path>.N`); 0: none, the file starts over.
    pub max_backups: usize,
}

/// The audit file and its size, rotated as [`AuditLogOptions`] say.
#[derive(Debug)]
pub struct AuditFile {
    options: AuditLogOptions,
    file: File,
    size: u64,
}

impl AuditFile {
    /// Opens (appending to) or creates the file, readable by the hub's user only: its lines
    /// name people, accounts and paths.
    pub fn open(options: AuditLogOptions) -> std::io::Result<Self> {
        let file = open_append(&options.path)?;
        let size = file.metadata()?.len();
        Ok(AuditFile {
            options,
            file,
            size,
        })
    }

    /// Appends `line` (one JSON object and its newline), rotating first when it would take
    /// the file past the size limit. A line larger than the limit still goes whole into a
    /// file of its own.
    pub fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        let max = self.options.max_bytes;
        if max > 0 && self.size > 0 && self.size.saturating_add(line.len() as u64) > max {
            self.rotate()?;
        }
        self.file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    /// `<path>.N-1` → `<path>.N` … `<path>` → `<path>.1`, the oldest past the limit removed;
    /// then a new, empty `<path>`.
    fn rotate(&mut self) -> std::io::Result<()> {
        let path = &self.options.path;
        let backups = self.options.max_backups;
        if backups == 0 {
            std::fs::remove_file(path).or_else(not_found_is_ok)?;
        } else {
            std::fs::remove_file(backup(path, backups)).or_else(not_found_is_ok)?;
            for n in (1..backups).rev() {
                std::fs::rename(backup(path, n), backup(path, n + 1)).or_else(not_found_is_ok)?;
            }
            std::fs::rename(path, backup(path, 1))?;
        }
        self.file = open_append(path)?;
        self.size = 0;
        Ok(())
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// `<path>.n`.
pub fn backup(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn not_found_is_ok(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

/// The tracing layer writing the audit events into an [`AuditFile`].
pub struct AuditFileLayer {
    file: Mutex<AuditFile>,
    /// Whether the last write failed (said once on stderr, not for every line).
    failing: AtomicBool,
}

impl AuditFileLayer {
    pub fn new(file: AuditFile) -> Self {
        AuditFileLayer {
            file: Mutex::new(file),
            failing: AtomicBool::new(false),
        }
    }
}

/// The layer for `options`, filtered to the audit target (so it enables no other event,
/// whatever the log's own filter), or why the file cannot be opened.
pub fn layer<S>(options: AuditLogOptions) -> crate::Result<Filtered<AuditFileLayer, Targets, S>>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let path = options.path.clone();
    let file = AuditFile::open(options).map_err(|e| {
        crate::error::HubError::Config(format!(
            "--audit-log-path {}: cannot open it to append: {e}; give a path in a directory \
             the hub may write (a volume), or leave the flag out to keep audit lines in the \
             log only",
            path.display()
        ))
    })?;
    Ok(AuditFileLayer::new(file).with_filter(Targets::new().with_target(TARGET, Level::INFO)))
}

impl<S: Subscriber> Layer<S> for AuditFileLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut fields = JsonFields(Map::new());
        event.record(&mut fields);
        let line = json!({
            "timestamp": jiff::Timestamp::now().to_string(),
            "level": event.metadata().level().as_str(),
            "fields": Value::Object(fields.0),
            "target": TARGET,
        });
        let mut text = line.to_string();
        text.push('\n');
        let written = self
            .file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_line(text.as_bytes());
        match written {
            Ok(()) => self.failing.store(false, Ordering::Relaxed),
            // Not a tracing event: it would come back here. Once per failing stretch.
            Err(e) if !self.failing.swap(true, Ordering::Relaxed) => {
                eprintln!("scale-agent-hub: cannot write the audit file (--audit-log-path): {e}")
            }
            Err(_) => {}
        }
    }
}

/// An event's fields as JSON: numbers and booleans as such, the rest as text (`%` and `?`
/// values as they print), as tracing-subscriber's JSON format writes them.
struct JsonFields(Map<String, Value>);

impl tracing::field::Visit for JsonFields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    fn options(dir: &Path, max_bytes: u64, max_backups: usize) -> AuditLogOptions {
        AuditLogOptions {
            path: dir.join("audit.log"),
            max_bytes,
            max_backups,
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("scale-agent-audit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn audit_events_become_json_lines_and_nothing_else_does() {
        let dir = temp_dir("lines");
        let options = options(&dir, 0, 0);
        let subscriber = tracing_subscriber::registry().with(layer(options.clone()).unwrap());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                target: TARGET,
                who = "alice",
                person = true,
                code = 201u16,
                account = %"prod",
                request_id = %"0b6f1c2e",
                "proxied write"
            );
            tracing::info!(target: "scale_agent_hub", "not an audit line");
            tracing::debug!(target: TARGET, "below info: not written");
        });
        let text = std::fs::read_to_string(&options.path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line = &lines[0];
        assert_eq!(line["target"], "audit");
        assert_eq!(line["level"], "INFO");
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'), "{line}");
        let fields = &line["fields"];
        assert_eq!(fields["message"], "proxied write");
        assert_eq!(fields["who"], "alice");
        assert_eq!(fields["person"], true);
        assert_eq!(fields["code"], 201);
        assert_eq!(fields["account"], "prod");
        assert_eq!(fields["request_id"], "0b6f1c2e");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&options.path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_file_rotates_by_size_keeping_max_backups() {
        let dir = temp_dir("rotation");
        let options = options(&dir, 25, 2);
        let mut file = AuditFile::open(options.clone()).unwrap();
        // Nine-byte lines: two fit in 25 bytes, the third rotates.
        for n in 0..7 {
            file.write_line(format!("line {n:03}\n").as_bytes())
                .unwrap();
        }
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        assert_eq!(read(options.path.clone()), "line 006\n");
        assert_eq!(read(backup(&options.path, 1)), "line 004\nline 005\n");
        assert_eq!(read(backup(&options.path, 2)), "line 002\nline 003\n");
        assert!(
            !backup(&options.path, 3).exists(),
            "lines 000 and 001 dropped"
        );
        // Reopened, it appends and counts what is there.
        drop(file);
        let mut file = AuditFile::open(options.clone()).unwrap();
        file.write_line(b"line 007\n").unwrap();
        file.write_line(b"line 008\n").unwrap();
        assert_eq!(read(options.path.clone()), "line 008\n");
        assert_eq!(read(backup(&options.path, 1)), "line 006\nline 007\n");
        // No backups kept: the file starts over.
        let none = AuditLogOptions {
            path: dir.join("none.log"),
            max_backups: 0,
            ..options
        };
        let mut file = AuditFile::open(none.clone()).unwrap();
        for n in 0..3 {
            file.write_line(format!("line {n:03}\n").as_bytes())
                .unwrap();
        }
        assert_eq!(read(none.path.clone()), "line 002\n");
        assert!(!backup(&none.path, 1).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
