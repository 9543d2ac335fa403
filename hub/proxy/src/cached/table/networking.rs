//! The `networking.k8s.io` kinds of the Service IP allocator: ServiceCIDRs and IPAddresses,
//! ported from Kubernetes 1.37's `pkg/printers/internalversion/printers.go` (sans-IO). The
//! group's other kinds (Ingresses, IngressClasses, NetworkPolicies) are printed in
//! [`super::builtin`].

use serde_json::{Value, json};

use super::{
    Column,
    columns::{CREATED_DOC, NAME_DOC, col},
    format::string,
};

/// A kind of the Service IP allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceNetwork {
    ServiceCidr,
    IpAddress,
}

/// `serviceCIDRColumnDefinitions`.
#[rustfmt::skip]
const SERVICE_CIDR: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("CIDRs", "string", "", 0, "cidrs defines the IP blocks in CIDR notation (e.g. \"192.168.0.0/24\" or \"2001:db8::/64\") from which to assign service cluster IPs. Max of two CIDRs is allowed, one of each IP family. This field is immutable."),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `ipAddressColumnDefinitions`: two columns, though `printIPAddress` writes an age too
/// (rows of three cells, as the API server sends them; kubectl prints two).
#[rustfmt::skip]
const IP_ADDRESS: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("ParentRef", "string", "", 0, "parentRef references the resource that an IPAddress is attached to. An IPAddress must reference a parent object."),
];

impl ServiceNetwork {
    /// The kind of a resource of `networking.k8s.io`, among these two.
    pub fn of(resource: &str) -> Option<ServiceNetwork> {
        match resource {
            "servicecidrs" => Some(ServiceNetwork::ServiceCidr),
            "ipaddresses" => Some(ServiceNetwork::IpAddress),
            _ => None,
        }
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            ServiceNetwork::ServiceCidr => SERVICE_CIDR,
            ServiceNetwork::IpAddress => IP_ADDRESS,
        }
    }

    /// `printServiceCIDR`: the CIDRs comma-separated; `printIPAddress`: the parent as
    /// `resource.group[/namespace]/name` in lower case (`<none>` without), and the age.
    pub fn cells(self, o: &Value, name: Value, age: Value) -> Vec<Value> {
        match self {
            ServiceNetwork::ServiceCidr => {
                let cidrs: Vec<&str> = o
                    .pointer("/spec/cidrs")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                vec![name, json!(cidrs.join(",")), age]
            }
            ServiceNetwork::IpAddress => {
                let parent = match o.pointer("/spec/parentRef") {
                    Some(p) if !p.is_null() => {
                        let mut parent =
                            group_resource(string(p.get("group")), string(p.get("resource")))
                                .to_lowercase();
                        let namespace = string(p.get("namespace"));
                        if !namespace.is_empty() {
                            parent = format!("{parent}/{namespace}");
                        }
                        format!("{parent}/{}", string(p.get("name")))
                    }
                    _ => "<none>".into(),
                };
                vec![name, json!(parent), age]
            }
        }
    }
}

/// `schema.GroupResource.String()`: `resource.group`, or the resource alone for the core
/// group.
pub fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}
