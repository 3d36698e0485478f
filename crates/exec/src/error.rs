//! Errors raised while running a plan.

use oxgen_graph::NodeRef;
use oxgen_tensor::{DType, TensorError};

/// What went wrong inside one op, before the node is known.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    Shape(String),
    #[error("input dtype {dtype} is not supported{detail}")]
    DType { dtype: DType, detail: String },
    #[error("{0}")]
    Value(String),
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl OpError {
    pub fn shape(msg: impl Into<String>) -> Self {
        OpError::Shape(msg.into())
    }

    pub fn value(msg: impl Into<String>) -> Self {
        OpError::Value(msg.into())
    }

    pub fn dtype(dtype: DType) -> Self {
        OpError::DType {
            dtype,
            detail: String::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{node}: {source}")]
    Node { node: Box<NodeRef>, source: OpError },
    #[error("{node}: produced {got} outputs, the graph expects {expected}")]
    OutputCount {
        node: Box<NodeRef>,
        expected: usize,
        got: usize,
    },
    #[error(transparent)]
    Runtime(#[from] oxgen_runtime::RuntimeError),
}

/// Kernel errors keep their message; bad indices are value errors, the rest shape errors.
impl From<oxgen_kernels::KernelError> for OpError {
    fn from(e: oxgen_kernels::KernelError) -> Self {
        match e {
            oxgen_kernels::KernelError::Index { .. } => OpError::value(e.to_string()),
            _ => OpError::shape(e.to_string()),
        }
    }
}
