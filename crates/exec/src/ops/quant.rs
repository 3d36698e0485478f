//! Block-quantized weight ops (placeholder: being implemented).

use oxgen_graph::Op;
use oxgen_tensor::Tensor;

use super::OpCtx;
use crate::OpError;

pub(super) fn run(op: &Op, _inputs: &[Option<&Tensor>], _n_outputs: usize, _ctx: &mut OpCtx) -> Result<Vec<Tensor>, OpError> {
    Err(OpError::value(format!("{op:?} has no kernel yet")))
}
