//! The user guide in `docs/` (issue 32): it builds with the pinned mdBook, every relative link
//! and anchor in the built book resolves (mdBook's own build checks neither), every page is in
//! `SUMMARY.md`, every error message the troubleshooting pages quote is still in the code, and
//! the generated pages (the command-line reference from `--help`, the error messages from the
//! code's `// troubleshooting:` markers, see `book/messages.rs`, and the table of Armory keys
//! from the agent's `ARMORY_KEYS`, see `book/armory_keys.rs`) are what the code says now.
//!
//! mdBook comes from crates.io through `docs/tools/install-mdbook.sh` (`make book`; `make test`
//! runs it first), cached outside the repository like the control plane; this test only finds
//! it, so `cargo test` needs no network.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

#[path = "book/armory_keys.rs"]
mod armory_keys;
#[path = "book/messages.rs"]
mod messages;

const MDBOOK_VERSION: &str = include_str!("../../docs/tools/mdbook-version");

/// The mdBook `docs/tools/install-mdbook.sh` installs (keep the two in step).
fn mdbook() -> anyhow::Result<PathBuf> {
    let version = MDBOOK_VERSION.trim();
    let path = scale_agent_e2e::binaries::cache_root()
        .join("tools/mdbook")
        .join(version)
        .join("bin/mdbook");
    ensure!(
        path.is_file(),
        "mdBook {version} is not at {}: run `make book` (docs/tools/install-mdbook.sh installs \
         it from crates.io into the cache)",
        path.display()
    );
    Ok(path)
}

/// Builds the book into a fresh directory under the test's target dir; fails on any warning
/// mdBook prints (an include that does not resolve is only a warning to it).
fn build_book() -> anyhow::Result<PathBuf> {
    let dest = Path::new(env!("CARGO_TARGET_TMPDIR")).join("book");
    if dest.exists() {
        std::fs::remove_dir_all(&dest).with_context(|| format!("remove {}", dest.display()))?;
    }
    let output = Command::new(mdbook()?)
        .arg("build")
        .arg(scale_agent_e2e::repo_root().join("docs"))
        .arg("--dest-dir")
        .arg(&dest)
        .output()
        .context("run mdbook build")?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success(),
        "mdbook build docs failed ({}):\n{log}",
        output.status
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    ensure!(
        warnings.is_empty(),
        "mdbook build docs warned; fix the pages:\n{}",
        warnings.join("\n")
    );
    Ok(dest)
}

fn files_under(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            files_under(&path, extension, found)?;
        } else if path.extension().is_some_and(|e| e == extension) {
            found.push(path);
        }
    }
    Ok(())
}

/// The values of every `name="…"` attribute in `html`.
fn attribute_values<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let needle = format!(" {name}=\"");
    let mut values = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find(&needle) {
        let after = &rest[start + needle.len()..];
        let Some(end) = after.find('"') else { break };
        values.push(&after[..end]);
        rest = &after[end..];
    }
    values
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative `href` of the HTML pages under `book` that does not resolve: no such file in
/// the book, no element with the fragment's id there, or a path leaving the book. Returns how
/// many links were checked besides.
fn broken_links(book: &Path) -> anyhow::Result<(usize, usize, Vec<String>)> {
    let mut pages = Vec::new();
    files_under(book, "html", &mut pages)?;
    let mut ids: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut html: BTreeMap<PathBuf, String> = BTreeMap::new();
    for page in &pages {
        let text =
            std::fs::read_to_string(page).with_context(|| format!("read {}", page.display()))?;
        ids.insert(
            page.clone(),
            attribute_values(&text, "id")
                .into_iter()
                .map(str::to_owned)
                .collect(),
        );
        html.insert(page.clone(), text);
    }

    let mut broken = Vec::new();
    let mut checked = 0;
    for (page, text) in &html {
        // mdBook's 404 page is served from the site's root (`<base href="/">`), not read as a
        // file; its links are the same as every page's.
        if page.file_name().is_some_and(|n| n == "404.html") {
            continue;
        }
        let shown = page.strip_prefix(book).unwrap_or(page).display();
        for href in attribute_values(text, "href") {
            if href.contains("://") || href.starts_with("mailto:") || href.starts_with("data:") {
                continue;
            }
            let (path, fragment) = href.split_once('#').unwrap_or((href, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                normalise(&page.parent().unwrap_or(book).join(path))
            };
            let target = if target.is_dir() {
                target.join("index.html")
            } else {
                target
            };
            checked += 1;
            if !target.starts_with(book) {
                broken.push(format!(
                    "{shown}: {href} leaves the book (write a path of the repository as code, \
                     not as a link)"
                ));
            } else if !target.is_file() {
                broken.push(format!("{shown}: {href}: no such page"));
            } else if !fragment.is_empty()
                && !ids.get(&target).is_some_and(|ids| ids.contains(fragment))
            {
                broken.push(format!(
                    "{shown}: {href}: no heading or id #{fragment} there"
                ));
            }
        }
    }
    Ok((pages.len(), checked, broken))
}

#[test]
fn the_book_builds_and_every_relative_link_and_anchor_resolves() -> anyhow::Result<()> {
    let book = build_book()?;
    let (pages, checked, broken) = broken_links(&book)?;
    ensure!(pages > 10, "the book has {pages} pages");
    if !broken.is_empty() {
        bail!(
            "{} of {checked} relative links in docs/ do not resolve:\n{}",
            broken.len(),
            broken.join("\n")
        );
    }
    println!("[book] {pages} pages, {checked} relative links and anchors resolve");
    Ok(())
}

/// The checker itself, on a book of three pages with one good and four bad links, so a
/// checker that passes everything cannot go unnoticed.
#[test]
fn the_link_checker_reports_missing_pages_anchors_and_links_out_of_the_book() -> anyhow::Result<()>
{
    let book = Path::new(env!("CARGO_TARGET_TMPDIR")).join("link-checker");
    if book.exists() {
        std::fs::remove_dir_all(&book)?;
    }
    std::fs::create_dir_all(book.join("tasks"))?;
    std::fs::write(
        book.join("index.html"),
        r##"<h1 id="top">Top</h1><a href="tasks/a.html#step-2">good</a>
           <a href="tasks/b.html">no page</a><a href="#nowhere">no anchor</a>"##,
    )?;
    std::fs::write(
        book.join("tasks/a.html"),
        r##"<h2 id="step-2">Step 2</h2><a href="../index.html#top">good</a>
           <a href="../../hub/README.html">out</a><a href="../index.html#step-2">wrong page</a>
           <a href="https://example.com/x">external, not checked</a>"##,
    )?;
    let (pages, checked, mut broken) = broken_links(&book)?;
    broken.sort();
    assert_eq!((pages, checked), (2, 6));
    assert_eq!(
        broken,
        [
            "index.html: #nowhere: no heading or id #nowhere there",
            "index.html: tasks/b.html: no such page",
            "tasks/a.html: ../../hub/README.html leaves the book (write a path of the repository \
             as code, not as a link)",
            "tasks/a.html: ../index.html#step-2: no heading or id #step-2 there",
        ]
    );
    Ok(())
}

#[test]
fn every_page_is_in_the_summary() -> anyhow::Result<()> {
    let src = scale_agent_e2e::repo_root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).context("read SUMMARY.md")?;
    let mut pages = Vec::new();
    files_under(&src, "md", &mut pages)?;
    let missing: Vec<String> = pages
        .iter()
        .filter_map(|p| p.strip_prefix(&src).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p != "SUMMARY.md" && !summary.contains(&format!("]({p})")))
        .collect();
    ensure!(
        missing.is_empty(),
        "pages not in docs/src/SUMMARY.md (mdBook would not build them): {missing:?}"
    );
    Ok(())
}

/// Rust source with string continuations joined (`"a \` + newline + indented `b"` reads as
/// `"a b"`), so a message split over lines is found as printed.
fn joined(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut continued = false;
    for line in source.lines() {
        let line = if continued { line.trim_start() } else { line };
        match line.strip_suffix('\\') {
            Some(head) => {
                out.push_str(head);
                continued = true;
            }
            None => {
                out.push_str(line);
                out.push('\n');
                continued = false;
            }
        }
    }
    out
}

/// Where the binaries' messages are written: the Rust sources of the product (not its tests)
/// and the manifests (the admission policy's messages are CEL in YAML).
fn product_files() -> anyhow::Result<Vec<PathBuf>> {
    let root = scale_agent_e2e::repo_root();
    let mut files = Vec::new();
    for dir in ["agent", "crds", "hub", "operator", "runtime"] {
        let mut found = Vec::new();
        files_under(&root.join(dir), "rs", &mut found)?;
        files.extend(
            found
                .into_iter()
                .filter(|p| !p.components().any(|c| c.as_os_str() == "tests")),
        );
    }
    files_under(&root.join("manifests"), "yaml", &mut files)?;
    Ok(files)
}

/// [`product_files`] with string continuations joined, `\"` read as `"` and a format
/// string's `{{` and `}}` as `{` and `}`, as printed.
fn product_sources() -> anyhow::Result<Vec<(PathBuf, String)>> {
    product_files()?
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            let printed = joined(&text)
                .replace("\\\"", "\"")
                .replace("{{", "{")
                .replace("}}", "}");
            Ok((path, printed))
        })
        .collect()
}

#[test]
fn every_quoted_message_is_in_the_code() -> anyhow::Result<()> {
    let dir = scale_agent_e2e::repo_root().join("docs/src/troubleshooting");
    let mut pages = Vec::new();
    files_under(&dir, "md", &mut pages)?;
    let sources = product_sources()?;
    let mut quoted = 0;
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page)?;
        let mut in_message = false;
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_message = !in_message && line.trim() == "```message";
                continue;
            }
            if !in_message {
                continue;
            }
            quoted += 1;
            // `…` stands where the code puts a value; each piece between them must be there.
            // Pieces of a few characters (`/`, `): `) say nothing and are skipped.
            for piece in line.split('…').map(str::trim).filter(|p| p.len() >= 12) {
                if !sources.iter().any(|(_, source)| source.contains(piece)) {
                    missing.push(format!(
                        "{}:{}: {piece:?}",
                        page.strip_prefix(scale_agent_e2e::repo_root())
                            .unwrap_or(page)
                            .display(),
                        number + 1
                    ));
                }
            }
        }
    }
    ensure!(
        quoted > 10,
        "the troubleshooting pages quote only {quoted} messages"
    );
    ensure!(
        missing.is_empty(),
        "quoted in the guide but no longer in the code (change the page to what the code \
         prints now):\n{}",
        missing.join("\n")
    );
    Ok(())
}

/// Each getting-started page names the tests that run its commands, and one of them names the
/// page back (issue 32: "a page and the test that runs it name each other"); a renamed or
/// deleted test file or page fails here, so neither can keep pointing at the other in vain.
#[test]
fn getting_started_pages_name_tests_that_exist() -> anyhow::Result<()> {
    let dir = scale_agent_e2e::repo_root().join("docs/src/getting-started");
    let mut pages = Vec::new();
    files_under(&dir, "md", &mut pages)?;
    ensure!(
        pages.len() >= 2,
        "docs/src/getting-started has {} pages",
        pages.len()
    );
    let mut problems = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page)?;
        let shown = page
            .strip_prefix(scale_agent_e2e::repo_root())
            .unwrap_or(page)
            .display()
            .to_string();
        let named: BTreeSet<&str> = text
            .split('`')
            .filter(|s| s.starts_with("e2e/tests/") && s.ends_with(".rs"))
            .collect();
        if named.is_empty() {
            problems.push(format!(
                "{shown} names no test (`e2e/tests/<file>.rs`) that runs it"
            ));
        }
        let mut named_back = false;
        for test in named {
            match std::fs::read_to_string(scale_agent_e2e::repo_root().join(test)) {
                Ok(source) => named_back |= source.contains(&shown),
                Err(_) => problems.push(format!("{shown} names {test}, which does not exist")),
            }
        }
        if !named_back {
            problems.push(format!(
                "{shown}: none of the tests it names names it back (write `{shown}` in the \
                 module doc of the test that runs its commands)"
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The page that holds each binary's `--help`, generated by
/// [`the_command_line_reference_is_each_binarys_help`].
const COMMAND_LINE_PAGE: &str = "docs/src/reference/command-line.md";
/// Set to rewrite [`COMMAND_LINE_PAGE`] instead of comparing it (`make book-reference`).
const WRITE_ENV: &str = "SCALE_AGENT_WRITE_BOOK_REFERENCE";

/// The binaries whose help the page holds: the name users type, this package's build of the
/// same command (`CARGO_BIN_EXE_*`), and the commands its top-level help does not list (the
/// hub's admin commands are parsed before its server flags).
const COMMANDS: &[(&str, &str, &[&str])] = &[
    (
        "scale-agent-hub",
        env!("CARGO_BIN_EXE_e2e-hub"),
        &["kubeconfig", "token", "agent-token", "agent", "account"],
    ),
    ("scale-agent", env!("CARGO_BIN_EXE_e2e-agent"), &[]),
    (
        "scale-agent-operator",
        env!("CARGO_BIN_EXE_e2e-operator"),
        &[],
    ),
];

/// `exe <args> --help` with an empty environment: clap prints an environment variable's
/// current value beside its flag, so the caller's variables would leak into the page.
fn help_text(exe: &str, args: &[String]) -> anyhow::Result<String> {
    let output = Command::new(exe)
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .with_context(|| format!("run {exe} {} --help", args.join(" ")))?;
    ensure!(
        output.status.success(),
        "{exe} {} --help failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// The subcommands a help text lists under `Commands:` (without clap's `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn command_line_reference() -> anyhow::Result<String> {
    let mut page = String::from(
        "<!-- Generated by e2e/tests/book.rs from each binary's --help; do not edit: \
         `make book-reference` rewrites it. -->\n\
         # Command-line reference\n\n\
         Every flag and command of the three binaries, as their `--help` prints it (generated \
         from the code, so it cannot drift; `make test` fails when it is out of date). A flag \
         shown with `[env: NAME=]` also reads that environment variable; the component pages \
         ([hub](hub.md), [agent](agent.md), [operator](operator.md)) explain them.\n",
    );
    for (name, exe, admin) in COMMANDS {
        let binary = Path::new(exe)
            .file_name()
            .and_then(|n| n.to_str())
            .context("binary name")?;
        // Depth first, in the order the help lists them: the stack pops its end first.
        let mut stack: Vec<Vec<String>> =
            admin.iter().rev().map(|c| vec![(*c).to_owned()]).collect();
        stack.push(Vec::new());
        while let Some(args) = stack.pop() {
            let help = help_text(exe, &args)?;
            let mut title = (*name).to_owned();
            for arg in &args {
                title.push(' ');
                title.push_str(arg);
            }
            page.push_str(&format!("\n## `{title}`\n\n```text\n"));
            for line in help.replace(binary, name).lines() {
                page.push_str(line.trim_end());
                page.push('\n');
            }
            page.push_str("```\n");
            for sub in subcommands(&help).into_iter().rev() {
                let mut next = args.clone();
                next.push(sub);
                stack.push(next);
            }
        }
    }
    Ok(page)
}

#[test]
fn the_command_line_reference_is_each_binarys_help() -> anyhow::Result<()> {
    let page = command_line_reference()?;
    let path = scale_agent_e2e::repo_root().join(COMMAND_LINE_PAGE);
    if std::env::var_os(WRITE_ENV).is_some() {
        std::fs::write(&path, &page).with_context(|| format!("write {}", path.display()))?;
        return Ok(());
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    ensure!(
        current == page,
        "{COMMAND_LINE_PAGE} is not what the binaries' --help prints now: run `make \
         book-reference` and commit it"
    );
    Ok(())
}

/// The page of error messages, generated from the markers in the code (see `book/messages.rs`).
const MESSAGES_PAGE: &str = "docs/src/troubleshooting/messages.md";

#[test]
fn the_messages_page_is_generated_from_the_code() -> anyhow::Result<()> {
    let root = normalise(scale_agent_e2e::repo_root());
    let files: Vec<PathBuf> = product_files()?.iter().map(|f| normalise(f)).collect();
    let page = messages::page(&messages::sources(&root, &files)?)?;
    ensure!(
        page.matches("```message").count() > 30,
        "the generated page has few messages:\n{page}"
    );
    let path = scale_agent_e2e::repo_root().join(MESSAGES_PAGE);
    if std::env::var_os(WRITE_ENV).is_some() {
        std::fs::write(&path, &page).with_context(|| format!("write {}", path.display()))?;
        return Ok(());
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    ensure!(
        current == page,
        "{MESSAGES_PAGE} is not what the code's `// troubleshooting:` markers and the admission \
         policies say now: run `make book-reference` and commit it"
    );
    Ok(())
}

/// The page with the table of Armory keys, and the code it is generated from (see
/// `book/armory_keys.rs`).
const ARMORY_KEYS_PAGE: &str = "docs/src/tasks/migrate-from-armory.md";
const ARMORY_KEYS_SOURCE: &str = "agent/src/config_armory.rs";

#[test]
fn the_armory_keys_table_is_generated_from_the_code() -> anyhow::Result<()> {
    let source = std::fs::read_to_string(scale_agent_e2e::repo_root().join(ARMORY_KEYS_SOURCE))
        .with_context(|| format!("read {ARMORY_KEYS_SOURCE}"))?;
    let keys = armory_keys::keys(&source)?;
    ensure!(
        keys.len() > 30,
        "only {} entries read from ARMORY_KEYS in {ARMORY_KEYS_SOURCE}",
        keys.len()
    );
    let path = scale_agent_e2e::repo_root().join(ARMORY_KEYS_PAGE);
    let current =
        std::fs::read_to_string(&path).with_context(|| format!("read {ARMORY_KEYS_PAGE}"))?;
    let page = armory_keys::page_with(&current, &armory_keys::table(&keys)?)?;
    if std::env::var_os(WRITE_ENV).is_some() {
        std::fs::write(&path, &page).with_context(|| format!("write {}", path.display()))?;
        return Ok(());
    }
    ensure!(
        current == page,
        "the Armory keys table of {ARMORY_KEYS_PAGE} is not what ARMORY_KEYS in \
         {ARMORY_KEYS_SOURCE} says now: run `make book-reference` and commit it"
    );
    Ok(())
}
