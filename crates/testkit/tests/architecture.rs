//! The crate map in ARCHITECTURE.md is the truth about dependencies: this test compares it
//! with `cargo metadata` so the map cannot drift and no dependency points up a layer, and
//! with the paths each crate's source names, so no dependency is declared but unused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

struct Row {
    layer: Option<u32>,
    deps: BTreeSet<String>,
}

fn crate_map() -> BTreeMap<String, Row> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md exists at the root");
    text.lines()
        .filter(|l| l.starts_with("| oxgen"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 4, "crate map row needs 4 cells: {l}");
            let deps = cells[3]
                .split(',')
                .map(str::trim)
                .filter(|d| d.starts_with("oxgen"))
                .map(String::from)
                .collect();
            (
                cells[0].to_string(),
                Row {
                    layer: cells[1].parse().ok(),
                    deps,
                },
            )
        })
        .collect()
}

fn metadata() -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, &mut files);
    files
}

/// The oxgen crates a package's library or binary source names (`oxgen_exec::…`,
/// `oxgen::…`), outside comments; tests, benches and examples are not counted.
fn source_edges(manifest: &Path) -> BTreeSet<String> {
    let files = rust_files(
        &manifest
            .parent()
            .expect("a manifest has a folder")
            .join("src"),
    );
    let mut used = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source files are UTF-8");
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            let mut rest = line;
            while let Some(at) = rest.find("oxgen") {
                let before = rest[..at].chars().next_back();
                let tail = &rest[at..];
                let len = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                let ident = &tail[..len];
                let is_path = tail[len..].starts_with("::");
                let in_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '"';
                if !before.is_some_and(in_word) && is_path {
                    used.insert(ident.replace('_', "-"));
                }
                rest = &tail[len.max(1)..];
            }
        }
    }
    used
}

#[test]
fn every_declared_dependency_is_used_in_the_source() {
    let meta = metadata();
    for package in meta["packages"].as_array().expect("packages is an array") {
        let name = package["name"].as_str().expect("package name");
        let declared: BTreeSet<String> = (package["dependencies"].as_array().into_iter())
            .flatten()
            .filter(|d| {
                d["kind"].is_null() && d["name"].as_str().is_some_and(|n| n.starts_with("oxgen"))
            })
            .map(|d| d["name"].as_str().expect("dependency name").to_string())
            .collect();
        let manifest = Path::new(package["manifest_path"].as_str().expect("manifest path"));
        let mut used = source_edges(manifest);
        used.remove(name);
        assert_eq!(
            declared, used,
            "{name}: the oxgen crates its Cargo.toml declares differ from those its source uses"
        );
    }
}

#[test]
fn crate_map_matches_cargo_metadata() {
    let meta = metadata();
    let map = crate_map();
    let mut seen = BTreeSet::new();
    for package in meta["packages"].as_array().expect("packages is an array") {
        let name = package["name"].as_str().expect("package name").to_string();
        let Some(row) = map.get(&name) else {
            panic!("{name} is a workspace crate missing from ARCHITECTURE.md's crate map");
        };
        seen.insert(name.clone());
        let deps: BTreeSet<String> = package["dependencies"]
            .as_array()
            .expect("dependencies is an array")
            .iter()
            .filter(|d| {
                d["kind"].is_null() && d["name"].as_str().is_some_and(|n| n.starts_with("oxgen"))
            })
            .map(|d| d["name"].as_str().expect("dependency name").to_string())
            .collect();
        assert_eq!(
            deps, row.deps,
            "{name}: Cargo.toml dependencies differ from ARCHITECTURE.md"
        );
        for dep in &deps {
            let dep_layer = map[dep].layer;
            assert!(
                matches!((row.layer, dep_layer), (Some(a), Some(b)) if b < a)
                    || row.layer.is_none(),
                "{name} (layer {:?}) depends on {dep} (layer {dep_layer:?}): dependencies must point down",
                row.layer
            );
        }
        for (dev, kind) in package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| (d["name"].as_str(), d["kind"].as_str()))
        {
            assert!(
                !(dev == Some("oxgen-testkit") && kind.is_none()),
                "{name} depends on oxgen-testkit outside dev-dependencies"
            );
        }
    }
    let missing: Vec<&String> = map.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md lists crates that do not exist: {missing:?}"
    );
}

/// The facade owns scheduling and chat preparation: the front ends (the server, the Python
/// package) submit to `oxgen::Engine` and prepare requests with `oxgen::prepare`, so none of
/// them steps a batch or composes a tool or reasoning grammar itself.
#[test]
fn front_ends_schedule_and_prepare_through_the_facade() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for front_end in ["server", "python"] {
        for file in rust_files(&crates.join(front_end).join("src")) {
            let text = std::fs::read_to_string(&file).expect("source files are UTF-8");
            for facade_only in ["advance_batch", "tool_grammar(", "after_reasoning("] {
                assert!(
                    !text.contains(facade_only),
                    "{} calls {facade_only}, which only the facade's engine and prepare may",
                    file.display()
                );
            }
        }
    }
}
