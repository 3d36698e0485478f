//! The server's request parsing: arbitrary bodies for every generating endpoint (OpenAI's
//! chat completions, completions and Responses, Anthropic's Messages, Ollama's chat and
//! generate), as the HTTP side parses and validates them before anything reaches the model.
//! Errors are expected; panics are bugs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for endpoint in oxgen_server::REQUEST_ENDPOINTS {
        let _ = oxgen_server::validate_request(endpoint, data);
    }
});
