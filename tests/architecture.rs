//! The arrows of docs/architecture.md, checked on the sources: inside idem-core, a layer never
//! imports a layer below it (values and the decision, then the store traits, then the engine);
//! between crates, the forbidden dependencies of the map do not exist.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, its test modules cut off (a test may use anything).
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).unwrap_or_default();
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                found.push((path, code.to_owned()));
            }
        }
    }
    found
}

/// The `crate::` modules a source names, comments and `$crate` paths of macros aside.
fn named_modules(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if before != Some('$') && before.is_none_or(|c| !c.is_ascii_alphanumeric()) {
                names.push(name);
            }
            rest = after;
        }
    }
    names
}

fn core_file(name: &str) -> PathBuf {
    root().join("idem-core/src").join(name)
}

/// Which files of idem-core name a module in `forbidden`.
fn violations(files: &[(PathBuf, String)], forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, code) in files {
        for module in named_modules(code) {
            if forbidden.contains(&module.as_str()) {
                found.push(format!("{} imports crate::{module}", path.display()));
            }
        }
    }
    found
}

/// The values and the decision import nothing of the store traits, the engine, operations or
/// rendering.
#[test]
fn the_values_and_the_decision_import_nothing_above_them() {
    let values = [
        "key.rs",
        "wire_key.rs",
        "scope.rs",
        "fingerprint.rs",
        "token.rs",
        "clock.rs",
        "response.rs",
        "codec.rs",
        "record.rs",
        "doubt.rs",
        "request.rs",
        "policy.rs",
        "error.rs",
        "problem.rs",
        "lease.rs",
        "answer.rs",
        "begin.rs",
        "completion.rs",
        "resolution.rs",
        "trail.rs",
        "decision.rs",
    ];
    let files: Vec<_> = values
        .iter()
        .map(|name| {
            let path = core_file(name);
            let code = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            let code = code
                .split("#[cfg(test)]")
                .next()
                .unwrap_or_default()
                .to_owned();
            (path, code)
        })
        .collect();
    let found = violations(
        &files,
        &[
            "store", "engine", "render", "memory", "testing", "changes", "event", "outcome",
        ],
    );
    assert!(found.is_empty(), "{found:#?}");
}

/// The store traits import nothing of the engine, of reconciliation or of rendering.
#[test]
fn the_store_traits_import_nothing_of_the_engine() {
    let files = sources(&core_file("store"));
    assert!(!files.is_empty());
    let found = violations(&files, &["engine", "render", "memory", "testing"]);
    assert!(found.is_empty(), "{found:#?}");
}

/// The engine imports no rendering and no operator tooling.
#[test]
fn the_engine_imports_no_rendering_and_no_operations() {
    let files = sources(&core_file("engine"));
    assert!(!files.is_empty());
    let found = violations(&files, &["render", "memory", "testing"]);
    assert!(found.is_empty(), "{found:#?}");
}

/// Operations sit beside idem-core, arrows one way: the operator reads, the reconciliation of
/// records in doubt and the change-feed loop are idem-ops' (which depends on idem-core alone),
/// not idem-core's modules; the store crates use them through idem-ops.
#[test]
fn operations_live_beside_idem_core() {
    for moved in ["listing.rs", "feed.rs", "backoff.rs", "reconcile"] {
        assert!(
            !core_file(moved).exists(),
            "idem-core/src/{moved} belongs to idem-ops"
        );
    }
    assert_eq!(library_dependencies("idem-ops"), ["idem-core"]);
    for store in ["idem-sqlite", "idem-postgres", "idem-redis"] {
        let deps = library_dependencies(store);
        assert!(deps.contains(&"idem-ops".to_owned()), "{store}: {deps:?}");
    }
}

/// The idem crates a package's Cargo.toml depends on, in any dependency table.
fn idem_dependencies(package: &str) -> Vec<String> {
    dependencies_in(package, |table| table.contains("dependencies"))
}

/// The idem crates a package's library depends on: its tests' and examples' are left out.
fn library_dependencies(package: &str) -> Vec<String> {
    dependencies_in(package, |table| {
        table.contains("dependencies") && !table.contains("dev-dependencies")
    })
}

/// The idem crates of the dependency tables `wanted` picks by their header.
fn dependencies_in(package: &str, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let manifest = root().join(package).join("Cargo.toml");
    let text = fs::read_to_string(&manifest).unwrap_or_else(|e| panic!("{package}: {e}"));
    let mut found = Vec::new();
    let mut in_dependencies = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = wanted(line);
            continue;
        }
        if in_dependencies && line.starts_with("idem-") {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            found.push(name);
        }
    }
    found
}

/// No store crate imports the inbox or the outbox: they use the stores.
#[test]
fn no_store_crate_depends_on_the_inbox_or_the_outbox() {
    for store in ["idem-sqlite", "idem-postgres", "idem-redis"] {
        let deps = idem_dependencies(store);
        assert!(deps.contains(&"idem-core".to_owned()), "{store}: {deps:?}");
        for forbidden in ["idem-inbox", "idem-outbox", "idem-tower"] {
            assert!(
                !deps.contains(&forbidden.to_owned()),
                "{store} depends on {forbidden}"
            );
        }
    }
}

/// idem-tower reaches the SQL stores through `Transactional`: its library depends on no store
/// crate (its tests run on a real one).
#[test]
fn idem_tower_depends_on_no_store_crate() {
    let deps = library_dependencies("idem-tower");
    assert!(deps.contains(&"idem-core".to_owned()), "{deps:?}");
    for store in ["idem-sqlite", "idem-postgres", "idem-redis"] {
        assert!(
            !deps.contains(&store.to_owned()),
            "idem-tower depends on {store}"
        );
    }
}

/// idem-core depends on no other idem crate, and on no HTTP or tower crate.
#[test]
fn idem_core_depends_on_no_idem_crate() {
    let deps = idem_dependencies("idem-core");
    assert!(
        deps.iter().all(|d| d == "idem-core"),
        "idem-core depends on {deps:?}"
    );
}

/// idem-core has no HTTP, axum or tower dependency or feature: rendering is idem-tower's.
#[test]
fn idem_core_depends_on_no_http_crate() {
    let manifest = root().join("idem-core").join("Cargo.toml");
    let text = fs::read_to_string(&manifest).expect("idem-core's Cargo.toml");
    for line in text.lines().map(str::trim) {
        for forbidden in ["http", "axum", "tower"] {
            assert!(!line.starts_with(forbidden), "idem-core: {line}");
        }
    }
}
