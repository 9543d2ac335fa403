//! Endpoints' and EndpointSlices' cells, ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO): at most three addresses, then
//! `+ N more...`.

use serde_json::{Value, json};

use super::format::string;

/// How many entries a cell lists before `+ N more...`.
const MAX: usize = 3;

/// `net.JoinHostPort`: an IPv6 address in brackets.
fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn array(value: Option<&Value>) -> &[Value] {
    value
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// `formatEndpoints` with no port filter: `ip:port` for each port of each subset (bare IPs
/// for a subset without ports), `<none>` without subsets.
pub fn endpoints(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let subsets = array(o.get("subsets"));
    let cell = if subsets.is_empty() {
        "<none>".to_string()
    } else {
        let (mut list, mut more, mut count) = (Vec::new(), false, 0);
        for subset in subsets {
            let addresses = array(subset.get("addresses"));
            let ports = array(subset.get("ports"));
            // Headless services may have no ports: one entry per address.
            let ports: Vec<Option<i64>> = if ports.is_empty() {
                vec![None]
            } else {
                ports
                    .iter()
                    .map(|p| Some(p.get("port").and_then(Value::as_i64).unwrap_or(0)))
                    .collect()
            };
            for port in ports {
                count += addresses.len();
                for address in addresses {
                    if list.len() == MAX {
                        more = true;
                        break;
                    }
                    let ip = string(address.get("ip"));
                    list.push(match port {
                        Some(port) => join_host_port(ip, port),
                        None => ip.to_string(),
                    });
                }
            }
        }
        let joined = list.join(",");
        if more {
            format!("{joined} + {} more...", count - MAX)
        } else {
            joined
        }
    };
    vec![name, json!(cell), age]
}

/// `listWithMoreString`: `<unset>` for an empty list.
fn list_with_more(list: &[String], count: usize) -> String {
    let joined = list.join(",");
    if count > MAX {
        format!("{joined} + {} more...", count - MAX)
    } else if joined.is_empty() {
        "<unset>".into()
    } else {
        joined
    }
}

/// `printEndpointSlice`: the address type, the ports (number, else name, else `*`), the
/// addresses of all endpoints.
pub fn endpoint_slice(o: &Value, name: Value, age: Value) -> Vec<Value> {
    let ports = array(o.get("ports"));
    let port_list: Vec<String> = ports
        .iter()
        .take(MAX)
        .map(
            |p| match (p.get("port").and_then(Value::as_i64), p.get("name")) {
                (Some(port), _) => port.to_string(),
                (None, Some(Value::String(name))) => name.clone(),
                _ => "*".into(),
            },
        )
        .collect();
    let addresses: Vec<&Value> = array(o.get("endpoints"))
        .iter()
        .flat_map(|e| array(e.get("addresses")))
        .collect();
    let address_list: Vec<String> = addresses
        .iter()
        .take(MAX)
        .map(|a| string(Some(*a)).to_string())
        .collect();
    vec![
        name,
        json!(string(o.get("addressType"))),
        json!(list_with_more(&port_list, ports.len())),
        json!(list_with_more(&address_list, addresses.len())),
        age,
    ]
}
