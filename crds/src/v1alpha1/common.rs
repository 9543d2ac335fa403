//! Pieces shared by both resources: name rules and serde helpers.

/// A DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or
/// digit. Kubernetes namespaces and Spinnaker account names managed by Scale Agent follow it.
/// Written for both RE2 (CEL `matches`, OpenAPI `pattern`) and a hand check.
pub const DNS1123_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Longest Spinnaker account name (and namespace name) accepted: a DNS-1123 label.
pub const ACCOUNT_NAME_MAX_LENGTH: usize = 63;

/// Whether `name` is a DNS-1123 label of at most 63 characters, the rule the CRDs enforce for
/// account names; lets the operator check `metadata.name` fallbacks the same way.
pub fn is_dns1123_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= ACCOUNT_NAME_MAX_LENGTH
                && alnum(first)
                && alnum(last)
                && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

// serde `skip_serializing_if` helper: keeps `false` flags out of serialized specs.
pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_labels() {
        for ok in ["a", "prod", "prod-eu-west-1", "0", "a1-b2", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok} should be accepted");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Prod",
            "prod_1",
            "prod.eu",
            "prod eu",
            &"a".repeat(64),
        ] {
            assert!(!is_dns1123_label(bad), "{bad} should be rejected");
        }
    }
}
