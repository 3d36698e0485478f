//! oxgen-graph: the graph IR and the operator registry.
//!
//! [`Graph::from_model`] turns a loaded ONNX model into nodes in topological order, each
//! carrying a typed [`Op`] built by the [`Registry`] from its `(domain, op_type, opset)`.
//! Everything a kernel needs from attributes is validated here, so an unsupported op,
//! opset, attribute or optional input fails at load, naming the node; nothing is matched
//! by string at run time. [`passes`] rewrite a graph into fewer, fused ops (constant and
//! shape folding, RMSNorm, rotary and attention fusion), running nodes only through an
//! [`passes::Evaluator`] a backend supplies.
//!
//! This crate must never execute a graph or allocate activations.

mod error;
mod index;
mod ir;
pub mod ops;
pub mod passes;
mod registry;

pub use error::{GraphError, NodeRef};
pub use index::{Index, KvLayout, decides_from_inputs};
pub use ir::{Dim, Graph, Node, ValueId, ValueInfo, ValueKind};
pub use ops::Op;
pub use registry::{NodeCtx, OpSpec, Registry};
