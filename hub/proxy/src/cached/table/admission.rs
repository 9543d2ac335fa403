//! The `admissionregistration.k8s.io` policies' Tables: ValidatingAdmissionPolicies,
//! MutatingAdmissionPolicies and their bindings, ported from Kubernetes 1.37's
//! `pkg/printers/internalversion/printers.go` (sans-IO). The webhook configurations of the
//! same group are printed in [`super::builtin`].

use serde_json::{Value, json};

use super::{
    Column,
    columns::{CREATED_DOC, NAME_DOC, col},
    format::string,
};

/// An admission policy kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionPolicy {
    Validating,
    ValidatingBinding,
    Mutating,
    MutatingBinding,
}

const PARAM_KIND_DOC: &str =
    "ParamKind specifies the kind of resources used to parameterize this policy";
const POLICY_NAME_DOC: &str =
    "PolicyName indicates the policy definition which the policy binding binded to";
const PARAM_REF_DOC: &str =
    "ParamRef indicates the param resource which sets the configuration param";

/// `validatingAdmissionPolicy`.
#[rustfmt::skip]
const VALIDATING: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Validations", "integer", "", 0, "Validations indicates the number of validation rules defined in this configuration"),
    col("ParamKind", "string", "", 0, PARAM_KIND_DOC),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `mutatingAdmissionPolicy`.
#[rustfmt::skip]
const MUTATING: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("Mutations", "integer", "", 0, "Mutation indicates the number of mutations rules defined in this configuration"),
    col("ParamKind", "string", "", 0, PARAM_KIND_DOC),
    col("Age", "string", "", 0, CREATED_DOC),
];

/// `validatingAdmissionPolicyBinding` and `mutatingAdmissionPolicyBinding` (the same).
#[rustfmt::skip]
const BINDING: &[Column] = &[
    col("Name", "string", "name", 0, NAME_DOC),
    col("PolicyName", "string", "", 0, POLICY_NAME_DOC),
    col("ParamRef", "string", "", 0, PARAM_REF_DOC),
    col("Age", "string", "", 0, CREATED_DOC),
];

impl AdmissionPolicy {
    /// The kind of a resource of `admissionregistration.k8s.io`.
    pub fn of(resource: &str) -> Option<AdmissionPolicy> {
        Some(match resource {
            "validatingadmissionpolicies" => AdmissionPolicy::Validating,
            "validatingadmissionpolicybindings" => AdmissionPolicy::ValidatingBinding,
            "mutatingadmissionpolicies" => AdmissionPolicy::Mutating,
            "mutatingadmissionpolicybindings" => AdmissionPolicy::MutatingBinding,
            _ => return None,
        })
    }

    pub fn columns(self) -> &'static [Column] {
        match self {
            AdmissionPolicy::Validating => VALIDATING,
            AdmissionPolicy::Mutating => MUTATING,
            AdmissionPolicy::ValidatingBinding | AdmissionPolicy::MutatingBinding => BINDING,
        }
    }

    /// `printValidatingAdmissionPolicy` and the others: the rules counted, the parameters'
    /// kind as `apiVersion/kind` (`<unset>` without); a binding's policy and parameters.
    pub fn cells(self, o: &Value, name: Value, age: Value) -> Vec<Value> {
        match self {
            AdmissionPolicy::Validating | AdmissionPolicy::Mutating => {
                let rules = if self == AdmissionPolicy::Validating {
                    "/spec/validations"
                } else {
                    "/spec/mutations"
                };
                let count = o
                    .pointer(rules)
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let param_kind = match o.pointer("/spec/paramKind") {
                    Some(p) if !p.is_null() => {
                        format!("{}/{}", string(p.get("apiVersion")), string(p.get("kind")))
                    }
                    _ => "<unset>".into(),
                };
                vec![name, json!(count), json!(param_kind), age]
            }
            AdmissionPolicy::ValidatingBinding | AdmissionPolicy::MutatingBinding => vec![
                name,
                json!(string(o.pointer("/spec/policyName"))),
                json!(param_ref(o.pointer("/spec/paramRef"))),
                age,
            ],
        }
    }
}

/// A binding's parameters: `namespace/name`, `*/name` without a namespace, else the
/// selector as its Go type's generated `String()` prints it; `<unset>` without.
fn param_ref(reference: Option<&Value>) -> String {
    let Some(reference) = reference.filter(|r| !r.is_null()) else {
        return "<unset>".into();
    };
    let name = string(reference.get("name"));
    if !name.is_empty() {
        return match string(reference.get("namespace")) {
            "" => format!("*/{name}"),
            namespace => format!("{namespace}/{name}"),
        };
    }
    match reference.get("selector") {
        Some(selector) if !selector.is_null() => label_selector_go_string(selector),
        _ => "<unset>".into(),
    }
}

/// `(*metav1.LabelSelector).String()`, the protobuf generator's debug form:
/// `&LabelSelector{MatchLabels:map[string]string{k: v,},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:k,Operator:In,Values:[a b],},},}`,
/// labels sorted by key, expressions in order.
pub fn label_selector_go_string(selector: &Value) -> String {
    let mut labels: Vec<(&String, &str)> = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k, v.as_str().unwrap_or_default()))
        .collect();
    labels.sort_unstable();
    let labels: String = labels.iter().map(|(k, v)| format!("{k}: {v},")).collect();
    let expressions: String = selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| {
            let values: Vec<&str> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                string(e.get("key")),
                string(e.get("operator")),
                values.join(" ")
            )
        })
        .collect();
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{expressions}}},}}"
    )
}
