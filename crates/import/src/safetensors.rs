//! A reader of Hugging Face's safetensors files (untrusted, DESIGN.md §5.3): an 8-byte
//! little-endian header length, a JSON header mapping each tensor's name to its `dtype`,
//! `shape` and `data_offsets` (relative to the end of the header), then the data. Every
//! offset is checked against the file and against the shape's byte count before a tensor is
//! handed out, and floating tensors come out as f32 whatever they were stored as.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use oxgen_tensor::Tensor;

use crate::ImportError;

/// A header larger than this is refused (real headers are a few hundred KB).
const MAX_HEADER: u64 = 100 << 20;

/// One tensor's entry in the header.
#[derive(Debug, Clone)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
}

/// A safetensors file read into memory, its header checked.
pub struct SafeTensors {
    path: PathBuf,
    data: Vec<u8>,
    start: usize,
    entries: BTreeMap<String, Entry>,
}

impl SafeTensors {
    /// Reads and checks `path`.
    pub fn open(path: &Path) -> Result<SafeTensors, ImportError> {
        let data = std::fs::read(path).map_err(|e| ImportError::io(path, "read", e))?;
        let bad = |problem: String| ImportError::Tensor {
            file: path.to_path_buf(),
            tensor: "(header)".into(),
            problem: format!("{problem}; the file is not a safetensors file or is truncated"),
        };
        let len = data
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| bad("is shorter than its 8-byte header length".into()))?;
        if len > MAX_HEADER || 8 + len > data.len() as u64 {
            return Err(bad(format!(
                "declares a {len}-byte header in a {}-byte file",
                data.len()
            )));
        }
        let start = 8 + len as usize;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&data[8..start])
                .map_err(|e| bad(format!("has a header that is not a JSON object ({e})")))?;
        let mut entries = BTreeMap::new();
        for (name, value) in header {
            if name == "__metadata__" {
                continue;
            }
            let entry = parse_entry(&value).ok_or_else(|| ImportError::Tensor {
                file: path.to_path_buf(),
                tensor: name.clone(),
                problem: format!(
                    "has a header entry without a string dtype, an integer shape and two \
                     data_offsets: {value}"
                ),
            })?;
            if entry.begin > entry.end || start + entry.end > data.len() {
                return Err(ImportError::Tensor {
                    file: path.to_path_buf(),
                    tensor: name,
                    problem: format!(
                        "has data_offsets [{}, {}] outside the {} data bytes; the file is \
                         truncated or corrupt",
                        entry.begin,
                        entry.end,
                        data.len() - start
                    ),
                });
            }
            entries.insert(name, entry);
        }
        Ok(SafeTensors {
            path: path.to_path_buf(),
            data,
            start,
            entries,
        })
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Tensor `name` as f32 (F32, F16 and BF16 are accepted), its shape checked to be
    /// `expected`.
    pub fn f32(&self, name: &str, expected: &[usize]) -> Result<Tensor, ImportError> {
        let entry = self.entry(name)?;
        if entry.shape != expected {
            return Err(self.problem(
                name,
                format!(
                    "has shape {:?}, but config.json needs {expected:?}; the weights and the \
                     config come from different models",
                    entry.shape
                ),
            ));
        }
        let bytes = &self.data[self.start + entry.begin..self.start + entry.end];
        let (width, convert): (usize, fn(&[u8]) -> f32) = match entry.dtype.as_str() {
            "F32" => (4, |b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
            "F16" => (2, |b| {
                f16::from_le_bytes(b.try_into().expect("2 bytes")).to_f32()
            }),
            "BF16" => (2, |b| {
                bf16::from_le_bytes(b.try_into().expect("2 bytes")).to_f32()
            }),
            other => {
                return Err(self.problem(
                    name,
                    format!("is stored as {other}; only F32, F16 and BF16 weights are read"),
                ));
            }
        };
        let numel: usize = expected.iter().product();
        if bytes.len() != numel * width {
            return Err(self.problem(
                name,
                format!(
                    "holds {} bytes, but {} {} values need {}; the file is corrupt",
                    bytes.len(),
                    numel,
                    entry.dtype,
                    numel * width
                ),
            ));
        }
        let values: Vec<f32> = bytes.chunks_exact(width).map(convert).collect();
        Ok(Tensor::from_slice(expected, &values).expect("the shape matches the values"))
    }

    /// Tensor `name` as f32, transposed from the stored `[out, in]` (torch's `Linear`) to the
    /// `[in, out]` an ONNX `MatMul` multiplies by.
    pub fn linear(&self, name: &str, out: usize, input: usize) -> Result<Tensor, ImportError> {
        let stored = self.f32(name, &[out, input])?;
        let w = stored.as_slice::<f32>().expect("f32");
        let mut t = vec![0f32; out * input];
        for (o, row) in w.chunks_exact(input).enumerate() {
            for (i, &v) in row.iter().enumerate() {
                t[i * out + o] = v;
            }
        }
        Ok(Tensor::from_slice([input, out].as_slice(), &t).expect("the shape matches the values"))
    }

    fn entry(&self, name: &str) -> Result<&Entry, ImportError> {
        self.entries.get(name).ok_or_else(|| {
            self.problem(
                name,
                "is missing; the file does not hold the model config.json describes".into(),
            )
        })
    }

    fn problem(&self, name: &str, problem: String) -> ImportError {
        ImportError::Tensor {
            file: self.path.clone(),
            tensor: name.to_string(),
            problem,
        }
    }
}

fn parse_entry(value: &serde_json::Value) -> Option<Entry> {
    let dtype = value.get("dtype")?.as_str()?.to_string();
    let shape = value
        .get("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<_>>>()?;
    let offsets = value.get("data_offsets")?.as_array()?;
    let [begin, end] = offsets.as_slice() else {
        return None;
    };
    Some(Entry {
        dtype,
        shape,
        begin: usize::try_from(begin.as_u64()?).ok()?,
        end: usize::try_from(end.as_u64()?).ok()?,
    })
}

/// Writes a safetensors file of f32 tensors (test fixtures, and the tiny encoder fixture's
/// maker).
pub fn write_f32(path: &Path, tensors: &[(&str, &[usize], &[f32])]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape, values) in tensors {
        let end = offset + values.len() * 4;
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut text = serde_json::Value::Object(header).to_string().into_bytes();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + text.len() + offset);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(&text);
    for (_, _, values) in tensors {
        for v in *values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(path, out)
}
