//! Block-quantized weight ops: com.microsoft::MatMulNBits and GatherBlockQuantized.

use crate::OpSpec;

/// com.microsoft::MatMulNBits attributes (placeholder: being implemented).
#[derive(Debug, Clone, PartialEq)]
pub struct MatMulNBits {}

/// com.microsoft::GatherBlockQuantized attributes (placeholder: being implemented).
#[derive(Debug, Clone, PartialEq)]
pub struct GatherBlockQuantized {}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![]
}
