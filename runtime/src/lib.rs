//! What every Scale Agent binary (agent, hub, operator, demo) shares: the `--log-format`
//! flag and log set-up, the shutdown signal, the version with its build-info metric,
//! [`Chain`], which prints an error with its causes, the host name that names a replica, the
//! time stamps written into Kubernetes objects, and [`write_private`] for files that hold
//! keys and tokens.

use clap::ValueEnum;
use prometheus_client::metrics::info::Info;
use tracing_subscriber::EnvFilter;

/// The version of every Scale Agent binary and image: the workspace's
/// (`[workspace.package] version` in Cargo.toml), as `--version` prints it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The build-info metric, `1` with the version as a label: registered as `build` under a
/// component's prefix it reads `scale_agent_hub_build_info{version="0.1.0"} 1`, so a
/// dashboard shows which version runs where.
pub fn build_info() -> Info<[(&'static str, &'static str); 1]> {
    Info::new([("version", VERSION)])
}

/// Log output format (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the global tracing subscriber: `RUST_LOG` filters (default `info`), in `format`,
/// colours only when writing to a terminal (never into log files or container logs).
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A tracing layer installed beside the log's own ([`init_tracing_with`]).
pub type ExtraLayer =
    Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// [`init_tracing`], plus `extra` (the hub's audit file) beside the log. `RUST_LOG` filters
/// the log only: `extra` brings its own filter, so what it writes does not depend on how
/// quiet the log is.
pub fn init_tracing_with(format: LogFormat, extra: Option<ExtraLayer>) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::{Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};
    let Some(extra) = extra else {
        return init_tracing(format);
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let log = tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal());
    let log: ExtraLayer = match format {
        LogFormat::Text => log.with_filter(filter).boxed(),
        LogFormat::Json => log.json().with_filter(filter).boxed(),
    };
    tracing_subscriber::registry().with(vec![log, extra]).init();
}

/// Completes on SIGTERM or Ctrl-C (SIGINT), whichever comes first. If a signal handler
/// cannot be installed, only the other one ends it.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C received, shutting down"),
                _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// An error and its causes on one line (`cannot read /etc/agent.yaml: No such file or
/// directory (os error 2)`), for log fields, status messages and HTTP answers.
///
/// The crates' error types never repeat their `#[source]` in their own message, so each cause
/// appears once: the error's message, then every `source()` after a `: `. A layer whose
/// message is exactly the one before it is left out: some libraries wrap an error in another
/// with the same text (hyper-util's `tcp connect error: tcp connect error: Connection
/// refused`), which says nothing twice.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if text != last {
                write!(f, ": {text}")?;
                last = text;
            }
            source = cause.source();
        }
        Ok(())
    }
}

/// Replaces `path` with `contents` atomically, readable by its owner only (mode 0600): for
/// keys, tokens and kubeconfigs.
///
/// The contents go to a temporary file in the same directory, which is flushed to disk and
/// renamed over `path`: a reader (Clouddriver watching its dynamic-config file, an agent
/// restarting) sees the old file or the new one, never half of one. The directory is then
/// flushed so the rename survives a crash. The directory must exist; on an error the
/// temporary file is removed.
pub fn write_private(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::{
        io::Write as _,
        os::unix::fs::OpenOptionsExt as _,
        sync::atomic::{AtomicU64, Ordering},
    };
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file path"))?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
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
    std::fs::File::open(dir)?.sync_all()
}

/// Where [`hostname`] reads the host name when `$HOSTNAME` is unset: the kernel's (what
/// `hostname` prints, a pod's name in Kubernetes), then the file most images carry.
const HOSTNAME_FILES: [&str; 2] = ["/proc/sys/kernel/hostname", "/etc/hostname"];

/// The host name, the default name of a replica (a pod's name in Kubernetes): `$HOSTNAME`,
/// else `/proc/sys/kernel/hostname`, else `/etc/hostname`, each trimmed; `None` when none of
/// them holds one.
pub fn hostname() -> Option<String> {
    hostname_from(std::env::var("HOSTNAME").ok(), &HOSTNAME_FILES)
}

fn hostname_from(env: Option<String>, files: &[impl AsRef<std::path::Path>]) -> Option<String> {
    let non_blank = |s: String| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    env.and_then(non_blank).or_else(|| {
        files
            .iter()
            .find_map(|file| std::fs::read_to_string(file).ok().and_then(non_blank))
    })
}

/// Now in RFC 3339, UTC, to the second (`2026-11-18T11:06:40Z`), as Kubernetes writes the
/// times of conditions and annotations.
pub fn now_rfc3339() -> String {
    rfc3339_seconds(jiff::Timestamp::now())
}

fn rfc3339_seconds(t: jiff::Timestamp) -> String {
    format!("{t:.0}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cause wrapped with what failed, its message leaving the cause out.
    #[derive(Debug)]
    struct Wrapped {
        what: &'static str,
        cause: Box<dyn std::error::Error + 'static>,
    }

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.what)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self.cause.as_ref())
        }
    }

    #[test]
    fn chain_prints_each_cause_once_in_order() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = Wrapped {
            what: "cannot connect to the hub",
            cause: Box::new(Wrapped {
                what: "transport error",
                cause: Box::new(refused()),
            }),
        };
        assert_eq!(
            Chain(&error).to_string(),
            "cannot connect to the hub: transport error: refused"
        );
        assert_eq!(Chain(&refused()).to_string(), "refused");
    }

    /// A library layer that only repeats its cause's message is printed once; a cause that
    /// merely contains the message before it is still printed.
    #[test]
    fn chain_leaves_out_a_layer_that_repeats_the_one_before() {
        let error = Wrapped {
            what: "tcp connect error",
            cause: Box::new(Wrapped {
                what: "tcp connect error",
                cause: Box::new(std::io::Error::other("tcp connect error: reset")),
            }),
        };
        assert_eq!(
            Chain(&error).to_string(),
            "tcp connect error: tcp connect error: reset"
        );
    }

    #[test]
    fn private_files_are_replaced_whole_with_mode_0600_and_no_temporary_file_left() {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = std::env::temp_dir().join(format!("scale-agent-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("accounts.yml");
        write_private(&path, b"one\n").unwrap();
        let first = std::fs::metadata(&path).unwrap();
        assert_eq!(first.permissions().mode() & 0o777, 0o600);
        write_private(&path, b"two\n").unwrap();
        let second = std::fs::metadata(&path).unwrap();
        assert_ne!(
            first.ino(),
            second.ino(),
            "replaced by a rename, not written in place"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1);
        assert!(write_private(&dir.join("missing/accounts.yml"), b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hostname_takes_the_environment_then_the_first_file_that_names_one() {
        let dir = std::env::temp_dir().join(format!("scale-agent-hostname-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (kernel, etc, blank) = (dir.join("kernel"), dir.join("etc"), dir.join("blank"));
        std::fs::write(&kernel, "pod-from-kernel\n").unwrap();
        std::fs::write(&etc, "pod-from-etc\n").unwrap();
        std::fs::write(&blank, " \n").unwrap();
        let missing = dir.join("missing");

        let env = || Some(" agent-0 ".to_string());
        assert_eq!(
            hostname_from(env(), &[&kernel, &etc]).as_deref(),
            Some("agent-0")
        );
        assert_eq!(
            hostname_from(Some(" ".into()), &[&kernel, &etc]).as_deref(),
            Some("pod-from-kernel")
        );
        assert_eq!(
            hostname_from(None, &[&missing, &blank, &etc]).as_deref(),
            Some("pod-from-etc")
        );
        assert_eq!(hostname_from(None, &[&missing, &blank]), None);
        std::fs::remove_dir_all(&dir).unwrap();
        // This machine has a kernel host name.
        assert!(hostname().is_some_and(|h| !h.is_empty() && h.trim() == h));
    }

    #[test]
    fn rfc3339_is_utc_to_the_second() {
        let t = jiff::Timestamp::new(1_795_000_000, 999_999_999).unwrap();
        assert_eq!(rfc3339_seconds(t), "2026-11-18T11:06:40Z");
        let leap_day = jiff::Timestamp::from_second(951_782_400).unwrap();
        assert_eq!(rfc3339_seconds(leap_day), "2000-02-29T00:00:00Z");
        assert_eq!(now_rfc3339().len(), "2026-11-18T11:06:40Z".len());
    }
}
