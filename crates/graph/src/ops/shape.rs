//! Ops that move, select or describe data without arithmetic: Reshape, Transpose, Concat,
//! Split, Slice, Gather, ScatterND, Expand, Tile, Shape, Constant and friends.

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

/// Squeeze/Unsqueeze axes: an attribute before opset 13, an optional input from 13 on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Squeeze {
    pub axes: Option<Vec<i64>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub axis: i64,
    /// Split sizes from the attribute (opset < 13); later opsets pass them as input 1.
    pub split: Option<Vec<i64>>,
    /// Outputs requested; with `num_outputs` (opset 18) or equal split, sizes are ceil-divided.
    pub outputs: usize,
}

/// Slice bounds given as attributes (opset < 10); later opsets pass them as inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub starts: Option<Vec<i64>>,
    pub ends: Option<Vec<i64>>,
    pub axes: Option<Vec<i64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather {
    pub axis: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScatterND {
    pub reduction: ScatterReduction,
}

fn simple(ctx: &mut NodeCtx, min: usize, max: usize, op: Op) -> Result<Op, GraphError> {
    ctx.inputs(min, max)?;
    ctx.outputs(1)?;
    Ok(op)
}

fn constant(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(0, 0)?;
    ctx.outputs(1)?;
    let value = if let Some(t) = ctx.tensor_opt("value")? {
        t
    } else if let Some(v) = ctx.float_opt("value_float")? {
        oxgen_tensor::Tensor::scalar(v)
    } else if let Some(v) = ctx.int_opt("value_int")? {
        oxgen_tensor::Tensor::scalar(v)
    } else if let Some(v) = ctx.floats_opt("value_floats")? {
        oxgen_tensor::Tensor::from_slice([v.len()], &v).map_err(|e| ctx.invalid(e.to_string()))?
    } else if let Some(v) = ctx.ints_opt("value_ints")? {
        oxgen_tensor::Tensor::from_slice([v.len()], &v).map_err(|e| ctx.invalid(e.to_string()))?
    } else {
        return Err(ctx.invalid("Constant needs one of value, value_float(s), value_int(s); sparse and string constants are not supported"));
    };
    Ok(Op::Constant(value))
}

fn constant_of_shape(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    ctx.outputs(1)?;
    let value = match ctx.tensor_opt("value")? {
        Some(t) if t.numel() == 1 => t
            .reshape(oxgen_tensor::Shape::scalar())
            .map_err(|e| ctx.invalid(e.to_string()))?,
        Some(t) => {
            return Err(ctx.attr_error(
                "value",
                format!("must hold one element, holds {}", t.numel()),
            ));
        }
        None => oxgen_tensor::Tensor::scalar(0.0f32),
    };
    Ok(Op::ConstantOfShape(value))
}

fn squeeze(ctx: &mut NodeCtx, unsqueeze: bool) -> Result<Op, GraphError> {
    let axes = if ctx.opset() < 13 {
        ctx.inputs(1, 1)?;
        ctx.ints_opt("axes")?
    } else {
        ctx.inputs(if unsqueeze { 2 } else { 1 }, 2)?;
        None
    };
    if unsqueeze && ctx.opset() < 13 && axes.is_none() {
        return Err(ctx.attr_error("axes", "is required"));
    }
    ctx.outputs(1)?;
    let s = Squeeze { axes };
    Ok(if unsqueeze {
        Op::Unsqueeze(s)
    } else {
        Op::Squeeze(s)
    })
}

fn split(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    let axis = ctx.int("axis", 0)?;
    let split = if ctx.opset() < 13 {
        ctx.inputs(1, 1)?;
        ctx.ints_opt("split")?
    } else {
        ctx.inputs(1, 2)?;
        None
    };
    let outputs = ctx.output_count();
    if ctx.opset() >= 18
        && let Some(n) = ctx.int_opt("num_outputs")?
    {
        if n < 1 || n as usize != outputs {
            return Err(ctx.attr_error(
                "num_outputs",
                format!("is {n} but the node has {outputs} outputs"),
            ));
        }
        if ctx.has_input(1) {
            return Err(ctx.invalid(
                "give either the 'split' input or the 'num_outputs' attribute, not both",
            ));
        }
    }
    if outputs == 0 {
        return Err(ctx.invalid("Split needs at least one output"));
    }
    Ok(Op::Split(Split {
        axis,
        split,
        outputs,
    }))
}

fn slice(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.outputs(1)?;
    if ctx.opset() < 10 {
        ctx.inputs(1, 1)?;
        let starts = ctx
            .ints_opt("starts")?
            .ok_or_else(|| ctx.attr_error("starts", "is required"))?;
        let ends = ctx
            .ints_opt("ends")?
            .ok_or_else(|| ctx.attr_error("ends", "is required"))?;
        let axes = ctx.ints_opt("axes")?;
        return Ok(Op::Slice(Slice {
            starts: Some(starts),
            ends: Some(ends),
            axes,
        }));
    }
    ctx.inputs(3, 5)?;
    Ok(Op::Slice(Slice {
        starts: None,
        ends: None,
        axes: None,
    }))
}

fn scatter_nd(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    let reduction = match ctx.string("reduction", "none")?.as_str() {
        "none" => ScatterReduction::None,
        "add" => ScatterReduction::Add,
        "mul" => ScatterReduction::Mul,
        "max" => ScatterReduction::Max,
        "min" => ScatterReduction::Min,
        other => return Err(ctx.attr_error("reduction", format!("unknown reduction \"{other}\""))),
    };
    simple(ctx, 3, 3, Op::ScatterND(ScatterND { reduction }))
}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![
        OpSpec::new("", "Identity", 1, |ctx| simple(ctx, 1, 1, Op::Identity)),
        OpSpec::new("", "Constant", 1, constant),
        OpSpec::new("", "ConstantOfShape", 9, constant_of_shape),
        OpSpec::new("", "Shape", 1, |ctx| {
            let start = ctx.int("start", 0)?;
            let end = ctx.int_opt("end")?;
            simple(ctx, 1, 1, Op::Shape { start, end })
        }),
        OpSpec::new("", "Size", 1, |ctx| simple(ctx, 1, 1, Op::Size)),
        OpSpec::new("", "Reshape", 5, |ctx| {
            let allowzero = ctx.bool("allowzero", false)?;
            simple(ctx, 2, 2, Op::Reshape { allowzero })
        }),
        OpSpec::new("", "Flatten", 1, |ctx| {
            let axis = ctx.int("axis", 1)?;
            simple(ctx, 1, 1, Op::Flatten { axis })
        }),
        OpSpec::new("", "Squeeze", 1, |ctx| squeeze(ctx, false)),
        OpSpec::new("", "Unsqueeze", 1, |ctx| squeeze(ctx, true)),
        OpSpec::new("", "Transpose", 1, |ctx| {
            let perm = ctx.ints_opt("perm")?;
            simple(ctx, 1, 1, Op::Transpose { perm })
        }),
        OpSpec::new("", "Concat", 4, |ctx| {
            let axis = ctx
                .int_opt("axis")?
                .ok_or_else(|| ctx.attr_error("axis", "is required"))?;
            simple(ctx, 1, usize::MAX, Op::Concat { axis })
        }),
        OpSpec::new("", "Split", 2, split),
        OpSpec::new("", "Slice", 1, slice),
        OpSpec::new("", "Expand", 8, |ctx| simple(ctx, 2, 2, Op::Expand)),
        OpSpec::new("", "Tile", 6, |ctx| simple(ctx, 2, 2, Op::Tile)),
        OpSpec::new("", "Range", 11, |ctx| simple(ctx, 3, 3, Op::Range)),
        OpSpec::new("", "Gather", 1, |ctx| {
            let axis = ctx.int("axis", 0)?;
            simple(ctx, 2, 2, Op::Gather(Gather { axis }))
        }),
        OpSpec::new("", "GatherElements", 11, |ctx| {
            let axis = ctx.int("axis", 0)?;
            simple(ctx, 2, 2, Op::GatherElements { axis })
        }),
        OpSpec::new("", "ScatterND", 11, scatter_nd),
        OpSpec::new("", "Trilu", 14, |ctx| {
            let upper = ctx.bool("upper", true)?;
            simple(ctx, 1, 2, Op::Trilu { upper })
        }),
    ]
}
