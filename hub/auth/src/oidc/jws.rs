//! Compact JWS (the form of an ID token): splitting, the header, and the signature checked
//! against the issuer's JSON Web Keys with `ring` (RS256/384/512, ES256/384). The claims are
//! judged in [`super::claims`].

use base64::Engine as _;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;

/// The parts of a compact JWS.
#[derive(Debug)]
pub struct Jws<'a> {
    pub header: Header,
    /// `<header>.<payload>`, what the signature covers.
    pub signed: &'a str,
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// The JOSE header fields the hub reads.
#[derive(Debug, Deserialize)]
pub struct Header {
    pub alg: String,
    pub kid: Option<String>,
}

/// One key of a JWKS.
#[derive(Clone, Debug, Deserialize)]
pub struct Jwk {
    pub kty: String,
    pub kid: Option<String>,
    #[serde(rename = "use")]
    pub use_: Option<String>,
    pub alg: Option<String>,
    // RSA
    pub n: Option<String>,
    pub e: Option<String>,
    // EC
    pub crv: Option<String>,
    pub x: Option<String>,
    pub y: Option<String>,
}

/// A JWKS document.
#[derive(Clone, Debug, Deserialize)]
pub struct JwkSet {
    pub keys: Vec<Jwk>,
}

fn b64(part: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|e| format!("not base64url: {e}"))
}

/// Whether `token` has the shape of a compact JWS (three base64url parts, the first a JSON
/// object): the hub's own tokens (`sat_...`) never do.
pub fn looks_like_jwt(token: &str) -> bool {
    let mut parts = token.split('.');
    matches!(
        (parts.next(), parts.next(), parts.next(), parts.next()),
        (Some(h), Some(_), Some(_), None) if h.starts_with("eyJ")
    )
}

/// Splits and decodes a compact JWS.
pub fn parse(token: &str) -> Result<Jws<'_>, String> {
    let mut parts = token.split('.');
    let (Some(header_part), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a JWT: it must have three dot-separated parts".into());
    };
    let header_bytes = b64(header_part).map_err(|e| format!("the JWT header is {e}"))?;
    let header: Header = serde_json::from_slice(&header_bytes)
        .map_err(|e| format!("the JWT header is not JSON with alg: {e}"))?;
    Ok(Jws {
        header,
        signed: &token[..header_part.len() + 1 + payload.len()],
        payload: b64(payload).map_err(|e| format!("the JWT payload is {e}"))?,
        signature: b64(signature).map_err(|e| format!("the JWT signature is {e}"))?,
    })
}

/// The algorithms the hub verifies (what identity providers sign ID tokens with).
pub const ALGORITHMS: &[&str] = &["RS256", "RS384", "RS512", "ES256", "ES384"];

/// Whether `key` can check a signature of `alg` (its type, curve and declared use and
/// algorithm fit).
pub fn key_fits(key: &Jwk, alg: &str) -> bool {
    if key.use_.as_deref().is_some_and(|u| u != "sig") {
        return false;
    }
    if key.alg.as_deref().is_some_and(|a| a != alg) {
        return false;
    }
    match alg {
        "RS256" | "RS384" | "RS512" => key.kty == "RSA",
        "ES256" => key.kty == "EC" && key.crv.as_deref() == Some("P-256"),
        "ES384" => key.kty == "EC" && key.crv.as_deref() == Some("P-384"),
        _ => false,
    }
}

/// Checks the signature of `jws` with `key`.
pub fn verify(jws: &Jws<'_>, key: &Jwk) -> Result<(), String> {
    let message = jws.signed.as_bytes();
    let field = |value: &Option<String>, name: &str| -> Result<Vec<u8>, String> {
        b64(value
            .as_deref()
            .ok_or_else(|| format!("the issuer's key has no {name}"))?)
        .map_err(|e| format!("the issuer's key's {name} is {e}"))
    };
    let checked = match jws.header.alg.as_str() {
        alg @ ("RS256" | "RS384" | "RS512") => {
            let params = match alg {
                "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                _ => &signature::RSA_PKCS1_2048_8192_SHA512,
            };
            let (n, e) = (field(&key.n, "n")?, field(&key.e, "e")?);
            RsaPublicKeyComponents { n: &n, e: &e }.verify(params, message, &jws.signature)
        }
        alg @ ("ES256" | "ES384") => {
            let params = if alg == "ES256" {
                &signature::ECDSA_P256_SHA256_FIXED
            } else {
                &signature::ECDSA_P384_SHA384_FIXED
            };
            let mut point = vec![0x04];
            point.extend(field(&key.x, "x")?);
            point.extend(field(&key.y, "y")?);
            UnparsedPublicKey::new(params, &point).verify(message, &jws.signature)
        }
        other => {
            return Err(format!(
                "the token is signed with {other:?}; the hub verifies {}",
                ALGORITHMS.join(", ")
            ));
        }
    };
    checked.map_err(|_| "its signature does not verify with the issuer's key".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};

    fn enc(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    #[test]
    fn es256_signatures_verify_and_tampering_is_caught() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let public = pair.public_key().as_ref();
        let key = Jwk {
            kty: "EC".into(),
            kid: Some("k1".into()),
            use_: Some("sig".into()),
            alg: None,
            n: None,
            e: None,
            crv: Some("P-256".into()),
            x: Some(enc(&public[1..33])),
            y: Some(enc(&public[33..])),
        };
        let signed = format!(
            "{}.{}",
            enc(br#"{"alg":"ES256","kid":"k1"}"#),
            enc(br#"{"sub":"alice"}"#)
        );
        let signature = pair.sign(&rng, signed.as_bytes()).unwrap();
        let token = format!("{signed}.{}", enc(signature.as_ref()));
        assert!(looks_like_jwt(&token) && !looks_like_jwt("sat_abc"));
        let jws = parse(&token).unwrap();
        assert_eq!(jws.header.kid.as_deref(), Some("k1"));
        assert!(key_fits(&key, "ES256") && !key_fits(&key, "RS256"));
        verify(&jws, &key).unwrap();
        let forged = format!(
            "{}.{}",
            &signed[..signed.len() - 2],
            enc(signature.as_ref())
        );
        let error = parse(&forged)
            .and_then(|jws| verify(&jws, &key))
            .unwrap_err();
        assert!(
            error.contains("signature") || error.contains("base64"),
            "{error}"
        );
    }

    /// RS256, what most identity providers sign with: a 2048-bit key made by openssl now
    /// (ring signs RSA but does not make keys), signed with ring, checked from n and e.
    #[test]
    fn rs256_signatures_verify() {
        let dir = std::env::temp_dir().join(format!("hub-jws-rsa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let der = dir.join("key.der");
        let made = std::process::Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ])
            .args(["-outform", "DER", "-out"])
            .arg(&der)
            .output()
            .expect("openssl makes the test's RSA key");
        assert!(made.status.success(), "{made:?}");
        let der = std::fs::read(&der).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        // OpenSSL 3 writes a DER RSA key as PKCS#1; older ones as PKCS#8.
        let pair = signature::RsaKeyPair::from_der(&der)
            .or_else(|_| signature::RsaKeyPair::from_pkcs8(&der))
            .unwrap();
        let public = pair.public();
        let components = RsaPublicKeyComponents::<Vec<u8>>::from(public);
        let key = Jwk {
            kty: "RSA".into(),
            kid: None,
            use_: None,
            alg: Some("RS256".into()),
            n: Some(enc(&components.n)),
            e: Some(enc(&components.e)),
            crv: None,
            x: None,
            y: None,
        };
        let signed = format!(
            "{}.{}",
            enc(br#"{"alg":"RS256"}"#),
            enc(br#"{"sub":"alice"}"#)
        );
        let mut sig = vec![0; public.modulus_len()];
        pair.sign(
            &signature::RSA_PKCS1_SHA256,
            &ring::rand::SystemRandom::new(),
            signed.as_bytes(),
            &mut sig,
        )
        .unwrap();
        let token = format!("{signed}.{}", enc(&sig));
        let jws = parse(&token).unwrap();
        assert!(key_fits(&key, "RS256") && !key_fits(&key, "RS384"));
        verify(&jws, &key).unwrap();
        sig[0] ^= 1;
        let tampered = format!("{signed}.{}", enc(&sig));
        assert!(verify(&parse(&tampered).unwrap(), &key).is_err());
    }
}
