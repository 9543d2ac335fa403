//! The container images: `images/image.sh` (what `make images` runs on the release binaries)
//! makes an image of each component from this build's debug binaries; each is read back as a
//! registry would (digests and sizes checked), unpacked, and its entrypoint run inside its own
//! root filesystem (chroot, as the image's non-root user) so a missing library, a wrong
//! entrypoint or a root user fails here. The agent's image then connects to a real hub.
//! When `make images` has run, its images in target/images are checked the same way.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use scale_agent_e2e::{
    fixtures::{hub_get_json, start_plaintext_hub, temp_dir},
    oci::{self, UnpackedImage},
    process::ManagedProcess,
};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every image: its directory under target/images, the product binary it runs, and the
/// debug binary of this package that is the same command (`cli::main`).
const COMPONENTS: [(&str, &str, &str); 3] = [
    (
        "operator",
        "scale-agent-operator",
        env!("CARGO_BIN_EXE_e2e-operator"),
    ),
    ("agent", "scale-agent", env!("CARGO_BIN_EXE_e2e-agent")),
    ("hub", "scale-agent-hub", env!("CARGO_BIN_EXE_e2e-hub")),
];

/// Runs `images/image.sh layout` on `binary`, writing the layout to `dir/layout`.
fn build_image(binary: &str, name: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let layout = dir.join("layout");
    let output = Command::new(scale_agent_e2e::repo_root().join("images/image.sh"))
        .args(["layout", binary, name])
        .arg(&layout)
        // The debug binaries are large; a fast gzip keeps this test quick.
        .env("SCALE_AGENT_IMAGE_GZIP_LEVEL", "1")
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "images/image.sh layout {binary} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(layout)
}

/// A command running `args` inside the image's root filesystem as the image's user: chroot
/// as root; otherwise chroot inside a user namespace (mapped to root, so the user is not
/// the image's, but the files are still only the image's).
fn in_image(image: &UnpackedImage, args: &[&str]) -> anyhow::Result<Command> {
    let uid = Command::new("id").arg("-u").output()?;
    let mut command = if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        let mut command = Command::new(host_tool("chroot")?);
        command.arg(format!("--userspec={}", image.user()));
        command
    } else {
        let mut command = Command::new(host_tool("unshare")?);
        command.args(["--map-root-user", "chroot"]);
        command
    };
    command.arg(&image.rootfs).args(args).env_clear();
    for pair in image.config["Env"].as_array().into_iter().flatten() {
        if let Some((key, value)) = pair.as_str().and_then(|p| p.split_once('=')) {
            command.env(key, value);
        }
    }
    Ok(command)
}

/// `name` on this machine's PATH: the command runs with the image's environment, whose PATH
/// would not find it.
fn host_tool(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} is not installed (coreutils/util-linux)"))
}

/// What every image must be: tagged and labelled with this version, a non-root user, its
/// binary as the entrypoint, no shell, and `--version` printing the version from inside it.
fn check_image(image: &UnpackedImage, binary: &str) -> anyhow::Result<()> {
    assert_eq!(image.tag, format!("v{VERSION}"));
    assert_eq!(
        image.label("org.opencontainers.image.version"),
        Some(VERSION)
    );
    assert_eq!(
        image.label("org.opencontainers.image.source"),
        Some("https://github.com/scale-agent/scale-agent")
    );
    let revision = image
        .label("org.opencontainers.image.revision")
        .unwrap_or_default();
    assert!(
        revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()),
        "the revision label is a git commit, not {revision:?}"
    );
    assert_eq!(image.user(), "65532:65532", "the image runs as nonroot");
    let entrypoint = format!("/usr/local/bin/{binary}");
    assert_eq!(image.entrypoint(), std::slice::from_ref(&entrypoint));
    assert!(
        !image.rootfs.join("bin/sh").exists() && !image.rootfs.join("usr/bin").exists(),
        "the image holds the binary and its runtime only, no shell or tools"
    );
    assert!(
        image
            .rootfs
            .join("etc/ssl/certs/ca-certificates.crt")
            .is_file()
    );

    let output = in_image(image, &[&entrypoint, "--version"])?.output()?;
    assert!(
        output.status.success(),
        "{entrypoint} --version failed inside the image: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        format!("{binary} {VERSION}")
    );
    Ok(())
}

/// A temporary directory removed when the test ends, pass or fail: each run unpacks about
/// 150 MB of image layers.
struct Scratch(PathBuf);

impl Scratch {
    fn new(prefix: &str) -> std::io::Result<Self> {
        temp_dir(prefix).map(Self)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn every_image_runs_its_entrypoint_as_nonroot_and_prints_the_version() -> anyhow::Result<()> {
    let scratch = Scratch::new("images")?;
    let dir = scratch.0.clone();
    for (component, binary, debug_binary) in COMPONENTS {
        let work = dir.join(component);
        let layout = build_image(debug_binary, binary, &work)?;
        let image = oci::unpack(&layout, &work)?;
        check_image(&image, binary)?;
    }
    Ok(())
}

/// The release images of `make images`, when it has run (CI no longer does: `.ci/run`).
#[test]
fn the_images_make_images_built_are_sound() -> anyhow::Result<()> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| scale_agent_e2e::repo_root().join("target"));
    let images = target.join("images");
    let scratch = Scratch::new("release-images")?;
    let dir = scratch.0.clone();
    for (component, binary, _) in COMPONENTS {
        let layout = images.join(component);
        if !layout.join("index.json").is_file() {
            eprintln!("{} not built (make images): skipped", layout.display());
            continue;
        }
        let image = oci::unpack(&layout, &dir.join(component))?;
        check_image(&image, binary)?;
        eprintln!(
            "{component}: {} KiB compressed, {}",
            image.compressed_size / 1024,
            image.manifest_digest
        );
    }
    Ok(())
}

#[test]
fn an_image_without_its_c_runtime_fails_the_check() -> anyhow::Result<()> {
    let scratch = Scratch::new("broken-image")?;
    let dir = scratch.0.clone();
    let (_, binary, debug_binary) = COMPONENTS[2];
    let layout = build_image(debug_binary, binary, &dir)?;
    let image = oci::unpack(&layout, &dir)?;
    std::fs::remove_file(image.rootfs.join("lib/x86_64-linux-gnu/libc.so.6"))?;
    // The entrypoint runs inside the image only: the host's libc does not stand in.
    let entrypoint = format!("/usr/local/bin/{binary}");
    let output = in_image(&image, &[&entrypoint, "--version"])?.output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "ran without libc: {stderr}");
    assert!(stderr.contains("libc.so.6"), "{stderr}");

    // A blob that no longer matches its digest is refused when the layout is read.
    let blobs = layout.join("blobs/sha256");
    let biggest = std::fs::read_dir(&blobs)?
        .filter_map(|e| e.ok())
        .max_by_key(|e| e.metadata().map(|m| m.len()).unwrap_or_default())
        .map(|e| e.path())
        .ok_or_else(|| anyhow::anyhow!("no blobs in {}", blobs.display()))?;
    let mut bytes = std::fs::read(&biggest)?;
    if let Some(last) = bytes.last_mut() {
        *last ^= 0xff;
    }
    std::fs::write(&biggest, bytes)?;
    let refused = oci::unpack(&layout, &dir.join("again")).map(|_| ());
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("hashes to sha256:"), "{message}");
    Ok(())
}

#[tokio::test]
async fn the_agent_image_connects_to_a_hub_and_both_say_the_version() -> anyhow::Result<()> {
    let scratch = Scratch::new("agent-image")?;
    let dir = scratch.0.clone();
    let hub = start_plaintext_hub(&dir).await?;
    let (_, binary, debug_binary) = COMPONENTS[1];
    let layout = build_image(debug_binary, binary, &dir)?;
    let image = oci::unpack(&layout, &dir)?;
    let grpc = hub.grpc_addr.to_string();
    let entrypoint = format!("/usr/local/bin/{binary}");
    let command = in_image(
        &image,
        &[
            &entrypoint,
            "--hub",
            &grpc,
            "--insecure-plaintext",
            "--replica",
            "from-image",
        ],
    )?;
    let mut agent = ManagedProcess::spawn_command("agent image", command, dir.join("agent.log"))?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let agents = hub_get_json(hub.http_addr, "/api/v1/agents")
            .await?
            .unwrap_or_default();
        let connected = agents
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["replica"] == "from-image");
        if let Some(connected) = connected {
            assert_eq!(connected["agentVersion"], VERSION);
            break;
        }
        agent.ensure_running()?;
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the agent in its image never connected to the hub: {agents}\n{}",
            scale_agent_e2e::process::tail(agent.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    agent.stop(Duration::from_secs(5));
    // The hub says the same version in its API.
    let hub_version = hub_get_json(hub.http_addr, "/api/v1/version").await?;
    assert_eq!(
        hub_version.map(|v| v["version"].clone()),
        Some(serde_json::json!(VERSION))
    );
    Ok(())
}

/// The Dockerfile (for people with a container engine) puts the same files in the same
/// images: its build stage runs `images/image.sh rootfs` for each component, each target
/// runs that component's binary, and its default VERSION is this one.
#[test]
fn the_dockerfile_builds_the_same_images() -> anyhow::Result<()> {
    let dockerfile = std::fs::read_to_string(scale_agent_e2e::repo_root().join("Dockerfile"))?;
    for (component, binary, _) in COMPONENTS {
        for line in [
            format!("images/image.sh rootfs target/release/{binary} {binary} /out/{component}"),
            format!("FROM common AS {component}\nCOPY --from=build /out/{component}/ /"),
            format!("ENTRYPOINT [\"/usr/local/bin/{binary}\"]"),
        ] {
            assert!(dockerfile.contains(&line), "the Dockerfile lacks {line:?}");
        }
    }
    assert!(dockerfile.contains(&format!("ARG VERSION={VERSION}\n")));
    assert!(dockerfile.contains("USER 65532:65532\n"));
    Ok(())
}
