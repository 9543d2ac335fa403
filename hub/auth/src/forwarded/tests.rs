use super::*;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// What nginx leaves unescaped in `$ssl_client_escaped_cert` (ngx_escape_uri with
/// NGX_ESCAPE_URI_COMPONENT): letters, digits and `-._~`.
const NGINX_ESCAPE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn client_pem(issuer: &CertifiedIssuer<'static, KeyPair>, san: &str) -> String {
    let mut params = CertificateParams::new(vec![san.to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    params.signed_by(&key, issuer).unwrap().pem()
}

fn escaped(pem: &str) -> String {
    utf8_percent_encode(pem, NGINX_ESCAPE).to_string()
}

fn proxy_addr() -> Option<SocketAddr> {
    Some("127.0.0.2:40000".parse().unwrap())
}

fn trust(format: ForwardedFormat, ca_pem: &str) -> ProxyTrust {
    ProxyTrust::new(
        format,
        None,
        ca_pem.as_bytes(),
        vec![Cidr::parse("127.0.0.2/32").unwrap()],
        vec!["grpc-proxy.example".into()],
    )
    .unwrap()
}

fn from_proxy() -> Peer<'static> {
    Peer {
        addr: proxy_addr(),
        certificate: None,
    }
}

#[test]
fn cidrs() {
    let net = Cidr::parse("10.1.0.0/16").unwrap();
    assert!(net.contains("10.1.200.3".parse().unwrap()));
    assert!(!net.contains("10.2.0.1".parse().unwrap()));
    assert!(net.contains("::ffff:10.1.0.9".parse().unwrap()));
    assert!(!net.contains("fd00::1".parse().unwrap()));
    let one = Cidr::parse("127.0.0.2").unwrap();
    assert_eq!(one.to_string(), "127.0.0.2/32");
    assert!(one.contains("127.0.0.2".parse().unwrap()));
    assert!(!one.contains("127.0.0.1".parse().unwrap()));
    assert!(
        Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap())
    );
    let v6 = Cidr::parse("fd00::/8").unwrap();
    assert!(v6.contains("fd12::1".parse().unwrap()));
    assert!(!v6.contains("fe80::1".parse().unwrap()));
    assert!(Cidr::parse("10.0.0.0/33").unwrap_err().contains("0 to 32"));
    assert!(
        Cidr::parse("proxy.local")
            .unwrap_err()
            .contains("10.0.0.0/8")
    );
}

/// Envoy's documented XFCC examples: several elements, quoted values with `,` `;` and
/// `=` inside, and the Cert field with a url-encoded PEM.
#[test]
fn xfcc_takes_the_last_element() {
    let docs = "By=http://frontend.lyft.com;\
            Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;\
            Subject=\"/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client\";\
            URI=http://testclient.lyft.com,\
            By=http://backend.lyft.com;\
            Hash=9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e;\
            URI=http://frontend.lyft.com";
    assert_eq!(last_xfcc_element(docs).unwrap(), XfccElement::default());

    let with_cert = format!(
        "By=spiffe://attacker;Cert=\"forged\",\
             By=spiffe://cluster.local/ns/spinnaker/sa/hub;\
             Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;\
             Cert=\"{}\";Subject=\"CN=agent-a,O=a\\\"b;c\";DNS=agent-a",
        escaped("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    );
    let element = last_xfcc_element(&with_cert).unwrap();
    assert!(
        element
            .cert
            .as_deref()
            .unwrap()
            .starts_with("-----BEGIN%20CERTIFICATE-----%0A")
    );
    assert_eq!(split_outside_quotes("a=\"x,y\",b", ','), ["a=\"x,y\"", "b"]);
    assert_eq!(unquote("\"a\\\"b\"").unwrap(), "a\"b");
    assert!(unquote("\"open").is_err());
    assert!(last_xfcc_element("Cert").is_err());
    assert!(last_xfcc_element(" , ").is_err());
}

/// F22: a proxy that appends its escaped PEM to the one the client sent (a second header
/// line, or a list in one line) would hand the hub the client's choice first; in
/// escaped-pem mode more than one value is refused, naming the header, whichever of
/// the two certificates comes first.
#[test]
fn escaped_pem_refuses_more_than_one_value() {
    let agents = ca("agents");
    let chosen = escaped(&client_pem(&agents, "agent-chosen.example"));
    let real = escaped(&client_pem(&agents, "agent-a.example"));
    let nginx = trust(ForwardedFormat::EscapedPem, &agents.pem());
    let appended_in_one_line = format!("{chosen}, {real}");
    let sent: [&[&str]; 3] = [
        &[&chosen, &real],
        &[&real, &chosen],
        &[&appended_in_one_line],
    ];
    for values in sent {
        let refusal = nginx.identity(from_proxy(), values).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::SeveralValues {
                header: "x-ssl-client-cert".into(),
                count: 2
            }
        );
        let message = refusal.to_string();
        assert!(
            message.contains("x-ssl-client-cert") && message.contains("2 values"),
            "{message}"
        );
    }
    // One value still names its agent; XFCC keeps taking lists (its last element).
    assert_eq!(
        nginx.identity(from_proxy(), &[&real]).unwrap(),
        "agent-a.example"
    );
}

#[test]
fn forwarded_certificates_are_verified_and_named() {
    let agents = ca("agents");
    let stranger = ca("stranger");
    let good = client_pem(&agents, "agent-a.example");
    let foreign = client_pem(&stranger, "agent-a.example");

    let nginx = trust(ForwardedFormat::EscapedPem, &agents.pem());
    assert_eq!(nginx.header(), "x-ssl-client-cert");
    assert_eq!(
        nginx.identity(from_proxy(), &[&escaped(&good)]).unwrap(),
        "agent-a.example"
    );
    let refusal = nginx
        .identity(from_proxy(), &[&escaped(&foreign)])
        .unwrap_err();
    assert!(matches!(refusal, Refusal::Invalid { .. }), "{refusal:?}");
    assert!(refusal.to_string().contains("--client-ca"), "{refusal}");
    let refusal = nginx
        .identity(from_proxy(), &["not%20a%20cert"])
        .unwrap_err();
    assert!(matches!(refusal, Refusal::Malformed { .. }), "{refusal:?}");
    assert!(
        refusal.to_string().contains("--forwarded-client-cert"),
        "{refusal}"
    );

    let envoy = trust(ForwardedFormat::Xfcc, &agents.pem());
    assert_eq!(envoy.header(), "x-forwarded-client-cert");
    let xfcc = |cert: &str| {
        format!(
            "By=spiffe://cluster.local/ns/spinnaker/sa/hub;\
                 Hash=0a1b;Cert=\"{}\";Subject=\"CN=agent-a\";DNS=agent-a.example",
            escaped(cert)
        )
    };
    assert_eq!(
        envoy.identity(from_proxy(), &[&xfcc(&good)]).unwrap(),
        "agent-a.example"
    );
    // A client of the proxy put a forged element first; the proxy appended the real one.
    let appended = format!("{},{}", xfcc(&foreign), xfcc(&good));
    assert_eq!(
        envoy.identity(from_proxy(), &[&appended]).unwrap(),
        "agent-a.example"
    );
    let appended = format!("{},{}", xfcc(&good), xfcc(&foreign));
    assert!(matches!(
        envoy.identity(from_proxy(), &[&appended]),
        Err(Refusal::Invalid { .. })
    ));
    // Two header lines are one list: the last line's last element counts.
    assert_eq!(
        envoy
            .identity(from_proxy(), &[&xfcc(&foreign), &xfcc(&good)])
            .unwrap(),
        "agent-a.example"
    );
    let refusal = envoy
        .identity(from_proxy(), &["By=x;Hash=0a1b;Subject=\"CN=a\""])
        .unwrap_err();
    assert!(refusal.to_string().contains("cert: true"), "{refusal}");
}

#[test]
fn the_header_counts_only_from_a_trusted_proxy() {
    let agents = ca("agents");
    let good = escaped(&client_pem(&agents, "agent-a.example"));
    let nginx = trust(ForwardedFormat::EscapedPem, &agents.pem());
    let direct = Peer {
        addr: Some("127.0.0.1:50000".parse().unwrap()),
        certificate: None,
    };
    let refusal = nginx.identity(direct, &[&good]).unwrap_err();
    assert_eq!(
        refusal,
        Refusal::UntrustedHeader {
            header: "x-ssl-client-cert".into(),
            peer: "127.0.0.1:50000".into()
        }
    );
    assert!(
        refusal.to_string().contains("--trusted-proxy-cidr"),
        "{refusal}"
    );
    let refusal = nginx.identity(direct, &[]).unwrap_err();
    assert!(matches!(refusal, Refusal::NotThroughProxy { .. }));
    assert!(
        refusal
            .to_string()
            .contains("connect the agent to the proxy"),
        "{refusal}"
    );
    let refusal = nginx.identity(from_proxy(), &[]).unwrap_err();
    assert!(matches!(refusal, Refusal::MissingHeader { .. }));
    assert!(
        refusal.to_string().contains("$ssl_client_escaped_cert"),
        "{refusal}"
    );

    // Trusted by the proxy's own client certificate, from any address.
    let proxies = ca("proxies");
    let proxy_cert = client_pem(&proxies, "grpc-proxy.example");
    let proxy_der = CertificateDer::from_pem_slice(proxy_cert.as_bytes()).unwrap();
    let other_der =
        CertificateDer::from_pem_slice(client_pem(&proxies, "someone-else.example").as_bytes())
            .unwrap();
    let by_cert = Peer {
        addr: Some("192.0.2.7:443".parse().unwrap()),
        certificate: Some(proxy_der.as_ref()),
    };
    assert_eq!(
        nginx.identity(by_cert, &[&good]).unwrap(),
        "agent-a.example"
    );
    let wrong_cert = Peer {
        certificate: Some(other_der.as_ref()),
        ..by_cert
    };
    assert!(matches!(
        nginx.identity(wrong_cert, &[&good]),
        Err(Refusal::UntrustedHeader { .. })
    ));
}

#[test]
fn construction_refuses_nonsense() {
    let agents = ca("agents");
    let err = ProxyTrust::new(ForwardedFormat::Xfcc, None, b"", vec![], vec![]).unwrap_err();
    assert!(err.contains("--client-ca"), "{err}");
    let err = ProxyTrust::new(
        ForwardedFormat::Xfcc,
        Some("bad header"),
        agents.pem().as_bytes(),
        vec![],
        vec![],
    )
    .unwrap_err();
    assert!(err.contains("--forwarded-client-cert-header"), "{err}");
    let custom = ProxyTrust::new(
        ForwardedFormat::EscapedPem,
        Some("X-Client-Cert"),
        agents.pem().as_bytes(),
        vec![],
        vec![],
    )
    .unwrap();
    assert_eq!(custom.header(), "x-client-cert");
    assert!(!custom.has_rules());
}
