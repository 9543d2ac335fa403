//! `docs/crds.md`: a field-by-field reference of every CRD, generated from the same schemas
//! as the YAML, so the documentation cannot drift from what the apiserver enforces.

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

use crate::render::CRD_FILE_HEADER;

/// Path of the reference, relative to the repository root.
pub const REFERENCE_PATH: &str = "docs/crds.md";

/// Renders the reference for `crds`: per CRD, its printer columns and a table of every
/// field of `spec` and `status` with type, default and description.
pub fn render_reference(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- {} -->\n# Custom resource reference\n",
        CRD_FILE_HEADER.trim_start_matches("# ").trim_end()
    );
    let _ = writeln!(
        out,
        "Every field of the Scale Agent custom resources, generated from the Rust types in \
         `crds/src` (the same schema the apiserver validates against; `kubectl explain` shows \
         the same text).\n"
    );
    for crd in crds {
        let names = &crd.spec.names;
        for version in &crd.spec.versions {
            let _ = writeln!(
                out,
                "## {} (`{}/{}`)\n",
                names.kind, crd.spec.group, version.name
            );
            let Some(schema) = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
            else {
                continue;
            };
            if let Some(description) = &schema.description {
                let _ = writeln!(out, "{}\n", description.trim());
            }
            let short = names.short_names.clone().unwrap_or_default().join(", ");
            let _ = writeln!(
                out,
                "Scope: {}. Plural: `{}`. Short names: `{short}`.\n",
                crd.spec.scope, names.plural
            );
            if let Some(columns) = &version.additional_printer_columns {
                let shown: Vec<_> = columns
                    .iter()
                    .map(|c| {
                        if c.priority.unwrap_or(0) > 0 {
                            format!("{} (wide)", c.name)
                        } else {
                            c.name.clone()
                        }
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "`kubectl get {}` columns: {}.\n",
                    names.plural,
                    shown.join(", ")
                );
            }
            for section in ["spec", "status"] {
                let Some(part) = schema.properties.as_ref().and_then(|p| p.get(section)) else {
                    continue;
                };
                let _ = writeln!(out, "### `{section}`\n");
                let _ = writeln!(out, "| Field | Type | Default | Description |");
                let _ = writeln!(out, "| --- | --- | --- | --- |");
                fields(&mut out, section, part);
                out.push('\n');
            }
        }
    }
    out
}

/// One table row per field below `schema`, depth first, in the schema's (alphabetical) order.
/// Types from k8s-openapi (resources, conditions, the pod fields of a ScaleAgent) are
/// documented upstream: their inner fields are not expanded.
fn fields(out: &mut String, path: &str, schema: &JSONSchemaProps) {
    let Some(properties) = &schema.properties else {
        return;
    };
    for (name, field) in properties {
        let field_path = format!("{path}.{name}");
        let required = schema
            .required
            .as_ref()
            .is_some_and(|r| r.iter().any(|n| n == name));
        let _ = writeln!(
            out,
            "| `{field_path}`{} | {} | {} | {} |",
            if required { " (required)" } else { "" },
            type_name(field),
            field
                .default
                .as_ref()
                .map(|d| format!("`{}`", d.0))
                .unwrap_or_default(),
            cell(field.description.as_deref().unwrap_or_default())
        );
        if is_upstream_type(&field_path) {
            continue;
        }
        match &field.items {
            Some(JSONSchemaPropsOrArray::Schema(item)) => {
                fields(out, &format!("{field_path}[]"), item)
            }
            _ => fields(out, &field_path, field),
        }
    }
}

fn is_upstream_type(path: &str) -> bool {
    const UPSTREAM: &[&str] = &[
        ".resources",
        ".conditions",
        ".affinity",
        ".tolerations",
        ".env",
        ".imagePullSecrets",
        ".topologySpreadConstraints",
    ];
    UPSTREAM.iter().any(|suffix| path.ends_with(suffix))
}

fn type_name(schema: &JSONSchemaProps) -> String {
    if schema.x_kubernetes_int_or_string == Some(true) {
        return "integer or string".into();
    }
    let base = schema.type_.clone().unwrap_or_else(|| "object".into());
    let base = match (&schema.items, base.as_str()) {
        (Some(JSONSchemaPropsOrArray::Schema(item)), "array") => {
            format!(
                "[]{}",
                item.type_.clone().unwrap_or_else(|| "object".into())
            )
        }
        _ => base,
    };
    match &schema.enum_ {
        Some(values) => {
            let values: Vec<_> = values.iter().map(|v| v.0.to_string()).collect();
            format!("{base}: {}", values.join(", ").replace('"', "`"))
        }
        None => base,
    }
}

/// A description fit for one Markdown table cell.
fn cell(text: &str) -> String {
    text.trim()
        .replace('|', "\\|")
        .replace("\n\n", "<br><br>")
        .replace('\n', "<br>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_field_has_a_row_with_its_description() {
        let reference = render_reference(&crate::crds());
        for row in [
            "| `spec.hub.address` (required) | string |",
            "| `spec.replicas` | integer | `2` |",
            "| `spec.agentRef` (required) | string |",
            "| `status.conditions` | []object |",
            "| `spec.nodeSelector` | object |",
            "| `spec.podDisruptionBudget.maxUnavailable` | integer or string |",
        ] {
            assert!(reference.contains(row), "missing row {row:?}");
        }
        assert!(reference.contains("`kubectl get scaleagents` columns: Ready, Replicas"));
        assert!(
            !reference.contains("status.conditions[].reason"),
            "upstream types stay unexpanded"
        );
        for upstream in ["spec.affinity.", "spec.tolerations[].", "spec.env[]."] {
            assert!(
                !reference.contains(&format!("`{upstream}")),
                "{upstream} is k8s-openapi's and stays unexpanded"
            );
        }
    }
}
