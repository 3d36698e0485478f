//! Prints a GGUF file's header, metadata (values truncated) and tensor infos.
//!
//! `cargo run -p oxgen-gguf --example gguf_dump -- model.gguf [--dequantize]`
//!
//! With `--dequantize`, also dequantizes every tensor of a supported type and repacks every
//! 2-D quantized one (MatMulNBits, and GatherBlockQuantized where representable), printing a
//! checksum — a smoke test that the whole file reads.

use std::process::ExitCode;

use oxgen_gguf::{GgufError, GgufFile, Value};

/// Longest value shown, in characters.
const MAX_VALUE_CHARS: usize = 100;

fn show(value: &Value) -> String {
    let s = value.to_string();
    match s.char_indices().nth(MAX_VALUE_CHARS) {
        Some((cut, _)) => format!("{}… ({} chars)", &s[..cut], s.chars().count()),
        None => s,
    }
}

fn run(path: &str, dequantize: bool) -> Result<(), GgufError> {
    let f = GgufFile::open(path)?;
    println!(
        "{path}: GGUF v{}, {} metadata entries, {} tensors, alignment {}, data at {}",
        f.version(),
        f.metadata().len(),
        f.tensors().len(),
        f.alignment(),
        f.data_offset()
    );
    for (key, value) in f.metadata() {
        let len = match value {
            Value::Array(a) => format!("[{}]", a.len()),
            _ => String::new(),
        };
        println!(
            "  {key}: {}{len} = {}",
            value.type_description(),
            show(value)
        );
    }
    for t in f.tensors() {
        println!(
            "  tensor {:<32} {:<6} ne {:?} offset {} ({} bytes)",
            t.name, t.ggml_type, t.dims, t.offset, t.n_bytes
        );
    }
    if dequantize {
        for t in f.tensors() {
            let d = match f.dequantize(&t.name) {
                Ok(d) => d,
                Err(e) => {
                    println!("  skip {}: {e}", t.name);
                    continue;
                }
            };
            let values = d.as_slice::<f32>().expect("dequantize returns f32");
            let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
            let mut line = format!("  {} {:?}: sum {sum:.6}", t.name, d.dims());
            if t.dims.len() == 2 && t.ggml_type.block_elems() > 1 {
                let m = f.matmul_nbits(&t.name)?;
                line += &format!(", MatMulNBits {}-bit B {:?}", m.bits, m.b.dims());
                match f.gather_block_quantized(&t.name) {
                    Ok(g) => line += &format!(", GatherBlockQuantized data {:?}", g.data.dims()),
                    Err(GgufError::Unsupported { .. }) => line += ", no GatherBlockQuantized",
                    Err(e) => return Err(e),
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dequantize = args.iter().any(|a| a == "--dequantize");
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [path] = paths.as_slice() else {
        eprintln!("usage: gguf_dump FILE.gguf [--dequantize]");
        return ExitCode::from(2);
    };
    match run(path, dequantize) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
