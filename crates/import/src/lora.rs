//! LoRA adapter files (untrusted, DESIGN.md §5.3) → [`oxgen_runtime::Adapter`]: each
//! module's `A` as `[in, rank]` and `B` as `[rank, out]` with the adapter's scale folded in,
//! named as Hugging Face names the projection (`model.layers.0.self_attn.q_proj`).
//!
//! Two formats:
//!
//! - **PEFT folders** (`adapter_config.json` + `adapter_model.safetensors`): tensors
//!   `base_model.model.<module>.lora_A.weight` (`[rank, in]`) and `.lora_B.weight`
//!   (`[out, rank]`); the scale is `lora_alpha / r`, or `lora_alpha / sqrt(r)` with
//!   `use_rslora`, per module where `rank_pattern` / `alpha_pattern` name it. What would
//!   change the model beyond low-rank products (DoRA, `modules_to_save`, LoRA biases,
//!   embedding adapters) is refused.
//! - **onnxruntime's `.onnx_adapter`** (what `onnxruntime.AdapterFormat` writes and
//!   onnxruntime-genai's `Adapters` loads): a FlatBuffers file, identifier `TORT`, whose
//!   root table holds `format_version`, `adapter_version`, `model_version` and a vector of
//!   parameters (`name`, `dims` int64, `data_type` in ONNX's numbering, `raw_data` bytes).
//!   Parameters are named as the base graph's LoRA inputs, which onnxruntime-genai's builder
//!   names `model.layers.0.attn.q_proj.lora_A.MatMul.weight` (`[in, rank]`) and
//!   `...lora_B.MatMul.weight` (`[rank, out]`, scale folded in already).

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use oxgen_runtime::{Adapter, LoraModule, content_key};

use crate::ImportError;
use crate::safetensors::SafeTensors;

/// Reads an adapter: a PEFT folder or an `.onnx_adapter` file.
pub fn read_adapter(path: &Path) -> Result<Adapter, ImportError> {
    if path.is_dir() {
        return read_peft(path);
    }
    let bytes = std::fs::read(path).map_err(|e| ImportError::io(path, "read", e))?;
    read_onnx_adapter(path, &bytes)
}

fn problem(path: &Path, what: impl Into<String>) -> ImportError {
    ImportError::Folder {
        dir: path.to_path_buf(),
        problem: what.into(),
    }
}

/// A matrix's dims and values.
type Matrix = (Vec<usize>, Vec<f32>);

/// Each module's `A` and `B` as read so far.
type Halves = BTreeMap<String, [Option<Matrix>; 2]>;

/// Pairs of `A` and `B` by module, checked: ranks agree, both present.
fn pair(
    path: &Path,
    halves: Halves,
    scale: impl Fn(&str, usize) -> f32,
) -> Result<Vec<LoraModule>, ImportError> {
    let mut modules = Vec::with_capacity(halves.len());
    for (module, [a, b]) in halves {
        let (Some((a_dims, a)), Some((b_dims, mut b))) = (a, b) else {
            return Err(problem(
                path,
                format!("module '{module}' has only one of its lora_A and lora_B matrices"),
            ));
        };
        let (&[in_features, rank], &[b_rank, out_features]) = (&a_dims[..], &b_dims[..]) else {
            return Err(problem(
                path,
                format!(
                    "module '{module}': lora_A has shape {a_dims:?} and lora_B {b_dims:?}; \
                     both must be matrices"
                ),
            ));
        };
        if rank != b_rank || rank == 0 {
            return Err(problem(
                path,
                format!(
                    "module '{module}': lora_A has rank {rank} ([in, rank] = {a_dims:?}) but \
                     lora_B has {b_rank} ([rank, out] = {b_dims:?}); the ranks must agree and \
                     not be 0"
                ),
            ));
        }
        let s = scale(&module, rank);
        if s != 1.0 {
            b.iter_mut().for_each(|v| *v *= s);
        }
        modules.push(LoraModule {
            module,
            rank,
            in_features,
            out_features,
            a,
            b,
        });
    }
    if modules.is_empty() {
        return Err(problem(path, "the adapter holds no LoRA matrices"));
    }
    Ok(modules)
}

/// Characters that make a PEFT pattern a regular expression rather than a name.
const REGEX_CHARS: &[char] = &[
    '*', '+', '?', '[', ']', '(', ')', '{', '}', '|', '^', '$', '\\',
];

/// Whether PEFT's pattern `key` names `module` (the whole name, or its last dotted parts).
fn pattern_names(key: &str, module: &str) -> bool {
    module == key || module.ends_with(&format!(".{key}"))
}

fn read_peft(dir: &Path) -> Result<Adapter, ImportError> {
    let config_path = dir.join("adapter_config.json");
    let config_bytes =
        std::fs::read(&config_path).map_err(|e| ImportError::io(&config_path, "read", e))?;
    let config: serde_json::Value = serde_json::from_slice(&config_bytes)
        .map_err(|e| problem(&config_path, format!("is not JSON: {e}")))?;
    let field = |k: &str| config.get(k).filter(|v| !v.is_null());
    if let Some(kind) = field("peft_type").and_then(|v| v.as_str())
        && kind != "LORA"
    {
        return Err(problem(
            &config_path,
            format!("peft_type is {kind}; only LoRA adapters (LORA) are supported"),
        ));
    }
    let refused = [
        ("use_dora", "DoRA adapters"),
        (
            "modules_to_save",
            "modules_to_save (whole modules trained beside the adapter)",
        ),
        ("lora_bias", "LoRA biases"),
        ("fan_in_fan_out", "fan_in_fan_out (Conv1D-style weights)"),
    ];
    for (key, what) in refused {
        let set = field(key).is_some_and(|v| match v {
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::Array(a) => !a.is_empty(),
            _ => true,
        });
        if set {
            return Err(problem(
                &config_path,
                format!("sets {key}: {what} are not supported; only plain low-rank products are"),
            ));
        }
    }
    let number = |v: &serde_json::Value| v.as_f64();
    let alpha = field("lora_alpha").and_then(number).unwrap_or(8.0);
    let rslora = field("use_rslora")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let alpha_pattern: Vec<(String, f64)> = field("alpha_pattern")
        .and_then(|v| v.as_object())
        .map(|m| {
            (m.iter())
                .filter_map(|(k, v)| Some((k.clone(), number(v)?)))
                .collect()
        })
        .unwrap_or_default();
    if let Some((key, _)) = (alpha_pattern.iter()).find(|(k, _)| k.contains(REGEX_CHARS)) {
        return Err(problem(
            &config_path,
            format!(
                "alpha_pattern key '{key}' is a regular expression; only module names and \
                 their dotted suffixes (q_proj, layers.0.self_attn.q_proj) are read"
            ),
        ));
    }
    let weights_path = dir.join("adapter_model.safetensors");
    if !weights_path.is_file() {
        return Err(problem(
            dir,
            "has no adapter_model.safetensors (a PEFT folder saved with safe_serialization; \
             adapter_model.bin, a pickle, is not read)",
        ));
    }
    let file = SafeTensors::open(&weights_path)?;
    let file_len = std::fs::metadata(&weights_path).map_or(0, |m| m.len());
    let mut values_read = 0u64;
    let mut halves = Halves::new();
    for name in file.names() {
        let Some(rest) = name.strip_prefix("base_model.model.") else {
            return Err(problem(
                &weights_path,
                format!("tensor '{name}' is not under base_model.model (not a PEFT adapter)"),
            ));
        };
        let (module, half) = if let Some(m) = rest.strip_suffix(".lora_A.weight") {
            (m, 0)
        } else if let Some(m) = rest.strip_suffix(".lora_B.weight") {
            (m, 1)
        } else {
            return Err(problem(
                &weights_path,
                format!(
                    "tensor '{name}' is not a lora_A or lora_B weight (embedding adapters, \
                     biases and DoRA magnitudes are not supported)"
                ),
            ));
        };
        let (_, dims) = file.info(name)?;
        let dims = dims.to_vec();
        let [rows, cols] = dims[..] else {
            return Err(problem(
                &weights_path,
                format!("tensor '{name}' has shape {dims:?}; a matrix is needed"),
            ));
        };
        // Tensors may not overlap: what they decode to is bounded by the file.
        values_read = values_read.saturating_add((rows as u64).saturating_mul(cols as u64));
        if values_read.saturating_mul(2) > file_len {
            return Err(problem(
                &weights_path,
                format!("tensor '{name}' overlaps others (more values than the file holds)"),
            ));
        }
        // PEFT stores torch's `Linear` layout, [out, in]: A is [rank, in], B [out, rank].
        let t = file.linear(name, rows, cols)?;
        let values = t.as_slice::<f32>().expect("f32").to_vec();
        let slot = &mut halves.entry(module.to_string()).or_default()[half];
        *slot = Some((vec![cols, rows], values));
    }
    let scale = |module: &str, rank: usize| {
        let a = (alpha_pattern.iter())
            .find(|(k, _)| pattern_names(k, module))
            .map_or(alpha, |(_, a)| *a);
        let r = rank as f64;
        (if rslora { a / r.sqrt() } else { a / r }) as f32
    };
    Ok(Adapter {
        modules: pair(&weights_path, halves, scale)?,
        key: content_key(&[&config_bytes, file.file_bytes()]),
    })
}

/// A FlatBuffers reader over untrusted bytes: every offset is checked.
struct Flat<'a> {
    bytes: &'a [u8],
}

impl<'a> Flat<'a> {
    fn get<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        self.bytes.get(at..at.checked_add(N)?)?.try_into().ok()
    }
    fn u32(&self, at: usize) -> Option<usize> {
        self.get::<4>(at).map(|b| u32::from_le_bytes(b) as usize)
    }
    /// Where field `field` of the table at `table` lies, when present.
    fn field(&self, table: usize, field: usize) -> Option<usize> {
        let soffset = i32::from_le_bytes(self.get::<4>(table)?) as isize;
        let vtable = (table as isize).checked_sub(soffset)? as usize;
        let vlen = u16::from_le_bytes(self.get::<2>(vtable)?) as usize;
        let entry = 4 + 2 * field;
        if entry + 2 > vlen {
            return None;
        }
        let off = u16::from_le_bytes(self.get::<2>(vtable + entry)?) as usize;
        (off != 0).then_some(table + off)
    }
    /// What an offset field at `at` points to.
    fn deref(&self, at: usize) -> Option<usize> {
        at.checked_add(self.u32(at)?)
    }
    /// A vector's element count and first element.
    fn vector(&self, at: usize, width: usize) -> Option<(usize, usize)> {
        let v = self.deref(at)?;
        let len = self.u32(v)?;
        let end = (v + 4).checked_add(len.checked_mul(width)?)?;
        (end <= self.bytes.len()).then_some((len, v + 4))
    }
    /// An int field (absent: 0); `None` when the table is out of bounds.
    fn int(&self, table: usize, field: usize) -> Option<i32> {
        self.get::<4>(table)?;
        match self.field(table, field) {
            Some(at) => self.get::<4>(at).map(i32::from_le_bytes),
            None => Some(0),
        }
    }
}

/// One parameter of an `.onnx_adapter`: name, dims, values as f32.
fn parameter(flat: &Flat, table: usize) -> Result<(String, Vec<usize>, Vec<f32>), String> {
    let bad = |what: &str| format!("a parameter's {what} is out of bounds or malformed");
    let name_at = flat.field(table, 0).ok_or("a parameter has no name")?;
    let (len, start) = flat.vector(name_at, 1).ok_or_else(|| bad("name"))?;
    let name = std::str::from_utf8(&flat.bytes[start..start + len])
        .map_err(|_| "a parameter's name is not UTF-8".to_string())?
        .to_string();
    let dims = match flat.field(table, 1) {
        None => Vec::new(),
        Some(at) => {
            let (n, start) = flat.vector(at, 8).ok_or_else(|| bad("dims"))?;
            (0..n)
                .map(|i| {
                    let d = i64::from_le_bytes(flat.get::<8>(start + 8 * i).expect("in bounds"));
                    usize::try_from(d).map_err(|_| format!("parameter '{name}' has dim {d}"))
                })
                .collect::<Result<Vec<usize>, String>>()?
        }
    };
    let dtype = flat.int(table, 2).ok_or_else(|| bad("data_type"))?;
    let (n, start) = match flat.field(table, 3) {
        Some(at) => flat.vector(at, 1).ok_or_else(|| bad("raw_data"))?,
        None => (0, 0),
    };
    let raw = &flat.bytes[start..start + n];
    let numel = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let (width, convert): (usize, fn(&[u8]) -> f32) = match dtype {
        1 => (4, |b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
        10 => (2, |b| {
            f16::from_le_bytes(b.try_into().expect("2 bytes")).to_f32()
        }),
        16 => (2, |b| {
            bf16::from_le_bytes(b.try_into().expect("2 bytes")).to_f32()
        }),
        other => {
            return Err(format!(
                "parameter '{name}' has data type {other}; float32 (1), float16 (10) and \
                 bfloat16 (16) are read"
            ));
        }
    };
    if numel.and_then(|n| n.checked_mul(width)) != Some(raw.len()) {
        return Err(format!(
            "parameter '{name}' holds {} bytes for dims {dims:?}; the file is corrupt",
            raw.len()
        ));
    }
    Ok((name, dims, raw.chunks_exact(width).map(convert).collect()))
}

fn read_onnx_adapter(path: &Path, bytes: &[u8]) -> Result<Adapter, ImportError> {
    let bad = |what: String| problem(path, what);
    if bytes.get(4..8) != Some(b"TORT") {
        return Err(bad(
            "is not an onnxruntime adapter (no TORT identifier; give an .onnx_adapter file or a \
             PEFT folder)"
                .into(),
        ));
    }
    let flat = Flat { bytes };
    let root = flat.u32(0).ok_or_else(|| bad("is truncated".into()))?;
    let version = flat
        .int(root, 0)
        .ok_or_else(|| bad("is truncated".into()))?;
    if version != 1 {
        return Err(bad(format!(
            "has adapter format version {version}; version 1 is read"
        )));
    }
    let params = flat
        .field(root, 3)
        .ok_or_else(|| bad("holds no parameters".into()))?;
    let (n, first) = flat
        .vector(params, 4)
        .ok_or_else(|| bad("its parameter list is out of bounds".into()))?;
    let mut halves = Halves::new();
    // Parameters may share one data vector in a FlatBuffers file: what they decode to is
    // bounded by the file, so a small file cannot ask for gigabytes.
    let mut decoded = 0usize;
    for i in 0..n {
        let table = flat
            .deref(first + 4 * i)
            .ok_or_else(|| bad("a parameter is out of bounds".into()))?;
        let (name, dims, values) = parameter(&flat, table).map_err(bad)?;
        decoded = decoded.saturating_add(values.len().saturating_mul(2));
        if decoded > bytes.len() {
            return Err(bad(format!(
                "its parameters hold more values than the file has bytes (at '{name}'): \
                 they share their data; the file is corrupt"
            )));
        }
        let (module, half) = if let Some(m) = name.strip_suffix(".lora_A.MatMul.weight") {
            (m, 0)
        } else if let Some(m) = name.strip_suffix(".lora_B.MatMul.weight") {
            (m, 1)
        } else {
            return Err(bad(format!(
                "parameter '{name}' is not a lora_A or lora_B weight as onnxruntime-genai's \
                 builder names them (<module>.lora_A.MatMul.weight)"
            )));
        };
        // The builder's `attn` is Hugging Face's `self_attn`.
        let module = module.replacen(".attn.", ".self_attn.", 1);
        halves.entry(module).or_default()[half] = Some((dims, values));
    }
    Ok(Adapter {
        modules: pair(path, halves, |_, _| 1.0)?,
        key: content_key(&[bytes]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_foreign_file_is_refused_with_a_message() {
        let path = Path::new("x.onnx_adapter");
        let err = read_onnx_adapter(path, b"not an adapter").unwrap_err();
        assert!(err.to_string().contains("TORT"), "{err}");
        // The identifier, then an offset past the end.
        let mut bytes = vec![0xff, 0xff, 0, 0];
        bytes.extend_from_slice(b"TORT");
        let err = read_onnx_adapter(path, &bytes).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    /// A PEFT folder of one module at rank 2 with `config`.
    fn peft(dir: &Path, config: &str) -> std::path::PathBuf {
        std::fs::write(dir.join("adapter_config.json"), config).unwrap();
        let m = "base_model.model.model.layers.0.self_attn.q_proj";
        let (a, b) = (format!("{m}.lora_A.weight"), format!("{m}.lora_B.weight"));
        let (av, bv) = ([1.0f32; 8], [0.5f32; 6]);
        let tensors: [(&str, &[usize], &[f32]); 2] = [(&a, &[2, 4], &av), (&b, &[3, 2], &bv)];
        crate::safetensors::write_f32(&dir.join("adapter_model.safetensors"), &tensors).unwrap();
        dir.to_path_buf()
    }

    #[test]
    fn peft_folders_are_read_transposed_and_scaled_or_refused_with_the_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let config = r#"{"peft_type": "LORA", "r": 2, "lora_alpha": 8,
                         "alpha_pattern": {"q_proj": 2}}"#;
        let adapter = read_adapter(&peft(tmp.path(), config)).unwrap();
        let m = &adapter.modules[0];
        assert_eq!(m.module, "model.layers.0.self_attn.q_proj");
        assert_eq!((m.in_features, m.rank, m.out_features), (4, 2, 3));
        // B [3, 2] of 0.5 → [2, 3], times alpha_pattern's 2 / r 2.
        assert_eq!(m.b, vec![0.5; 6]);
        let refused = [
            (
                r#"{"r": 2, "lora_alpha": 8, "alpha_pattern": {"q_.*": 2}}"#,
                "regular expression",
            ),
            (r#"{"r": 2, "use_dora": true}"#, "DoRA"),
            (r#"{"peft_type": "IA3"}"#, "only LoRA"),
        ];
        for (config, why) in refused {
            let err = read_adapter(&peft(tmp.path(), config))
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{config}: {err}");
        }
    }

    #[test]
    fn peft_patterns_name_whole_dotted_parts() {
        assert!(pattern_names("q_proj", "model.layers.0.self_attn.q_proj"));
        assert!(pattern_names(
            "layers.0.self_attn.q_proj",
            "model.layers.0.self_attn.q_proj"
        ));
        assert!(!pattern_names("proj", "model.layers.0.self_attn.q_proj"));
    }
}
