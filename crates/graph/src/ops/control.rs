//! Control flow: ONNX `If`, `Loop` and `Scan`, whose attributes are graphs.
//!
//! A branch or body is built into the IR like a model's graph ([`crate::Graph`]); the values
//! of enclosing graphs it reads are its captures, and the node lists them as extra inputs
//! after its declared ones, so the enclosing graph orders and frees them as usual. The
//! executor runs a subgraph as a session of its own.
//!
//! Supported: tensors only (branches and bodies that produce or take sequences or optionals
//! fail at load, as their inputs and outputs have no tensor type); `Scan` from opset 9 (the
//! opset-8 form with a batch axis and `sequence_lens` is not).

use super::Op;
use crate::{Graph, GraphError, NodeCtx, OpSpec};

/// A branch or loop body, and where its captured values are among the node's inputs.
#[derive(Debug, Clone)]
pub struct Subgraph {
    /// The executor moves it into a session of its own when it plans the enclosing graph
    /// (leaving an empty graph here), so its tensors are held once.
    pub graph: Graph,
    /// For each of `graph.captures`, in order: the index of the node input that feeds it.
    pub inputs: Vec<usize>,
}

/// `If`: one output per branch output, from the branch `cond` picks.
#[derive(Debug, Clone)]
pub struct If {
    pub then_branch: Subgraph,
    pub else_branch: Subgraph,
}

/// `Loop`: inputs `M` (trip count, optional), `cond` (optional) and N carried values; the
/// body maps (iteration, cond, N values) to (cond, N values, K scan outputs); the node's
/// outputs are the N final values and the K scan outputs stacked on a new first axis.
#[derive(Debug, Clone)]
pub struct Loop {
    pub body: Subgraph,
}

/// `Scan` (opset 9 on): N state values then M scanned inputs; the body maps (N states, M
/// slices) to (N states, K slices); the outputs are the N final states and the K slices
/// stacked along their axes.
#[derive(Debug, Clone)]
pub struct Scan {
    pub body: Subgraph,
    pub num_scan_inputs: usize,
    /// Per scanned input: the axis it is sliced along (non-negative once the rank is known).
    pub input_axes: Vec<i64>,
    /// Per scanned input: true to walk it backwards.
    pub input_reverse: Vec<bool>,
    pub output_axes: Vec<i64>,
    pub output_reverse: Vec<bool>,
}

fn subgraph(ctx: &mut NodeCtx, name: &str) -> Result<Subgraph, GraphError> {
    Ok(Subgraph {
        graph: ctx.subgraph(name)?,
        inputs: Vec::new(),
    })
}

fn build_if(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    let then_branch = subgraph(ctx, "then_branch")?;
    let else_branch = subgraph(ctx, "else_branch")?;
    let outputs = ctx.output_count();
    for (name, b) in [("then_branch", &then_branch), ("else_branch", &else_branch)] {
        if !b.graph.inputs.is_empty() {
            return Err(ctx.attr_error(name, "must have no inputs"));
        }
        if b.graph.outputs.len() != outputs {
            return Err(ctx.attr_error(
                name,
                format!("has {} outputs, the node {outputs}", b.graph.outputs.len()),
            ));
        }
    }
    Ok(Op::If(Box::new(If {
        then_branch,
        else_branch,
    })))
}

fn build_loop(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    // M and cond may be empty names (absent); the carried values follow them.
    ctx.inputs(0, usize::MAX)?;
    if ctx.input_count() < 2 {
        return Err(ctx.invalid(format!(
            "has {} inputs; Loop takes M and cond (either may be empty) before its carried values",
            ctx.input_count()
        )));
    }
    let body = subgraph(ctx, "body")?;
    let carried = ctx.input_count().saturating_sub(2);
    let (body_in, body_out) = (body.graph.inputs.len(), body.graph.outputs.len());
    if body_in != 2 + carried {
        return Err(ctx.attr_error(
            "body",
            format!("has {body_in} inputs; with {carried} loop-carried values it needs {} (iteration number, condition, the values)", 2 + carried),
        ));
    }
    if body_out < 1 + carried || ctx.output_count() != body_out - 1 {
        return Err(ctx.attr_error(
            "body",
            format!(
                "has {body_out} outputs and the node {}: the body returns the condition, the {carried} carried values and the scan outputs, the node the values and the scan outputs",
                ctx.output_count()
            ),
        ));
    }
    Ok(Op::Loop(Box::new(Loop { body })))
}

fn build_scan(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(1, usize::MAX)?;
    let body = subgraph(ctx, "body")?;
    let m = match ctx.int_opt("num_scan_inputs")? {
        Some(m) if m >= 1 => m as usize,
        Some(m) => {
            return Err(ctx.attr_error("num_scan_inputs", format!("must be at least 1, got {m}")));
        }
        None => return Err(ctx.attr_error("num_scan_inputs", "is required")),
    };
    let inputs = ctx.input_count();
    if m > inputs {
        return Err(ctx.invalid(format!("num_scan_inputs {m} exceeds the {inputs} inputs")));
    }
    let n = inputs - m;
    let k = ctx.output_count().checked_sub(n).ok_or_else(|| {
        ctx.invalid(format!(
            "{} outputs, fewer than the {n} state values",
            ctx.output_count()
        ))
    })?;
    if body.graph.inputs.len() != n + m || body.graph.outputs.len() != n + k {
        return Err(ctx.attr_error(
            "body",
            format!(
                "has {} inputs and {} outputs; it needs {} and {} ({n} states, {m} scanned inputs, {k} scan outputs)",
                body.graph.inputs.len(),
                body.graph.outputs.len(),
                n + m,
                n + k
            ),
        ));
    }
    let mut list = |name: &str, len: usize| -> Result<Vec<i64>, GraphError> {
        let v = ctx.ints_opt(name)?.unwrap_or_else(|| vec![0; len]);
        if v.len() != len {
            return Err(ctx.attr_error(name, format!("has {} values, expected {len}", v.len())));
        }
        Ok(v)
    };
    let input_axes = list("scan_input_axes", m)?;
    let input_dirs = list("scan_input_directions", m)?;
    let output_axes = list("scan_output_axes", k)?;
    let output_dirs = list("scan_output_directions", k)?;
    let reverse = |ctx: &NodeCtx, name: &str, dirs: Vec<i64>| -> Result<Vec<bool>, GraphError> {
        dirs.into_iter()
            .map(|d| match d {
                0 => Ok(false),
                1 => Ok(true),
                d => Err(ctx.attr_error(name, format!("values must be 0 or 1, got {d}"))),
            })
            .collect()
    };
    Ok(Op::Scan(Box::new(Scan {
        input_reverse: reverse(ctx, "scan_input_directions", input_dirs)?,
        output_reverse: reverse(ctx, "scan_output_directions", output_dirs)?,
        body,
        num_scan_inputs: m,
        input_axes,
        output_axes,
    })))
}

impl Op {
    /// The op's branches or body.
    pub fn subgraphs(&self) -> Vec<&Subgraph> {
        match self {
            Op::If(i) => vec![&i.then_branch, &i.else_branch],
            Op::Loop(l) => vec![&l.body],
            Op::Scan(s) => vec![&s.body],
            _ => Vec::new(),
        }
    }

    pub fn subgraphs_mut(&mut self) -> Vec<&mut Subgraph> {
        match self {
            Op::If(i) => vec![&mut i.then_branch, &mut i.else_branch],
            Op::Loop(l) => vec![&mut l.body],
            Op::Scan(s) => vec![&mut s.body],
            _ => Vec::new(),
        }
    }
}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![
        OpSpec::new("", "If", 1, build_if),
        OpSpec::new("", "Loop", 1, build_loop),
        OpSpec::new("", "Scan", 9, build_scan),
    ]
}
