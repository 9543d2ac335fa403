//! Argo CD's view of Scale Agent's custom resources: the health checks shipped in
//! `manifests/argocd/argocd-cm.yaml`, run the way Argo CD runs them (a Lua 5.1 chunk with the
//! object in the global `obj`, returning `{status, message}`) by the reference Lua 5.1
//! interpreter that `e2e/lua/install.sh` unpacks from Debian's packages into the cache.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

use crate::{
    binaries::cache_root,
    error::{Error, Result, io_err},
};

/// `manifests/argocd/argocd-cm.yaml` of this checkout.
pub fn health_checks_path() -> PathBuf {
    crate::repo_root()
        .join("manifests")
        .join("argocd")
        .join("argocd-cm.yaml")
}

/// The health check Lua of `kind` (`ScaleAgent` or `AgentAccount`), as shipped.
pub fn health_script(kind: &str) -> Result<String> {
    let path = health_checks_path();
    let text =
        std::fs::read_to_string(&path).map_err(io_err(format!("read {}", path.display())))?;
    let config: Value = serde_saphyr::from_str(&text).map_err(|e| Error::Manifest {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let key = format!("resource.customizations.health.scaleagent.dev_{kind}");
    config["data"][&key]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Manifest {
            path,
            message: format!("no data key {key}"),
        })
}

/// A JSON value as a Lua expression (objects become tables with string keys, arrays
/// tables indexed from 1, null nil).
pub fn lua_literal(value: &Value) -> String {
    let string = |s: &str| {
        let mut out = String::from("\"");
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\{}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    };
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => string(s),
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua_literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("[{}] = {}", string(k), lua_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Argo CD's health of `object` (a `kind`): `(status, message)`.
pub fn health(kind: &str, object: &Value) -> Result<(String, String)> {
    let version = cache_root().join("lua/current");
    let lua = version.join("usr/bin/lua5.1");
    let library_dir = std::fs::read_to_string(version.join(".library-dir"))
        .map(|dir| version.join(dir.trim()))
        .map_err(|_| Error::LuaMissing { path: lua.clone() })?;
    if !lua.is_file() {
        return Err(Error::LuaMissing { path: lua });
    }
    let program = format!(
        "obj = {}\nlocal hs = (function()\n{}\nend)()\nio.write(hs.status, \"\\n\", hs.message or \"\")\n",
        lua_literal(object),
        health_script(kind)?
    );
    let output = Command::new(&lua)
        .arg("-")
        .env("LD_LIBRARY_PATH", library_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            if let Some(mut stdin) = child.stdin.take() {
                stdin.write_all(program.as_bytes())?;
            }
            child.wait_with_output()
        })
        .map_err(io_err(format!("run {}", lua.display())))?;
    if !output.status.success() {
        return Err(Error::HealthCheck {
            kind: kind.to_owned(),
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (status, message) = text.split_once('\n').unwrap_or((text.as_str(), ""));
    Ok((status.to_owned(), message.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_becomes_lua() {
        let value = serde_json::json!({"a": [1, "x\"y", null, true]});
        assert_eq!(lua_literal(&value), r#"{["a"] = {1, "x\"y", nil, true}}"#);
    }
}
