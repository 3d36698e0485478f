//! oxgen-graph: the graph IR and the operator registry.
//!
//! [`Graph::from_model`] turns a loaded ONNX model into nodes in topological order, each
//! carrying a typed [`Op`] built by the [`Registry`] from its `(domain, op_type, opset)`.
//! Everything a kernel needs from attributes is validated here, so an unsupported op,
//! opset, attribute or optional input fails at load, naming the node; nothing is matched
//! by string at run time.
//!
//! This crate must never execute a graph or allocate activations.

mod error;
mod ir;
pub mod ops;
mod registry;

pub use error::{GraphError, NodeRef};
pub use ir::{Dim, Graph, Node, ValueId, ValueInfo, ValueKind};
pub use ops::Op;
pub use registry::{NodeCtx, OpSpec, Registry};
