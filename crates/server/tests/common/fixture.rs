//! The fixture package the HTTP tests serve, the server settings they share and a chat
//! request body to vary.

use oxgen_server::Config;
use oxgen_testkit::fixtures::{FixtureConfig, write_package};
use serde_json::{Value, json};

pub const MODEL: &str = "fixture";

pub fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    dir
}

/// The fixture package opened in-process on one thread: what served values are checked
/// against (`Model::logits`).
pub fn model(dir: &std::path::Path) -> oxgen::Model {
    let options = oxgen::ModelOptions {
        threads: 1,
        ..oxgen::ModelOptions::default()
    };
    oxgen::Model::open(dir, &options).unwrap()
}

pub fn config() -> Config {
    let mut c = Config::new(MODEL);
    c.aliases = vec!["other-name".into(), "org/fixture".into()];
    c.max_body = 4096;
    c.max_tokens_limit = 64;
    c
}

pub fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "the cat and the dog"}],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": true,
    });
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            body.as_object_mut().unwrap().remove(k);
        } else {
            body[k] = v.clone();
        }
    }
    body
}
