//! The troubleshooting page `docs/src/troubleshooting/messages.md`, generated from the code so
//! it cannot drift from what the binaries print (issue 32).
//!
//! Two sources, both read as text (nothing is compiled or run):
//! - Rust: a `// troubleshooting: <where it shows>` comment, then `//` lines saying what it
//!   means and what to change, marks the message written right after it: the first string
//!   literal with a space in it, within [`LOOKAHEAD`] lines. A `PascalCase` literal between the
//!   marker and the message (a condition's `reason: "…"`) is the reason, shown in the heading.
//! - The admission policies (`manifests/policy/*.yaml`): every `messageExpression`, its string
//!   literals joined with `…` where CEL puts a value, each branch of a `? :` on its own.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, bail};

/// How many lines after a marker its message may start.
const LOOKAHEAD: usize = 30;

const MARKER: &str = "// troubleshooting:";

/// One message of the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the user meets it (a condition, an exit, an HTTP answer...).
    pub heading: String,
    /// The condition's reason, when the code gives one beside the message.
    pub reason: Option<String>,
    /// What it means and what to change.
    pub explanation: String,
    /// The message as printed, `…` where the code puts a value.
    pub message: String,
    /// The file it is written in, relative to the repository.
    pub source: String,
}

/// The page's sections: the top directory of a source, and its title, in the page's order.
const SECTIONS: &[(&str, &str, &str)] = &[
    (
        "manifests",
        "Admission: creating or changing a ScaleAgent or AgentAccount",
        "The API server refuses the request itself (HTTP 403, `kubectl` prints the message) \
         when the ValidatingAdmissionPolicies the install ships (`manifests/policy/`) say no: \
         fields that widen what an agent may do are reserved to the admin group \
         (`scale-agent-admins` by default), and references must name things the requester may \
         read. Nothing is created.",
    ),
    (
        "crds",
        "The custom resources",
        "Errors in rendering a `ScaleAgent`'s and its `AgentAccount`s' agent configuration.",
    ),
    (
        "operator",
        "The operator: conditions and Events",
        "`kubectl -n <namespace> describe scaleagent <name>` (or `agentaccount`) shows the \
         conditions and the Warning Events the operator writes; the reason is the condition's \
         `reason`.",
    ),
    (
        "agent",
        "The agent",
        "The agent's log, its admin port (`/accounts`, `/readyz`) and the `Connected` and \
         `AccountFailing` conditions it writes into its ScaleAgent and AgentAccounts.",
    ),
    (
        "hub",
        "The hub",
        "What the hub answers: a gRPC status or a `REJECTED` assignment for agents (the agent \
         writes it into the AgentAccount's `Connected` condition), an HTTP error for the REST \
         API and the proxy (a Kubernetes `Status` that kubectl prints), or its log at start-up. \
         gRPC refusals end the call (or the stream) with the status shown; a refused \
         registration is a `REJECTED` assignment and the stream goes on; REST API refusals are \
         JSON `{\"error\": ...}` (a 401 carries `WWW-Authenticate: Bearer`). An HTTP refusal \
         of a request with a body (a missing or foreign token, a role too small) is sent once \
         the hub has read that body (and thrown it away), up to 1 MiB and 5 s: answering \
         earlier makes HTTP/2 reset the stream, and curl 7.88 then fails with error 92 and no \
         message. Two refusals on the way are not the hub's own words: behind a \
         TLS-terminating gRPC proxy (nginx), an agent certificate the proxy's CA did not sign \
         is refused by nginx (HTTP 400, gRPC `INTERNAL`; its log says \"client SSL \
         certificate verify error\") before the hub sees the stream; and a write through the \
         proxy that the target cluster's RBAC forbids to the agent's (or the impersonated) \
         ServiceAccount or person is the API server's 403, passed on as it is.",
    ),
    (
        "runtime",
        "Every binary",
        "Start-up errors shared by the three binaries.",
    ),
];

/// Decodes the Rust string literal starting at `text[start]` (the opening quote): returns
/// its value and the index after its closing quote.
fn rust_literal(text: &[char], start: usize) -> anyhow::Result<(String, usize)> {
    let mut value = String::new();
    let mut i = start + 1;
    while i < text.len() {
        match text[i] {
            '"' => return Ok((value, i + 1)),
            '\\' => {
                let Some(&next) = text.get(i + 1) else { break };
                i += 2;
                match next {
                    // A continuation: the newline and the next line's indent are not there.
                    '\n' => {
                        while text.get(i).is_some_and(|c| c.is_whitespace()) {
                            i += 1;
                        }
                    }
                    'n' | 't' => value.push(' '),
                    other => value.push(other),
                }
            }
            c => {
                value.push(c);
                i += 1;
            }
        }
    }
    bail!("a string literal that does not end")
}

/// A format string as printed: each `{…}` argument becomes `…`, `{{` and `}}` braces.
fn as_printed(format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('{', Some('{')) | ('}', Some('}')) => {
                out.push(c);
                chars.next();
            }
            ('{', _) => {
                for inner in chars.by_ref() {
                    if inner == '}' {
                        break;
                    }
                }
                out.push('…');
            }
            _ => out.push(c),
        }
    }
    out
}

fn is_reason(literal: &str) -> bool {
    literal.len() > 2
        && literal.starts_with(|c: char| c.is_ascii_uppercase())
        && literal.chars().all(|c| c.is_ascii_alphanumeric())
        && literal.chars().any(|c| c.is_ascii_lowercase())
}

/// The marked messages of one Rust file.
pub fn rust_entries(source: &str, text: &str) -> anyhow::Result<Vec<Entry>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut entries = Vec::new();
    for (number, line) in lines.iter().enumerate() {
        let Some(heading) = line.trim_start().strip_prefix(MARKER) else {
            continue;
        };
        let at = format!("{source}:{}", number + 1);
        let heading = heading.trim().to_owned();
        if heading.is_empty() {
            bail!("{at}: `{MARKER}` names no place where the message shows");
        }
        let mut explanation = Vec::new();
        let mut next = number + 1;
        while let Some(comment) = lines.get(next).map(|l| l.trim_start())
            && comment.starts_with("//")
            && !comment.starts_with("///")
            && !comment.starts_with(MARKER)
        {
            explanation.push(comment.trim_start_matches('/').trim());
            next += 1;
        }
        // The code after the marker, comments left out, as one text to read literals from.
        let code: String = lines[next..lines.len().min(next + LOOKAHEAD)]
            .iter()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let chars: Vec<char> = code.chars().collect();
        let mut reason = None;
        let mut message = None;
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                // A char literal holding a quote would read as a string.
                '\'' if chars.get(i + 2) == Some(&'\'') => i += 3,
                '\'' if chars.get(i + 1) == Some(&'\\') && chars.get(i + 3) == Some(&'\'') => {
                    i += 4
                }
                '"' => {
                    let (literal, end) = rust_literal(&chars, i).with_context(|| at.clone())?;
                    i = end;
                    if literal.contains(' ') {
                        message = Some(as_printed(&literal));
                        break;
                    }
                    if reason.is_none() && is_reason(&literal) {
                        reason = Some(literal);
                    }
                }
                _ => i += 1,
            }
        }
        let Some(message) = message else {
            bail!(
                "{at}: no message (a string literal with a space) within {LOOKAHEAD} lines of \
                 the `{MARKER}` marker"
            );
        };
        entries.push(Entry {
            heading,
            reason,
            explanation: explanation.join(" ").trim().to_owned(),
            message,
            source: source.to_owned(),
        });
    }
    Ok(entries)
}

/// A CEL message expression as printed: its literals in order, `…` for what CEL computes,
/// one text per branch of a conditional (`(cond ? a : b)`, not nested).
fn cel_messages(expression: &str) -> Vec<String> {
    // The alternatives being built; a conditional forks them.
    let mut texts = vec![String::new()];
    // Where each open parenthesis began, so a condition can be cut away.
    let mut opened: Vec<usize> = Vec::new();
    // While in a conditional: the depth it opened at, and the other branch's texts.
    let mut fork: Option<(usize, Vec<String>)> = None;
    let mut pending = false;
    let flush = |texts: &mut Vec<String>, pending: &mut bool| {
        if std::mem::take(pending) {
            for text in texts.iter_mut() {
                if !text.ends_with('…') {
                    text.push('…');
                }
            }
        }
    };
    let mut chars = expression.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let literal: String = chars.by_ref().take_while(|&inner| inner != '\'').collect();
                flush(&mut texts, &mut pending);
                for text in &mut texts {
                    text.push_str(&literal);
                }
            }
            '(' => {
                flush(&mut texts, &mut pending);
                opened.push(texts[0].len());
            }
            ')' => {
                if let Some((depth, _)) = &fork
                    && *depth == opened.len()
                    && let Some((_, first)) = fork.take()
                {
                    flush(&mut texts, &mut pending);
                    let second = std::mem::replace(&mut texts, first);
                    texts.extend(second);
                }
                opened.pop();
            }
            '?' if fork.is_none() => {
                // What came since the group opened is the condition: not printed.
                let start = opened.last().copied().unwrap_or(0);
                for text in &mut texts {
                    text.truncate(start);
                }
                pending = false;
                fork = Some((opened.len(), texts.clone()));
            }
            ':' if fork.is_some() => {
                flush(&mut texts, &mut pending);
                if let Some((_, other)) = fork.as_mut() {
                    // `other` now holds the first branch; `texts` starts the second.
                    std::mem::swap(&mut texts, other);
                }
            }
            '+' => {}
            c if c.is_whitespace() => {}
            _ => pending = true,
        }
    }
    flush(&mut texts, &mut pending);
    texts
}

/// `impersonateServiceAccount` or `credentials.kubeconfigSecretRef`: a lower-case start, then
/// letters and dots with an upper-case letter or a dot among them.
fn is_field_name(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_lowercase())
        && word.chars().all(|c| c.is_ascii_alphabetic() || c == '.')
        && word.chars().any(|c| c.is_ascii_uppercase() || c == '.')
}

/// The messages of one admission policy file.
pub fn policy_entries(source: &str, text: &str) -> Vec<Entry> {
    let lines: Vec<&str> = text.lines().collect();
    let mut entries = Vec::new();
    let mut seen = BTreeSet::new();
    for (number, line) in lines.iter().enumerate() {
        if !line.trim_start().starts_with("messageExpression:") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let mut expression = line
            .trim_start()
            .trim_start_matches("messageExpression:")
            .trim()
            .trim_start_matches(">-")
            .to_owned();
        for more in &lines[number + 1..] {
            if more.trim().is_empty() || more.len() - more.trim_start().len() <= indent {
                break;
            }
            expression.push(' ');
            expression.push_str(more.trim());
        }
        for message in cel_messages(&expression) {
            if !seen.insert(message.clone()) {
                continue;
            }
            let words: Vec<&str> = message
                .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
                .map(|w| w.trim_end_matches('.'))
                .collect();
            // The field the message is about: the first `spec.…`, else the first name of a
            // field (`impersonateServiceAccount`, `credentials.kubeconfigSecretRef`).
            let field = words
                .iter()
                .find(|w| w.starts_with("spec."))
                .or_else(|| words.iter().find(|w| is_field_name(w)))
                .map_or_else(|| "a field".to_owned(), |w| format!("`{w}`"));
            let kind = words.first().copied().unwrap_or("the object");
            entries.push(Entry {
                heading: format!("{kind}: {field} refused"),
                reason: Some("Forbidden".to_owned()),
                explanation: String::new(),
                message,
                source: source.to_owned(),
            });
        }
    }
    entries
}

/// `text` with its first letter upper-case, as a heading starts.
fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// The page, from every source file (`(path relative to the repository, text)`).
pub fn page(sources: &[(String, String)]) -> anyhow::Result<String> {
    let mut entries: Vec<Entry> = Vec::new();
    for (path, text) in sources {
        if path.ends_with(".rs") {
            entries.extend(rust_entries(path, text)?);
        } else if path.starts_with("manifests/policy/") && path.ends_with(".yaml") {
            entries.extend(policy_entries(path, text));
        }
    }
    let mut page = String::from(
        "<!-- Generated by e2e/tests/book.rs (tests/book/messages.rs) from the code; do not \
         edit: `make book-reference` rewrites it. -->\n\
         # Error messages\n\n\
         The messages a user can meet, where each shows, what it means and what to change. \
         This page is generated from the code, so every message is the text the binaries \
         print today (`…` stands where the code puts a value: a name, a number, a list):\n\n\
         - in the Rust sources, a comment `// troubleshooting: <where it shows>`, followed by \
         `//` lines that say what it means and what to change, marks the message written right \
         after it (the first string literal with a space in it; a `PascalCase` literal before \
         it, such as a condition's `reason`, is shown in the heading);\n\
         - the admission policies' messages are read from `manifests/policy/*.yaml` (each \
         `messageExpression`).\n\n\
         `e2e/tests/book.rs` (`the_messages_page_is_generated_from_the_code`) fails when this \
         page is not what the code says now, and `make book-reference` rewrites it. To add a \
         message, put the comment above it in the code and run `make book-reference`. Every \
         refusal of the hub is here, with the code it answers with in its heading (the \
         hand-written table of refusals it replaces could drift from the code, and had).\n",
    );
    for (top, title, intro) in SECTIONS {
        let mut section: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.source.split('/').next() == Some(*top))
            .collect();
        if section.is_empty() {
            continue;
        }
        section.sort_by(|a, b| a.source.cmp(&b.source));
        page.push_str(&format!("\n## {title}\n\n{intro}\n"));
        for entry in section {
            let heading = match &entry.reason {
                Some(reason) => format!("`{reason}`: {}", entry.heading),
                None => capitalised(&entry.heading),
            };
            page.push_str(&format!(
                "\n### {heading}\n\n```message\n{}\n```\n\n",
                entry.message
            ));
            if !entry.explanation.is_empty() {
                page.push_str(&entry.explanation);
                page.push_str("\n\n");
            }
            page.push_str(&format!("Source: `{}`.\n", entry.source));
        }
    }
    Ok(page)
}

/// Every file the page is generated from, relative to `repo`, in a stable order.
pub fn sources(repo: &Path, files: &[std::path::PathBuf]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(repo)
            .unwrap_or(file)
            .to_string_lossy()
            .replace('\\', "/");
        let relative = relative.trim_start_matches("./").to_owned();
        let text = std::fs::read_to_string(file).with_context(|| format!("read {relative}"))?;
        out.push((relative, text));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_message_is_found_with_its_reason_and_explanation() -> anyhow::Result<()> {
        let code = r#"
        // troubleshooting: AgentAccount `Accepted=False`
        // Create the ScaleAgent first.
        return Err(Rejection {
            reason: "AgentNotFound",
            message: format!(
                "ScaleAgent {} not found in {namespace:?}: create it, \
                 or set {{spec.agentRef}}",
                name
            ),
        });
        let other = "not marked at all";
"#;
        let entries = rust_entries("operator/src/x.rs", code)?;
        assert_eq!(
            entries,
            [Entry {
                heading: "AgentAccount `Accepted=False`".into(),
                reason: Some("AgentNotFound".into()),
                explanation: "Create the ScaleAgent first.".into(),
                message: "ScaleAgent … not found in …: create it, or set {spec.agentRef}".into(),
                source: "operator/src/x.rs".into(),
            }]
        );
        assert!(rust_entries("x.rs", "// troubleshooting: nowhere\nlet x = 1;\n").is_err());
        Ok(())
    }

    #[test]
    fn policy_messages_are_read_once_each_with_their_kind_and_field() {
        let policy = r#"
  validations:
    - expression: "variables.admin"
      reason: Forbidden
      messageExpression: >-
        'AgentAccount ' + object.metadata.name + ' names impersonateServiceAccount ' + t
        + ', which you may not impersonate yourself'
    - expression: "x"
      messageExpression: >-
        'AgentAccount ' + object.metadata.name + ' names impersonateServiceAccount ' + u
        + ', which you may not impersonate yourself'
    - expression: "y"
      messageExpression: >-
        'ScaleAgent ' + object.metadata.name + ' sets spec.dynamicAccounts: reserved'
"#;
        let entries = policy_entries("manifests/policy/p.yaml", policy);
        let shown: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| (e.heading.as_str(), e.message.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "AgentAccount: `impersonateServiceAccount` refused",
                    "AgentAccount … names impersonateServiceAccount …, which you may not \
                     impersonate yourself"
                ),
                (
                    "ScaleAgent: `spec.dynamicAccounts` refused",
                    "ScaleAgent … sets spec.dynamicAccounts: reserved"
                ),
            ]
        );
    }

    #[test]
    fn cel_literals_are_joined_and_each_branch_is_a_message() {
        assert_eq!(
            cel_messages(
                "'ScaleAgent ' + object.metadata.name + ' adds ' + string(size(x)) + ' namespaces'"
            ),
            ["ScaleAgent … adds … namespaces"]
        );
        assert_eq!(
            cel_messages(
                "'A ' + n + (old && c == 'impersonate' ? ' changes x: ' + g + '. Leave' : ' sets y: ' + g + '. Remove')"
            ),
            ["A … changes x: …. Leave", "A … sets y: …. Remove"]
        );
    }
}
