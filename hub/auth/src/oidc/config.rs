//! `--authentication-config`: the Kubernetes API server's structured authentication
//! configuration (`apiserver.config.k8s.io` `AuthenticationConfiguration`), the subset the
//! hub supports, so a platform team hands the hub the file it wrote for its clusters.
//!
//! Supported per `jwt` entry: `issuer.url`, `issuer.discoveryURL`, `issuer.audiences`,
//! `issuer.audienceMatchPolicy` (`MatchAny`), `issuer.certificateAuthority` (PEM, inline),
//! `claimMappings.username` and `claimMappings.groups` (`claim` and `prefix`). Anything else
//! the upstream type has (CEL `expression`s, `claimValidationRules`, `userValidationRules`,
//! `uid`, `extra`, `anonymous`, ...) is refused by name: accepting and ignoring a rule would
//! admit people the clusters refuse.

use serde::Deserialize;

/// The API versions of `AuthenticationConfiguration` the file may name.
const API_VERSIONS: &[&str] = &[
    "apiserver.config.k8s.io/v1",
    "apiserver.config.k8s.io/v1beta1",
    "apiserver.config.k8s.io/v1alpha1",
];

/// One trusted issuer, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuerConfig {
    /// `iss` of its tokens, and (without `discovery_url`) where discovery is fetched from.
    pub url: String,
    /// Where discovery is fetched instead of `<url>/.well-known/openid-configuration`.
    pub discovery_url: Option<String>,
    /// A token's `aud` must hold at least one of these.
    pub audiences: Vec<String>,
    /// PEM of the CAs that sign the issuer's serving certificate; `None`: public roots.
    pub certificate_authority: Option<String>,
    pub username: ClaimMapping,
    /// `None`: the token's groups are not read.
    pub groups: Option<ClaimMapping>,
}

/// A claim and the prefix put before its value(s).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimMapping {
    pub claim: String,
    pub prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct File {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    jwt: Vec<Jwt>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Jwt {
    issuer: Issuer,
    claim_mappings: ClaimMappings,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Issuer {
    url: String,
    #[serde(rename = "discoveryURL")]
    discovery_url: Option<String>,
    #[serde(default)]
    audiences: Vec<String>,
    audience_match_policy: Option<String>,
    certificate_authority: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimMappings {
    username: ClaimMapping,
    groups: Option<ClaimMapping>,
}

/// The keys the hub understands at each level; any other is named in the refusal.
const TOP: &[&str] = &["apiVersion", "kind", "jwt"];
const JWT: &[&str] = &["issuer", "claimMappings"];
const ISSUER: &[&str] = &[
    "url",
    "discoveryURL",
    "audiences",
    "audienceMatchPolicy",
    "certificateAuthority",
];
const MAPPINGS: &[&str] = &["username", "groups"];
const MAPPING: &[&str] = &["claim", "prefix"];

/// The unsupported keys of `value` (an object) at `path`.
fn unsupported(value: &serde_json::Value, path: &str, known: &[&str], out: &mut Vec<String>) {
    if let Some(map) = value.as_object() {
        for key in map.keys().filter(|k| !known.contains(&k.as_str())) {
            out.push(format!("{path}{key}"));
        }
    }
}

/// Parses the file's text (YAML, or JSON) into the issuers it trusts. Errors say what to
/// change: the line of a syntax error, the unsupported fields by path, a missing prefix.
pub fn parse(text: &str) -> Result<Vec<IssuerConfig>, String> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| match e.location() {
            Some(at) => format!("line {}: {e}", at.line()),
            None => e.to_string(),
        })?;
    let mut refused = Vec::new();
    unsupported(&value, "", TOP, &mut refused);
    for (i, jwt) in value["jwt"].as_array().into_iter().flatten().enumerate() {
        let at = format!("jwt[{i}].");
        unsupported(jwt, &at, JWT, &mut refused);
        unsupported(
            &jwt["issuer"],
            &format!("{at}issuer."),
            ISSUER,
            &mut refused,
        );
        let mappings = &jwt["claimMappings"];
        unsupported(
            mappings,
            &format!("{at}claimMappings."),
            MAPPINGS,
            &mut refused,
        );
        for name in MAPPINGS {
            let path = format!("{at}claimMappings.{name}.");
            unsupported(&mappings[name], &path, MAPPING, &mut refused);
        }
    }
    if !refused.is_empty() {
        return Err(format!(
            "the hub does not support {} (it supports issuer url, discoveryURL, audiences, \
             audienceMatchPolicy, certificateAuthority, and claimMappings username and groups \
             with claim and prefix); remove them from the hub's copy",
            refused.join(", ")
        ));
    }
    let file: File = serde_json::from_value(value).map_err(|e| e.to_string())?;
    if let Some(version) = file.api_version.as_deref()
        && !API_VERSIONS.contains(&version)
    {
        return Err(format!(
            "apiVersion {version:?} is not one of {}",
            API_VERSIONS.join(", ")
        ));
    }
    if let Some(kind) = file.kind.as_deref()
        && kind != "AuthenticationConfiguration"
    {
        return Err(format!(
            "kind {kind:?}: the file must be an AuthenticationConfiguration"
        ));
    }
    if file.jwt.is_empty() {
        return Err("jwt: the file names no issuer".into());
    }
    let mut issuers = Vec::new();
    for (i, jwt) in file.jwt.into_iter().enumerate() {
        issuers.push(issuer(i, jwt, &issuers)?);
    }
    Ok(issuers)
}

fn issuer(i: usize, jwt: Jwt, before: &[IssuerConfig]) -> Result<IssuerConfig, String> {
    let at = format!("jwt[{i}]");
    let url = jwt.issuer.url;
    if !url.starts_with("https://") {
        return Err(format!(
            "{at}.issuer.url {url:?} must be an https:// URL (keys are fetched from it)"
        ));
    }
    if before.iter().any(|b| b.url == url) {
        return Err(format!("{at}.issuer.url {url:?} is configured twice"));
    }
    if let Some(discovery) = &jwt.issuer.discovery_url
        && !discovery.starts_with("https://")
    {
        return Err(format!(
            "{at}.issuer.discoveryURL {discovery:?} must be an https:// URL"
        ));
    }
    if jwt.issuer.audiences.is_empty() {
        return Err(format!(
            "{at}.issuer.audiences: name at least one audience (the client id the tokens are \
             issued for)"
        ));
    }
    match jwt.issuer.audience_match_policy.as_deref() {
        None if jwt.issuer.audiences.len() > 1 => {
            return Err(format!(
                "{at}.issuer.audienceMatchPolicy must be MatchAny when several audiences are \
                 listed"
            ));
        }
        None | Some("MatchAny") => {}
        Some(other) => {
            return Err(format!(
                "{at}.issuer.audienceMatchPolicy {other:?}: only MatchAny is supported"
            ));
        }
    }
    let username = jwt.claim_mappings.username;
    check_mapping(&at, "username", &username)?;
    if let Some(groups) = &jwt.claim_mappings.groups {
        check_mapping(&at, "groups", groups)?;
    }
    Ok(IssuerConfig {
        url,
        discovery_url: jwt.issuer.discovery_url,
        audiences: jwt.issuer.audiences,
        certificate_authority: jwt
            .issuer
            .certificate_authority
            .filter(|pem| !pem.trim().is_empty()),
        username,
        groups: jwt.claim_mappings.groups,
    })
}

/// The API server's rule: a claim needs an explicit prefix (`""` for none), so that nobody
/// maps an issuer's users onto cluster users by accident.
fn check_mapping(at: &str, name: &str, mapping: &ClaimMapping) -> Result<(), String> {
    if mapping.claim.is_empty() {
        return Err(format!("{at}.claimMappings.{name}.claim is empty"));
    }
    if mapping.prefix.is_none() {
        return Err(format!(
            "{at}.claimMappings.{name}.prefix is required when claim is set (set it to \"\" \
             for no prefix)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: apiserver.config.k8s.io/v1beta1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: https://issuer.example
    audiences: [scale-agent]
    certificateAuthority: |
      -----BEGIN CERTIFICATE-----
      -----END CERTIFICATE-----
  claimMappings:
    username: {claim: email, prefix: "oidc:"}
    groups: {claim: groups, prefix: "oidc:"}
"#;

    #[test]
    fn the_api_servers_file_parses() {
        let issuers = parse(GOOD).unwrap();
        assert_eq!(issuers.len(), 1);
        let issuer = &issuers[0];
        assert_eq!(issuer.url, "https://issuer.example");
        assert_eq!(issuer.audiences, ["scale-agent"]);
        assert_eq!(issuer.username.prefix.as_deref(), Some("oidc:"));
        assert_eq!(issuer.groups.as_ref().unwrap().claim, "groups");
        assert!(issuer.certificate_authority.is_some());
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let text = GOOD.replace(
            "  claimMappings:",
            "  claimValidationRules: [{claim: hd, requiredValue: example.com}]\n  claimMappings:",
        );
        let error = parse(&text).unwrap_err();
        assert!(error.contains("jwt[0].claimValidationRules"), "{error}");
        let text = GOOD.replace(
            "{claim: email, prefix: \"oidc:\"}",
            "{expression: claims.sub}",
        );
        let error = parse(&text).unwrap_err();
        assert!(
            error.contains("jwt[0].claimMappings.username.expression"),
            "{error}"
        );
        let text = GOOD.replace("{claim: email, prefix: \"oidc:\"}", "{claim: email}");
        assert!(parse(&text).unwrap_err().contains("prefix is required"));
        let text = GOOD.replace("audiences: [scale-agent]", "audiences: [a, b]");
        assert!(parse(&text).unwrap_err().contains("MatchAny"));
        let text = GOOD.replace("https://issuer.example", "http://issuer.example");
        assert!(parse(&text).unwrap_err().contains("https://"));
    }
}
