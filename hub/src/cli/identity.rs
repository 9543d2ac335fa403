//! `scale-agent-hub agent ...`: the admin levers on agent identities (issue 28, F4/F17),
//! through the hub's admin API ([`crate::identity_admin`]). `agent disable <identity>` ends
//! the identity's streams at once and refuses its streams, enrolments and renewals until
//! `agent enable <identity>`; `agent deny-certificate <identity> --serial <hex>` refuses one
//! certificate wherever it is presented.

use anyhow::Context as _;
use clap::Subcommand;

use super::admin::{HubAccess, encode_query, table};
use crate::identity_admin::IdentityView;

#[derive(Debug, Subcommand)]
pub enum AgentAction {
    /// Every identity that enrolled or that an admin disabled or denied a certificate of:
    /// its accounts pattern, enrolment, state and live streams.
    List {
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Disable an identity: its live streams end now (with every proxy session they carry),
    /// and it opens no stream, enrols and renews nothing until enabled again.
    Disable {
        /// The identity (as `agent list` or `account bindings` show it).
        identity: String,
        /// Why (shown to the agent in its refusals, and in `agent list`).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Enable a disabled identity again (its denied certificates stay denied).
    Enable {
        identity: String,
        #[command(flatten)]
        hub: HubAccess,
    },
    /// Deny one certificate of an identity by serial number (hex, as `openssl x509 -noout
    /// -serial` prints it or the hub logs it when issuing): it is refused for streams and
    /// renewals; the identity's streams reconnect with their own certificates.
    DenyCertificate {
        identity: String,
        #[arg(long)]
        serial: String,
        #[command(flatten)]
        hub: HubAccess,
    },
}

/// Runs an `agent` command, printing its result.
pub async fn run(action: AgentAction) -> anyhow::Result<()> {
    let (hub, method, path) = match action {
        AgentAction::List { hub } => {
            let body = hub.call("GET", "/api/v1/agent-identities").await?;
            let list: Vec<IdentityView> =
                serde_json::from_str(&body).context("the hub's identity list")?;
            let mut rows = vec![
                [
                    "IDENTITY", "ACCOUNTS", "ENROLLED", "DISABLED", "DENIED", "STREAMS",
                ]
                .map(str::to_string)
                .to_vec(),
            ];
            for i in list {
                rows.push(vec![
                    i.identity,
                    i.accounts.unwrap_or_else(|| "-".into()),
                    i.enrolled.unwrap_or_else(|| "-".into()),
                    i.disabled.unwrap_or_else(|| "-".into()),
                    if i.denied_serials.is_empty() {
                        "-".into()
                    } else {
                        i.denied_serials.join(",")
                    },
                    i.live_streams.to_string(),
                ]);
            }
            println!("{}", table(&rows));
            return Ok(());
        }
        AgentAction::Disable {
            identity,
            reason,
            hub,
        } => {
            let path = format!(
                "/api/v1/agent-identities/{}/disable?reason={}",
                encode_query(&identity),
                encode_query(&reason)
            );
            (hub, "disabled", path)
        }
        AgentAction::Enable { identity, hub } => {
            let path = format!(
                "/api/v1/agent-identities/{}/enable",
                encode_query(&identity)
            );
            (hub, "enabled", path)
        }
        AgentAction::DenyCertificate {
            identity,
            serial,
            hub,
        } => {
            let path = format!(
                "/api/v1/agent-identities/{}/deny-certificate?serial={}",
                encode_query(&identity),
                encode_query(&serial)
            );
            (hub, "denied a certificate of", path)
        }
    };
    let body = hub.call("POST", &path).await?;
    let view: IdentityView = serde_json::from_str(&body).context("the hub's answer")?;
    println!(
        "{method} identity {}; {} live stream(s) ended on the replica that answered",
        view.identity,
        view.disconnected.unwrap_or(0)
    );
    Ok(())
}
