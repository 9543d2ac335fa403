use super::*;

#[test]
fn admin_commands_are_recognised_by_their_first_word() {
    assert!(is_admin_command(Some("kubeconfig")));
    assert!(is_admin_command(Some("token")));
    assert!(!is_admin_command(Some("--grpc-addr")));
    assert!(is_admin_command(Some("agent-token")));
    assert!(is_admin_command(Some("account")));
    let parsed = AdminCommand::try_parse_from([
        "scale-agent-hub",
        "agent-token",
        "create",
        "--identity",
        "prod-agent",
        "--accounts",
        "prod-*",
        "--ttl",
        "1h",
        "--once",
    ])
    .unwrap();
    assert!(matches!(
        parsed.command,
        Admin::AgentToken { action: AgentTokenAction::Create { ref identity, once: true, .. } } if identity == "prod-agent"
    ));
    let parsed = AdminCommand::try_parse_from([
        "scale-agent-hub",
        "account",
        "rebind",
        "prod",
        "--identity",
        "prod-agent-2",
    ])
    .unwrap();
    assert!(matches!(
        parsed.command,
        Admin::Account { action: AccountAction::Rebind { ref name, ref identity, .. } } if name == "prod" && identity == "prod-agent-2"
    ));
    assert!(!is_admin_command(None));
    let parsed = AdminCommand::try_parse_from([
        "scale-agent-hub",
        "kubeconfig",
        "--account",
        "prod",
        "--hub-url",
        "https://hub:8443",
    ])
    .unwrap();
    assert!(matches!(parsed.command, Admin::Kubeconfig { ref account, .. } if account == "prod"));
    assert!(AdminCommand::try_parse_from(["scale-agent-hub", "kubeconfig"]).is_err());
    let parsed = AdminCommand::try_parse_from([
        "scale-agent-hub",
        "token",
        "create",
        "--name",
        "ci",
        "--role",
        "operator",
    ])
    .unwrap();
    assert!(
        matches!(parsed.command, Admin::Token { action: TokenAction::Create { ref name, role: Role::Operator, .. } } if name == "ci")
    );
    assert!(
        AdminCommand::try_parse_from([
            "scale-agent-hub",
            "token",
            "create",
            "--name",
            "ci",
            "--role",
            "root",
        ])
        .is_err()
    );
    let parsed =
        AdminCommand::try_parse_from(["scale-agent-hub", "token", "revoke", "abc"]).unwrap();
    assert!(
        matches!(parsed.command, Admin::Token { action: TokenAction::Revoke { ref id, .. } } if id == "abc")
    );
    let parsed = AdminCommand::try_parse_from([
        "scale-agent-hub",
        "token",
        "list",
        "--hub-url",
        "https://hub:8443",
    ])
    .unwrap();
    assert!(
        matches!(parsed.command, Admin::Token { action: TokenAction::List { ref hub } } if hub.hub_url == "https://hub:8443")
    );
}

#[test]
fn token_tables_align() {
    let table = token_table(&[
        TokenView {
            id: "0123".into(),
            kind: "proxy".into(),
            source: "hub".into(),
            role: None,
            account: "prod".into(),
            name: "clouddriver".into(),
            created: "2026-11-23T00:00:00Z".into(),
            derived: true,
            expires: String::new(),
            accounts: Vec::new(),
        },
        TokenView {
            id: String::new(),
            kind: "api".into(),
            source: "file".into(),
            role: Some(Role::Operator),
            account: String::new(),
            name: "ci".into(),
            created: String::new(),
            derived: false,
            expires: "2026-11-23T12:00:00Z".into(),
            accounts: vec!["prod-*".into()],
        },
    ]);
    assert_eq!(
        table,
        "ID    KIND   ROLE      ACCOUNT  NAME         SOURCE  CREATED               DERIVED  EXPIRES\n\
         0123  proxy  -         prod     clouddriver  hub     2026-11-23T00:00:00Z  true     -\n\
         -     api    operator  prod-*   ci           file    -                     false    2026-11-23T12:00:00Z"
    );
    assert_eq!(encode_query("a b/c"), "a%20b%2Fc");
}
