//! The ONNX loader on arbitrary bytes: protobuf decoding, external-data references (resolved
//! against an empty folder, so every one must be refused cleanly), initializer reads, and the
//! graph IR with its typed ops. Anything may fail; nothing may panic.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

fn empty_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join("oxgen-fuzz-empty");
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        dir
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let bytes = bytes::Bytes::copy_from_slice(data);
    let Ok(model) = oxgen_onnx::Model::from_bytes(bytes, Some(empty_dir())) else {
        return;
    };
    let _ = model.external_files();
    for init in &model.graph().initializer {
        let _ = model.tensor(init);
    }
    let _ = oxgen_graph::Graph::from_model(&model);
});
