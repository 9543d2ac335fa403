//! The crate's one error type.

/// Errors from rendering CRDs and from reading typed values out of specs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CRD could not be rendered as YAML.
    #[error("failed to render the {crd} CustomResourceDefinition as YAML: {source}")]
    Render {
        /// `metadata.name` of the CRD.
        crd: String,
        /// The serializer's error.
        #[source]
        source: serde_saphyr::SerializeError,
    },

    /// A duration field does not parse.
    #[error("{field} is '{value}', which is not a duration: write it like 720h or 90m ({source})")]
    InvalidDuration {
        /// Path of the field in the resource.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The parser's error.
        #[source]
        source: kube::core::duration::ParseError,
    },

    /// A duration field is negative.
    #[error("{field} is '{value}', which is negative: write a positive duration like 720h")]
    NegativeDuration {
        /// Path of the field in the resource.
        field: &'static str,
        /// The offending value.
        value: String,
    },

    /// The agent's config file does not parse.
    #[error("invalid agent config: {0}")]
    AgentConfig(String),
}
