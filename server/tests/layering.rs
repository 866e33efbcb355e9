//! The server's layering, checked: every `crate::…` path in a module names only modules that
//! module may depend on, so a back-edge (say, the engine reaching into MCP) fails the tests.
//! See ARCHITECTURE.md ("Dependencies point one way").

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each top-level module of `server/src` and the modules it may name. `http` is the composition
/// root: it opens the store, registers the kinds and wires the rest.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "http",
        &[
            "auth",
            "config",
            "engine",
            "heap",
            "kinds",
            "mcp",
            "store",
            "streams",
            "telemetry",
        ],
    ),
    (
        "mcp",
        &["auth", "config", "counts", "engine", "streams", "telemetry"],
    ),
    ("streams", &["counts", "store", "telemetry"]),
    ("kinds", &["engine"]),
    ("engine", &["store", "telemetry"]),
    ("store", &["telemetry"]),
    // Names of the metrics, recorded where things happen.
    ("telemetry", &[]),
    // Handing freed memory back to the system.
    ("heap", &[]),
    ("config", &["auth", "store"]),
    ("auth", &[]),
    // Per-key counts of what is alive (open streams, waiting calls).
    ("counts", &[]),
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The modules a file names through `crate::`, comments and the unit-test module left out
/// (tests wire real parts together, a store under an engine under the MCP layer).
fn named_modules(source: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for line in source.lines() {
        if line.trim() == "#[cfg(test)]" {
            break;
        }
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let grouped = after.starts_with('{');
            if grouped {
                // `use crate::{a, b::c}`: every first segment in the group.
                let group = after[1..].split('}').next().unwrap_or_default();
                for item in group.split(',') {
                    let first: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !first.is_empty() {
                        named.insert(first);
                    }
                }
            } else if !name.is_empty() {
                named.insert(name);
            }
            rest = after;
        }
    }
    named
}

#[test]
fn modules_depend_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut violations = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("inside src");
        let module = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|name| name.trim_end_matches(".rs"))
            .expect("a module name");
        if module == "lib" {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(name, _)| *name == module)
            .map(|(_, allowed)| *allowed)
            .unwrap_or_else(|| panic!("module {module} is not in the layering table"));
        let source = std::fs::read_to_string(file).expect("readable source");
        for named in named_modules(&source) {
            if named != module && !allowed.contains(&named.as_str()) {
                violations.push(format!("{} names crate::{named}", relative.display()));
            }
        }
    }
    assert!(violations.is_empty(), "back-edges: {violations:#?}");
}

#[test]
fn the_shared_crate_stays_portable() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/Cargo.toml");
    let manifest = std::fs::read_to_string(manifest).expect("shared/Cargo.toml");
    for runtime in ["tokio", "axum", "rmcp", "rusqlite", "reqwest"] {
        assert!(
            !manifest.lines().any(|line| line.starts_with(runtime)),
            "the shared crate must build for wasm32 without {runtime}"
        );
    }
}

#[test]
fn the_scanner_sees_plain_grouped_and_inline_paths() {
    let named = named_modules(
        "use crate::engine::Engine;\nuse crate::{store::Store, streams};\n\
         let x = crate::mcp::error::ApiError::invalid(\"\"); // crate::http is a comment\n\
         #[cfg(test)]\nuse crate::config::Config;",
    );
    let named: Vec<&str> = named.iter().map(String::as_str).collect();
    assert_eq!(named, ["engine", "mcp", "store", "streams"]);
}
