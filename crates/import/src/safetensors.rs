//! A reader of Hugging Face's safetensors files (untrusted, DESIGN.md §5.3): an 8-byte
//! little-endian header length, a JSON header mapping each tensor's name to its `dtype`,
//! `shape` and `data_offsets` (relative to the end of the header), then the data. Every
//! offset is checked against the file and against the shape's byte count before a tensor is
//! handed out, and floating tensors come out as f32 whatever they were stored as.
//!
//! A file is memory-mapped, not read: a checkpoint of several gigabytes is converted one
//! tensor at a time. [`Checkpoint`] is a folder's weights, one file or the shards a
//! `model.safetensors.index.json` names.

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

/// A safetensors file, mapped, its header checked.
pub struct SafeTensors {
    path: PathBuf,
    data: Bytes,
    start: usize,
    entries: BTreeMap<String, Entry>,
}

/// A file's bytes: mapped, or empty (an empty file cannot be mapped).
enum Bytes {
    Mapped(memmap2::Mmap),
    Empty,
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Empty => &[],
        }
    }
}

impl SafeTensors {
    /// Maps and checks `path`. The file must not change while it is open.
    pub fn open(path: &Path) -> Result<SafeTensors, ImportError> {
        let io = |action, e| ImportError::io(path, action, e);
        let file = std::fs::File::open(path).map_err(|e| io("open", e))?;
        let len = file
            .metadata()
            .map_err(|e| io("read metadata of", e))?
            .len();
        let data = if len == 0 {
            Bytes::Empty
        } else {
            // SAFETY: the map is read-only and owned here; the checkpoint must not be modified
            // while it is imported (as for GGUF files).
            Bytes::Mapped(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io("memory-map", e))?)
        };
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

    /// The whole file's bytes (what names its contents).
    pub fn file_bytes(&self) -> &[u8] {
        &self.data
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Tensor `name`'s stored dtype (`F32`, `BF16`, `U8`, ...) and shape.
    pub fn info(&self, name: &str) -> Result<(&str, &[usize]), ImportError> {
        let entry = self.entry(name)?;
        Ok((&entry.dtype, &entry.shape))
    }

    /// Tensor `name`'s entry, its shape checked to be `expected`, and its bytes.
    fn checked(&self, name: &str, expected: &[usize]) -> Result<(&Entry, &[u8]), ImportError> {
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
        Ok((
            entry,
            &self.data[self.start + entry.begin..self.start + entry.end],
        ))
    }

    /// Drops tensor `name`'s pages from memory (they are read again from the file if used
    /// again): the import touches each tensor once, so the process holds a tensor or a
    /// layer at a time, not every page of the checkpoint it has read.
    pub fn release(&self, name: &str) {
        if let (Bytes::Mapped(map), Some(entry)) = (&self.data, self.entries.get(name)) {
            let (start, len) = (self.start + entry.begin, entry.end - entry.begin);
            // SAFETY: the map is a read-only view of the file; dropping its pages only makes
            // the next read fault them in from the file again.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len)
            };
        }
    }

    /// Tensor `name`'s bytes, stored as `U8` with shape `expected` (packed codes, scales).
    pub fn u8(&self, name: &str, expected: &[usize]) -> Result<&[u8], ImportError> {
        let (entry, bytes) = self.checked(name, expected)?;
        let numel: usize = expected.iter().product();
        if entry.dtype != "U8" || bytes.len() != numel {
            return Err(self.problem(
                name,
                format!(
                    "is {} in {} bytes, but {numel} U8 values are needed",
                    entry.dtype,
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// Tensor `name` as f32 (F32, F16 and BF16 are accepted), its shape checked to be
    /// `expected`.
    pub fn f32(&self, name: &str, expected: &[usize]) -> Result<Tensor, ImportError> {
        let (entry, bytes) = self.checked(name, expected)?;
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
        // Decoded straight into the tensor: a large table is held once, not twice.
        let mut t = Tensor::zeros(oxgen_tensor::DType::F32, expected).expect("a checked shape");
        let out = t.as_mut_slice::<f32>().expect("f32");
        for (v, b) in out.iter_mut().zip(bytes.chunks_exact(width)) {
            *v = convert(b);
        }
        Ok(t)
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

/// A Hugging Face folder's weights: `model.safetensors`, or the shards its
/// `model.safetensors.index.json` maps each tensor to.
pub struct Checkpoint {
    files: Vec<SafeTensors>,
    /// Tensor name -> index into `files`.
    index: BTreeMap<String, usize>,
}

/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

impl Checkpoint {
    /// Opens the weights of the folder `dir`.
    pub fn open(dir: &Path) -> Result<Checkpoint, ImportError> {
        let index_path = dir.join(INDEX_FILE);
        let names: Vec<String> = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| ImportError::io(&index_path, "read", e))?;
            let bad = |problem: String| ImportError::Metadata {
                file: index_path.clone(),
                key: "weight_map".into(),
                problem,
            };
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| bad(format!("the file is not JSON ({e})")))?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| bad("is missing or not an object of tensor -> file".into()))?;
            let mut files: Vec<String> = Vec::new();
            for (tensor, file) in map {
                let file = file
                    .as_str()
                    .filter(|f| !f.contains('/') && !f.contains('\\') && *f != "..")
                    .ok_or_else(|| {
                        bad(format!(
                            "'{tensor}' maps to {file}, not a file name in the folder"
                        ))
                    })?;
                if !files.iter().any(|f| f == file) {
                    files.push(file.to_string());
                }
            }
            if files.is_empty() {
                return Err(bad("names no tensors".into()));
            }
            files.sort();
            files
        } else {
            vec!["model.safetensors".to_string()]
        };
        let mut checkpoint = Checkpoint {
            files: Vec::new(),
            index: BTreeMap::new(),
        };
        for name in names {
            let path = dir.join(&name);
            if !path.is_file() {
                return Err(ImportError::Folder {
                    dir: dir.to_path_buf(),
                    problem: format!(
                        "{name} is missing{}; download the whole checkpoint",
                        if index_path.is_file() {
                            format!(" (named by {INDEX_FILE})")
                        } else {
                            format!(", and there is no {INDEX_FILE} naming shards")
                        }
                    ),
                });
            }
            let file = SafeTensors::open(&path)?;
            for tensor in file.names() {
                checkpoint
                    .index
                    .insert(tensor.to_string(), checkpoint.files.len());
            }
            checkpoint.files.push(file);
        }
        Ok(checkpoint)
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Whether the checkpoint holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The file holding `name` (the first file, to say it is missing, when none does).
    pub fn file(&self, name: &str) -> &SafeTensors {
        &self.files[self.index.get(name).copied().unwrap_or(0)]
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
