//! Typed ops → kernels. One file per op family, mirroring `oxgen_graph::ops`.
//!
//! Every op reads its inputs as `Option<&Tensor>` (absent optional inputs are `None`),
//! validates shapes and dtypes, allocates its outputs from the arena and calls kernels.
//! Errors say what was wrong with which input; the session adds the node.

#[macro_use]
mod dispatch;
mod attention;
mod control;
mod elementwise;
mod encoder;
mod integer;
pub mod moe;
mod nn;
pub(crate) mod quant;
mod reduce;
mod rotary;
mod shape;

use oxgen_graph::Op;
use oxgen_kernels::ThreadPool;
use oxgen_tensor::{DType, Shape, Tensor};
use smallvec::{SmallVec, smallvec};

use crate::lower::Lowered;
use crate::{Arena, OpError};

/// An op's outputs, in order (inline: no allocation for up to four).
pub type Outputs = SmallVec<[Tensor; 4]>;

/// What an op may use while it runs: what every op shares, and its own lowered form.
pub struct OpCtx<'a> {
    pub arena: &'a mut Arena,
    pub pool: &'a ThreadPool,
    /// Compute in f32 whatever a node's `accuracy_level` allows (see [`crate::ExecOptions`]).
    pub exact: bool,
    /// Bit `k`: output `k` is read after this node (see [`OpCtx::wants`]).
    pub wanted: u64,
    /// What this node runs with beyond its inputs (its repacked weights, its subgraphs'
    /// sessions, its KV layer).
    pub lowered: &'a Lowered,
    /// In a ragged step: the step's paged KV cache (read and written by the nodes lowered
    /// with a KV layer instead of their past and present tensors).
    pub kv: Option<crate::kv::PagedStep<'a>>,
    /// What reading weights costs, counted by the ops that read them.
    pub weights: &'a mut WeightUse,
}

/// What reading weights cost over a session's runs, and which weights stay resident.
pub struct WeightUse {
    pub counters: OpCounters,
    /// Which expert weights are resident under the weight budget (MoE nodes tell it what
    /// they used).
    pub residency: crate::residency::Residency,
}

/// Work ops count themselves, where it depends on their inputs: a MoE node's experts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounters {
    /// Weight bytes streamed (on top of the fixed per-node counts of the session).
    pub streamed: u64,
    /// MoE nodes run, experts they computed and token-to-expert routes they took.
    pub moe_layers: u64,
    pub moe_experts: u64,
    pub moe_routes: u64,
}

impl OpCtx<'_> {
    /// Whether output `k` is read after this node. An op still returns a tensor for every
    /// output up to the last named one, but may leave the contents of one nobody reads
    /// uncomputed.
    pub fn wants(&self, k: usize) -> bool {
        k >= 64 || self.wanted >> k & 1 == 1
    }

    pub fn alloc(&mut self, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor, OpError> {
        self.arena.alloc(dtype, shape)
    }
}

/// Runs one op; returns its outputs in order (`n_outputs` is how many the node names).
///
/// `donated[k]` holds input `k` when the executor handed it over for in-place update (its
/// `inputs[k]` is then `None`); see [`owned_input`].
pub fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    donated: &mut [Option<Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Variadic(_)
        | Op::Where
        | Op::Clip(_)
        | Op::Cast(_)
        | Op::SiluMul => elementwise::run(op, inputs, ctx).map(|t| smallvec![t]),
        Op::EmbedNorm(_)
        | Op::BiasGelu { .. }
        | Op::ErfGelu(_)
        | Op::Attention(_)
        | Op::EncoderAttention(_) => encoder::run(op, inputs, n_outputs, ctx),
        Op::Identity => Ok(smallvec![owned_input(inputs, donated, 0)?]),
        Op::Constant(t) => Ok(smallvec![t.clone()]),
        Op::ConstantOfShape(_)
        | Op::Shape { .. }
        | Op::Size
        | Op::Reshape { .. }
        | Op::Flatten { .. }
        | Op::Squeeze(_)
        | Op::Unsqueeze(_)
        | Op::Transpose { .. }
        | Op::Concat { .. }
        | Op::Split(_)
        | Op::Slice(_)
        | Op::Expand
        | Op::Tile
        | Op::Range
        | Op::Gather(_)
        | Op::GatherElements { .. }
        | Op::ScatterND(_)
        | Op::Trilu { .. } => shape::run(op, inputs, donated, n_outputs, ctx),
        Op::CumSum(_) | Op::Reduce(_) | Op::ArgReduce(_) | Op::TopK(_) | Op::Softmax(_) => {
            reduce::run(op, inputs, n_outputs, ctx)
        }
        Op::MatMul | Op::Gemm(_) | Op::Norm(_) | Op::SkipNorm(_) => {
            nn::run(op, inputs, n_outputs, ctx)
        }
        Op::MatMulNBits(_)
        | Op::MatMulNBitsGroup(_)
        | Op::MatMulNBitsGlu(_)
        | Op::GatherBlockQuantized(_)
        | Op::Dequantize(_) => quant::run(op, inputs, n_outputs, ctx),
        Op::DynamicQuantize | Op::MatMulInteger | Op::MatMulIntegerToFloat => {
            integer::run(op, inputs, ctx)
        }
        Op::GroupQueryAttention(_) => attention::run(op, inputs, donated, n_outputs, ctx),
        Op::Rotary(_) => rotary::run(op, inputs, ctx),
        Op::Moe(m) => moe::run(m, inputs, ctx).map(|t| smallvec![t]),
        Op::If(_) | Op::Loop(_) | Op::Scan(_) => control::run(op, inputs, n_outputs, ctx),
    }
}

/// Required input `i`.
pub fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor, OpError> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| OpError::value(format!("input {i} is required")))
}

/// Input `i` as an owned tensor to update in place: the donated one when the executor
/// handed it over, else a copy of the lent one.
pub fn owned_input(
    inputs: &[Option<&Tensor>],
    donated: &mut [Option<Tensor>],
    i: usize,
) -> Result<Tensor, OpError> {
    match donated.get_mut(i).and_then(Option::take) {
        Some(t) => Ok(t),
        None => Ok(input(inputs, i)?.clone()),
    }
}

/// Optional input `i`.
pub fn opt_input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    inputs.get(i).copied().flatten()
}

/// A short list (dims, axes) kept inline: no allocation up to rank 8.
pub type Small<T> = SmallVec<[T; 8]>;

/// Reads an int64 or int32 tensor (shapes, axes, indices given as data) as `i64`s.
pub fn read_i64s(t: &Tensor, what: &str) -> Result<Small<i64>, OpError> {
    match t.dtype() {
        DType::I64 => Ok(SmallVec::from_slice(t.as_slice::<i64>()?)),
        DType::I32 => Ok(t.as_slice::<i32>()?.iter().map(|&v| v as i64).collect()),
        other => Err(OpError::DType {
            dtype: other,
            detail: format!(" for {what}: expected int64 or int32"),
        }),
    }
}

/// Resolves a possibly negative `axis` against `rank` (ONNX: `-rank <= axis < rank`).
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(OpError::value(format!(
            "axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}
