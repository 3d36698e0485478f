//! Structured output on real-world schemas: Kubernetes' object schemas (kubernetes-validate),
//! SchemaStore's (vendored in check-jsonschema) and function-call parameters (the Berkeley
//! Function Calling Leaderboard's data), read from their wheels by `schema_corpus.py`.
//! Each is compiled as a strict `json_schema` request compiles it (objects closed, unknown
//! formats dropped) with the default model's tokenizer; the counts per source (compiled,
//! refused by reason) must equal the committed manifest
//! (`crates/testkit/thirdparty/schema_corpus/manifest.json`; `OXGEN_UPDATE_SCHEMA_CORPUS=1`
//! rewrites it). Then a sample of each source is answered by the default model at 256 and
//! 384 tokens, and every reply must parse and validate against the original schema.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use common::{default_model, start};
use oxgen::Constraint;
use oxgen_server::Config;
use serde_json::{Value, json};

/// Schemas per source answered by the model.
const SAMPLE: usize = 3;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/schema_corpus.py")
}

fn manifest_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/schema_corpus/manifest.json")
}

/// llguidance's refusal as a short reason: the keywords it names, or what kind of refusal.
fn reason(message: &str) -> String {
    let message = message.trim_start_matches("constraint: ");
    if let Some(keys) = message.strip_prefix("Unimplemented keys: ") {
        return keys.replace(['[', ']', '"'], "");
    }
    let kinds = [
        ("oneOf", "oneOf"),
        ("Resource '", "external $ref"),
        ("Invalid type", "a type JSON Schema has not"),
        ("Unsatisfiable", "unsatisfiable"),
        ("min/maxProperties", "minProperties/maxProperties"),
        ("too large", "too large"),
        ("Unknown format", "format"),
    ];
    match kinds.iter().find(|(needle, _)| message.contains(needle)) {
        Some((_, kind)) => kind.to_string(),
        None => message.chars().take(60).collect(),
    }
}

#[test]
fn real_world_schemas_compile_as_the_manifest_says_and_their_replies_validate() {
    let python = std::env::var("OXGEN_PYTHON").expect("OXGEN_PYTHON: run scripts/test.sh");
    let wheels = std::env::var("OXGEN_SCHEMA_WHEELS")
        .expect("OXGEN_SCHEMA_WHEELS (the corpus's wheels): run scripts/test.sh");
    let work = tempfile::tempdir().unwrap();
    let corpus = work.path().join("corpus.jsonl");
    let out = Command::new(&python)
        .arg(script())
        .args(["extract", &wheels])
        .arg(&corpus)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let model = oxgen::Model::open(default_model(), &Default::default()).unwrap();
    let grammars = model.grammars().unwrap();
    let mut counts: BTreeMap<String, (usize, usize, BTreeMap<String, usize>)> = BTreeMap::new();
    let mut compiled: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(&corpus).unwrap().lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        let source = entry["source"].as_str().unwrap().to_string();
        let schema = oxgen::close_objects(&entry["schema"]);
        let c = counts.entry(source.clone()).or_default();
        c.0 += 1;
        match grammars.compile(&Constraint::JsonSchema(schema)) {
            Ok(_) => {
                c.1 += 1;
                let ids = compiled.entry(source).or_default();
                ids.push(entry["id"].as_str().unwrap().to_string());
            }
            Err(e) => *c.2.entry(reason(&e.to_string())).or_default() += 1,
        }
    }
    let sources: serde_json::Map<String, Value> = (counts.iter())
        .map(|(source, (schemas, ok, refused))| {
            (
                source.clone(),
                json!({"schemas": schemas, "compiled": ok, "refused": refused}),
            )
        })
        .collect();
    let manifest = json!({"sources": sources});
    if std::env::var_os("OXGEN_UPDATE_SCHEMA_CORPUS").is_some() {
        let text = serde_json::to_string_pretty(&manifest).unwrap() + "\n";
        std::fs::write(manifest_path(), text).unwrap();
    }
    let committed: Value =
        serde_json::from_str(&std::fs::read_to_string(manifest_path()).unwrap()).unwrap();
    assert_eq!(
        manifest, committed,
        "the corpus compiles differently from the manifest (OXGEN_UPDATE_SCHEMA_CORPUS=1 \
         rewrites it)"
    );
    let total: u64 = (sources.values())
        .map(|s| s["schemas"].as_u64().unwrap())
        .sum();
    assert!(sources.len() >= 3 && total >= 1000, "{manifest}");
    drop(model);

    // Evenly spread over each source's compiled schemas.
    let mut sample = String::new();
    for ids in compiled.values() {
        for i in 0..SAMPLE {
            sample.push_str(&ids[i * ids.len() / SAMPLE]);
            sample.push('\n');
        }
    }
    let ids = work.path().join("sample.txt");
    std::fs::write(&ids, sample).unwrap();
    let server = start(&default_model(), 2, Config::new("m"));
    let out = Command::new(&python)
        .arg(script())
        .arg("run")
        .arg(format!("http://{}", server.addr()))
        .arg("m")
        .arg(&corpus)
        .arg(&ids)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    println!("{report}");
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.shutdown().unwrap();
}
