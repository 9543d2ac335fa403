//! A real PostgreSQL server for the tests of the hub's PostgreSQL store and of several hub
//! replicas: Debian's postgresql-15, unpacked by `e2e/postgres/install.sh` (`make postgres`)
//! into the cache and run from its own binaries (no pg_ctl, no postgresql-common).
//!
//! ```no_run
//! # async fn example() -> scale_agent_e2e::Result<()> {
//! use scale_agent_e2e::postgres::PostgresServer;
//! let mut server = PostgresServer::start().await?;
//! let client = server.connect().await?;
//! client.batch_execute("CREATE TABLE t (v text)").await.unwrap();
//! server.kill(); // SIGKILL, as a crash
//! server.restart().await?; // same port, same data
//! # Ok(()) }
//! ```
//!
//! Each server gets its own directory, a free loopback port, a database and a password user
//! who owns it (`url()`), and a superuser for what a test may need beyond that
//! (`superuser_url()`). Start-up is fast: `initdb` (1.1 to 1.5 s here, 3 to 3.7 s while
//! other builds keep the disk busy) runs once per test process into a template cluster that
//! each server copies, on tmpfs when there is room (see `runs_root`); a server then answers
//! its first query 0.3 to 0.6 s after `start()` is called. The servers run with `fsync=off`.
//! That loses nothing a test can observe: a killed server's writes are in the kernel's page
//! cache (or on tmpfs), which its restart reads; only a machine crash would lose them.
//!
//! PostgreSQL refuses to run as root. When the tests run as root, initdb and postgres run as
//! uid and gid 65534 (nobody) without supplementary groups, on directories chowned to it,
//! from a copy (hard links when it can) of the unpacked packages in a place it can read:
//! the cache is under root's home, which others cannot enter.

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use tokio_postgres::{Client, NoTls};

use crate::{
    binaries::cache_root,
    error::{Error, Result, io_err, postgres_text},
    process::{self, ManagedProcess},
};

/// The PostgreSQL major version `e2e/postgres/install.sh` unpacks.
pub const MAJOR: &str = "15";
/// The database of `url()`, owned by [`USER`].
pub const DATABASE: &str = "scale_agent";
/// The password user of `url()`: not a superuser, as a hub would be given.
pub const USER: &str = "scale_agent";
/// The superuser initdb creates, for `superuser_url()`.
pub const SUPERUSER: &str = "postgres";

/// Who runs PostgreSQL when the tests run as root: nobody.
const UNPRIVILEGED: u32 = 65534;
/// How long a server may take to accept connections (crash recovery included).
const READY: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before the server is killed.
const SHUTDOWN: Duration = Duration::from_secs(30);
/// How long killed processes may take to be gone.
const KILLED: Duration = Duration::from_secs(10);

/// The unpacked packages, where the user that runs PostgreSQL can read them.
struct Install {
    /// `usr/lib/postgresql/15/bin`.
    bin: PathBuf,
    /// The unpacked libraries' directories, for `LD_LIBRARY_PATH`.
    library_path: String,
    /// The uid (and gid) to run as, when the tests run as root.
    run_as: Option<u32>,
    /// The uid PostgreSQL runs as.
    owner: u32,
    /// Where the servers' directories go.
    runs: PathBuf,
}

impl Install {
    /// A command running `program` from the install as the right user, in `dir`.
    fn command(&self, program: &str, dir: &Path) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command
            .current_dir(dir)
            .env("LD_LIBRARY_PATH", &self.library_path)
            // GMT needs no zoneinfo files (PostgreSQL knows it), and the tests need no other.
            .env("TZ", "GMT");
        if let Some(id) = self.run_as {
            // std sets the gid, drops the supplementary groups and then sets the uid, as
            // `setpriv --reuid --regid --clear-groups` would.
            command.uid(id).gid(id);
        }
        command
    }

    /// Hands `path` to the user that runs PostgreSQL.
    fn chown(&self, path: &Path) -> Result<()> {
        match self.run_as {
            Some(id) => std::os::unix::fs::lchown(path, Some(id), Some(id))
                .map_err(io_err(format!("chown {} to uid {id}", path.display()))),
            None => Ok(()),
        }
    }
}

/// `init` once per process; a failure is kept (as text) for later callers, the first
/// caller gets the error itself.
fn once<T>(
    cell: &'static OnceLock<Result<T, String>>,
    init: impl FnOnce() -> Result<T>,
) -> Result<&'static T> {
    let mut first = None;
    let value = cell.get_or_init(|| {
        init().map_err(|error| {
            let text = error.to_string();
            first = Some(error);
            text
        })
    });
    match value {
        Ok(value) => Ok(value),
        Err(text) => Err(first.unwrap_or_else(|| Error::PostgresSetup {
            what: "an earlier start in this process".into(),
            output: text.clone(),
        })),
    }
}

fn install() -> Result<&'static Install> {
    static INSTALL: OnceLock<Result<Install, String>> = OnceLock::new();
    once(&INSTALL, find_install)
}

fn find_install() -> Result<Install> {
    let current = cache_root().join("postgres").join("current");
    let bin = format!("usr/lib/postgresql/{MAJOR}/bin");
    let missing = || Error::PostgresMissing {
        path: current.join(&bin).join("postgres"),
    };
    let tree = fs::canonicalize(&current).map_err(|_| missing())?;
    if !tree.join(&bin).join("postgres").is_file() {
        return Err(missing());
    }
    let library_dirs = fs::read_to_string(tree.join(".library-dirs")).map_err(|_| missing())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let euid = unsafe { libc::geteuid() };
    let run_as = (euid == 0).then_some(UNPRIVILEGED);
    let name = format!("scale-agent-postgres-{euid}");
    let tree = match run_as {
        Some(_) => {
            // Beside the cache's file system when /tmp is on it, so hard links do.
            let stage_root = std::env::temp_dir().join(&name);
            create_dir_for_all(&stage_root)?;
            stage(&tree, &stage_root)?
        }
        None => tree,
    };
    let runs = runs_root().join(&name);
    create_dir_for_all(&runs)?;
    // Servers of test processes killed outright died with them; their shared memory did not.
    let owner = run_as.unwrap_or(euid);
    process::sweep_stale_runs(&runs, |dir| remove_shared_memory(&dir.join("data"), owner));
    let library_path = library_dirs
        .lines()
        .filter(|line| !line.is_empty())
        .map(|dir| tree.join(dir).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    Ok(Install {
        bin: tree.join(bin),
        library_path,
        run_as,
        owner,
        runs,
    })
}

/// Where the servers' directories go: tmpfs when the machine has one with room to spare,
/// because copying the template there takes a tenth of the time it takes on a disk that
/// other work keeps busy (0.12 to 0.2 s against 1.3 to 2.1 s for `cp -a` of its 39 MB
/// here, with the load at 13 on 2 cores). A container's /dev/shm is often 64 MB: too small.
fn runs_root() -> PathBuf {
    const ROOM: u64 = 2 << 30;
    let shm = Path::new("/dev/shm");
    if available_bytes(shm).is_some_and(|bytes| bytes >= ROOM) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The space left for unprivileged users on the file system of `dir`.
fn available_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data, for which all zeroes is a valid value.
    #[allow(unsafe_code)]
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and outlives the call; `stat` is a valid place for
    // its answer.
    #[allow(unsafe_code)]
    let status = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    (status == 0).then(|| stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Creates `dir` (and its parents) readable by everyone, whatever the umask.
fn create_dir_for_all(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
        .map_err(io_err(format!("chmod {}", dir.display())))
}

/// A copy of the unpacked packages in `runs`, shared by the test processes (made once per
/// version: a copy in progress has another name until it is complete).
fn stage(tree: &Path, runs: &Path) -> Result<PathBuf> {
    let version = tree
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staged = runs.join(format!("install-{version}"));
    if staged.is_dir() {
        return Ok(staged);
    }
    let partial = runs.join(format!("install-{version}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    copy_tree(tree, &partial, true, &|_| Ok(()))?;
    if fs::rename(&partial, &staged).is_err() {
        // Another test process staged it first.
        let _ = fs::remove_dir_all(&partial);
    }
    Ok(staged)
}

/// Copies the tree `from` to `to` with its modes, hard-linking files when `link` (copying
/// when the link fails, e.g. across file systems), and calls `own` on everything made.
fn copy_tree(from: &Path, to: &Path, link: bool, own: &dyn Fn(&Path) -> Result<()>) -> Result<()> {
    let mode = fs::metadata(from)
        .map_err(io_err(format!("read {}", from.display())))?
        .permissions();
    fs::create_dir(to).map_err(io_err(format!("create {}", to.display())))?;
    fs::set_permissions(to, mode).map_err(io_err(format!("chmod {}", to.display())))?;
    for entry in fs::read_dir(from).map_err(io_err(format!("read {}", from.display())))? {
        let entry = entry.map_err(io_err(format!("read {}", from.display())))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry
            .file_type()
            .map_err(io_err(format!("read {}", source.display())))?;
        if kind.is_dir() {
            copy_tree(&source, &target, link, own)?;
            continue;
        }
        if kind.is_symlink() {
            let points_to =
                fs::read_link(&source).map_err(io_err(format!("read {}", source.display())))?;
            std::os::unix::fs::symlink(points_to, &target)
                .map_err(io_err(format!("create {}", target.display())))?;
        } else if !(link && fs::hard_link(&source, &target).is_ok()) {
            fs::copy(&source, &target).map_err(io_err(format!(
                "copy {} to {}",
                source.display(),
                target.display()
            )))?;
        }
        own(&target)?;
    }
    own(to)
}

/// A cluster initdb made once per test process, which each server copies.
struct Template {
    data: PathBuf,
    password: String,
}

fn template() -> Result<&'static Template> {
    static TEMPLATE: OnceLock<Result<Template, String>> = OnceLock::new();
    once(&TEMPLATE, || make_template(install()?))
}

/// A directory in `runs` for this process, removed when it exits (or by the next run's
/// sweep when it is killed), handed to the user that runs PostgreSQL.
fn run_dir(install: &Install, name: &str) -> Result<PathBuf> {
    let dir = install.runs.join(format!("{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    create_dir_for_all(&dir)?;
    fs::write(dir.join("owner.pid"), std::process::id().to_string())
        .map_err(io_err("write owner.pid"))?;
    process::remove_at_exit(dir.clone());
    install.chown(&dir)?;
    Ok(dir)
}

fn make_template(install: &Install) -> Result<Template> {
    let dir = run_dir(install, "template")?;
    let data = dir.join("data");
    let password = format!("{:032x}", rand::random::<u128>());
    let password_file = dir.join("password");
    fs::write(&password_file, &password).map_err(io_err("write the superuser's password"))?;
    install.chown(&password_file)?;
    // The C locale and UTF-8 need no locales package; --no-sync because nothing here
    // must survive a machine crash.
    let mut initdb = install.command("initdb", &dir);
    initdb
        .arg("--pgdata")
        .arg(&data)
        .args([
            "--no-sync",
            "--no-locale",
            "--encoding=UTF8",
            "--no-instructions",
        ])
        .args(["--username", SUPERUSER, "--auth=scram-sha-256"])
        .arg(format!("--pwfile={}", password_file.display()));
    let output = initdb.output().map_err(io_err(format!(
        "run {}",
        install.bin.join("initdb").display()
    )))?;
    let _ = fs::remove_file(&password_file);
    if !output.status.success() {
        return Err(Error::PostgresSetup {
            what: format!("initdb ({})", output.status),
            output: output_text(&output.stdout, &output.stderr),
        });
    }
    // The user and database, in single-user mode: no server, no client needed. Its
    // statements end at a newline; it reports errors on stderr but still exits 0.
    let sql = format!(
        "CREATE ROLE {USER} LOGIN PASSWORD '{password}';\n\
         CREATE DATABASE {DATABASE} OWNER {USER};\n"
    );
    let mut single = install.command("postgres", &dir);
    single
        .arg("--single")
        .arg("-D")
        .arg(&data)
        .args(["-c", "fsync=off", "-c", "jit=off", "postgres"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = single
        .spawn()
        .map_err(io_err("start postgres in single-user mode"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(sql.as_bytes())
            .map_err(io_err("write to postgres in single-user mode"))?;
    }
    let output = child
        .wait_with_output()
        .map_err(io_err("wait for postgres in single-user mode"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || stderr.contains("ERROR:") || stderr.contains("FATAL:") {
        return Err(Error::PostgresSetup {
            what: format!("creating the user and database ({})", output.status),
            output: output_text(&output.stdout, &output.stderr),
        });
    }
    Ok(Template { data, password })
}

fn output_text(stdout: &[u8], stderr: &[u8]) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(stdout),
        String::from_utf8_lossy(stderr)
    )
}

/// TLS for a server ([`PostgresServer::start_with_tls`]): `ssl=on` with a serving
/// certificate for 127.0.0.1 and localhost made by [`crate::pki`].
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The CA that signed the server's certificate (PEM).
    pub ca_pem: String,
    pub serving: crate::pki::CertifiedKey,
    /// Only TLS connections are accepted (pg_hba `hostssl` lines only): a plaintext one is
    /// refused with "no pg_hba.conf entry ... no encryption".
    pub tls_only: bool,
}

impl ServerTls {
    /// A fresh CA and a serving certificate for loopback signed by it.
    pub fn new(tls_only: bool) -> Result<Self> {
        let ca = crate::pki::CertificateAuthority::new("postgres-test-ca")?;
        Ok(ServerTls {
            serving: ca.serving("postgres", &[])?,
            ca_pem: ca.cert_pem,
            tls_only,
        })
    }

    /// Like [`ServerTls::new`], with a certificate naming `127.0.0.1` only (what `url()`
    /// and the harness connect to), not `localhost` (for `sslmode=verify-ca` against
    /// `verify-full`).
    pub fn ip_only(tls_only: bool) -> Result<Self> {
        let ca = crate::pki::CertificateAuthority::new("postgres-test-ca")?;
        Ok(ServerTls {
            serving: ca.serving_ip_only("postgres")?,
            ca_pem: ca.cert_pem,
            tls_only,
        })
    }
}

/// A running (or killed, or stopped) PostgreSQL server with its own data.
pub struct PostgresServer {
    /// Set: the server speaks TLS (and the harness's own connections use it).
    tls: Option<ServerTls>,
    install: &'static Install,
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    password: String,
    process: Option<ManagedProcess>,
    /// How many times it was started: each start logs to its own file.
    starts: u32,
}

impl PostgresServer {
    /// Starts a server with a fresh cluster (a copy of the template) on a free loopback
    /// port, and waits until its user can connect.
    pub async fn start() -> Result<PostgresServer> {
        Self::start_inner(None).await
    }

    /// Like [`PostgresServer::start`], with `ssl=on` and `tls`'s certificate; the CA's PEM
    /// is written to [`PostgresServer::ca_file`].
    pub async fn start_with_tls(tls: ServerTls) -> Result<PostgresServer> {
        Self::start_inner(Some(tls)).await
    }

    async fn start_inner(tls: Option<ServerTls>) -> Result<PostgresServer> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        let (install, template, dir) = blocking(move || {
            let install = install()?;
            let template = template()?;
            let dir = run_dir(install, &number.to_string())?;
            copy_tree(&template.data, &dir.join("data"), false, &|path| {
                install.chown(path)
            })?;
            Ok((install, template, dir))
        })
        .await?;
        let mut server = PostgresServer {
            tls,
            install,
            data: dir.join("data"),
            dir,
            port: crate::local_agent::free_port()?,
            password: template.password.clone(),
            process: None,
            starts: 0,
        };
        server.write_tls_files()?;
        server.launch().await?;
        Ok(server)
    }

    /// The server's certificate and key (the key readable by the server's user only, as
    /// PostgreSQL demands), its CA, and the TLS-only pg_hba.conf.
    fn write_tls_files(&self) -> Result<()> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        let write = |name: &str, text: &str, mode: u32| -> Result<()> {
            let path = self.dir.join(name);
            fs::write(&path, text).map_err(io_err(format!("write {}", path.display())))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(io_err(format!("chmod {}", path.display())))?;
            self.install.chown(&path)
        };
        write("server.crt", &tls.serving.cert_pem, 0o644)?;
        write("server.key", &tls.serving.key_pem, 0o600)?;
        write("ca.pem", &tls.ca_pem, 0o644)?;
        let host = if tls.tls_only { "hostssl" } else { "host" };
        write(
            "pg_hba.conf",
            &format!("{host} all all 127.0.0.1/32 scram-sha-256\n"),
            0o644,
        )
    }

    /// The PEM file of the CA that signed the server's certificate (TLS servers only).
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|_| self.dir.join("ca.pem"))
    }

    /// `postgres://scale_agent:<password>@127.0.0.1:<port>/scale_agent`.
    pub fn url(&self) -> String {
        self.url_for(USER)
    }

    /// The same database as the superuser.
    pub fn superuser_url(&self) -> String {
        self.url_for(SUPERUSER)
    }

    fn url_for(&self, user: &str) -> String {
        format!(
            "postgres://{user}:{}@127.0.0.1:{}/{DATABASE}",
            self.password, self.port
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The log of the latest start (each start has its own file beside it).
    pub fn log(&self) -> PathBuf {
        self.dir.join(format!("postgres-{}.log", self.starts))
    }

    /// The postmaster's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ManagedProcess::pid)
    }

    /// A client connected as `url()`'s user (its connection runs on a spawned task).
    pub async fn connect(&self) -> Result<Client> {
        self.connect_to(&self.url()).await
    }

    /// A client connected to `url` (one of this server's), over TLS checked against the
    /// server's CA when it has TLS.
    pub async fn connect_to(&self, url: &str) -> Result<Client> {
        match &self.tls {
            Some(tls) => connect_tls(url, &tls.ca_pem).await,
            None => connect(url).await,
        }
    }

    /// SIGKILLs the server and every process it started, as a crash of the database
    /// server: every session ends at once, and the next start recovers from the WAL.
    pub fn kill(&mut self) {
        let Some(mut postmaster) = self.process.take() else {
            return;
        };
        let pid = postmaster.pid();
        // Frozen, it cannot start new workers while its children are listed. Its children
        // call setsid, so a signal to its process group would not reach them.
        process::send_signal(pid, libc::SIGSTOP);
        let children = process::children_of(pid);
        process::send_signal(pid, libc::SIGKILL);
        for child in &children {
            process::send_signal(*child, libc::SIGKILL);
        }
        // A restart must not find the old processes still attached to the shared memory.
        let deadline = Instant::now() + KILLED;
        while Instant::now() < deadline
            && (!postmaster.has_exited() || children.iter().any(|c| process::is_alive(*c)))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the server with a fast shutdown (sessions are ended, their open transactions
    /// rolled back, a checkpoint written), killing it when that takes longer than 30 s.
    /// SIGTERM would be a smart shutdown, which waits for every client to disconnect.
    pub async fn stop(&mut self) {
        let Some(postmaster) = self.process.as_ref() else {
            return;
        };
        process::send_signal(postmaster.pid(), libc::SIGINT);
        let deadline = Instant::now() + SHUTDOWN;
        while let Some(postmaster) = self.process.as_mut() {
            if postmaster.has_exited() {
                self.process = None;
            } else if Instant::now() > deadline {
                tracing::warn!(log = %self.log().display(), "postgres did not stop in time; killing it");
                self.kill();
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Starts the server again on the same port and data (stopping it first if it runs),
    /// and waits until its user can connect.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await;
        self.launch().await
    }

    /// Starts the server again after [`Self::stop`] or [`Self::kill`], on the same port and
    /// data, and waits until its user can connect.
    pub async fn start_again(&mut self) -> Result<()> {
        self.launch().await
    }

    async fn launch(&mut self) -> Result<()> {
        self.starts += 1;
        let mut command = self.install.command("postgres", &self.dir);
        command.arg("-D").arg(&self.data);
        for setting in [
            "listen_addresses=127.0.0.1".to_string(),
            format!("port={}", self.port),
            // No Unix socket: its default directory (/var/run/postgresql) may not exist.
            "unix_socket_directories=".into(),
            // See the module's comment. full_page_writes guards against torn pages in a
            // machine crash only.
            "fsync=off".into(),
            "full_page_writes=off".into(),
            // Dynamic shared memory in files in the data directory rather than in /dev/shm,
            // so that a killed server's go with its directory.
            "dynamic_shared_memory_type=mmap".into(),
            // The JIT's LLVM is not unpacked.
            "jit=off".into(),
            // Tests hold little data, and several servers run at once.
            "shared_buffers=16MB".into(),
        ] {
            command.arg("-c").arg(setting);
        }
        if self.tls.is_some() {
            for (setting, file) in [
                ("ssl_cert_file", "server.crt"),
                ("ssl_key_file", "server.key"),
                ("hba_file", "pg_hba.conf"),
            ] {
                command
                    .arg("-c")
                    .arg(format!("{setting}={}", self.dir.join(file).display()));
            }
            command.arg("-c").arg("ssl=on");
        }
        let process = ManagedProcess::spawn_command("postgres", command, self.log())?;
        self.process = Some(process);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let url = self.url();
        loop {
            if let Some(process) = self.process.as_mut() {
                process.ensure_running()?;
            }
            let last_error = match self.connect_to(&url).await {
                Ok(client) => match client.simple_query("SELECT 1").await {
                    Ok(_) => return Ok(()),
                    Err(error) => postgres_text(&error),
                },
                Err(error) => error.to_string(),
            };
            if started.elapsed() > READY {
                return Err(Error::NotReady {
                    component: "postgres",
                    waited_secs: READY.as_secs(),
                    log: self.log(),
                    log_tail: format!(
                        "{}\n(last connection attempt: {last_error})",
                        process::tail(&self.log(), 20)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
        remove_shared_memory(&self.data, self.install.owner);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Removes the System V segment a killed postmaster of the cluster in `data` left, when
/// nobody uses it and `owner` owns it (so that a reused id cannot take another server's
/// memory away). PostgreSQL removes it itself on a clean stop and on its next start, which
/// a dropped server never has. Its other shared memory is anonymous, or files in the data
/// directory (see `launch`).
fn remove_shared_memory(data: &Path, owner: u32) {
    // Line 7 of postmaster.pid holds the segment's key and id; a clean stop removes the file.
    let Ok(pid_file) = fs::read_to_string(data.join("postmaster.pid")) else {
        return;
    };
    let Some(id) = pid_file
        .lines()
        .nth(6)
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|id| id.parse::<libc::c_int>().ok())
    else {
        return;
    };
    // SAFETY: shmid_ds is plain data, for which all zeroes is a valid value.
    #[allow(unsafe_code)]
    let mut segment: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT fills `segment`, a valid place for it; IPC_RMID takes no buffer.
    #[allow(unsafe_code)]
    unsafe {
        if libc::shmctl(id, libc::IPC_STAT, &mut segment) == 0
            && segment.shm_nattch == 0
            && segment.shm_perm.uid == owner
        {
            libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// A client connected to `url`, its connection running on a spawned task.
pub async fn connect(url: &str) -> Result<Client> {
    let (client, connection) =
        client_config(url)?
            .connect(NoTls)
            .await
            .map_err(|source| Error::Postgres {
                action: "connect to PostgreSQL".into(),
                source,
            })?;
    run_connection(connection);
    Ok(client)
}

/// `url` parsed, with a 5 s connection timeout.
fn client_config(url: &str) -> Result<tokio_postgres::Config> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|source| Error::Postgres {
        action: "parse a PostgreSQL URL".into(),
        source,
    })?;
    config.connect_timeout(Duration::from_secs(5));
    Ok(config)
}

/// Runs a client's connection on a task of its own until it ends.
fn run_connection(
    connection: impl Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send + 'static,
) {
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "PostgreSQL connection ended");
        }
    });
}

/// A client connected to `url` over TLS (`sslmode=require` semantics: TLS or nothing),
/// checking the server's certificate against `ca_pem` and its name.
pub async fn connect_tls(url: &str, ca_pem: &str) -> Result<Client> {
    let mut config = client_config(url)?;
    config.ssl_mode(tokio_postgres::config::SslMode::Require);
    let tls = scale_agent_testkit::tls::client_config(Some(ca_pem)).map_err(|error| {
        Error::PostgresSetup {
            what: "a TLS client configuration trusting the test CA".into(),
            output: error.to_string(),
        }
    })?;
    let (client, connection) = config
        .connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
        .await
        .map_err(|source| Error::Postgres {
            action: "connect to PostgreSQL over TLS".into(),
            source,
        })?;
    run_connection(connection);
    Ok(client)
}

/// One replica's tenure of an account, as the hub's `ownership_history` table records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenure {
    pub replica: String,
    pub epoch: i64,
    pub acquired: SystemTime,
    /// `None` while it lasts.
    pub released: Option<SystemTime>,
}

/// The tenures of every account in the hub's `ownership_history`, in the order they began.
pub async fn ownership_history(client: &Client) -> Result<BTreeMap<String, Vec<Tenure>>> {
    let rows = client
        .query(
            "SELECT account, replica, epoch, acquired_at, released_at FROM ownership_history
             ORDER BY account, acquired_at, epoch",
            &[],
        )
        .await
        .map_err(|source| Error::Postgres {
            action: "read ownership_history".into(),
            source,
        })?;
    let mut by_account: BTreeMap<String, Vec<Tenure>> = BTreeMap::new();
    for row in rows {
        by_account.entry(row.get(0)).or_default().push(Tenure {
            replica: row.get(1),
            epoch: row.get(2),
            acquired: row.get(3),
            released: row.get(4),
        });
    }
    Ok(by_account)
}

/// Panics unless each of `account`'s tenures ended before the next began (two replicas
/// never owned it at once) and their epochs grow.
pub fn assert_no_overlap(account: &str, tenures: &[Tenure]) {
    for pair in tenures.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let ended = before
            .released
            .unwrap_or_else(|| panic!("{account}: {before:?} never ended, yet {after:?} began"));
        assert!(
            ended <= after.acquired,
            "{account}: {before:?} overlaps {after:?}"
        );
        assert!(
            after.epoch > before.epoch,
            "{account}: epochs must grow: {tenures:?}"
        );
    }
}

/// Runs blocking set-up work (initdb, copies) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Error::PostgresSetup {
            what: "the set-up task".into(),
            output: error.to_string(),
        })?
}
