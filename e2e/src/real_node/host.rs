//! What a real node changes on the machine, and putting it back: the pods' bridge, the
//! iptables rules kube-proxy, kubelet and the CNI plugins add (saved before, restored
//! after), the kernel settings kubelet and the bridge plugin set, network namespaces of
//! sandboxes that were not torn down, containerd's shims and the mounts under the node's
//! directory.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use crate::error::{Error, Result};

use super::{BRIDGE, BRIDGE_ADDRESS};

/// Kernel settings kubelet (`setupKernelTunables`), kube-proxy and the bridge plugin may
/// change: read at start, written back at the end.
const SYSCTLS: &[&str] = &[
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Runs `program args`, failing with its output when it fails.
pub(super) fn run(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Result<String> {
    let program = program.as_ref();
    let shown = format!("{} {}", program.to_string_lossy(), args.join(" "));
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Io {
            action: format!("run {shown}"),
            source,
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::NodeCommand {
            command: shown,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// Runs a clean-up command whose failure is only reported: clean-up goes on.
pub(super) fn run_quietly(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Option<String> {
    match run(program, args) {
        Ok(out) => Some(out),
        Err(error) => {
            eprintln!("[real-node] clean-up: {error}");
            None
        }
    }
}

/// The machine's network state before the node started, put back by [`Self::restore`].
/// Also written to `saved_dir`, so a run killed before it restored (no Drop) is restored by
/// the next one ([`Self::restore_leftover`]).
pub(super) struct HostSnapshot {
    saved_dir: PathBuf,
    iptables: String,
    ip6tables: String,
    /// `nft list tables` (e.g. `table ip nat`), when nft is installed: kube-proxy's and
    /// kubelet's iptables (nf_tables backend) make tables that restoring the rules leaves
    /// in place, empty.
    nft_tables: Option<BTreeSet<String>>,
    sysctls: Vec<(String, String)>,
    netns: BTreeSet<String>,
    /// The machine's network interfaces (`/sys/class/net`): the pods' veths that outlive
    /// their network namespace are the new `veth*` ones.
    links: BTreeSet<String>,
}

impl HostSnapshot {
    /// Saves the tables and settings; `saved_dir` holds the copy for a later run.
    pub(super) fn take(saved_dir: &Path) -> Result<Self> {
        fs::create_dir_all(saved_dir).map_err(crate::error::io_err(format!(
            "create {}",
            saved_dir.display()
        )))?;
        let snapshot = Self {
            saved_dir: saved_dir.to_path_buf(),
            iptables: run("iptables-save", &[])?,
            ip6tables: run("ip6tables-save", &[])?,
            nft_tables: nft_tables(),
            sysctls: SYSCTLS
                .iter()
                .filter_map(|name| {
                    let value = fs::read_to_string(Path::new("/proc/sys").join(name)).ok()?;
                    Some((name.to_string(), value.trim().to_string()))
                })
                .collect(),
            netns: network_namespaces(),
            links: links(),
        };
        let write = |name: &str, text: &str| {
            fs::write(saved_dir.join(name), text).map_err(crate::error::io_err(format!(
                "save {name} in {}",
                saved_dir.display()
            )))
        };
        write("iptables.rules", &snapshot.iptables)?;
        write("ip6tables.rules", &snapshot.ip6tables)?;
        write(
            "links",
            &snapshot
                .links
                .iter()
                .map(|n| format!("{n}\n"))
                .collect::<String>(),
        )?;
        write(
            "netns",
            &snapshot
                .netns
                .iter()
                .map(|n| format!("{n}\n"))
                .collect::<String>(),
        )?;
        if let Some(tables) = &snapshot.nft_tables {
            write(
                "nft-tables",
                &tables.iter().map(|t| format!("{t}\n")).collect::<String>(),
            )?;
        }
        write(
            "sysctls",
            &snapshot
                .sysctls
                .iter()
                .map(|(name, value)| format!("{name} {value}\n"))
                .collect::<String>(),
        )?;
        Ok(snapshot)
    }

    /// A run that was killed left its snapshot in `saved_dir`: put the machine back first.
    pub(super) fn restore_leftover(saved_dir: &Path) {
        let Ok(iptables) = fs::read_to_string(saved_dir.join("iptables.rules")) else {
            return;
        };
        eprintln!(
            "[real-node] an earlier run did not clean up: restoring the network tables it saved in {}",
            saved_dir.display()
        );
        let snapshot = Self {
            saved_dir: saved_dir.to_path_buf(),
            iptables,
            ip6tables: fs::read_to_string(saved_dir.join("ip6tables.rules")).unwrap_or_default(),
            nft_tables: fs::read_to_string(saved_dir.join("nft-tables"))
                .ok()
                .map(|text| text.lines().map(str::to_string).collect()),
            sysctls: fs::read_to_string(saved_dir.join("sysctls"))
                .unwrap_or_default()
                .lines()
                .filter_map(|line| line.split_once(' '))
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            netns: fs::read_to_string(saved_dir.join("netns"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect(),
            links: fs::read_to_string(saved_dir.join("links"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect(),
        };
        snapshot.delete_new_network_namespaces();
        delete_bridge();
        snapshot.restore();
    }

    /// Deletes the network namespaces made since the snapshot (sandboxes kubelet did not
    /// tear down; their veths go with them).
    pub(super) fn delete_new_network_namespaces(&self) {
        for name in network_namespaces().difference(&self.netns) {
            if name.starts_with("cni-") {
                run_quietly("ip", &["netns", "delete", name]);
            }
        }
    }

    /// Puts the tables and settings back: every nftables table that exists now but did not
    /// before is deleted (without nft: every iptables table not saved is flushed and its
    /// chains deleted), the saved iptables tables are restored as they were (the KUBE-* and
    /// CNI-* chains go), and the settings written back. Removes the saved copy.
    pub(super) fn restore(&self) {
        for link in links().difference(&self.links) {
            // Gone already when the kernel finished tearing down its namespace meanwhile.
            if link.starts_with("veth") && Path::new("/sys/class/net").join(link).exists() {
                let _ = run("ip", &["link", "delete", link]);
            }
        }
        let flush_new = match (&self.nft_tables, nft_tables()) {
            (Some(before), Some(now)) => {
                for table in now.difference(before) {
                    let words: Vec<&str> = table.split_whitespace().collect();
                    if let ["table", family, name] = words[..] {
                        run_quietly("nft", &["delete", "table", family, name]);
                    }
                }
                false
            }
            _ => true,
        };
        restore_tables("iptables", &self.iptables, flush_new);
        restore_tables("ip6tables", &self.ip6tables, flush_new);
        for (name, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(name);
            let now = fs::read_to_string(&path).unwrap_or_default();
            if now.trim() != value
                && let Err(error) = fs::write(&path, value)
            {
                eprintln!("[real-node] clean-up: could not restore {name} = {value}: {error}");
            }
        }
        let _ = fs::remove_dir_all(&self.saved_dir);
    }
}

/// `iptables-restore` of the saved tables; `flush_new`: also empty the tables that were not
/// saved (when nft could not delete them).
fn restore_tables(family: &str, saved: &str, flush_new: bool) {
    let saved_tables = tables(saved);
    if flush_new && let Some(now) = run_quietly(format!("{family}-save"), &[]) {
        for table in tables(&now).difference(&saved_tables) {
            run_quietly(family, &["-t", table, "-F"]);
            run_quietly(family, &["-t", table, "-X"]);
        }
    }
    if saved_tables.is_empty() {
        return;
    }
    let restore = || -> std::io::Result<std::process::ExitStatus> {
        use std::io::Write as _;
        let mut child = Command::new(format!("{family}-restore"))
            .stdin(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(saved.as_bytes())?;
        }
        child.wait()
    };
    match restore() {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("[real-node] clean-up: {family}-restore exited with {status}"),
        Err(error) => eprintln!("[real-node] clean-up: {family}-restore: {error}"),
    }
}

/// The tables named in `iptables-save` output (`*filter`, `*nat`, ...).
fn tables(save: &str) -> BTreeSet<String> {
    save.lines()
        .filter_map(|line| line.strip_prefix('*'))
        .map(str::to_string)
        .collect()
}

/// `nft list tables`, one `table <family> <name>` each; `None` without nft.
fn nft_tables() -> Option<BTreeSet<String>> {
    let listed = Command::new("nft").args(["list", "tables"]).output().ok()?;
    listed.status.success().then(|| {
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(|line| line.trim().to_string())
            .filter(|line| line.starts_with("table "))
            .collect()
    })
}

fn links() -> BTreeSet<String> {
    fs::read_dir("/sys/class/net")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn network_namespaces() -> BTreeSet<String> {
    fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Makes the pods' bridge with the gateway address before anything starts: the API server
/// listens there, and the bridge plugin takes the bridge as it finds it.
pub(super) fn create_bridge() -> Result<()> {
    delete_bridge();
    let address = format!("{BRIDGE_ADDRESS}/24");
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run("ip", &["addr", "add", &address, "dev", BRIDGE])?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    Ok(())
}

pub(super) fn delete_bridge() {
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        run_quietly("ip", &["link", "delete", BRIDGE]);
    }
}

/// Kills containerd's shims whose `-address` argument (the socket of the containerd that
/// started them) starts with `socket_prefix`: after containerd stops, a shim keeps its
/// container running. Found by that argument, which only real nodes' shims have.
pub(super) fn kill_shims(socket_prefix: &str) {
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_shim = args.first().is_some_and(|a| a.contains("containerd-shim"));
        if is_shim && args.iter().any(|a| a.starts_with(socket_prefix)) {
            // A container's init is the shim's child and outlives a killed shim: kill the
            // containers first (the rest of each container dies with its PID namespace).
            for container in crate::process::children_of(pid) {
                crate::process::send_signal(container, libc::SIGKILL);
            }
            eprintln!("[real-node] clean-up: killing containerd shim {pid} and its containers");
            crate::process::send_signal(pid, libc::SIGKILL);
        }
    }
}

/// Unmounts what is still mounted under `dir` (kubelet's volumes, containerd's root
/// filesystems and shm), deepest first, lazily so a busy one does not stop the rest.
pub(super) fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        run_quietly("umount", &["--lazy", &point.to_string_lossy()]);
    }
}

/// Removes the empty cgroups of containers (`/sys/fs/cgroup/<controller>/k8s.io/<id>`, the
/// CRI namespace's default parent) that runc could not remove because the container was
/// killed under it. A cgroup that still has processes cannot be removed, so a container
/// that runs (of another containerd) is not touched.
pub(super) fn remove_empty_container_cgroups() {
    let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for controller in controllers.filter_map(|e| e.ok()) {
        let Ok(containers) = fs::read_dir(controller.path().join("k8s.io")) else {
            continue;
        };
        for container in containers.filter_map(|e| e.ok()) {
            let name = container.file_name();
            let name = name.to_string_lossy();
            if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                let _ = fs::remove_dir(container.path());
            }
        }
    }
}
