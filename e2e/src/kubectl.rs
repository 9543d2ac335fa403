//! Running kubectl (any of the versions the harness builds) as a test's client, and making
//! its output comparable across two targets: the same command against the API server
//! directly and through the hub's proxy must give the same answer, once the names and
//! values that differ by nature (namespace, uids, resourceVersions, times) are masked.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::{Error, Result};

/// What a kubectl run gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stderr as a user reads it: without klog's info lines (what `-v=6` adds), with klog's
    /// error and fatal lines reduced to their message (kubectl 1.22 at `-v=6` reports
    /// errors through klog's fatal path), and without the goroutine dump that follows a
    /// fatal line.
    pub fn messages(&self) -> String {
        let mut out = Vec::new();
        for line in self.stderr.lines() {
            if line.starts_with("goroutine ") {
                break;
            }
            if is_klog_line(line) {
                if matches!(line.chars().next(), Some('E' | 'F'))
                    && let Some(i) = line.find("] ")
                {
                    out.push(&line[i + 2..]);
                }
                continue;
            }
            out.push(line);
        }
        out.join("\n")
    }
}

/// A kubectl binary with a home of its own (its discovery and HTTP caches live there, as
/// they do in Clouddriver's pod).
#[derive(Clone, Debug)]
pub struct Kubectl {
    pub binary: PathBuf,
    pub home: PathBuf,
}

impl Kubectl {
    pub fn new(binary: PathBuf, home: PathBuf) -> Self {
        Kubectl { binary, home }
    }

    /// Runs `kubectl --kubeconfig=<kubeconfig> <args>` with `stdin`, waiting at most
    /// `timeout`.
    pub async fn run(
        &self,
        kubeconfig: &Path,
        args: &[String],
        stdin: Option<&str>,
        timeout: Duration,
    ) -> Result<Outcome> {
        use tokio::io::AsyncWriteExt as _;
        std::fs::create_dir_all(&self.home).map_err(|source| Error::Io {
            action: format!("create {}", self.home.display()),
            source,
        })?;
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .env("HOME", &self.home)
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let what = format!("{} {}", self.binary.display(), args.join(" "));
        let io = |source| Error::Io {
            action: format!("run {what}"),
            source,
        };
        let mut child = command.spawn().map_err(io)?;
        if let Some(mut input) = child.stdin.take() {
            if let Some(text) = stdin {
                input.write_all(text.as_bytes()).await.map_err(io)?;
            }
            drop(input);
        }
        let output = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| Error::Timeout {
                secs: timeout.as_secs(),
                what: what.clone(),
            })?
            .map_err(io)?;
        Ok(Outcome {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Whether a line is klog's (`I1123 00:36:02.123456   12345 file.go:12] ...`).
pub fn is_klog_line(line: &str) -> bool {
    let mut chars = line.chars();
    matches!(chars.next(), Some('I' | 'W' | 'E' | 'F'))
        && line.len() > 5
        && line[1..5].chars().all(|c| c.is_ascii_digit())
        && line[5..].starts_with(' ')
}

/// One HTTP request kubectl logged at `-v=6`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    pub method: String,
    /// The URL's path after the server's own path (`/clusters/<account>` for the proxy),
    /// with the query.
    pub path: String,
    pub status: u16,
}

/// The requests in kubectl's `-v=6` log whose URL starts with `server` (both log formats:
/// 1.22's `GET https://… 200 OK in 3 milliseconds` and the structured `"Response"
/// verb="GET" url="https://…" status="200 OK"`).
pub fn requests(stderr: &str, server: &str) -> Vec<Request> {
    let server = server.trim_end_matches('/');
    stderr
        .lines()
        .filter(|line| is_klog_line(line))
        .filter_map(|line| {
            let rest = &line[line.find("] ")? + 2..];
            let (method, url, status) = if rest.starts_with("\"Response\"") {
                let field = |name: &str| {
                    let start = rest.find(&format!("{name}=\""))? + name.len() + 2;
                    let end = rest[start..].find('"')? + start;
                    Some(rest[start..end].to_string())
                };
                (field("verb")?, field("url")?, field("status")?)
            } else {
                let mut words = rest.split_whitespace();
                let method = words.next()?.to_string();
                let url = words.next()?.to_string();
                let status = words.next()?.to_string();
                (method, url, status)
            };
            if !method.chars().all(|c| c.is_ascii_uppercase()) {
                return None;
            }
            let path = url.strip_prefix(server)?.to_string();
            let status = status.split_whitespace().next()?.parse().ok()?;
            Some(Request {
                method,
                path,
                status,
            })
        })
        .collect()
}

/// A request's path with values that change between runs masked: the query's values
/// (resourceVersions, timeouts, hashes) and `namespace` (as `NS`).
pub fn request_shape(path: &str, namespace: &str) -> String {
    let path = path.replace(namespace, "NS");
    match path.split_once('?') {
        None => path,
        Some((base, query)) => {
            let mut keys: Vec<&str> = query
                .split('&')
                .map(|pair| pair.split_once('=').map_or(pair, |(k, _)| k))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            format!("{base}?{}", keys.join("&"))
        }
    }
}

/// Names made from `generateName` prefixes end in five random characters.
const GENERATED_SUFFIX: usize = 5;

/// Masks the random suffix of names generated from `prefix` (`web-run-x7k2p`).
pub fn mask_generated(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let after = &rest[i + prefix.len()..];
        let suffix_len = after
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .count();
        out.push_str(&rest[..i + prefix.len()]);
        if suffix_len == GENERATED_SUFFIX {
            out.push_str("GENERATED");
            rest = &after[GENERATED_SUFFIX..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Masks what differs by nature between two runs of the same commands in two namespaces:
/// `namespace` becomes `NS`; in JSON, uids, resourceVersions, times, allocated cluster IPs,
/// managedFields, the names of generated objects, the Deployment revision annotation and
/// every object's `status` (written by controllers on their own schedule) are replaced or
/// dropped. Text that is not JSON only has the namespace masked.
pub fn normalize(text: &str, namespace: &str) -> String {
    let replaced = text.replace(namespace, "NS");
    match serde_json::from_str::<Value>(&replaced) {
        Ok(mut value) => {
            scrub(&mut value);
            serde_json::to_string_pretty(&value).unwrap_or(replaced)
        }
        Err(_) => replaced.trim_end().to_string(),
    }
}

fn looks_like_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 19
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
}

fn scrub(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.contains_key("metadata")
                && map.get("kind").and_then(Value::as_str) != Some("Status")
            {
                map.remove("status");
            }
            map.remove("managedFields");
            map.remove("deployment.kubernetes.io/revision");
            for key in [
                "uid",
                "resourceVersion",
                "selfLink",
                "clusterIP",
                "clusterIPs",
            ] {
                if let Some(v) = map.get_mut(key) {
                    *v = Value::String(key.to_uppercase());
                }
            }
            if map.contains_key("generateName")
                && let Some(name) = map.get_mut("name")
            {
                *name = Value::String("GENERATED".into());
            }
            for v in map.values_mut() {
                scrub(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::String(s) if looks_like_time(s) => *s = "TIME".into(),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_lines_and_requests_of_both_formats() {
        let log = "\
I1123 00:36:02.123456   12345 round_trippers.go:454] GET https://hub:8443/clusters/a/api?timeout=32s 200 OK in 3 milliseconds
I1123 00:36:02.223456   12345 round_trippers.go:632] \"Response\" verb=\"PATCH\" url=\"https://hub:8443/clusters/a/apis/apps/v1/namespaces/x/deployments/web?fieldManager=kubectl\" status=\"200 OK\" milliseconds=4
I1123 00:36:02.323456   12345 round_trippers.go:632] \"Response\" verb=\"GET\" url=\"https://other/api\" status=\"200 OK\" milliseconds=4
Error from server (NotFound): deployments.apps \"nope\" not found";
        let found = requests(log, "https://hub:8443/clusters/a");
        assert_eq!(
            found,
            vec![
                Request {
                    method: "GET".into(),
                    path: "/api?timeout=32s".into(),
                    status: 200
                },
                Request {
                    method: "PATCH".into(),
                    path: "/apis/apps/v1/namespaces/x/deployments/web?fieldManager=kubectl".into(),
                    status: 200
                },
            ]
        );
        let outcome = Outcome {
            code: Some(1),
            stdout: String::new(),
            stderr: log.into(),
        };
        assert_eq!(
            outcome.messages(),
            "Error from server (NotFound): deployments.apps \"nope\" not found"
        );
        let fatal = Outcome {
            code: Some(255),
            stdout: String::new(),
            stderr: "I1123 00:00:00.1 1 a.go:1] GET x\nF1123 00:00:00.2 1 helpers.go:118] error: Metrics API not available\ngoroutine 1 [running]:\nk8s.io/klog/v2.stacks(0x1)\n".into(),
        };
        assert_eq!(fatal.messages(), "error: Metrics API not available");
        assert_eq!(
            request_shape(
                "/api/v1/namespaces/ns-1/pods?limit=500&continue=abc&limit=2",
                "ns-1"
            ),
            "/api/v1/namespaces/NS/pods?continue&limit"
        );
    }

    #[test]
    fn normalized_outputs_compare_across_namespaces() {
        let a = r#"{"kind":"Deployment","metadata":{"name":"web","namespace":"ns-a","uid":"1","resourceVersion":"5","creationTimestamp":"2026-11-23T00:00:00Z","managedFields":[{}]},"spec":{"x":1},"status":{"replicas":1}}"#;
        let b = r#"{"kind":"Deployment","metadata":{"name":"web","namespace":"ns-b","uid":"2","resourceVersion":"9","creationTimestamp":"2026-11-23T00:00:05Z"},"spec":{"x":1},"status":{"replicas":0}}"#;
        assert_eq!(normalize(a, "ns-a"), normalize(b, "ns-b"));
        let c = b.replace("\"x\":1", "\"x\":2");
        assert_ne!(
            normalize(a, "ns-a"),
            normalize(&c, "ns-b"),
            "a real difference stays"
        );
        let status = r#"{"kind":"Status","metadata":{},"status":"Failure","code":404}"#;
        assert!(
            normalize(status, "x").contains("Failure"),
            "a Status keeps its status"
        );
        assert_eq!(
            normalize("deployment.apps/web scaled in ns-a\n", "ns-a"),
            "deployment.apps/web scaled in NS"
        );
        assert_eq!(
            mask_generated("web-run-x7k2p deleted; web-run-long-name kept", "web-run-"),
            "web-run-GENERATED deleted; web-run-long-name kept"
        );
    }
}
