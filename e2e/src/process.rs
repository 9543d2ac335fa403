//! Child processes that cannot outlive the process that started them.
//!
//! Every child is started with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when
//! its parent dies: after the last test, on a panic that aborts, on Ctrl-C or on `kill -9`.
//! The death signal is tied to the *thread* that forked the child, not the process, so all
//! children are forked by one spawner thread that lives as long as the process.
//! Children also get their own process group: a Ctrl-C in the terminal reaches only the
//! parent, which can then stop them in order (controller manager, apiserver, etcd).

#![allow(unsafe_code)] // prctl, kill and atexit have no safe std wrappers; each use is commented.

use std::{
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Mutex, OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use crate::error::{Error, Result, io_err};

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> Option<&'static mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (requests, incoming) = mpsc::channel::<SpawnRequest>();
            thread::Builder::new()
                .name("child-spawner".into())
                .spawn(move || {
                    // The static keeps the sender alive, so this loop (and with it the
                    // parent thread of every child) runs until the process ends.
                    for mut request in incoming {
                        let _ = request.reply.send(request.command.spawn());
                    }
                })
                .ok()
                .map(|_| requests)
        })
        .as_ref()
}

/// Starts `command` so that it dies with this process, in a process group of its own.
pub fn spawn_tied_to_this_process(mut command: Command) -> io::Result<Child> {
    let parent = std::process::id();
    command.process_group(0);
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid, _exit) without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then nobody would kill us.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let spawner =
        spawner().ok_or_else(|| io::Error::other("could not start the spawner thread"))?;
    let (reply, result) = mpsc::channel();
    spawner
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("the spawner thread has stopped"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("the spawner thread has stopped"))?
}

/// Sends `signal` to `pid`; a process that is already gone is not an error.
pub fn send_signal(pid: u32, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions; a stale pid at worst gets ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// The state letter and parent pid of `pid`, from /proc.
fn state_and_parent(pid: &str) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name in parentheses, which may itself hold spaces;
    // the parent's pid comes next.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.to_string();
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

fn is_live_state(state: &str) -> bool {
    state != "Z" && state != "X"
}

/// Whether a process with this pid exists (and is not a zombie).
pub fn is_alive(pid: u32) -> bool {
    state_and_parent(&pid.to_string()).is_some_and(|(state, _)| is_live_state(&state))
}

/// The live children of `pid` (for servers whose workers leave its process group, such as
/// PostgreSQL's, which call setsid).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            state_and_parent(&child.to_string())
                .is_some_and(|(state, parent)| parent == pid && is_live_state(&state))
        })
        .collect()
}

/// Waits up to `within` for every named process to be gone; returns those still alive.
pub fn still_alive_after(
    pids: &[(String, u32)],
    within: std::time::Duration,
) -> Vec<(String, u32)> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let alive: Vec<(String, u32)> = pids
            .iter()
            .filter(|(_, pid)| is_alive(*pid))
            .cloned()
            .collect();
        if alive.is_empty() || std::time::Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits until `addr` accepts TCP connections, at most `within`; fails early when `process`
/// exits, and with the tail of `log` (where `component` says why) when it never listens.
pub async fn wait_listening(
    process: &mut ManagedProcess,
    addr: std::net::SocketAddr,
    component: &'static str,
    log: &Path,
    within: Duration,
) -> Result<()> {
    wait_ready(process, component, log, within, || async move {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await
}

/// Polls `probe` every 50 ms until it holds, at most `within`; fails early when `process`
/// exits, and with the tail of `log` (where `component` says why) when it never does.
pub async fn wait_ready<F, Fut>(
    process: &mut ManagedProcess,
    component: &'static str,
    log: &Path,
    within: Duration,
    mut probe: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        process.ensure_running()?;
        if probe().await {
            return Ok(());
        }
        if started.elapsed() > within {
            return Err(Error::NotReady {
                component,
                waited_secs: within.as_secs(),
                log: log.to_path_buf(),
                log_tail: tail(log, 20),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A child process with its log file, stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct ManagedProcess {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ManagedProcess {
    /// Starts `program` with `args`, its stdout and stderr appended to `log`.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self> {
        let mut command = Command::new(program);
        command.args(args);
        Self::spawn_command(name, command, log)
    }

    /// Starts a prepared `command` (program, arguments, environment, working directory),
    /// its stdin closed and its stdout and stderr appended to `log`.
    pub fn spawn_command(name: &'static str, mut command: Command, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).map_err(io_err(format!("create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io_err(format!("open {}", log.display())))?;
        let program = PathBuf::from(command.get_program());
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = spawn_tied_to_this_process(command)
            .map_err(io_err(format!("start {name} ({})", program.display())))?;
        Ok(Self { name, child, log })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails with the end of the log when the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status)),
            Err(source) => Err(Error::Io {
                action: format!("check on {}", self.name),
                source,
            }),
        }
    }

    pub(crate) fn exited(&self, status: ExitStatus) -> Error {
        Error::Exited {
            component: self.name,
            status,
            log: self.log.clone(),
            log_tail: tail(&self.log, 20),
        }
    }

    /// Whether the process has exited (and been reaped).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)) | Err(_))
    }

    /// Asks the process to stop, and kills it when it has not stopped after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        send_signal(self.pid(), libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// The last `lines` lines of a log file, for error messages.
pub fn tail(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 16 * 1024;
    let Ok(mut file) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Run directories to remove when the process exits normally. Children need no such list:
/// the kernel kills them when the process dies.
static REMOVE_AT_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_dirs_at_exit() {
    if let Ok(dirs) = REMOVE_AT_EXIT.lock() {
        for dir in dirs.iter() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Removes `dir` when the process exits (the test harness ends with `exit`). A run killed
/// outright leaves its directory behind; the next run sweeps it (see `sweep_stale_runs`).
pub fn remove_at_exit(dir: PathBuf) {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe {
            libc::atexit(remove_dirs_at_exit);
        }
    });
    if let Ok(mut dirs) = REMOVE_AT_EXIT.lock() {
        dirs.push(dir);
    }
}

/// Removes run directories under `root` whose owning process (the pid in their `owner.pid`)
/// has died without cleaning up (killed outright); their components died with it.
/// `before_removing` gets each such directory first, for what outlives its processes
/// elsewhere (PostgreSQL's shared memory).
pub fn sweep_stale_runs(root: &Path, before_removing: impl Fn(&Path)) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let owner = std::fs::read_to_string(entry.path().join("owner.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok());
        if owner.is_some_and(|pid| !is_alive(pid)) {
            before_removing(&entry.path());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_stopped_and_reported() {
        let dir = std::env::temp_dir().join(format!("process-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut sleeper = ManagedProcess::spawn(
            "sleep",
            Path::new("/bin/sh"),
            &["-c".into(), "echo started; exec sleep 30".into()],
            dir.join("sleep.log"),
        )
        .unwrap();
        let pid = sleeper.pid();
        assert!(is_alive(pid));
        sleeper.ensure_running().unwrap();
        sleeper.stop(Duration::from_secs(5));
        assert!(!is_alive(pid), "stopped process {pid} is still alive");

        let mut failing = ManagedProcess::spawn(
            "failing",
            Path::new("/bin/sh"),
            &["-c".into(), "echo some reason >&2; exit 3".into()],
            dir.join("failing.log"),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let err = loop {
            if let Err(e) = failing.ensure_running() {
                break e;
            }
            assert!(Instant::now() < deadline, "process did not exit");
            thread::sleep(Duration::from_millis(10));
        };
        let message = err.to_string();
        assert!(message.contains("failing exited"), "{message}");
        assert!(message.contains("some reason"), "{message}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stale_runs_are_swept_and_live_ones_kept() {
        let root = std::env::temp_dir().join(format!("sweep-test-{}", std::process::id()));
        let live = root.join("live");
        let stale = root.join("stale");
        std::fs::create_dir_all(&live).unwrap();
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(live.join("owner.pid"), std::process::id().to_string()).unwrap();
        // Pid numbers are bounded by pid_max (at most 2^22), so this one cannot be alive.
        std::fs::write(stale.join("owner.pid"), "99999999").unwrap();
        let swept = Mutex::new(Vec::new());
        sweep_stale_runs(&root, |dir| swept.lock().unwrap().push(dir.to_path_buf()));
        assert_eq!(*swept.lock().unwrap(), vec![stale.clone()]);
        assert!(live.exists());
        assert!(!stale.exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn children_are_listed_until_they_die() {
        let dir = std::env::temp_dir().join(format!("children-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut shell = ManagedProcess::spawn(
            "shell",
            Path::new("/bin/sh"),
            &["-c".into(), "sleep 30 & sleep 30 & wait".into()],
            dir.join("shell.log"),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let children = loop {
            let children = children_of(shell.pid());
            if children.len() == 2 {
                break children;
            }
            assert!(
                Instant::now() < deadline,
                "children of the shell: {children:?}"
            );
            thread::sleep(Duration::from_millis(10));
        };
        assert!(children.iter().all(|child| is_alive(*child)));
        for child in &children {
            send_signal(*child, libc::SIGKILL);
        }
        // The shell reaps them, so they are neither alive nor listed.
        assert!(
            still_alive_after(
                &[("sleep".into(), children[0]), ("sleep".into(), children[1])],
                Duration::from_secs(5)
            )
            .is_empty()
        );
        assert!(children_of(shell.pid()).is_empty());
        shell.stop(Duration::from_secs(5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
