//! The prefix cache's disk tier on the default model: a prompt's KV read back from disk
//! (after its blocks left the pool, or after a restart) gives the same greedy text as a
//! cold run, for f32 and int8 caches; an altered file is never used. A saved chat resumes
//! with its KV.
//!
//! The model comes from `$OXGEN_DEFAULT_MODEL` (set by `scripts/test.sh`).

use std::path::Path;

use oxgen::{GenerateOptions, KvBudget, KvDtype, Model, ModelOptions, Output, Prompt};
use oxgen_testkit::default_model_dir;

fn open(disk: Option<&Path>, kv_dtype: Option<KvDtype>, blocks: usize) -> Model {
    let options = ModelOptions {
        threads: 2,
        memory: oxgen::MemoryOptions {
            kv_dtype,
            kv: KvBudget::Blocks(blocks),
            ..Default::default()
        },
        kv_disk_cache: disk.map(Path::to_path_buf),
        ..ModelOptions::default()
    };
    Model::open(default_model_dir(), &options).expect("opening the default model")
}

fn prompt(topic: &str) -> Prompt {
    let notes = format!("Notes on {topic}: it matters, it is old, it is studied. ").repeat(8);
    Prompt::chat(&[
        (
            "system",
            "You are a careful assistant who answers in one sentence.",
        ),
        ("user", &format!("{notes}Summarize the notes.")),
    ])
}

fn generate(model: &mut Model, prompt: &Prompt) -> Output {
    let options = GenerateOptions {
        max_new_tokens: 24,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    model.reset();
    model.generate(prompt, &options, |_| {}).unwrap()
}

fn kvb_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "kvb") {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn greedy_text_is_the_same_cold_from_disk_and_after_a_restart() {
    for kv in [None, Some(KvDtype::Int8)] {
        let dir = tempfile::tempdir().unwrap();
        let first = prompt("tides");
        let cold = generate(&mut open(None, kv, 64), &first);
        let blocks = cold.usage.prompt_tokens / 16;
        assert!(blocks >= 6, "the prompt spans several blocks");

        // Written as it is computed, then read back after a restart.
        let mut model = open(Some(dir.path()), kv, 64);
        let written = generate(&mut model, &first);
        assert_eq!(
            written.text, cold.text,
            "{kv:?}: the tier changes nothing cold"
        );
        assert_eq!(written.usage.prefix_reused, 0);
        drop(model);
        assert!(kvb_files(dir.path()).len() >= blocks);
        let mut model = open(Some(dir.path()), kv, 64);
        let restarted = generate(&mut model, &first);
        assert_eq!(restarted.text, cold.text, "{kv:?}: after a restart");
        assert_eq!(restarted.usage.prefix_reused, blocks * 16, "{kv:?}");
        let usage = model.kv_usage().unwrap();
        assert_eq!(usage.prefix_disk_hits as usize, blocks);
        let disk = model.kv_disk().unwrap();
        assert_eq!((disk.hits as usize, disk.rejected), (blocks, 0));

        // Another prompt takes every block of a small pool; the first comes back from disk.
        let mut model = open(Some(dir.path()), kv, blocks + 4);
        generate(&mut model, &prompt("volcanoes"));
        generate(&mut model, &prompt("glaciers"));
        let evicted = model.kv_usage().unwrap().evictions;
        assert!(evicted > 0, "the pool evicted cached blocks");
        let again = generate(&mut model, &first);
        assert_eq!(again.text, cold.text, "{kv:?}: after eviction from memory");
        assert_eq!(again.usage.prefix_reused, blocks * 16);
    }
}

#[test]
fn an_altered_cache_file_is_ignored_and_its_prefix_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let first = prompt("comets");
    let cold = generate(&mut open(Some(dir.path()), None, 64), &first);
    let mut files = kvb_files(dir.path());
    files.sort_by_key(|f| std::fs::metadata(f).unwrap().len());
    // The first block's file is the shortest (the least prefix): alter one byte of its KV.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x10;
    std::fs::write(&files[0], &bytes).unwrap();
    // Truncate another.
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() / 2]).unwrap();

    let mut model = open(Some(dir.path()), None, 64);
    let out = generate(&mut model, &first);
    assert_eq!(out.text, cold.text);
    assert_eq!(
        out.usage.prefix_reused, 0,
        "the chain breaks at its first block"
    );
    // The altered one when read, the truncated one when the folder was indexed at open.
    assert_eq!(model.kv_disk().unwrap().rejected, 2);
    drop(model);
    // Both were written again whole, and the next run reads every block.
    let mut model = open(Some(dir.path()), None, 64);
    let out = generate(&mut model, &first);
    assert_eq!(out.text, cold.text);
    assert_eq!(out.usage.prefix_reused, cold.usage.prompt_tokens / 16 * 16);
}

/// A saved conversation resumes with its KV: the next turn prefills only what it adds and
/// answers as the unsaved conversation does; an altered file is refused; a model whose KV
/// is laid out otherwise resumes the messages alone and says why.
#[test]
fn a_saved_chat_resumes_without_a_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rivers.session");
    let options = GenerateOptions {
        max_new_tokens: 12,
        ..GenerateOptions::default()
    };
    // A chat keeps a sequence of a fixed size, as `oxgen run` does.
    let open = |kv_dtype| {
        let options = ModelOptions {
            threads: 2,
            memory: oxgen::MemoryOptions {
                kv_dtype,
                ctx_size: Some(512),
                ..Default::default()
            },
            ..ModelOptions::default()
        };
        Model::open(default_model_dir(), &options).unwrap()
    };
    let mut model = open(None);
    let mut chat = oxgen::Chat::new(Some("You answer briefly."));
    chat.send(&mut model, "Name three rivers.", &options, |_| {})
        .unwrap();
    let saved = chat.save(&mut model, &file).unwrap();
    assert!(saved > 20, "{saved} positions of KV saved");
    let next = chat
        .send(&mut model, "Which is the longest?", &options, |_| {})
        .unwrap();

    assert_eq!(next.usage.prefix_reused, saved);

    let mut fresh = open(None);
    let resumed = oxgen::Chat::load(&mut fresh, &file).unwrap();
    assert_eq!((resumed.kv_positions, resumed.note), (saved, None));
    let mut chat = resumed.chat;
    assert_eq!(chat.messages().len(), 2);
    let again = chat
        .send(&mut fresh, "Which is the longest?", &options, |_| {})
        .unwrap();
    assert_eq!(again.text, next.text);
    assert_eq!(
        again.usage.prefix_reused, saved,
        "the conversation was not prefilled"
    );

    // Another layout (an int8 cache) takes the messages alone.
    let mut int8 = open(Some(KvDtype::Int8));
    let resumed = oxgen::Chat::load(&mut int8, &file).unwrap();
    assert_eq!(resumed.kv_positions, 0);
    assert!(resumed.note.unwrap().contains("does not fit"));

    // One altered byte of KV: refused.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let err = oxgen::Chat::load(&mut fresh, &file)
        .unwrap_err()
        .to_string();
    assert!(err.contains("checksum"), "{err}");
}
