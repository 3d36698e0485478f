//! Errors raised while turning an ONNX model into a [`crate::Graph`].

/// Where in the model a problem sits: enough to find the node in Netron or `oxgen inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRef {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub opset: i64,
}

impl std::fmt::Display for NodeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let domain = if self.domain.is_empty() {
            "ai.onnx"
        } else {
            &self.domain
        };
        write!(
            f,
            "node '{}' ({domain}::{}, opset {})",
            self.name, self.op_type, self.opset
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error(
        "{node}: operator not supported by the native backend (no kernel for this op type in this domain)"
    )]
    UnsupportedOp { node: Box<NodeRef> },
    #[error("{node}: opset {} is not supported; this op type is implemented for opsets {supported}", node.opset)]
    UnsupportedOpset {
        node: Box<NodeRef>,
        supported: String,
    },
    #[error("{node}: attribute '{attr}': {reason}")]
    Attribute {
        node: Box<NodeRef>,
        attr: String,
        reason: String,
    },
    #[error(
        "{node}: attribute '{attr}' is not supported by this implementation; remove it or use the ort backend"
    )]
    UnsupportedAttribute { node: Box<NodeRef>, attr: String },
    #[error("{node}: takes {min}..={max} inputs, got {got}{extra}")]
    InputCount {
        node: Box<NodeRef>,
        min: usize,
        max: usize,
        got: usize,
        extra: String,
    },
    #[error("{node}: input {index} is required but empty")]
    MissingInput { node: Box<NodeRef>, index: usize },
    #[error("{node}: produces at most {max} outputs, got {got}")]
    OutputCount {
        node: Box<NodeRef>,
        max: usize,
        got: usize,
    },
    #[error("{node}: input '{value}' is not produced by any node, initializer or graph input")]
    UndefinedValue { node: Box<NodeRef>, value: String },
    #[error("value '{value}' is produced twice (by {first} and by {second})")]
    DuplicateValue {
        value: String,
        first: String,
        second: String,
    },
    #[error("graph output '{0}' is not produced by any node, initializer or graph input")]
    UndefinedOutput(String),
    #[error("the graph has a cycle through {0}")]
    Cycle(Box<NodeRef>),
    #[error("{node}: {reason}")]
    Invalid { node: Box<NodeRef>, reason: String },
    #[error("graph {what} '{name}': {reason}")]
    Io {
        what: &'static str,
        name: String,
        reason: String,
    },
    #[error(transparent)]
    Onnx(Box<oxgen_onnx::OnnxError>),
}

impl From<oxgen_onnx::OnnxError> for GraphError {
    fn from(e: oxgen_onnx::OnnxError) -> Self {
        GraphError::Onnx(Box::new(e))
    }
}
