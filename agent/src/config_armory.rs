//! Armory agent keys that Scale Agent does not read the way Armory's agent does: each is
//! either refused (the agent would behave differently in a way that matters, e.g. TLS not
//! verified as asked) or reported at start-up as having no effect, always with what to use
//! instead. Keys that are honoured are plain fields of
//! [`scale_agent_crds::agent_config::AgentConfig`]; the table in the guide's
//! `docs/src/tasks/migrate-from-armory.md` lists both.
//!
//! Pure: works on the file's YAML as a [`serde_json::Value`].

use serde_json::Value;

/// When an entry applies to the value at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum When {
    /// The key is present, whatever its value.
    Present,
    /// The value is `true`, a non-empty string, list or map, or a non-zero number: `false`
    /// (or empty) is what Scale Agent does anyway.
    Set,
    /// The value is a string starting with this prefix.
    StartsWith(&'static str),
}

/// What the agent does with a key an entry matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The agent does not start (a running agent keeps its previous config).
    Refused,
    /// A start-up warning: the key has no effect, harmlessly.
    NoEffect,
}

/// One Armory key and what Scale Agent does with it.
struct ArmoryKey {
    /// Path with list items written `[]`, e.g. `kubernetes.accounts[].insecure`.
    path: &'static str,
    when: When,
    verdict: Verdict,
    /// Why, and what to use instead.
    message: &'static str,
}

const fn refused(path: &'static str, when: When, message: &'static str) -> ArmoryKey {
    ArmoryKey {
        path,
        when,
        verdict: Verdict::Refused,
        message,
    }
}

const fn no_effect(path: &'static str, when: When, message: &'static str) -> ArmoryKey {
    ArmoryKey {
        path,
        when,
        verdict: Verdict::NoEffect,
        message,
    }
}

const ACCOUNT_KUBECONFIG_REF: &str = "secret-engine references (encryptedFile:vault!…, encryptedFile:k8s!…) are not resolved: mount the kubeconfig as a file (a Secret volume, or Vault Agent Injector rendering it) and set kubeconfigFile to its path, or use an AgentAccount with credentials.kubeconfigSecretRef";

/// Every Armory key (AO, section 1 of the reference) that is not honoured as Armory honours
/// it. The proxy keys (`*.noProxy`, see `egress.rs`) and `keepAliveHeartbeatSeconds` are
/// honoured, so not listed; `clouddriver.keepAlive{TimeOut,Operation}Seconds` are not listed
/// either: they are reported as unknown keys until they are wired.
const ARMORY_KEYS: &[ArmoryKey] = &[
    no_effect(
        "timeoutSeconds",
        When::Present,
        "each operation's deadline comes from the hub's request (30 s when it gives none); remove the key",
    ),
    refused(
        "certFile",
        When::Present,
        "Armory's 2020 key is not read: set clouddriver.tls.clientCertFile and clouddriver.tls.clientKeyFile",
    ),
    refused(
        "clouddriver.tls.insecureSkipVerify",
        When::Set,
        "the hub's certificate is always verified: set clouddriver.tls.cacertFile to the CA that signed it (and clouddriver.tls.serverName when the name differs), or remove the key",
    ),
    refused(
        "clouddriver.tls.clientKeyFilePassword",
        When::Set,
        "encrypted private keys are not supported: decrypt the key to unencrypted PKCS#8 PEM (openssl pkcs8 -topk8 -nocrypt -in key.pem -out key.pk8.pem), point clientKeyFile at it and remove the password",
    ),
    refused(
        "clouddriver.tls.clientKeyPassword",
        When::Set,
        "encrypted private keys are not supported: decrypt the key to unencrypted PKCS#8 PEM (openssl pkcs8 -topk8 -nocrypt -in key.pem -out key.pk8.pem), point clientKeyFile at it and remove the password",
    ),
    refused(
        "clouddriver.auth.tokenCommand",
        When::Present,
        "commands are not run: have the command (a sidecar or a CronJob) write the token to a file and set clouddriver.auth.tokenFile, which is read again on every connect",
    ),
    no_effect(
        "clouddriver.responseRetries",
        When::Present,
        "an operation result is sent once; when the stream drops, the hub resends idempotent operations to another replica; remove the key",
    ),
    no_effect(
        "kubernetes.reconnectTimeoutMs",
        When::Present,
        "reconnects to the hub follow clouddriver.backoff; remove the key",
    ),
    no_effect(
        "kubernetes.cacheGroupSize",
        When::Present,
        "initial LISTs are limited by tasks.totalBudget and tasks.budgetPerAccount instead; remove the key",
    ),
    no_effect(
        "kubernetes.cacheGroupDelayMs",
        When::Present,
        "initial LISTs are limited by tasks.totalBudget and tasks.budgetPerAccount instead; remove the key",
    ),
    no_effect(
        "kubernetes.retries",
        When::Present,
        "not configurable: watches retry with backoff, scale and rollout retry 409 Conflicts, and a failed operation goes back to the hub, which decides on a resend; remove the key",
    ),
    no_effect(
        "kubernetes.serverSideApply",
        When::Present,
        "each apply operation says whether it is server-side (serverSide in the hub's request, default true), for every kind; remove the key",
    ),
    refused(
        "kubernetes.accounts[].insecure",
        When::Set,
        "the API server's certificate is always verified: put its CA in the kubeconfig (certificate-authority-data), or remove the key",
    ),
    refused(
        "kubernetes.accounts[].kubeconfigFile",
        When::StartsWith("encrypted"),
        ACCOUNT_KUBECONFIG_REF,
    ),
    refused(
        "kubernetes.accounts[].kubeConfigFile",
        When::StartsWith("encrypted"),
        ACCOUNT_KUBECONFIG_REF,
    ),
    no_effect(
        "kubernetes.accounts[].oAuthScopes",
        When::Present,
        "auth-provider plugins are not run: use a kubeconfig with a static token or a client certificate; remove the key",
    ),
    no_effect(
        "kubernetes.accounts[].serviceAccountName",
        When::Present,
        "serviceAccount: true uses the pod's own ServiceAccount (the Deployment's serviceAccountName); remove the key",
    ),
    no_effect(
        "kubernetes.accounts[].maxResumableResourceAgeMs",
        When::Present,
        "the agent resumes from the hub's last resourceVersion at any age and lists again when the API server answers 410 Gone; remove the key",
    ),
    no_effect(
        "kubernetes.accounts[].onlySpinnakerManaged",
        When::Present,
        "not implemented (nor by Armory's agent); remove the key",
    ),
    no_effect(
        "kubernetes.accounts[].skipServerSideApply",
        When::Present,
        "removed by Armory in 1.0.47; each apply operation says whether it is server-side; remove the key",
    ),
    no_effect(
        "kubernetes.accounts[].skipManifestDefaults",
        When::Present,
        "removed by Armory in 1.0.47; manifests are applied as given; remove the key",
    ),
    no_effect(
        "kubernetes.accounts[].metrics",
        When::Set,
        "in the agent's own config it grants nothing: `kubectl top` through the hub is tunnelled to the cluster's metrics-server, and the AgentAccount's podMetrics grants the reads (scale-agent migrate sets it from this key); set it to false or remove it",
    ),
    no_effect(
        "tasks.queueCheckFrequencyMs",
        When::Present,
        "a LIST starts as soon as the budget has room; remove the key",
    ),
    no_effect(
        "server.host",
        When::Present,
        "the admin listener's address is --admin-addr (SCALE_AGENT_ADMIN_ADDR), default 0.0.0.0:<server.port>; remove the key",
    ),
    refused(
        "server.ssl.enabled",
        When::Set,
        "TLS on the admin port is not supported: terminate TLS in front of it, and remove server.ssl",
    ),
    no_effect(
        "server.ssl",
        When::Present,
        "TLS on the admin port is not supported; remove the key",
    ),
    no_effect(
        "logging.format",
        When::Present,
        "use --log-format (SCALE_AGENT_LOG_FORMAT): text or json",
    ),
    no_effect(
        "logging.level",
        When::Present,
        "use RUST_LOG, e.g. RUST_LOG=debug",
    ),
    no_effect(
        "logging.file",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.multiWrite",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.maxSizeMb",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.maxAgeDays",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.maxBackups",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.localTime",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.compress",
        When::Present,
        "logs go to stdout only (collect them from the container); remove the key",
    ),
    no_effect(
        "logging.fields",
        When::Present,
        "log lines carry no extra fields; remove the key",
    ),
    no_effect(
        "prometheus",
        When::Present,
        "metrics are always served on the admin port (server.port) at /metrics; scrape that port and remove the key",
    ),
    no_effect(
        "pprof",
        When::Present,
        "there is no profiling endpoint; remove the key",
    ),
    refused(
        "secrets.vault.enabled",
        When::Set,
        "Vault references are not resolved: render kubeconfigs with the Vault Agent Injector into files (or armory-agent-local.yaml, which is read) and set kubeconfigFile to their paths",
    ),
    no_effect(
        "secrets",
        When::Present,
        "secret engines are not used; remove the key",
    ),
    no_effect(
        "dynamicAccountsEnabled",
        When::Present,
        "use dynamicAccounts.enabled (and dynamicAccounts.kubeconfigSecrets) to serve the accounts the hub pushes; remove the key",
    ),
    refused(
        "hub.connection",
        When::Present,
        "Armory Cloud's keys were removed by Armory in 2021: set clouddriver.grpc and clouddriver.tls.*",
    ),
    refused(
        "hub.auth.armory",
        When::Present,
        "Armory Cloud's keys were removed by Armory in 2021: use clouddriver.auth.tokenFile or a client certificate",
    ),
];

/// An Armory key found in a config, with what Scale Agent does with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArmoryNotice {
    /// Where the key is, e.g. `kubernetes.accounts[0].insecure`.
    pub path: String,
    pub verdict: Verdict,
    /// Why, and what to use instead.
    pub message: &'static str,
}

impl std::fmt::Display for ArmoryNotice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.verdict {
            // troubleshooting: the agent exits at start-up on an Armory key
            // An Armory key the agent would honour differently in a way that matters (TLS not
            // verified, a token command, secret engines) is refused, with what to use instead;
            // [Migrate from Armory](../tasks/migrate-from-armory.md) lists every key. Keys with no
            // effect are only reported.
            Verdict::Refused => write!(f, "{} is not supported: {}", self.path, self.message),
            Verdict::NoEffect => write!(f, "{} has no effect: {}", self.path, self.message),
        }
    }
}

fn is_set(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.trim().is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The values at `path` (list items written `[]`), with the concrete path of each.
fn lookup<'v>(value: &'v Value, path: &str) -> Vec<(String, &'v Value)> {
    let mut found = vec![(String::new(), value)];
    for segment in path.split('.') {
        let (key, each) = match segment.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (segment, false),
        };
        let mut next = Vec::new();
        for (shown, current) in found {
            let Some(child) = current.get(key) else {
                continue;
            };
            let shown = if shown.is_empty() {
                key.to_owned()
            } else {
                format!("{shown}.{key}")
            };
            if each {
                for (index, item) in child.as_array().into_iter().flatten().enumerate() {
                    next.push((format!("{shown}[{index}]"), item));
                }
            } else {
                next.push((shown, child));
            }
        }
        found = next;
    }
    found
}

/// The Armory keys in `raw` that are refused or have no effect, in table order. A key
/// whose child is refused (`server.ssl.enabled`) is reported once, by the child.
pub fn check(raw: &Value) -> Vec<ArmoryNotice> {
    let mut notices: Vec<ArmoryNotice> = Vec::new();
    for entry in ARMORY_KEYS {
        // `hub` is read as `clouddriver` (its alias), so its keys get the same verdicts.
        let alias = entry
            .path
            .strip_prefix("clouddriver.")
            .map(|rest| format!("hub.{rest}"));
        let found = lookup(raw, entry.path)
            .into_iter()
            .chain(alias.iter().flat_map(|alias| lookup(raw, alias)));
        for (path, value) in found {
            let applies = match entry.when {
                When::Present => true,
                When::Set => is_set(value),
                When::StartsWith(prefix) => value.as_str().is_some_and(|s| s.starts_with(prefix)),
            };
            let reported_below = notices
                .iter()
                .any(|n| n.path.starts_with(&format!("{path}.")));
            if applies && !reported_below {
                notices.push(ArmoryNotice {
                    path,
                    verdict: entry.verdict,
                    message: entry.message,
                });
            }
        }
    }
    notices
}

/// Whether an unknown key (as [`scale_agent_crds::agent_config::UnknownKey::path`] shows
/// it) is one of the table's, so it is reported by [`check`] rather than as unknown.
pub fn covers(unknown_path: &str) -> bool {
    let mut normalized = normalize(unknown_path);
    if let Some(rest) = normalized.strip_prefix("hub.")
        && !covers_exactly(&normalized)
    {
        normalized = format!("clouddriver.{rest}");
    }
    covers_exactly(&normalized)
}

fn covers_exactly(normalized: &str) -> bool {
    ARMORY_KEYS.iter().any(|entry| {
        normalized == entry.path || normalized.starts_with(&format!("{}.", entry.path))
    })
}

/// `kubernetes.accounts[3].x` → `kubernetes.accounts[].x`.
fn normalize(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push_str("[]");
            }
            ']' => in_index = false,
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notices(yaml: &str) -> Vec<String> {
        let raw: Value = serde_saphyr::from_str(yaml).unwrap();
        check(&raw).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn harmless_values_pass_and_harmful_ones_are_named_with_what_to_do() {
        assert!(notices("clouddriver:\n  tls:\n    insecureSkipVerify: false\n").is_empty());
        let found = notices(
            "clouddriver:\n  tls:\n    insecureSkipVerify: true\nkubernetes:\n  accounts:\n    - name: a\n    - name: b\n      insecure: true\n      kubeconfigFile: encryptedFile:vault!e:secret!p:k!k:config\nserver:\n  ssl:\n    enabled: true\n    certFile: /c\n",
        );
        assert_eq!(found.len(), 4, "{found:#?}");
        assert!(found[0].starts_with("clouddriver.tls.insecureSkipVerify is not supported: the hub's certificate is always verified: set clouddriver.tls.cacertFile"), "{}", found[0]);
        assert!(found[1].starts_with("kubernetes.accounts[1].insecure is not supported"));
        assert!(found[2].starts_with(
            "kubernetes.accounts[1].kubeconfigFile is not supported: secret-engine references"
        ));
        // server.ssl is reported once, by its refused child.
        assert!(found[3].starts_with("server.ssl.enabled is not supported: TLS on the admin port"));
    }

    #[test]
    fn covered_unknown_keys_are_recognised_by_prefix() {
        assert!(covers("kubernetes.retries"));
        assert!(covers("kubernetes.retries.maxRetries"));
        assert!(covers("kubernetes.accounts[12].oAuthScopes"));
        assert!(!covers("kubernetes.retriez"));
        assert!(!covers("clouddriver.noProxy"));
        assert!(covers("hub.auth.tokenCommand.command"));
        assert!(covers("hub.connection.grpc"));
        assert_eq!(
            notices("hub:\n  auth:\n    tokenCommand:\n      command: x\n")[0],
            "hub.auth.tokenCommand is not supported: commands are not run: have the command (a sidecar or a CronJob) write the token to a file and set clouddriver.auth.tokenFile, which is read again on every connect"
        );
        assert_eq!(normalize("a[1].b[22].c"), "a[].b[].c");
    }
}
