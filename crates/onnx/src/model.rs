//! [`Model`]: a loaded `.onnx` file with its external data memory-mapped.
//!
//! The model file is memory-mapped and decoded by prost straight from the map, so every
//! `raw_data` field is a zero-copy [`Bytes`] slice of it. Each external data file is mapped
//! once and kept for the model's lifetime; initializers become [`Tensor`]s over slices of the
//! map (borrowed when aligned, copied otherwise, see [`Tensor::from_bytes`]).
//!
//! Loading checks the parts that can be checked without decoding every tensor: the graph is
//! present, opset imports are consistent, and every external tensor's location, offset and
//! length are valid (so a missing or truncated data file fails at load, naming the tensor).
//!
//! Memory maps assume the files are not modified or truncated while the model is loaded, as
//! in every mmap-based runtime: write new models to a new path and rename (the writer does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use oxgen_tensor::{DType, Tensor};
use prost::Message;

use crate::OnnxError;
use crate::external::{join_location, parse_ref, resolve_inside};
use crate::proto::{GraphProto, ModelProto, NodeProto, TensorProto};
use crate::tensor::{decode_inline, from_bytes, header, is_external, name_of};

/// The file name preferred when [`Model::load`] is given a folder.
pub const DEFAULT_MODEL_FILE: &str = "model.onnx";

/// An external data file used by a model, as reported by `oxgen inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalFileInfo {
    /// Canonical path of the data file.
    pub path: PathBuf,
    /// Size of the file in bytes.
    pub file_size: u64,
    /// Sum of the byte ranges the model's tensors reference in it (overlaps counted twice).
    pub bytes_referenced: u64,
}

/// A mapped external data file.
struct DataFile {
    path: PathBuf,
    bytes: Bytes,
}

/// A decoded ONNX model whose tensors can be read without copying.
pub struct Model {
    path: Option<PathBuf>,
    /// The model file for messages; empty for in-memory models.
    label: PathBuf,
    base_dir: Option<PathBuf>,
    proto: ModelProto,
    opsets: BTreeMap<String, i64>,
    /// External data files by `location`, filled at load; later look-ups of locations not
    /// seen at load (tensors outside the graph) add to it.
    files: Mutex<BTreeMap<String, DataFile>>,
    /// Bytes referenced per `location`, counted at load.
    referenced: BTreeMap<String, u64>,
}

impl Model {
    /// Loads a model. `path` is a `.onnx` file, or a folder holding `model.onnx` or exactly
    /// one `.onnx` file. External data is resolved relative to the model file's folder.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, OnnxError> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| OnnxError::io(path, "open", e))?;
        let file = if meta.is_dir() {
            find_model_in(path)?
        } else {
            path.to_path_buf()
        };
        let bytes = map_file(&file)?;
        let base_dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Model::decode(bytes, Some(file), Some(base_dir))
    }

    /// Decodes a model from bytes. `base_dir` is the folder external data locations are
    /// relative to; without it, a model with external data fails to load.
    pub fn from_bytes(bytes: Bytes, base_dir: Option<&Path>) -> Result<Model, OnnxError> {
        Model::decode(bytes, None, base_dir.map(Path::to_path_buf))
    }

    fn decode(
        bytes: Bytes,
        path: Option<PathBuf>,
        base_dir: Option<PathBuf>,
    ) -> Result<Model, OnnxError> {
        let label = path.clone().unwrap_or_default();
        let proto = ModelProto::decode(bytes).map_err(|source| OnnxError::Decode {
            file: label.clone(),
            message: "ModelProto",
            source,
        })?;
        if proto.graph.is_none() {
            return Err(OnnxError::MissingGraph { file: label });
        }
        let opsets = opsets_of(&proto, &label)?;
        let mut model = Model {
            path,
            label,
            base_dir,
            proto,
            opsets,
            files: Mutex::new(BTreeMap::new()),
            referenced: BTreeMap::new(),
        };
        model.check_external_data()?;
        Ok(model)
    }

    /// Maps every external data file and checks every external tensor's range, counting the
    /// bytes referenced per file.
    fn check_external_data(&mut self) -> Result<(), OnnxError> {
        let mut referenced = BTreeMap::new();
        let mut check = |t: &TensorProto| -> Result<(), OnnxError> {
            if !is_external(t) {
                return Ok(());
            }
            // Unsupported dtypes are reported when (if ever) the tensor is decoded; their
            // range is still checked, with the length the file gives.
            let expect = match DType::from_onnx(t.data_type.unwrap_or(0)) {
                Some(_) => Some(header(t, &self.label)?),
                None => None,
            };
            let (location, _, bytes) =
                self.external_slice(t, expect.as_ref().map(|h| (h.0, h.1.as_slice(), h.2)))?;
            *referenced.entry(location).or_insert(0u64) += bytes.len() as u64;
            Ok(())
        };
        for_each_tensor(&self.proto, &mut check)?;
        self.referenced = referenced;
        Ok(())
    }

    /// The model file, or `None` for a model decoded from bytes.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn proto(&self) -> &ModelProto {
        &self.proto
    }

    /// The main graph.
    pub fn graph(&self) -> &GraphProto {
        self.proto
            .graph
            .as_ref()
            .expect("Model::decode rejects models without a graph")
    }

    /// The opset version imported for `domain`; `""` and `"ai.onnx"` are the same domain.
    pub fn opset(&self, domain: &str) -> Option<i64> {
        self.opsets.get(normalize_domain(domain)).copied()
    }

    /// All imported opsets, the default domain as `""`.
    pub fn opsets(&self) -> &BTreeMap<String, i64> {
        &self.opsets
    }

    /// Decodes a tensor of this model (an initializer, or a `Constant`'s `value` attribute)
    /// into a [`Tensor`]. External data is borrowed from the mapped data file when aligned.
    pub fn tensor(&self, t: &TensorProto) -> Result<Tensor, OnnxError> {
        if !is_external(t) {
            return decode_inline(t, &self.label);
        }
        let (dtype, dims, nbytes) = header(t, &self.label)?;
        let (_, data_file, bytes) = self.external_slice(t, Some((dtype, &dims, nbytes)))?;
        from_bytes(t, &data_file, dtype, &dims, bytes)
    }

    /// The external data files the model references, with their sizes and the bytes its
    /// tensors use, ordered by location.
    pub fn external_files(&self) -> Vec<ExternalFileInfo> {
        let files = self
            .files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        files
            .iter()
            .map(|(location, f)| ExternalFileInfo {
                path: f.path.clone(),
                file_size: f.bytes.len() as u64,
                bytes_referenced: self.referenced.get(location).copied().unwrap_or(0),
            })
            .collect()
    }

    /// The checked bytes of an external tensor: `(location, data file, bytes)`. `expect` is
    /// the dtype, dims and byte size when the dtype is known; `length` must then match it.
    fn external_slice(
        &self,
        t: &TensorProto,
        expect: Option<(DType, &[usize], usize)>,
    ) -> Result<(String, PathBuf, Bytes), OnnxError> {
        let r = parse_ref(t, &self.label)?;
        let (data_path, whole) = self.data_file(&r.location, t)?;
        let file_size = whole.len() as u64;
        if let (Some((dtype, dims, nbytes)), Some(length)) = (expect, r.length)
            && length != nbytes as u64
        {
            return Err(OnnxError::ExternalLength {
                file: data_path,
                tensor: name_of(t),
                dtype,
                dims: dims.to_vec(),
                length,
                expected: nbytes as u64,
            });
        }
        let length = match (r.length, expect) {
            (Some(l), _) => l,
            (None, Some((_, _, nbytes))) => nbytes as u64,
            (None, None) => file_size.saturating_sub(r.offset),
        };
        let range = r
            .offset
            .checked_add(length)
            .filter(|&end| end <= file_size)
            .and_then(|end| Some(usize::try_from(r.offset).ok()?..usize::try_from(end).ok()?));
        let Some(range) = range else {
            return Err(OnnxError::ExternalRange {
                file: data_path,
                tensor: name_of(t),
                offset: r.offset,
                length,
                file_size,
            });
        };
        Ok((r.location, data_path, whole.slice(range)))
    }

    /// The mapped data file for `location`, mapping it on first use.
    fn data_file(&self, location: &str, t: &TensorProto) -> Result<(PathBuf, Bytes), OnnxError> {
        let mut files = self
            .files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(f) = files.get(location) {
            return Ok((f.path.clone(), f.bytes.clone()));
        }
        let Some(base_dir) = &self.base_dir else {
            return Err(OnnxError::BadTensor {
                file: self.label.clone(),
                tensor: name_of(t),
                field: "external_data",
                problem: format!(
                    "the data is in external file {location:?}, but the model was decoded from \
                     bytes without a base folder; pass base_dir to Model::from_bytes"
                ),
            });
        };
        let joined = join_location(base_dir, location, t, &self.label)?;
        let path = resolve_inside(base_dir, &joined, location, t, &self.label)?;
        let bytes = map_file(&path)?;
        files.insert(
            location.to_string(),
            DataFile {
                path: path.clone(),
                bytes: bytes.clone(),
            },
        );
        Ok((path, bytes))
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("opsets", &self.opsets)
            .field("nodes", &self.graph().node.len())
            .field("initializers", &self.graph().initializer.len())
            .finish_non_exhaustive()
    }
}

fn normalize_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

fn opsets_of(proto: &ModelProto, file: &Path) -> Result<BTreeMap<String, i64>, OnnxError> {
    let mut opsets = BTreeMap::new();
    for o in &proto.opset_import {
        let domain = normalize_domain(o.domain.as_deref().unwrap_or("")).to_string();
        let malformed = |problem: String| OnnxError::Malformed {
            file: file.to_path_buf(),
            field: format!("opset_import for domain {domain:?}"),
            problem,
        };
        let Some(version) = o.version else {
            return Err(malformed(
                "the version is missing; re-export the model".into(),
            ));
        };
        if let Some(old) = opsets.insert(domain.clone(), version)
            && old != version
        {
            return Err(malformed(format!(
                "imported twice, as versions {old} and {version}; keep one"
            )));
        }
    }
    Ok(opsets)
}

/// Calls `f` on every tensor the model holds: initializers, sparse initializers' parts and
/// tensor attributes, in subgraphs and functions too. Recursion depth is bounded by prost's
/// decoding recursion limit.
fn for_each_tensor(
    proto: &ModelProto,
    f: &mut impl FnMut(&TensorProto) -> Result<(), OnnxError>,
) -> Result<(), OnnxError> {
    if let Some(g) = &proto.graph {
        visit_graph(g, f)?;
    }
    for func in &proto.functions {
        visit_nodes(&func.node, f)?;
    }
    Ok(())
}

fn visit_graph(
    g: &GraphProto,
    f: &mut impl FnMut(&TensorProto) -> Result<(), OnnxError>,
) -> Result<(), OnnxError> {
    for t in &g.initializer {
        f(t)?;
    }
    for s in &g.sparse_initializer {
        for t in s.values.iter().chain(&s.indices) {
            f(t)?;
        }
    }
    visit_nodes(&g.node, f)
}

fn visit_nodes(
    nodes: &[NodeProto],
    f: &mut impl FnMut(&TensorProto) -> Result<(), OnnxError>,
) -> Result<(), OnnxError> {
    for a in nodes.iter().flat_map(|n| &n.attribute) {
        for t in a.t.iter().chain(&a.tensors) {
            f(t)?;
        }
        for s in a.sparse_tensor.iter().chain(&a.sparse_tensors) {
            for t in s.values.iter().chain(&s.indices) {
                f(t)?;
            }
        }
        for g in a.g.iter().chain(&a.graphs) {
            visit_graph(g, f)?;
        }
    }
    Ok(())
}

/// Picks the model in a folder: `model.onnx`, else the only `.onnx` file.
fn find_model_in(dir: &Path) -> Result<PathBuf, OnnxError> {
    let preferred = dir.join(DEFAULT_MODEL_FILE);
    if preferred.is_file() {
        return Ok(preferred);
    }
    let entries = std::fs::read_dir(dir).map_err(|e| OnnxError::io(dir, "list", e))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| OnnxError::io(dir, "list", e))?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "onnx") && path.is_file() {
            found.push(path);
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(OnnxError::ModelNotFound {
            dir: dir.to_path_buf(),
            problem: "the folder holds no .onnx file".into(),
        }),
        n => {
            let names: Vec<String> = found
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect();
            Err(OnnxError::ModelNotFound {
                dir: dir.to_path_buf(),
                problem: format!(
                    "the folder holds {n} .onnx files ({}) and none is named {DEFAULT_MODEL_FILE}",
                    names.join(", ")
                ),
            })
        }
    }
}

/// Memory-maps a regular file into [`Bytes`] (empty files give empty bytes).
pub(crate) fn map_file(path: &Path) -> Result<Bytes, OnnxError> {
    // Checked before opening: opening a FIFO would block.
    let meta = std::fs::metadata(path).map_err(|e| OnnxError::io(path, "open", e))?;
    if !meta.is_file() {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
        return Err(OnnxError::io(path, "memory-map", e));
    }
    let file = std::fs::File::open(path).map_err(|e| OnnxError::io(path, "open", e))?;
    let meta = file
        .metadata()
        .map_err(|e| OnnxError::io(path, "read metadata of", e))?;
    if meta.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only and lives as long as the `Bytes` that own it. The file must
    // not be modified or truncated while mapped; oxgen writes models by rename, and the
    // module docs state this precondition for files from elsewhere.
    let map =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|e| OnnxError::io(path, "memory-map", e))?;
    Ok(Bytes::from_owner(map))
}
