//! Kubeconfigs that point kubectl, Helm, client-go and Clouddriver at the hub's proxy:
//! `server: <public URL>/clusters/<account>` with the account's bearer token.
//!
//! Rendering only, from what the caller gives it (nothing of the hub, no IO): the API's
//! kubeconfig route ([`crate::admin_api`]) and the registrar's hand-over of the accounts to
//! Clouddriver use it.

use base64::Engine as _;
use serde::Serialize;

/// Everything a kubeconfig for one account needs.
#[derive(Clone, Debug)]
pub struct KubeconfigFor<'a> {
    pub account: &'a str,
    /// The hub's HTTP listener as clients reach it, e.g. `https://hub.example:8443`.
    pub public_url: &'a str,
    /// PEM of the CA that signed the hub's serving certificate; the system roots when
    /// absent.
    pub ca_pem: Option<&'a [u8]>,
    pub token: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig<'a> {
    // The one camelCase key of a kubeconfig's kebab-case top level.
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    clusters: Vec<Named<'a, Cluster>>,
    users: Vec<Named<'a, User<'a>>>,
    contexts: Vec<Named<'a, Context<'a>>>,
    current_context: &'a str,
}

#[derive(Serialize)]
struct Named<'a, T> {
    name: &'a str,
    #[serde(flatten)]
    value: T,
}

#[derive(Serialize)]
struct Cluster {
    cluster: ClusterSpec,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterSpec {
    server: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate_authority_data: Option<String>,
}

#[derive(Serialize)]
struct User<'a> {
    user: UserSpec<'a>,
}

#[derive(Serialize)]
struct UserSpec<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exec: Option<ExecSpec<'a>>,
}

/// `users[].user.exec` of a kubeconfig: the command kubectl runs for a credential.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExecSpec<'a> {
    api_version: &'static str,
    command: &'a str,
    args: &'a [String],
    /// Required by `client.authentication.k8s.io/v1`: the command never prompts.
    interactive_mode: &'static str,
}

/// The command an exec-plugin kubeconfig runs to get a token (kubectl runs it and reads an
/// `ExecCredential` from its standard output).
#[derive(Clone, Debug)]
pub struct ExecCommand<'a> {
    pub command: &'a str,
    pub args: &'a [String],
}

#[derive(Serialize)]
struct Context<'a> {
    context: ContextSpec<'a>,
}

#[derive(Serialize)]
struct ContextSpec<'a> {
    cluster: &'a str,
    user: &'a str,
}

/// The proxy URL of an account.
pub fn server_url(public_url: &str, account: &str) -> String {
    format!("{}/clusters/{account}", public_url.trim_end_matches('/'))
}

/// The kubeconfig YAML.
pub fn render(k: &KubeconfigFor<'_>) -> String {
    render_user(
        k,
        UserSpec {
            token: Some(k.token),
            exec: None,
        },
    )
}

/// A kubeconfig whose user holds no token but runs `exec` for one
/// (`client.authentication.k8s.io/v1`); `k.token` is ignored.
pub fn render_exec(k: &KubeconfigFor<'_>, exec: &ExecCommand<'_>) -> String {
    render_user(
        k,
        UserSpec {
            token: None,
            exec: Some(ExecSpec {
                api_version: "client.authentication.k8s.io/v1",
                command: exec.command,
                args: exec.args,
                interactive_mode: "Never",
            }),
        },
    )
}

fn render_user(k: &KubeconfigFor<'_>, spec: UserSpec<'_>) -> String {
    let user = format!("scale-agent-{}", k.account);
    let config = Kubeconfig {
        api_version: "v1",
        kind: "Config",
        clusters: vec![Named {
            name: k.account,
            value: Cluster {
                cluster: ClusterSpec {
                    server: server_url(k.public_url, k.account),
                    certificate_authority_data: k
                        .ca_pem
                        .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem)),
                },
            },
        }],
        users: vec![Named {
            name: &user,
            value: User { user: spec },
        }],
        contexts: vec![Named {
            name: k.account,
            value: Context {
                context: ContextSpec {
                    cluster: k.account,
                    user: &user,
                },
            },
        }],
        current_context: k.account,
    };
    // Serialising these plain structs cannot fail.
    serde_saphyr::to_string(&config).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfig_points_at_the_account_with_its_token() {
        let yaml = render(&KubeconfigFor {
            account: "prod-eu",
            public_url: "https://hub.example:8443/",
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"),
            token: "sat_abc",
        });
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        let mut keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "apiVersion",
                "clusters",
                "contexts",
                "current-context",
                "kind",
                "users"
            ]
        );
        assert_eq!(value["apiVersion"], "v1");
        assert_eq!(value["kind"], "Config");
        assert_eq!(value["current-context"], "prod-eu");
        assert_eq!(
            value["clusters"][0]["cluster"]["server"],
            "https://hub.example:8443/clusters/prod-eu"
        );
        assert_eq!(value["users"][0]["user"]["token"], "sat_abc");
        assert_eq!(value["contexts"][0]["context"]["cluster"], "prod-eu");
        assert_eq!(
            value["contexts"][0]["context"]["user"],
            value["users"][0]["name"]
        );
        let ca = value["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .unwrap();
        let pem = base64::engine::general_purpose::STANDARD
            .decode(ca)
            .unwrap();
        assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));

        let without_ca = render(&KubeconfigFor {
            account: "a",
            public_url: "https://hub",
            ca_pem: None,
            token: "t",
        });
        assert!(
            !without_ca.contains("certificate-authority"),
            "{without_ca}"
        );
    }

    #[test]
    fn an_exec_kubeconfig_holds_the_command_not_a_token() {
        let args = vec!["token".to_string(), "credential".to_string()];
        let yaml = render_exec(
            &KubeconfigFor {
                account: "prod",
                public_url: "https://hub",
                ca_pem: None,
                token: "sat_never",
            },
            &ExecCommand {
                command: "/usr/bin/scale-agent-hub",
                args: &args,
            },
        );
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        let user = &value["users"][0]["user"];
        assert!(user.get("token").is_none(), "{yaml}");
        assert_eq!(
            user["exec"]["apiVersion"],
            "client.authentication.k8s.io/v1"
        );
        assert_eq!(user["exec"]["command"], "/usr/bin/scale-agent-hub");
        assert_eq!(user["exec"]["args"][1], "credential");
        assert_eq!(user["exec"]["interactiveMode"], "Never");
    }
}
