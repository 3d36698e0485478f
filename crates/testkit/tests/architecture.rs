//! The crate map in ARCHITECTURE.md is the truth about dependencies: this test compares it
//! with `cargo metadata` so the map cannot drift and no dependency points up a layer.

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

#[test]
fn crate_map_matches_cargo_metadata() {
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
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
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
