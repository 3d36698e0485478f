//! The GGUF reader on arbitrary bytes (untrusted files): header, metadata, tensor infos and
//! their data ranges. Anything may fail; nothing may panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(file) = oxgen_gguf::GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata() {
        let _ = (key.len(), format!("{value:?}").len());
    }
    let _ = (file.version(), file.alignment(), file.data_offset());
});
