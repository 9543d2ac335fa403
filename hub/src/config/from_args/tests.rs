use std::time::Duration;

use clap::Parser as _;

use super::*;
use crate::config::{
    DEFAULT_AGENT_CERT_LIFETIME, DEFAULT_MAX_HEARTBEAT_PERIOD, DEFAULT_MIN_HEARTBEAT_PERIOD,
};

#[test]
fn store_flags() {
    use crate::store::Backend;
    let args = Args::try_parse_from(["scale-agent-hub"]).unwrap();
    assert!(matches!(
        args.store.backend(None).unwrap(),
        Backend::Embedded
    ));
    let err = args
        .store
        .backend(Some("postgres://u:p@h/d".into()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--store postgres"), "{err}");

    let args = Args::try_parse_from(["scale-agent-hub", "--store", "postgres"]).unwrap();
    let err = args.store.backend(None).unwrap_err().to_string();
    assert!(err.contains("--postgres-url-file"), "{err}");
    // Below verify-full only with --postgres-insecure-tls (review F11).
    for url in ["postgres://u:p@h/d", "postgres://u:p@h/d?sslmode=require"] {
        let err = args
            .store
            .backend(Some(url.into()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--postgres-insecure-tls") && err.contains("sslmode=verify-full"),
            "{err}"
        );
    }
    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--store",
        "postgres",
        "--postgres-insecure-tls",
    ])
    .unwrap();
    let Backend::Postgres(options) = args
        .store
        .backend(Some(" postgres://u:p@h/d\n".into()))
        .unwrap()
    else {
        panic!("not postgres");
    };
    assert_eq!(options.url, "postgres://u:p@h/d");

    // The file wins over the environment, trimmed like a Secret's key with a newline.
    let file = std::env::temp_dir().join(format!("hub-pg-url-{}", std::process::id()));
    std::fs::write(&file, "postgres://f:s3cret@db:5433/hub\n").unwrap();
    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--store",
        "postgres",
        "--postgres-url-file",
        file.to_str().unwrap(),
        "--postgres-insecure-tls",
    ])
    .unwrap();
    let backend = args.store.backend(Some("postgres://env/x".into())).unwrap();
    std::fs::remove_file(&file).unwrap();
    let Backend::Postgres(options) = &backend else {
        panic!("not postgres");
    };
    assert_eq!(options.url, "postgres://f:s3cret@db:5433/hub");
    assert!(!format!("{backend:?}").contains("s3cret"));
}

#[test]
fn defaults_and_missing_tls() {
    let args = Args::try_parse_from(["scale-agent-hub"]).unwrap();
    assert_eq!(args.listeners.grpc_addr.port(), 9091);
    assert_eq!(args.listeners.http_addr.port(), 8443);
    assert_eq!(args.streams.grace_period, Duration::from_secs(600));
    assert_eq!(args.streams.heartbeat_period, Duration::from_secs(15));
    assert_eq!(args.streams.max_unacked, 1000);
    assert_eq!(args.streams.max_object_bytes, 2 * 1024 * 1024);
    assert_eq!(args.store.store_cache_mib, 2);
    assert_eq!(args.streams.watch_history_mib, 256);
    assert_eq!(args.streams.discovery_cache_mib, 512);
    assert_eq!(args.streams.max_objects_per_account, 250_000);
    assert_eq!(args.streams.max_accounts_per_identity, 1000);
    assert_eq!(args.streams.max_streams_per_identity, 16);
    assert_eq!(args.agents.agent_cert_lifetime, DEFAULT_AGENT_CERT_LIFETIME);
    let err = args.into_config().unwrap_err().to_string();
    assert!(err.contains("--tls-cert, --tls-key"), "{err}");
    assert!(!err.contains("--client-ca"), "{err}");

    // Plaintext gRPC still needs TLS material for HTTP, or the explicit flag.
    let args = Args::try_parse_from(["scale-agent-hub", "--insecure-plaintext"]).unwrap();
    let err = args.into_config().unwrap_err().to_string();
    assert!(err.contains("--http-plaintext"), "{err}");

    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--insecure-plaintext",
        "--http-plaintext",
        "--allow",
        "agent-a=prod-*",
        "--allow",
        "*=dev",
        "--grace-period",
        "2m",
    ])
    .unwrap();
    let config = args.into_config().unwrap();
    assert!(matches!(
        config.agents.security,
        GrpcSecurity::InsecurePlaintext
    ));
    assert_eq!(config.agents.allow.len(), 2);
    assert_eq!(config.streams.grace_period, Duration::from_secs(120));
    assert!(!format!("{config:?}").contains("PRIVATE"));

    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--insecure-plaintext",
        "--http-plaintext",
        "--heartbeat-period",
        "5000h",
    ])
    .unwrap();
    let err = args.into_config().unwrap_err().to_string();
    assert!(err.contains("--heartbeat-period"), "{err}");
}

/// An agent's requested heartbeat period is granted within the hub's bounds; no request
/// gets the hub's period; bounds that exclude the default period are refused.
#[test]
fn proxy_audit_reads_flag() {
    use crate::proxy::audit::AuditReads;
    let parse = |extra: &[&str]| {
        let mut argv = vec![
            "scale-agent-hub",
            "--insecure-plaintext",
            "--http-plaintext",
        ];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)
    };
    let config = parse(&[]).unwrap().into_config().unwrap();
    assert_eq!(config.api.proxy_audit_reads, AuditReads::All);
    let config = parse(&["--proxy-audit-reads=sample:10"])
        .unwrap()
        .into_config()
        .unwrap();
    assert_eq!(config.api.proxy_audit_reads, AuditReads::Sample(10));
    let err = parse(&["--proxy-audit-reads=some"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--proxy-audit-reads") && err.contains("writes-only"),
        "{err}"
    );
}

#[test]
fn heartbeat_requests_are_clamped_to_the_bounds() {
    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--insecure-plaintext",
        "--http-plaintext",
        "--heartbeat-period=10s",
        "--min-heartbeat-period=5s",
        "--max-heartbeat-period=60s",
    ])
    .unwrap();
    let config = args.into_config().unwrap();
    let secs = Duration::from_secs;
    assert_eq!(config.streams.granted_heartbeat_period(0), secs(10));
    assert_eq!(config.streams.granted_heartbeat_period(1), secs(5));
    assert_eq!(config.streams.granted_heartbeat_period(20), secs(20));
    assert_eq!(config.streams.granted_heartbeat_period(3600), secs(60));
    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--insecure-plaintext",
        "--http-plaintext",
        "--heartbeat-period=15s",
        "--max-heartbeat-period=10s",
    ])
    .unwrap();
    let err = args.into_config().unwrap_err().to_string();
    assert!(err.contains("--max-heartbeat-period"), "{err}");
    let defaults = Args::try_parse_from(["scale-agent-hub"]).unwrap();
    assert_eq!(
        defaults.streams.min_heartbeat_period,
        DEFAULT_MIN_HEARTBEAT_PERIOD
    );
    assert_eq!(
        defaults.streams.max_heartbeat_period,
        DEFAULT_MAX_HEARTBEAT_PERIOD
    );
}

/// Every TLS file flag is checked when the flags are read, before the store is opened,
/// and a file without what it should hold is refused naming the flag and the file.
#[test]
fn tls_files_without_a_certificate_or_key_are_refused_naming_flag_and_file() {
    let dir = std::env::temp_dir().join(format!("scale-agent-hub-tlsfiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["hub.test".to_string()]).unwrap();
    let cert = dir.join("tls.crt");
    std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).unwrap();
    let key_file = dir.join("tls.key");
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let (cert, key_file, empty) = (
        cert.display().to_string(),
        key_file.display().to_string(),
        empty.display().to_string(),
    );
    let parse = |extra: &[&str]| {
        let mut argv = vec!["scale-agent-hub"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap().into_config()
    };
    let good = ["--tls-cert", cert.as_str(), "--tls-key", key_file.as_str()];
    assert!(parse(&good).is_ok());
    let cases: [(&[&str], &str, &str, &str); 5] = [
        (
            &["--client-ca", &empty],
            "--client-ca",
            &empty,
            "no certificate",
        ),
        (
            &["--agent-ca-cert", &empty, "--agent-ca-key", &key_file],
            "--agent-ca-cert",
            &empty,
            "no certificate",
        ),
        (
            &["--agent-ca-cert", &cert, "--agent-ca-key", &cert],
            "--agent-ca-key",
            &cert,
            "no private key",
        ),
        (
            &["--http-tls-key", &empty],
            "--http-tls-key",
            &empty,
            "no private key",
        ),
        (
            &["--client-ca", "/nonexistent/ca.pem"],
            "--client-ca",
            "/nonexistent/ca.pem",
            "cannot be read",
        ),
    ];
    for (extra, flag, file, problem) in cases {
        let mut argv = good.to_vec();
        argv.extend_from_slice(extra);
        let err = parse(&argv).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{flag} {file}: {problem}")),
            "{err}"
        );
    }
    let err = parse(&["--tls-cert", &empty, "--tls-key", &key_file])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("--tls-cert {empty}: no certificate")),
        "{err}"
    );
    assert!(err.contains("point --tls-cert at a PEM file"), "{err}");
    let err = parse(&["--tls-cert", &cert, "--tls-key", &empty])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("point --tls-key at the PEM private key"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// F24: --insecure-plaintext no longer silently wins over the flags of an
/// authenticating mode; the refusal names both. And the enrolment's maximum age cannot
/// be shorter than a certificate's lifetime.
#[test]
fn conflicting_agent_authentication_flags_are_refused_naming_both() {
    for flag in ["--client-ca", "--tls-cert", "--tls-key"] {
        let err = Args::try_parse_from([
            "scale-agent-hub",
            "--http-plaintext",
            "--insecure-plaintext",
            flag,
            "/etc/some.pem",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--insecure-plaintext") && err.contains(flag),
            "{flag}: {err}"
        );
    }
    let err = Args::try_parse_from([
        "scale-agent-hub",
        "--http-plaintext",
        "--insecure-plaintext",
        "--forwarded-client-cert",
        "xfcc",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("--insecure-plaintext") && err.contains("--forwarded-client-cert"),
        "{err}"
    );
    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--http-plaintext",
        "--insecure-plaintext",
        "--agent-cert-lifetime",
        "720h",
        "--agent-max-enrolment-age",
        "24h",
    ])
    .unwrap();
    let err = args.into_config().unwrap_err().to_string();
    assert!(
        err.contains("--agent-max-enrolment-age") && err.contains("--agent-cert-lifetime"),
        "{err}"
    );
    let args = Args::try_parse_from([
        "scale-agent-hub",
        "--http-plaintext",
        "--insecure-plaintext",
    ])
    .unwrap();
    assert_eq!(
        args.agents.agent_max_enrolment_age,
        crate::config::DEFAULT_AGENT_MAX_ENROLMENT_AGE
    );
}

#[test]
fn proxy_mode_flags() {
    let dir = std::env::temp_dir().join(format!("scale-agent-hub-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
    let ca = ca.display().to_string();
    let key_path = dir.join("ca.key");
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let key_path = key_path.display().to_string();
    let parse = |extra: &[&str]| {
        let mut argv = vec![
            "scale-agent-hub",
            "--http-plaintext",
            "--forwarded-client-cert",
        ];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap().into_config()
    };

    let err = parse(&["escaped-pem", "--trusted-proxy-cidr", "10.0.0.0/8"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs --client-ca"), "{err}");
    let err = parse(&["escaped-pem", "--client-ca", &ca])
        .unwrap_err()
        .to_string();
    assert!(err.contains("set --trusted-proxy-cidr"), "{err}");
    let err = parse(&[
        "xfcc",
        "--client-ca",
        &ca,
        "--trusted-proxy-identity",
        "envoy.spinnaker",
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("--trusted-proxy-ca"), "{err}");
    let err = parse(&[
        "xfcc",
        "--client-ca",
        &ca,
        "--trusted-proxy-cidr",
        "10.0.0.0/8",
        "--tls-cert",
        &ca,
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("both --tls-cert and --tls-key"), "{err}");

    let config = parse(&[
        "escaped-pem",
        "--client-ca",
        &ca,
        "--trusted-proxy-cidr",
        "10.0.0.0/8,127.0.0.2",
    ])
    .unwrap();
    let GrpcSecurity::TrustedProxy(proxy) = &config.agents.security else {
        panic!("not proxy mode: {:?}", config.agents.security);
    };
    assert!(proxy.hop_tls.is_none());
    assert_eq!(proxy.trust.header(), "x-ssl-client-cert");

    let config = parse(&[
        "xfcc",
        "--client-ca",
        &ca,
        "--trusted-proxy-identity",
        "envoy.spinnaker",
        "--tls-cert",
        &ca,
        "--tls-key",
        &key_path,
        "--trusted-proxy-ca",
        &ca,
    ])
    .unwrap();
    let GrpcSecurity::TrustedProxy(proxy) = &config.agents.security else {
        panic!("not proxy mode: {:?}", config.agents.security);
    };
    assert!(proxy.hop_tls.as_ref().unwrap().proxy_ca_pem.is_some());
    assert!(proxy.trust.trusts_only_identities());

    let err = Args::try_parse_from([
        "scale-agent-hub",
        "--insecure-plaintext",
        "--forwarded-client-cert",
        "xfcc",
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot be used with"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
