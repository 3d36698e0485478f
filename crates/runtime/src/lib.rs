//! oxgen-runtime: the backend seam.
//!
//! Every backend (native kernels, ONNX Runtime) implements [`Session`]: a loaded model that
//! runs named input tensors to named output tensors. Conformance suites and tools are written
//! once against this trait and run on every backend. Language models are also stepped
//! through [`LanguageModel`]: token spans per sequence in, logits out, with the KV cache owned
//! by the backend behind opaque sequence ids.
//!
//! This crate must never depend on a backend, parse model files or run kernels.

mod blocks;
mod disk;
mod kv_dtype;
mod lm;
mod lora;

pub use blocks::{BlockCopy, BlockPool, BlockTable, CHAIN_ROOT, KvUsage, chain_key, content_key};
pub use disk::{BlockFormat, DiskCache, DiskStats, DiskTier};
pub use kv_dtype::KvDtype;
pub use lora::{Adapter, AdapterId, LoraModule};

pub use lm::{
    Batch, Capabilities, ExpertResidency, KvNames, KvTemplates, LanguageModel, LmContract,
    LogitsWanted, OpTime, SeqId, SeqSlot, SeqStep, SeqTable, StepCounters, StepLogits,
    check_context,
};

pub use oxgen_tensor::Dim;

/// The most kernel threads a model may be asked for (every option that takes a thread count
/// is checked against it).
pub const MAX_THREADS: usize = 1024;

/// A thread count asked for (0: every core), checked against [`MAX_THREADS`]: the one check,
/// which the CLI's flags and `Model::open` both make, with its one message.
pub fn check_threads(threads: usize) -> Result<usize, String> {
    match threads <= MAX_THREADS {
        true => Ok(threads),
        false => Err(format!(
            "{threads} threads asked for; at most {MAX_THREADS} (0 uses every core)"
        )),
    }
}

/// The thread count a backend runs with when asked for `threads`: 0 means every core the
/// process may use. Resolved once, so what a run reports is what it used (with 0, the most
/// it used: the native pool then leaves room for other processes' work).
pub fn resolve_threads(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}
use oxgen_tensor::{DType, Tensor};

/// What a model declares about one of its inputs or outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoSpec {
    pub name: String,
    pub dtype: Option<DType>,
    /// `None` when the model declares no shape.
    pub dims: Option<Vec<Dim>>,
}

impl IoSpec {
    /// Checks a tensor against the declared dtype and fixed dimensions.
    pub fn check(&self, tensor: &Tensor) -> Result<(), RuntimeError> {
        if let Some(dtype) = self.dtype
            && dtype != tensor.dtype()
        {
            return Err(RuntimeError::InputDType {
                name: self.name.clone(),
                expected: dtype,
                actual: tensor.dtype(),
            });
        }
        if let Some(dims) = &self.dims {
            let fits = dims.len() == tensor.rank()
                && dims
                    .iter()
                    .zip(tensor.dims())
                    .all(|(d, &a)| !matches!(d, Dim::Fixed(f) if *f != a));
            if !fits {
                return Err(RuntimeError::InputShape {
                    name: self.name.clone(),
                    expected: format_dims(dims),
                    actual: tensor.dims().to_vec(),
                });
            }
        }
        Ok(())
    }
}

/// `[batch, 3, ?]`
pub fn format_dims(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Named tensors, in and out of a run.
pub type Tensors = Vec<(String, Tensor)>;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("input '{name}' is required but was not given")]
    MissingInput { name: String },
    #[error("'{name}' is not an input of this model (its inputs are: {known})")]
    UnknownInput { name: String, known: String },
    #[error("input '{name}' was given twice")]
    DuplicateInput { name: String },
    #[error("input '{name}' must be {expected}, got {actual}")]
    InputDType {
        name: String,
        expected: DType,
        actual: DType,
    },
    #[error("input '{name}' must have shape {expected}, got {actual:?}")]
    InputShape {
        name: String,
        expected: String,
        actual: Vec<usize>,
    },
    #[error("not a language model: {0}")]
    Contract(String),
    #[error("sequence {0}: {1}")]
    Sequence(u64, String),
    #[error("{0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

/// A model loaded into a backend, ready to run.
pub trait Session: Send {
    /// The backend's name (`native`, `ort`).
    fn backend(&self) -> &'static str;
    fn inputs(&self) -> &[IoSpec];
    fn outputs(&self) -> &[IoSpec];
    /// Runs the model. Every declared input must be given once; outputs come back in
    /// declared order.
    fn run(&mut self, inputs: Tensors) -> Result<Tensors, RuntimeError>;
    /// Times each op type from now on (`true`, from zero) or stops; a backend that cannot
    /// does nothing.
    fn set_profiling(&mut self, on: bool) {
        let _ = on;
    }
    /// Time per op type since profiling was switched on, most expensive first.
    fn op_times(&self) -> Vec<OpTime> {
        Vec::new()
    }
}

/// Orders `inputs` as `specs` declares them, checking names, dtypes and fixed dimensions.
pub fn bind_inputs(specs: &[IoSpec], inputs: Tensors) -> Result<Vec<Tensor>, RuntimeError> {
    let mut slots: Vec<Option<Tensor>> = vec![None; specs.len()];
    for (name, tensor) in inputs {
        let Some(i) = specs.iter().position(|s| s.name == name) else {
            let known = specs
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(RuntimeError::UnknownInput { name, known });
        };
        specs[i].check(&tensor)?;
        if slots[i].replace(tensor).is_some() {
            return Err(RuntimeError::DuplicateInput { name });
        }
    }
    slots
        .into_iter()
        .zip(specs)
        .map(|(t, s)| {
            t.ok_or_else(|| RuntimeError::MissingInput {
                name: s.name.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, dims: Vec<Dim>) -> IoSpec {
        IoSpec {
            name: name.into(),
            dtype: Some(DType::F32),
            dims: Some(dims),
        }
    }

    #[test]
    fn binding_checks_names_dtypes_and_fixed_dims() {
        let specs = [
            spec("x", vec![Dim::Symbolic("n".into()), Dim::Fixed(2)]),
            spec("y", vec![]),
        ];
        let x = Tensor::zeros(DType::F32, [5, 2]).unwrap();
        let y = Tensor::scalar(1.0f32);
        let bound = bind_inputs(
            &specs,
            vec![("y".into(), y.clone()), ("x".into(), x.clone())],
        )
        .unwrap();
        assert_eq!(bound[0].dims(), &[5, 2]);

        let err = bind_inputs(&specs, vec![("x".into(), x.clone())]).unwrap_err();
        assert!(matches!(err, RuntimeError::MissingInput { ref name } if name == "y"));
        let err = bind_inputs(&specs, vec![("z".into(), y.clone())]).unwrap_err();
        assert!(err.to_string().contains("its inputs are: x, y"), "{err}");
        let bad = Tensor::zeros(DType::F32, [5, 3]).unwrap();
        let err =
            bind_inputs(&specs, vec![("x".into(), bad), ("y".into(), y.clone())]).unwrap_err();
        assert!(err.to_string().contains("[n, 2]"), "{err}");
        let err = bind_inputs(&specs, vec![("y".into(), Tensor::scalar(1i64))]).unwrap_err();
        assert!(matches!(err, RuntimeError::InputDType { .. }));
    }
}
