//! Reductions along axes: ReduceX, ArgMax/ArgMin, TopK, CumSum, Softmax/LogSoftmax.

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    L1,
    L2,
    LogSum,
    LogSumExp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reduce {
    pub kind: ReduceKind,
    /// Axes from the attribute (older opsets); newer opsets pass them as optional input 1.
    pub axes: Option<Vec<i64>>,
    pub keepdims: bool,
    /// With no axes: reduce nothing (true) or everything (false).
    pub noop_with_empty_axes: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgReduce {
    /// ArgMax (true) or ArgMin (false).
    pub max: bool,
    pub axis: i64,
    pub keepdims: bool,
    pub select_last_index: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopK {
    pub axis: i64,
    pub largest: bool,
    pub sorted: bool,
    /// K from the attribute (opset 1); later opsets pass it as input 1.
    pub k: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CumSum {
    pub exclusive: bool,
    pub reverse: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Softmax {
    pub axis: i64,
    /// Opset < 13: the input is coerced to 2-D at `axis` and normalized over the flattened
    /// trailing dimensions.
    pub flatten: bool,
    pub log: bool,
    /// Hardmax: 1 at the first maximum along the axis, 0 elsewhere.
    pub hard: bool,
}

fn reduce(ctx: &mut NodeCtx, kind: ReduceKind, axes_input_since: i64) -> Result<Op, GraphError> {
    ctx.outputs(1)?;
    let keepdims = ctx.bool("keepdims", true)?;
    let axes = if ctx.opset() < axes_input_since {
        ctx.inputs(1, 1)?;
        ctx.ints_opt("axes")?
    } else {
        ctx.inputs(1, 2)?;
        None
    };
    let noop_with_empty_axes = if ctx.opset() >= axes_input_since {
        ctx.bool("noop_with_empty_axes", false)?
    } else {
        false
    };
    Ok(Op::Reduce(Reduce {
        kind,
        axes,
        keepdims,
        noop_with_empty_axes,
    }))
}

fn arg_reduce(ctx: &mut NodeCtx, max: bool) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    ctx.outputs(1)?;
    let axis = ctx.int("axis", 0)?;
    let keepdims = ctx.bool("keepdims", true)?;
    let select_last_index = ctx.bool("select_last_index", false)?;
    Ok(Op::ArgReduce(ArgReduce {
        max,
        axis,
        keepdims,
        select_last_index,
    }))
}

fn top_k(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.outputs(2)?;
    let axis = ctx.int("axis", -1)?;
    let largest = ctx.bool("largest", true)?;
    let sorted = ctx.bool("sorted", true)?;
    let k = if ctx.opset() < 10 {
        ctx.inputs(1, 1)?;
        Some(
            ctx.int_opt("k")?
                .ok_or_else(|| ctx.attr_error("k", "is required"))?,
        )
    } else {
        ctx.inputs(2, 2)?;
        None
    };
    Ok(Op::TopK(TopK {
        axis,
        largest,
        sorted,
        k,
    }))
}

fn softmax(ctx: &mut NodeCtx, log: bool, hard: bool) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    ctx.outputs(1)?;
    let flatten = ctx.opset() < 13;
    let axis = ctx.int("axis", if flatten { 1 } else { -1 })?;
    Ok(Op::Softmax(Softmax {
        axis,
        flatten,
        log,
        hard,
    }))
}

macro_rules! reduce_specs {
    ($($name:literal => $kind:ident, axes input since $v:literal;)*) => {
        vec![$(OpSpec::new("", $name, 1, |ctx| reduce(ctx, ReduceKind::$kind, $v)),)*]
    };
}

pub(super) fn specs() -> Vec<OpSpec> {
    let mut specs = reduce_specs! {
        "ReduceSum" => Sum, axes input since 13;
        "ReduceMean" => Mean, axes input since 18;
        "ReduceMax" => Max, axes input since 18;
        "ReduceMin" => Min, axes input since 18;
        "ReduceProd" => Prod, axes input since 18;
        "ReduceSumSquare" => SumSquare, axes input since 18;
        "ReduceL1" => L1, axes input since 18;
        "ReduceL2" => L2, axes input since 18;
        "ReduceLogSum" => LogSum, axes input since 18;
        "ReduceLogSumExp" => LogSumExp, axes input since 18;
    };
    specs.extend([
        OpSpec::new("", "ArgMax", 1, |ctx| arg_reduce(ctx, true)),
        OpSpec::new("", "ArgMin", 1, |ctx| arg_reduce(ctx, false)),
        OpSpec::new("", "TopK", 1, top_k),
        OpSpec::new("", "CumSum", 11, |ctx| {
            let exclusive = ctx.bool("exclusive", false)?;
            let reverse = ctx.bool("reverse", false)?;
            ctx.inputs(2, 2)?;
            ctx.outputs(1)?;
            Ok(Op::CumSum(CumSum { exclusive, reverse }))
        }),
        OpSpec::new("", "Softmax", 1, |ctx| softmax(ctx, false, false)),
        OpSpec::new("", "LogSoftmax", 1, |ctx| softmax(ctx, true, false)),
        OpSpec::new("", "Hardmax", 1, |ctx| softmax(ctx, false, true)),
    ]);
    specs
}
