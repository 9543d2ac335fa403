//! Whether a read asks for a Table (sans-IO): the Accept header's media types in order, as
//! the API server negotiates them, and the `includeObject` query parameter.

/// The Table's API version (the API server serves both; kubectl asks for v1, then v1beta1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TableVersion {
    V1,
    V1beta1,
}

impl TableVersion {
    pub fn api_version(self) -> &'static str {
        match self {
            TableVersion::V1 => "meta.k8s.io/v1",
            TableVersion::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// What each row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IncludeObject {
    None,
    /// The default: the object's metadata as a `PartialObjectMetadata`.
    #[default]
    Metadata,
    Object,
}

/// The outcome of negotiating Accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negotiated {
    /// The first acceptable media type is a Table in JSON.
    Table(TableVersion),
    /// Not a Table: the other cached forms decide ([`super::super::request::parse_accept`]).
    NotTable,
    /// A Table in a form the cache does not write (protobuf, YAML, unknown parameters).
    Tunnel,
}

/// Walks Accept's media types in order like the API server: a Table of an unknown version
/// or group is skipped (not acceptable), the first JSON Table answers; anything else first
/// is not a Table.
pub fn negotiate(accept: Option<&str>) -> Negotiated {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Negotiated::NotTable;
    };
    for clause in accept.split(',') {
        let mut params = clause.split(';').map(str::trim);
        let media = params.next().unwrap_or_default();
        let (mut as_, mut g, mut v) = (None, None, None);
        let mut unknown = false;
        for p in params {
            match p.split_once('=') {
                Some(("as", value)) => as_ = Some(value),
                Some(("g", value)) => g = Some(value),
                Some(("v", value)) => v = Some(value),
                Some(("q", _)) | Some(("charset", _)) => {}
                _ => unknown = true,
            }
        }
        if as_ != Some("Table") {
            return Negotiated::NotTable;
        }
        if g != Some("meta.k8s.io") {
            continue;
        }
        let version = match v {
            Some("v1") => TableVersion::V1,
            Some("v1beta1") => TableVersion::V1beta1,
            _ => continue,
        };
        if unknown || !matches!(media, "application/json" | "*/*" | "application/*") {
            return Negotiated::Tunnel;
        }
        return Negotiated::Table(version);
    }
    // No acceptable media type: the API server answers 406; let it.
    Negotiated::Tunnel
}

/// Splits `includeObject` off a Table read's query: the value and the query without it
/// (for [`super::super::request::parse_query`]); `None` for a value the API server
/// refuses (it answers 400 itself through the tunnel).
pub fn include_object(query: Option<&str>) -> Option<(IncludeObject, String)> {
    let mut include = IncludeObject::default();
    let mut rest = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("includeObject", value) => {
                include = match value {
                    "" | "Metadata" => IncludeObject::Metadata,
                    "None" => IncludeObject::None,
                    "Object" => IncludeObject::Object,
                    _ => return None,
                }
            }
            _ => rest.push(pair),
        }
    }
    Some((include, rest.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(Some(kubectl)),
            Negotiated::Table(TableVersion::V1)
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json"
            )),
            Negotiated::Table(TableVersion::V1beta1)
        );
        // An unknown Table version is skipped, as on the API server.
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v2;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io"
            )),
            Negotiated::Table(TableVersion::V1beta1)
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v2;g=meta.k8s.io,application/json"
            )),
            Negotiated::NotTable
        );
        for not_table in [
            None,
            Some(""),
            Some("application/json"),
            Some("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Some("application/json,application/json;as=Table;v=v1;g=meta.k8s.io"),
        ] {
            assert_eq!(negotiate(not_table), Negotiated::NotTable, "{not_table:?}");
        }
        for tunnelled in [
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
            "application/yaml;as=Table;v=v1;g=meta.k8s.io",
            "application/json;as=Table;v=v1;g=meta.k8s.io;stream=watch",
            "application/json;as=Table;v=v3;g=meta.k8s.io",
        ] {
            assert_eq!(
                negotiate(Some(tunnelled)),
                Negotiated::Tunnel,
                "{tunnelled}"
            );
        }
    }

    #[test]
    fn include_object_values() {
        assert_eq!(
            include_object(Some("limit=500&includeObject=Object")),
            Some((IncludeObject::Object, "limit=500".to_string()))
        );
        assert_eq!(
            include_object(None),
            Some((IncludeObject::Metadata, String::new()))
        );
        assert_eq!(
            include_object(Some("includeObject=None&labelSelector=a%3Db")),
            Some((IncludeObject::None, "labelSelector=a%3Db".to_string()))
        );
        assert_eq!(include_object(Some("includeObject=Everything")), None);
    }
}
