//! An ID token's claims, judged the way the Kubernetes API server judges them: `iss` is the
//! issuer's URL, `aud` holds one of its audiences, `exp` has not passed and `nbf` has come,
//! and the username and groups claims, with their prefixes, name the person.

use serde_json::Value;

use super::config::{ClaimMapping, IssuerConfig};

/// Clock skew allowed on `nbf` and `iat` (the issuer's clock ahead of the hub's); `exp` is
/// checked without any, so a token stops working when its issuer says.
pub const NBF_LEEWAY_SECONDS: i64 = 30;

/// A person an issuer vouches for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    /// The username claim after the prefix.
    pub user: String,
    /// The groups claim, each after the prefix.
    pub groups: Vec<String>,
    /// The issuer's URL.
    pub issuer: String,
    /// `exp`, Unix seconds.
    pub expires: i64,
}

/// The `iss` of a payload, read before the signature is checked only to pick the issuer.
pub fn issuer_of(payload: &[u8]) -> Option<String> {
    let claims: Value = serde_json::from_slice(payload).ok()?;
    claims["iss"].as_str().map(str::to_string)
}

/// Judges the claims of a token whose signature `issuer`'s key verified.
pub fn judge(payload: &[u8], issuer: &IssuerConfig, now: i64) -> Result<Person, String> {
    let claims: Value =
        serde_json::from_slice(payload).map_err(|e| format!("its claims are not JSON: {e}"))?;
    let iss = claims["iss"].as_str().unwrap_or_default();
    if iss != issuer.url {
        return Err(format!("iss {iss:?} is not {:?}", issuer.url));
    }
    let audiences: Vec<&str> = match &claims["aud"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !audiences
        .iter()
        .any(|aud| issuer.audiences.iter().any(|want| want == aud))
    {
        return Err(format!(
            "aud {audiences:?} holds none of the audiences the hub accepts ({:?})",
            issuer.audiences
        ));
    }
    let Some(expires) = claims["exp"].as_i64() else {
        return Err("it has no exp claim".into());
    };
    if now >= expires {
        let when = jiff::Timestamp::from_second(expires)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| expires.to_string());
        return Err(format!(
            // troubleshooting: proxy or REST API: HTTP 401 for an OIDC token
            // Follows `the OIDC ID token is refused: `. Sign in again; the other reasons name the
            // audience, issuer or key the hub expected.
            "it expired at {when}: sign in again (your credential plugin, e.g. kubelogin, \
             fetches a new one)"
        ));
    }
    if let Some(nbf) = claims["nbf"].as_i64()
        && nbf > now + NBF_LEEWAY_SECONDS
    {
        return Err(format!("it is not valid before {nbf} (nbf; now {now})"));
    }
    let user = username(&claims, &issuer.username)?;
    let groups = match &issuer.groups {
        Some(mapping) => groups(&claims, mapping)?,
        None => Vec::new(),
    };
    Ok(Person {
        user,
        groups,
        issuer: issuer.url.clone(),
        expires,
    })
}

fn username(claims: &Value, mapping: &ClaimMapping) -> Result<String, String> {
    let value = claims[&mapping.claim]
        .as_str()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            format!(
                "its username claim {:?} is missing or not a string",
                mapping.claim
            )
        })?;
    // The API server's rule: an email is a username only when the issuer verified it.
    if mapping.claim == "email" && claims["email_verified"] == Value::Bool(false) {
        return Err("its email is not verified (email_verified is false)".into());
    }
    Ok(format!(
        "{}{value}",
        mapping.prefix.as_deref().unwrap_or("")
    ))
}

fn groups(claims: &Value, mapping: &ClaimMapping) -> Result<Vec<String>, String> {
    let prefix = mapping.prefix.as_deref().unwrap_or("");
    let names: Vec<&str> = match &claims[&mapping.claim] {
        Value::Null => Vec::new(),
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many
            .iter()
            .map(|g| {
                g.as_str().ok_or_else(|| {
                    format!("its groups claim {:?} holds a non-string", mapping.claim)
                })
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(format!(
                "its groups claim {:?} is neither a string nor a list of strings",
                mapping.claim
            ));
        }
    };
    Ok(names.into_iter().map(|g| format!("{prefix}{g}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> IssuerConfig {
        IssuerConfig {
            url: "https://issuer.example".into(),
            discovery_url: None,
            audiences: vec!["hub".into()],
            certificate_authority: None,
            username: ClaimMapping {
                claim: "email".into(),
                prefix: Some("oidc:".into()),
            },
            groups: Some(ClaimMapping {
                claim: "groups".into(),
                prefix: Some("oidc:".into()),
            }),
        }
    }

    fn claims(extra: Value) -> Vec<u8> {
        let mut base = serde_json::json!({
            "iss": "https://issuer.example", "aud": ["other", "hub"], "exp": 2000,
            "email": "alice@example.com", "groups": ["team-a"],
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::to_vec(&base).unwrap()
    }

    #[test]
    fn claims_are_judged_like_the_api_server_does() {
        let person = judge(&claims(serde_json::json!({})), &issuer(), 1000).unwrap();
        assert_eq!(person.user, "oidc:alice@example.com");
        assert_eq!(person.groups, ["oidc:team-a"]);
        let refused = |extra: Value, now: i64| judge(&claims(extra), &issuer(), now).unwrap_err();
        assert!(refused(serde_json::json!({"aud": "x"}), 1000).contains("aud"));
        assert!(refused(serde_json::json!({"iss": "https://evil"}), 1000).contains("iss"));
        assert!(refused(serde_json::json!({}), 2000).contains("expired at"));
        assert!(refused(serde_json::json!({"nbf": 1100}), 1000).contains("not valid before"));
        assert!(refused(serde_json::json!({"email_verified": false}), 1000).contains("verified"));
        assert!(refused(serde_json::json!({"groups": 3}), 1000).contains("groups"));
        assert!(refused(serde_json::json!({"email": ""}), 1000).contains("username claim"));
    }
}
