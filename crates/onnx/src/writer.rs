//! Writing ONNX models and tensor files: [`ModelBuilder`] for the GGUF importer and test
//! fixtures, [`save_tensor_file`] for node-test style `.pb` files, and [`attr`] helpers.
//!
//! [`ModelBuilder::save`] can move large initializers into `<model file name>.data` next to
//! the model, each at an offset aligned to [`EXTERNAL_ALIGN`] bytes so the loader borrows
//! them from the memory map in place. Files are written under temporary names in the target
//! folder and renamed into place, data file first, so a failed or interrupted save leaves no
//! half-written model behind (DESIGN.md §5.5).
//!
//! A builder can also stream its large initializers into that file as they are added
//! ([`ModelBuilder::stream_external_data`]), so a multi-gigabyte model is written holding only
//! its graph in memory, never all of its weights.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use oxgen_tensor::{DType, Tensor};
use prost::Message;

use crate::OnnxError;
use crate::proto::attribute_proto::AttributeType;
use crate::proto::tensor_proto::DataLocation;
use crate::proto::tensor_shape_proto::{Dimension, dimension};
use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto, type_proto,
};

/// IR version written: 10 is the first with int4/uint4 (onnx 1.16).
pub const IR_VERSION: i64 = 10;

/// Default-domain opset used when the builder is given none.
pub const DEFAULT_OPSET: i64 = 21;

/// Alignment of each tensor inside an external data file: one cache line, enough for any
/// dtype and SIMD load, so aligned tensors are borrowed from the map instead of copied.
pub const EXTERNAL_ALIGN: usize = 64;

/// A dimension of a graph input or output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(usize),
    /// A named dimension such as `batch_size` or `sequence_length`.
    Symbolic(String),
}

impl From<usize> for Dim {
    fn from(d: usize) -> Dim {
        Dim::Fixed(d)
    }
}

impl From<&str> for Dim {
    fn from(name: &str) -> Dim {
        Dim::Symbolic(name.to_string())
    }
}

/// Builds a single-graph ONNX model.
#[derive(Debug)]
pub struct ModelBuilder {
    producer: String,
    opsets: Vec<(String, i64)>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
    initializers: Vec<(String, Initializer)>,
    nodes: Vec<NodeProto>,
    metadata: Vec<(String, String)>,
    /// Where large initializers go as they are added, once streaming.
    external: Option<std::sync::Mutex<ExternalData>>,
}

/// An initializer: its data held until the model is saved, or already written to the
/// external data file (only the proto's header, which points at it, is held).
#[derive(Debug)]
enum Initializer {
    Held(Tensor),
    Written(Box<TensorProto>),
}

/// `<model file name>.data`, being written under a temporary name as initializers arrive.
#[derive(Debug)]
struct ExternalData {
    file: TempFile,
    out: std::io::BufWriter<std::fs::File>,
    /// The data file's name, as each initializer's `location` gives it.
    name: String,
    model_path: PathBuf,
    offset: usize,
    threshold: usize,
    /// The first write that failed; [`ModelBuilder::save`] reports it.
    error: Option<std::io::Error>,
}

impl ExternalData {
    /// Appends `tensor` (aligned) and returns its header pointing at the bytes.
    fn append(&mut self, name: &str, tensor: &Tensor) -> TensorProto {
        let pad = self.offset.next_multiple_of(EXTERNAL_ALIGN) - self.offset;
        let offset = self.offset + pad;
        if self.error.is_none() {
            let written = (self.out.write_all(&[0u8; EXTERNAL_ALIGN][..pad]))
                .and_then(|()| self.out.write_all(tensor.as_bytes()));
            self.error = written.err();
        }
        self.offset = offset + tensor.nbytes();
        external_header(name, tensor, &self.name, offset)
    }
}

impl ModelBuilder {
    /// An empty model whose `producer_name` is `producer`.
    pub fn new(producer: &str) -> Self {
        ModelBuilder {
            producer: producer.to_string(),
            opsets: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            initializers: Vec::new(),
            nodes: Vec::new(),
            metadata: Vec::new(),
            external: None,
        }
    }

    /// From now on, writes every initializer of at least `threshold` bytes into
    /// `<model_path file name>.data` as it is added (aligned as [`save`](Self::save) aligns
    /// them) and keeps only its header, so memory holds the graph, not the weights. The data
    /// file is written under a temporary name; [`save`](Self::save), which must then be given
    /// `model_path`, renames it into place, and dropping the builder unsaved removes it.
    pub fn stream_external_data(
        &mut self,
        model_path: &Path,
        threshold: usize,
    ) -> Result<&mut Self, OnnxError> {
        let name = format!("{}.data", file_name(model_path)?);
        let file = TempFile::new(&model_path.with_file_name(&name));
        let out =
            std::fs::File::create(&file.tmp).map_err(|e| OnnxError::io(&file.tmp, "create", e))?;
        self.external = Some(std::sync::Mutex::new(ExternalData {
            file,
            out: std::io::BufWriter::new(out),
            name,
            model_path: model_path.to_path_buf(),
            offset: 0,
            threshold,
            error: None,
        }));
        Ok(self)
    }

    /// Imports `domain` at `version` (`""` and `"ai.onnx"` are the default domain); a second
    /// call for the same domain replaces the version. Without a default-domain import,
    /// [`DEFAULT_OPSET`] is used.
    pub fn opset(&mut self, domain: &str, version: i64) -> &mut Self {
        let domain = if domain == "ai.onnx" { "" } else { domain };
        match self.opsets.iter_mut().find(|(d, _)| d == domain) {
            Some(entry) => entry.1 = version,
            None => self.opsets.push((domain.to_string(), version)),
        }
        self
    }

    /// Adds a graph input.
    pub fn input(&mut self, name: &str, dtype: DType, dims: &[Dim]) -> &mut Self {
        self.inputs.push(value_info(name, dtype, dims));
        self
    }

    /// Adds a graph output.
    pub fn output(&mut self, name: &str, dtype: DType, dims: &[Dim]) -> &mut Self {
        self.outputs.push(value_info(name, dtype, dims));
        self
    }

    /// Adds an initializer (written out at once when streaming and it is large enough).
    pub fn initializer(&mut self, name: &str, tensor: Tensor) -> &mut Self {
        let init = match &mut self.external {
            Some(ext) => {
                let ext = ext.get_mut().unwrap_or_else(|e| e.into_inner());
                if tensor.nbytes() >= ext.threshold {
                    Initializer::Written(Box::new(ext.append(name, &tensor)))
                } else {
                    Initializer::Held(tensor)
                }
            }
            None => Initializer::Held(tensor),
        };
        self.initializers.push((name.to_string(), init));
        self
    }

    /// Adds a node; an empty `domain` or `name` is left unset.
    pub fn node(
        &mut self,
        op_type: &str,
        domain: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> &mut Self {
        self.nodes.push(NodeProto {
            op_type: Some(op_type.to_string()),
            domain: (!domain.is_empty()).then(|| domain.to_string()),
            name: (!name.is_empty()).then(|| name.to_string()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self
    }

    /// Adds a `metadata_props` entry to the model.
    pub fn metadata(&mut self, key: &str, value: &str) -> &mut Self {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }

    /// The builder's graph alone, data inline, as a subgraph (an `If` branch, a loop body):
    /// its inputs, outputs, initializers and nodes; opsets and metadata stay the model's.
    pub fn subgraph(&self, name: &str) -> GraphProto {
        GraphProto {
            name: Some(name.to_string()),
            ..self.build().graph.expect("assemble always sets the graph")
        }
    }

    /// The model with all initializer data inline in `raw_data`.
    pub fn build(&self) -> ModelProto {
        self.assemble(|_| false)
    }

    /// The model proto; initializers for which `external` is true get no data (the caller
    /// fills in `external_data`).
    fn assemble(&self, external: impl Fn(&Tensor) -> bool) -> ModelProto {
        let mut opset_import: Vec<OperatorSetIdProto> = self
            .opsets
            .iter()
            .map(|(d, v)| OperatorSetIdProto {
                domain: Some(d.clone()),
                version: Some(*v),
            })
            .collect();
        if !self.opsets.iter().any(|(d, _)| d.is_empty()) {
            opset_import.insert(
                0,
                OperatorSetIdProto {
                    domain: Some(String::new()),
                    version: Some(DEFAULT_OPSET),
                },
            );
        }
        let initializer = self
            .initializers
            .iter()
            .map(|(name, init)| match init {
                Initializer::Written(header) => (**header).clone(),
                Initializer::Held(t) if external(t) => TensorProto {
                    raw_data: None,
                    ..tensor_header(name, t)
                },
                Initializer::Held(t) => tensor_to_proto(name, t),
            })
            .collect();
        ModelProto {
            ir_version: Some(IR_VERSION),
            producer_name: Some(self.producer.clone()),
            opset_import,
            metadata_props: self
                .metadata
                .iter()
                .map(|(k, v)| StringStringEntryProto {
                    key: Some(k.clone()),
                    value: Some(v.clone()),
                })
                .collect(),
            graph: Some(GraphProto {
                name: Some("main".into()),
                node: self.nodes.clone(),
                initializer,
                input: self.inputs.clone(),
                output: self.outputs.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Writes the model to `path`. With `external_threshold = Some(n)`, initializers of at
    /// least `n` bytes go to `<file name>.data` next to it (each aligned to
    /// [`EXTERNAL_ALIGN`]); with `None`, everything is inline. Files are written to temporary
    /// paths and renamed, so nothing half-written is left on failure.
    pub fn save(&self, path: &Path, external_threshold: Option<usize>) -> Result<(), OnnxError> {
        if let Some(ext) = &self.external {
            return self.save_streamed(path, ext);
        }
        let is_external = |t: &Tensor| external_threshold.is_some_and(|n| t.nbytes() >= n);
        let mut proto = self.assemble(is_external);
        let data_name = format!("{}.data", file_name(path)?);
        let data_path = path.with_file_name(&data_name);

        let mut data_tmp = None;
        let held = self.initializers.iter().filter_map(|(_, init)| match init {
            Initializer::Held(t) => Some(t),
            Initializer::Written(_) => None,
        });
        if held.clone().any(is_external) {
            let graph = proto
                .graph
                .as_mut()
                .expect("assemble always sets the graph");
            let tmp = TempFile::new(&data_path);
            tmp.write(|w| {
                let mut offset = 0usize;
                for (t, p) in held.zip(graph.initializer.iter_mut()) {
                    if !is_external(t) {
                        continue;
                    }
                    let pad = offset.next_multiple_of(EXTERNAL_ALIGN) - offset;
                    w.write_all(&[0u8; EXTERNAL_ALIGN][..pad])?;
                    offset += pad;
                    w.write_all(t.as_bytes())?;
                    let name = p.name.clone().unwrap_or_default();
                    *p = external_header(&name, t, &data_name, offset);
                    offset += t.nbytes();
                }
                Ok(())
            })?;
            data_tmp = Some(tmp);
        }

        let model_tmp = TempFile::new(path);
        model_tmp.write(|w| w.write_all(&proto.encode_to_vec()))?;
        if let Some(tmp) = data_tmp {
            tmp.commit()?;
        }
        model_tmp.commit()
    }

    /// [`save`](Self::save) for a builder that streamed its data: the data file is finished
    /// (flushed, synced) and both files renamed into place.
    fn save_streamed(
        &self,
        path: &Path,
        ext: &std::sync::Mutex<ExternalData>,
    ) -> Result<(), OnnxError> {
        let mut ext = ext.lock().unwrap_or_else(|e| e.into_inner());
        if ext.model_path != path {
            let e = std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the external data was streamed for {}, not this path",
                    ext.model_path.display()
                ),
            );
            return Err(OnnxError::io(path, "write", e));
        }
        let tmp = ext.file.tmp.clone();
        let io_err = |e| OnnxError::io(&tmp, "write", e);
        if let Some(e) = ext.error.take() {
            return Err(io_err(e));
        }
        ext.out.flush().map_err(io_err)?;
        ext.out.get_ref().sync_all().map_err(io_err)?;
        let proto = self.assemble(|_| false);
        let model_tmp = TempFile::new(path);
        model_tmp.write(|w| w.write_all(&proto.encode_to_vec()))?;
        ext.file.rename()?;
        model_tmp.commit()
    }
}

/// `path`'s file name, or an error saying it has none.
fn file_name(path: &Path) -> Result<String, OnnxError> {
    let name = path.file_name().ok_or_else(|| {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path has no file name",
        );
        OnnxError::io(path, "write", e)
    })?;
    Ok(name.to_string_lossy().into_owned())
}

/// The header of `tensor` stored in external file `location` at `offset`.
fn external_header(name: &str, tensor: &Tensor, location: &str, offset: usize) -> TensorProto {
    TensorProto {
        raw_data: None,
        data_location: Some(DataLocation::External as i32),
        external_data: [
            ("location", location.to_string()),
            ("offset", offset.to_string()),
            ("length", tensor.nbytes().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v),
        })
        .collect(),
        ..tensor_header(name, tensor)
    }
}

/// A serialized `TensorProto` with `raw_data` (little-endian) holding a copy of `tensor`.
/// Dimensions above `i64::MAX` (possible only in empty tensors) are written as `i64::MAX`.
pub fn tensor_to_proto(name: &str, tensor: &Tensor) -> TensorProto {
    TensorProto {
        raw_data: Some(Bytes::copy_from_slice(tensor.as_bytes())),
        ..tensor_header(name, tensor)
    }
}

fn tensor_header(name: &str, tensor: &Tensor) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        data_type: Some(tensor.dtype().to_onnx()),
        dims: tensor
            .dims()
            .iter()
            .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
            .collect(),
        ..Default::default()
    }
}

/// Writes `tensor` as a standalone serialized `TensorProto` named `name`, like the ONNX node
/// tests' `input_0.pb`; read it back with [`crate::load_tensor_file`].
pub fn save_tensor_file(path: &Path, name: &str, tensor: &Tensor) -> Result<(), OnnxError> {
    let tmp = TempFile::new(path);
    tmp.write(|w| w.write_all(&tensor_to_proto(name, tensor).encode_to_vec()))?;
    tmp.commit()
}

fn value_info(name: &str, dtype: DType, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => dimension::Value::DimValue(i64::try_from(*n).unwrap_or(i64::MAX)),
                Dim::Symbolic(s) => dimension::Value::DimParam(s.clone()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(dtype.to_onnx()),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A file being written under a temporary name next to its target; removed on drop unless
/// committed (renamed onto the target).
#[derive(Debug)]
struct TempFile {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl TempFile {
    fn new(target: &Path) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let unique = format!(
            ".{name}.tmp-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        TempFile {
            tmp: target.with_file_name(unique),
            target: target.to_path_buf(),
            committed: false,
        }
    }

    /// Creates the temporary file and fills it with `fill`, synced to disk.
    fn write(
        &self,
        fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
    ) -> Result<(), OnnxError> {
        let io_err = |e| OnnxError::io(&self.tmp, "write", e);
        let file = std::fs::File::create(&self.tmp).map_err(io_err)?;
        let mut w = std::io::BufWriter::new(file);
        fill(&mut w).map_err(io_err)?;
        let file = w.into_inner().map_err(|e| io_err(e.into_error()))?;
        file.sync_all().map_err(io_err)
    }

    fn commit(mut self) -> Result<(), OnnxError> {
        self.rename()
    }

    /// Renames the file onto its target (at most once; a later drop leaves it).
    fn rename(&mut self) -> Result<(), OnnxError> {
        if !self.committed {
            std::fs::rename(&self.tmp, &self.target)
                .map_err(|e| OnnxError::io(&self.target, "rename a temporary file onto", e))?;
            self.committed = true;
        }
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            // Best effort: the file may not exist if creating it failed.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Builders for `AttributeProto`s.
pub mod attr {
    use super::*;

    fn base(name: &str, kind: AttributeType) -> AttributeProto {
        AttributeProto {
            name: Some(name.to_string()),
            r#type: Some(kind as i32),
            ..Default::default()
        }
    }

    pub fn int(name: &str, value: i64) -> AttributeProto {
        AttributeProto {
            i: Some(value),
            ..base(name, AttributeType::Int)
        }
    }

    pub fn ints(name: &str, values: &[i64]) -> AttributeProto {
        AttributeProto {
            ints: values.to_vec(),
            ..base(name, AttributeType::Ints)
        }
    }

    pub fn float(name: &str, value: f32) -> AttributeProto {
        AttributeProto {
            f: Some(value),
            ..base(name, AttributeType::Float)
        }
    }

    pub fn floats(name: &str, values: &[f32]) -> AttributeProto {
        AttributeProto {
            floats: values.to_vec(),
            ..base(name, AttributeType::Floats)
        }
    }

    pub fn string(name: &str, value: &str) -> AttributeProto {
        AttributeProto {
            s: Some(Bytes::copy_from_slice(value.as_bytes())),
            ..base(name, AttributeType::String)
        }
    }

    pub fn strings(name: &str, values: &[&str]) -> AttributeProto {
        let strings = values
            .iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect();
        AttributeProto {
            strings,
            ..base(name, AttributeType::Strings)
        }
    }

    /// A graph attribute (an `If` branch, a loop body).
    pub fn graph(name: &str, value: GraphProto) -> AttributeProto {
        AttributeProto {
            g: Some(value),
            ..base(name, AttributeType::Graph)
        }
    }

    /// A tensor attribute (a `Constant`'s `value`), data inline.
    pub fn tensor(name: &str, value: &Tensor) -> AttributeProto {
        AttributeProto {
            t: Some(tensor_to_proto("", value)),
            ..base(name, AttributeType::Tensor)
        }
    }
}
