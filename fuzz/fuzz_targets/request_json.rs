//! The server's request parsing: arbitrary bodies for both completion endpoints, as the
//! HTTP side parses and validates them before anything reaches the model. Errors are
//! expected; panics are bugs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = oxgen_server::validate_request(true, data);
    let _ = oxgen_server::validate_request(false, data);
});
