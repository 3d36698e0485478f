//! Attention ops: com.microsoft::GroupQueryAttention and RotaryEmbedding (contrib and ONNX).

use crate::OpSpec;

/// com.microsoft::GroupQueryAttention attributes (placeholder: being implemented).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupQueryAttention {}

/// RotaryEmbedding attributes (placeholder: being implemented).
#[derive(Debug, Clone, PartialEq)]
pub struct Rotary {}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![]
}
