//! A graph run through ONNX Runtime: named tensors in, named tensors out.

use std::path::Path;

use ort::value::{Outlet, ValueType};
use oxgen_runtime::{Dim, IoSpec, RuntimeError, Session, Tensors, bind_inputs};

use crate::{OrtError, dtype_of, environment, from_ort, into_tensor, to_ort};

/// Opens `model` in an ONNX Runtime session with `threads` intra-op threads (0: ONNX
/// Runtime's default, every core).
pub(crate) fn open_session(
    model: &Path,
    lib: Option<&Path>,
    threads: usize,
) -> Result<ort::session::Session, OrtError> {
    let (_, env) = environment(lib)?;
    let err = |e: ort::Error<ort::session::builder::SessionBuilder>| OrtError::Ort(e.to_string());
    let mut builder = ort::session::Session::builder(env)?;
    if threads > 0 {
        builder = builder.with_intra_threads(threads).map_err(err)?;
    }
    builder
        .commit_from_file(model)
        .map_err(|e| OrtError::Ort(format!("{}: {e}", model.display())))
}

/// An input or output as ONNX Runtime declares it.
pub(crate) fn io_spec(outlet: &Outlet) -> IoSpec {
    let (dtype, dims) = match outlet.dtype() {
        ValueType::Tensor {
            ty,
            shape,
            dimension_symbols,
        } => {
            let dims = shape
                .iter()
                .enumerate()
                .map(|(i, &d)| match (d, dimension_symbols.get(i)) {
                    (d, _) if d >= 0 => Dim::Fixed(d as usize),
                    (_, Some(s)) if !s.is_empty() => Dim::Symbolic(s.to_string()),
                    _ => Dim::Unknown,
                })
                .collect();
            (dtype_of(*ty), Some(dims))
        }
        _ => (None, None),
    };
    IoSpec {
        name: outlet.name().to_string(),
        dtype,
        dims,
    }
}

/// A model run through ONNX Runtime.
pub struct OrtSession {
    session: ort::session::Session,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
}

impl OrtSession {
    /// Opens `model`; `lib` is the ONNX Runtime library (else found as
    /// [`crate::locate_library`] says).
    pub fn open(model: &Path, lib: Option<&Path>, threads: usize) -> Result<OrtSession, OrtError> {
        let session = open_session(model, lib, threads)?;
        Ok(OrtSession {
            inputs: session.inputs().iter().map(io_spec).collect(),
            outputs: session.outputs().iter().map(io_spec).collect(),
            session,
        })
    }
}

impl Session for OrtSession {
    fn backend(&self) -> &'static str {
        "ort"
    }

    fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }

    fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }

    fn run(&mut self, inputs: Tensors) -> Result<Tensors, RuntimeError> {
        let bound = bind_inputs(&self.inputs, inputs)?;
        let allocator = self.session.allocator();
        let values = self
            .inputs
            .iter()
            .zip(&bound)
            .map(|(spec, t)| Ok((spec.name.clone(), to_ort(allocator, t)?)))
            .collect::<Result<Vec<_>, OrtError>>()?;
        let outputs = self
            .session
            .run(values)
            .map_err(|e| OrtError::Ort(e.to_string()))?;
        let names: Vec<String> = self.outputs.iter().map(|s| s.name.clone()).collect();
        let mut outputs = outputs;
        names
            .into_iter()
            .map(|name| {
                let value = outputs
                    .remove(&name)
                    .ok_or_else(|| OrtError::Ort(format!("the run returned no '{name}'")))?;
                let t = from_ort(&into_tensor(value)?)
                    .map_err(|e| OrtError::Ort(format!("'{name}': {e}")))?;
                Ok((name, t))
            })
            .collect::<Result<Tensors, OrtError>>()
            .map_err(RuntimeError::from)
    }
}
