//! Static shape facts: each value's dtype and dimensions, and the elements of small integer
//! tensors (the shape arithmetic exporters write), inferred without running anything.
//!
//! A dimension or element is a [`Sym`]: a known integer, or an unknown one named by a symbol.
//! A graph input's named dimension (`batch_size`, `sequence_length`) is one symbol wherever
//! it appears; other unknowns get fresh symbols, which then flow through the ops, so two
//! values can be proved to share a dimension even when its size is known only at run time.
//! Equal symbols are equal at run time; different symbols may or may not be.
//!
//! Rules cover the ops exporters use for shapes and the ones the fusion patterns check
//! (element-wise, `MatMul`, `Reshape`, `Transpose`, `Concat`, `Gather`, `Slice`, `Expand`,
//! `Unsqueeze`, ...). Any other op makes its outputs unknown, which only stops rewrites.

use std::collections::HashMap;

use oxgen_tensor::{DType, Tensor};

use crate::ops::{BinaryOp, Op, UnaryOp};
use crate::{Dim, Graph, Node, ValueId, ValueKind};

mod dims;

pub use dims::reshape_dims;
use dims::{squeeze_dims, unsqueeze_dims};

/// A dimension or integer element: known, or a symbol for an unknown integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sym {
    Known(i64),
    Var(u32),
}

/// Integer tensors with at most this many elements have their elements tracked.
const MAX_DATA: usize = 64;

/// What is known about every value of a graph.
#[derive(Debug, Clone)]
pub struct Facts {
    dtype: Vec<Option<DType>>,
    dims: Vec<Option<Vec<Sym>>>,
    data: Vec<Option<Vec<Sym>>>,
    next: u32,
}

/// One output's facts: dtype, dimensions, elements.
type Out = (Option<DType>, Option<Vec<Sym>>, Option<Vec<Sym>>);

fn is_int(dtype: Option<DType>) -> bool {
    matches!(dtype, Some(DType::I64 | DType::I32))
}

/// The elements of a small integer tensor.
fn int_data(t: &Tensor) -> Option<Vec<Sym>> {
    if t.numel() > MAX_DATA {
        return None;
    }
    match t.dtype() {
        DType::I64 => Some(
            t.as_slice::<i64>()
                .ok()?
                .iter()
                .map(|&v| Sym::Known(v))
                .collect(),
        ),
        DType::I32 => Some(
            t.as_slice::<i32>()
                .ok()?
                .iter()
                .map(|&v| Sym::Known(i64::from(v)))
                .collect(),
        ),
        _ => None,
    }
}

fn known_dims(t: &Tensor) -> Vec<Sym> {
    t.dims().iter().map(|&d| Sym::Known(d as i64)).collect()
}

/// `axis` in `-rank..rank` as an index.
fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Known integers, or `None` if any is a symbol.
pub fn all_known(syms: &[Sym]) -> Option<Vec<i64>> {
    syms.iter()
        .map(|s| match s {
            Sym::Known(v) => Some(*v),
            Sym::Var(_) => None,
        })
        .collect()
}

/// The range `Slice` takes from a dimension of known length `n`: `(first, count)` with step.
pub(crate) fn slice_range(n: i64, start: i64, end: i64, step: i64) -> Option<(i64, i64)> {
    if step == 0 {
        return None;
    }
    let fix = |v: i64, lo: i64, hi: i64| {
        let v = if v < 0 { v.saturating_add(n) } else { v };
        v.clamp(lo, hi)
    };
    if step > 0 {
        let (s, e) = (fix(start, 0, n), fix(end, 0, n));
        Some((s, ((e - s).max(0) + step - 1) / step))
    } else {
        let (s, e) = (fix(start, 0, n - 1), fix(end, -1, n - 1));
        Some((s, ((s - e).max(0) + (-step) - 1) / (-step)))
    }
}

/// Known product and symbol multiset of dimensions.
fn product(dims: &[Sym]) -> Option<(i64, Vec<u32>)> {
    let mut known = 1i64;
    let mut vars = Vec::new();
    for d in dims {
        match d {
            Sym::Known(v) => known = known.checked_mul(*v)?,
            Sym::Var(s) => vars.push(*s),
        }
    }
    vars.sort_unstable();
    Some((known, vars))
}

impl Facts {
    /// Infers facts for every value of `graph` (nodes must be in topological order).
    pub fn infer(graph: &Graph) -> Facts {
        let n = graph.values.len();
        let mut f = Facts {
            dtype: vec![None; n],
            dims: vec![None; n],
            data: vec![None; n],
            next: 0,
        };
        let mut params: HashMap<&str, u32> = HashMap::new();
        for (i, v) in graph.values.iter().enumerate() {
            match v.kind {
                ValueKind::Initializer => {
                    if let Some(t) = graph.initializers.get(&ValueId(i)) {
                        f.dtype[i] = Some(t.dtype());
                        f.dims[i] = Some(known_dims(t));
                        f.data[i] = int_data(t);
                    }
                }
                ValueKind::Input => {
                    f.dtype[i] = v.dtype;
                    f.dims[i] = v.dims.as_ref().map(|dims| {
                        dims.iter()
                            .map(|d| match d {
                                Dim::Fixed(n) => Sym::Known(*n as i64),
                                Dim::Symbolic(name) => {
                                    let next = &mut f.next;
                                    Sym::Var(*params.entry(name.as_str()).or_insert_with(|| {
                                        *next += 1;
                                        *next - 1
                                    }))
                                }
                                Dim::Unknown => {
                                    f.next += 1;
                                    Sym::Var(f.next - 1)
                                }
                            })
                            .collect()
                    });
                }
                ValueKind::Node | ValueKind::Captured => {}
            }
        }
        for node in &graph.nodes {
            let outs = f.node(node);
            for (k, out) in node.outputs.iter().enumerate() {
                if let Some(v) = out {
                    let (dtype, dims, data) = outs.get(k).cloned().unwrap_or((None, None, None));
                    f.dtype[v.0] = dtype;
                    f.dims[v.0] = dims;
                    f.data[v.0] = data;
                }
            }
        }
        f
    }

    pub fn dtype(&self, v: ValueId) -> Option<DType> {
        self.dtype[v.0]
    }

    /// Dimensions, when the rank is known.
    pub fn dims(&self, v: ValueId) -> Option<&[Sym]> {
        self.dims[v.0].as_deref()
    }

    pub fn rank(&self, v: ValueId) -> Option<usize> {
        self.dims(v).map(<[Sym]>::len)
    }

    /// Elements of a small integer tensor, as far as known.
    pub fn data(&self, v: ValueId) -> Option<&[Sym]> {
        self.data[v.0].as_deref()
    }

    /// Elements, when every one is known.
    pub fn known_data(&self, v: ValueId) -> Option<Vec<i64>> {
        all_known(self.data(v)?)
    }

    /// Dimension `axis` (negative counts from the end).
    pub fn dim(&self, v: ValueId, axis: i64) -> Option<Sym> {
        let dims = self.dims(v)?;
        norm_axis(axis, dims.len()).map(|a| dims[a])
    }

    fn fresh(&mut self) -> Sym {
        self.next += 1;
        Sym::Var(self.next - 1)
    }

    fn get(&self, node: &Node, k: usize) -> Out {
        match node.inputs.get(k).copied().flatten() {
            Some(v) => (
                self.dtype[v.0],
                self.dims[v.0].clone(),
                self.data[v.0].clone(),
            ),
            None => (None, None, None),
        }
    }

    /// Numpy broadcasting of two shapes.
    fn broadcast(&mut self, a: &[Sym], b: &[Sym]) -> Vec<Sym> {
        let rank = a.len().max(b.len());
        (0..rank)
            .map(|i| {
                let x = (i + a.len()).checked_sub(rank).map(|j| a[j]);
                let y = (i + b.len()).checked_sub(rank).map(|j| b[j]);
                match (x, y) {
                    (Some(x), None) => x,
                    (None, Some(y)) => y,
                    (Some(x), Some(y)) if x == y => x,
                    (Some(Sym::Known(1)), Some(y)) => y,
                    (Some(x), Some(Sym::Known(1))) => x,
                    // A symbol meeting a known size other than 1 must be that size or 1:
                    // either way the result is the known size.
                    (Some(k @ Sym::Known(_)), Some(Sym::Var(_)))
                    | (Some(Sym::Var(_)), Some(k @ Sym::Known(_))) => k,
                    _ => self.fresh(),
                }
            })
            .collect()
    }

    fn broadcast_all(&mut self, shapes: &[Option<Vec<Sym>>]) -> Option<Vec<Sym>> {
        let mut out: Vec<Sym> = Vec::new();
        for s in shapes {
            out = self.broadcast(&out, s.as_ref()?);
        }
        Some(out)
    }

    /// Element-wise integer arithmetic on tracked elements (shape arithmetic such as
    /// `head_dim / 2`).
    fn arith(&mut self, op: BinaryOp, a: &[Sym], b: &[Sym]) -> Option<Vec<Sym>> {
        let n = a.len().max(b.len());
        if !(a.len() == n || a.len() == 1) || !(b.len() == n || b.len() == 1) {
            return None;
        }
        let pick = |s: &[Sym], i: usize| if s.len() == 1 { s[0] } else { s[i] };
        Some(
            (0..n)
                .map(|i| {
                    let (x, y) = (pick(a, i), pick(b, i));
                    let known = match (op, x, y) {
                        (BinaryOp::Add, Sym::Known(x), Sym::Known(y)) => x.checked_add(y),
                        (BinaryOp::Sub, Sym::Known(x), Sym::Known(y)) => x.checked_sub(y),
                        (BinaryOp::Mul, Sym::Known(x), Sym::Known(y)) => x.checked_mul(y),
                        // ONNX integer Div truncates, like Rust's.
                        (BinaryOp::Div, Sym::Known(x), Sym::Known(y)) if y != 0 => x.checked_div(y),
                        _ => None,
                    };
                    match (known, op, x, y) {
                        (Some(v), ..) => Sym::Known(v),
                        (None, BinaryOp::Add | BinaryOp::Sub, v, Sym::Known(0)) => v,
                        (None, BinaryOp::Add, Sym::Known(0), v) => v,
                        (None, BinaryOp::Mul | BinaryOp::Div, v, Sym::Known(1)) => v,
                        (None, BinaryOp::Mul, Sym::Known(1), v) => v,
                        _ => self.fresh(),
                    }
                })
                .collect(),
        )
    }

    /// The facts of each output of `node`.
    fn node(&mut self, node: &Node) -> Vec<Out> {
        let (t0, d0, x0) = self.get(node, 0);
        let same = (t0, d0.clone(), None);
        let one = |o: Out| vec![o];
        match &node.op {
            Op::Constant(t) => one((Some(t.dtype()), Some(known_dims(t)), int_data(t))),
            Op::Identity => one((t0, d0, x0)),
            Op::Cast(c) => {
                let to = c.to.or(self.get(node, 1).0);
                let data = x0.filter(|_| is_int(t0) && is_int(to));
                one((to, d0, data))
            }
            Op::Unary(u) => {
                let dtype = match u {
                    UnaryOp::Not | UnaryOp::IsNaN | UnaryOp::IsInf { .. } => Some(DType::Bool),
                    _ => t0,
                };
                let data = match (u, &x0) {
                    (UnaryOp::Neg, Some(x)) if is_int(t0) => Some(
                        x.iter()
                            .map(|s| match s {
                                Sym::Known(v) => v.checked_neg().map(Sym::Known),
                                Sym::Var(_) => None,
                            })
                            .collect::<Option<Vec<_>>>()
                            .unwrap_or_else(|| x.iter().map(|_| self.fresh()).collect()),
                    ),
                    _ => None,
                };
                one((dtype, d0, data))
            }
            Op::Binary(b) => {
                let (_, d1, x1) = self.get(node, 1);
                let dims = match (&d0, &d1) {
                    (Some(a), Some(c)) => Some(self.broadcast(a, c)),
                    _ => None,
                };
                let logical = matches!(b, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor);
                let dtype = if b.is_comparison() || logical {
                    Some(DType::Bool)
                } else {
                    t0
                };
                let data = match (&x0, &x1) {
                    (Some(a), Some(c))
                        if is_int(t0)
                            && matches!(
                                b,
                                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
                            ) =>
                    {
                        self.arith(*b, a, c)
                    }
                    _ => None,
                };
                one((dtype, dims, data))
            }
            Op::Variadic(_) => {
                let shapes: Vec<_> = (0..node.inputs.len())
                    .map(|k| self.get(node, k).1)
                    .collect();
                let dims = self.broadcast_all(&shapes);
                one((t0, dims, None))
            }
            Op::Where => {
                let shapes: Vec<_> = (0..3).map(|k| self.get(node, k).1).collect();
                let dims = self.broadcast_all(&shapes);
                one((self.get(node, 1).0, dims, None))
            }
            Op::Clip(_) | Op::Softmax(_) | Op::Trilu { .. } | Op::Rotary(_) | Op::CumSum(_) => {
                one(same)
            }
            Op::Norm(_) => vec![same, (t0, None, None), (t0, None, None)],
            Op::SkipNorm(_) => vec![same.clone(), (t0, None, None), (t0, None, None), same],
            Op::BiasGelu { .. } | Op::ErfGelu(_) => one(same),
            // q (batch, seq, ·), k, v (batch, seq, heads · v size) → v's shape.
            Op::EncoderAttention(_) => one((t0, self.get(node, 2).1, None)),
            Op::Attention(a) => {
                // (batch, seq, in) → (batch, seq, V's width).
                let (_, dw, _) = self.get(node, 1);
                let width = match (a.qkv_sizes, dw.as_deref()) {
                    (Some([_, _, v]), _) => Some(Sym::Known(v as i64)),
                    (None, Some(&[_, Sym::Known(n)])) if n % 3 == 0 => Some(Sym::Known(n / 3)),
                    _ => None,
                };
                let dims = match (d0.as_deref(), width) {
                    (Some(&[b, s, _]), Some(w)) => Some(vec![b, s, w]),
                    _ => None,
                };
                one((t0, dims, None))
            }
            Op::EmbedNorm(_) => {
                // ids (batch, seq) and the word table (vocab, hidden) → (batch, seq, hidden).
                let (tw, dw, _) = self.get(node, 2);
                let ids = d0.filter(|d| d.len() == 2);
                let dims = match (&ids, &dw) {
                    (Some(ids), Some(w)) if w.len() == 2 => Some(vec![ids[0], ids[1], w[1]]),
                    _ => None,
                };
                let batch = ids.map(|d| vec![d[0]]);
                vec![
                    (tw, dims.clone(), None),
                    (Some(DType::I32), batch, None),
                    (tw, dims, None),
                ]
            }
            Op::Shape { start, end } => {
                let Some(dims) = d0 else {
                    return one((Some(DType::I64), None, None));
                };
                let r = dims.len() as i64;
                let fix = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (s, e) = (fix(*start), fix(end.unwrap_or(r)));
                let data = dims[s..e.max(s)].to_vec();
                one((
                    Some(DType::I64),
                    Some(vec![Sym::Known(data.len() as i64)]),
                    Some(data),
                ))
            }
            Op::Size => {
                let data = d0
                    .as_deref()
                    .and_then(all_known)
                    .and_then(|d| d.iter().try_fold(1i64, |a, &b| a.checked_mul(b)))
                    .map_or_else(|| self.fresh(), Sym::Known);
                one((Some(DType::I64), Some(vec![]), Some(vec![data])))
            }
            Op::Reshape { allowzero } => {
                let target = self.get(node, 1).2;
                let dims = target.and_then(|t| self.reshape(d0.as_deref(), &t, *allowzero));
                one((t0, dims, x0))
            }
            Op::Flatten { axis } => {
                let dims = d0.as_ref().and_then(|d| {
                    let a = if *axis < 0 {
                        *axis + d.len() as i64
                    } else {
                        *axis
                    };
                    let a = usize::try_from(a).ok().filter(|&a| a <= d.len())?;
                    let (lo, hi) = d.split_at(a);
                    Some(vec![self.product_dim(lo), self.product_dim(hi)])
                });
                one((t0, dims, x0))
            }
            Op::Unsqueeze(s) | Op::Squeeze(s) => {
                let axes = s
                    .axes
                    .clone()
                    .or_else(|| self.get(node, 1).2.as_deref().and_then(all_known));
                let squeeze = matches!(node.op, Op::Squeeze(_));
                let dims = d0.and_then(|d| {
                    if squeeze {
                        squeeze_dims(&d, axes.as_deref())
                    } else {
                        unsqueeze_dims(&d, axes.as_deref()?)
                    }
                });
                one((t0, dims, x0))
            }
            Op::Transpose { perm } => {
                let dims = d0.and_then(|d| {
                    let perm: Vec<usize> = match perm {
                        Some(p) => p
                            .iter()
                            .map(|&a| norm_axis(a, d.len()))
                            .collect::<Option<_>>()?,
                        None => (0..d.len()).rev().collect(),
                    };
                    (perm.len() == d.len()).then(|| perm.iter().map(|&a| d[a]).collect())
                });
                one((t0, dims, None))
            }
            Op::Concat { axis } => one(self.concat(node, *axis)),
            Op::Slice(s) => one(self.slice(node, s)),
            Op::Expand => {
                let target = self.get(node, 1).2;
                let dims = match (d0, target) {
                    (Some(d), Some(t)) => Some(self.broadcast(&d, &t)),
                    _ => None,
                };
                one((t0, dims, None))
            }
            Op::Range => {
                let args: Vec<Option<i64>> = (0..3)
                    .map(|k| match self.get(node, k).2.as_deref() {
                        Some([Sym::Known(v)]) => Some(*v),
                        _ => None,
                    })
                    .collect();
                let (dims, data) = match (args[0], args[1], args[2]) {
                    (Some(s), Some(l), Some(d)) if d != 0 && is_int(t0) => {
                        let count = ((l - s) as f64 / d as f64).ceil().max(0.0) as i64;
                        let data = (count as usize <= MAX_DATA)
                            .then(|| (0..count).map(|i| Sym::Known(s + i * d)).collect());
                        (vec![Sym::Known(count)], data)
                    }
                    _ => (vec![self.fresh()], None),
                };
                one((t0, Some(dims), data))
            }
            Op::Gather(g) => one(self.gather(node, g.axis)),
            Op::ConstantOfShape(value) => {
                let dims = x0.clone();
                let data = x0
                    .as_deref()
                    .and_then(all_known)
                    .filter(|_| value.numel() == 1)
                    .and_then(|d| {
                        let n = d.iter().try_fold(1i64, |a, &b| a.checked_mul(b))?;
                        let v = int_data(value)?;
                        (n >= 0 && n as usize <= MAX_DATA).then(|| vec![v[0]; n as usize])
                    });
                one((Some(value.dtype()), dims, data))
            }
            Op::Reduce(r) => {
                let axes = r
                    .axes
                    .clone()
                    .or_else(|| self.get(node, 1).2.as_deref().and_then(all_known));
                let has_axes_input = node.inputs.get(1).copied().flatten().is_some();
                let dims = d0.and_then(|d| {
                    let reduced: Vec<bool> = match &axes {
                        Some(a) if !a.is_empty() => {
                            let mut m = vec![false; d.len()];
                            for &x in a {
                                m[norm_axis(x, d.len())?] = true;
                            }
                            m
                        }
                        None if has_axes_input => return None,
                        _ => vec![!r.noop_with_empty_axes; d.len()],
                    };
                    Some(
                        d.iter()
                            .zip(&reduced)
                            .filter_map(|(&s, &red)| match (red, r.keepdims) {
                                (false, _) => Some(s),
                                (true, true) => Some(Sym::Known(1)),
                                (true, false) => None,
                            })
                            .collect(),
                    )
                });
                one((t0, dims, None))
            }
            Op::ArgReduce(a) => {
                let dims = d0.and_then(|mut d| {
                    let ax = norm_axis(a.axis, d.len())?;
                    if a.keepdims {
                        d[ax] = Sym::Known(1);
                    } else {
                        d.remove(ax);
                    }
                    Some(d)
                });
                one((Some(DType::I64), dims, None))
            }
            Op::MatMul => {
                let d1 = self.get(node, 1).1;
                let dims = match (d0, d1) {
                    (Some(a), Some(b)) => self.matmul(&a, &b),
                    _ => None,
                };
                one((t0, dims, None))
            }
            Op::MatMulNBits(m) | Op::MatMulNBitsGlu([m, _]) => {
                let dims = d0.and_then(|mut d| {
                    *d.last_mut()? = Sym::Known(m.n as i64);
                    Some(d)
                });
                one((t0, dims, None))
            }
            Op::SiluMul => one((t0, d0, None)),
            // int32 products, or float ones of the scales' type (input 2).
            Op::MatMulInteger | Op::MatMulIntegerToFloat => {
                let d1 = self.get(node, 1).1;
                let dtype = match node.op {
                    Op::MatMulInteger => Some(DType::I32),
                    _ => self.get(node, 2).0,
                };
                let dims = match (d0, d1) {
                    (Some(a), Some(b)) => self.matmul(&a, &b),
                    _ => None,
                };
                one((dtype, dims, None))
            }
            // uint8 codes of the input's shape, their float32 scale and zero point (scalars).
            Op::DynamicQuantize => vec![
                (Some(DType::U8), d0, None),
                (Some(DType::F32), Some(Vec::new()), None),
                (Some(DType::U8), Some(Vec::new()), None),
            ],
            // Values of the scale's type (input 1) in the codes' shape.
            Op::Dequantize(_) => one((self.get(node, 1).0, d0, None)),
            Op::MatMulNBitsGroup(parts) => parts
                .iter()
                .map(|m| {
                    let dims = d0.clone().and_then(|mut d| {
                        *d.last_mut()? = Sym::Known(m.n as i64);
                        Some(d)
                    });
                    (t0, dims, None)
                })
                .collect(),
            Op::GroupQueryAttention(_) => {
                // Output 0 has the query's shape when key and value come separately.
                let separate = node.inputs.get(1).copied().flatten().is_some();
                one((t0, d0.filter(|_| separate), None))
            }
            _ => vec![(t0, None, None)],
        }
    }

    /// A single dimension equal to the product of `dims`.
    fn product_dim(&mut self, dims: &[Sym]) -> Sym {
        match product(dims) {
            Some((k, vars)) if vars.is_empty() => Sym::Known(k),
            Some((1, vars)) if vars.len() == 1 => Sym::Var(vars[0]),
            _ => self.fresh(),
        }
    }

    fn matmul(&mut self, a: &[Sym], b: &[Sym]) -> Option<Vec<Sym>> {
        let (ra, rb) = (a.len(), b.len());
        match (ra, rb) {
            (0, _) | (_, 0) => None,
            (1, 1) => Some(vec![]),
            (1, _) => {
                let mut o = b[..rb - 2].to_vec();
                o.push(b[rb - 1]);
                Some(o)
            }
            (_, 1) => Some(a[..ra - 1].to_vec()),
            _ => {
                let mut o = self.broadcast(&a[..ra - 2], &b[..rb - 2]);
                o.extend([a[ra - 2], b[rb - 1]]);
                Some(o)
            }
        }
    }

    /// Reshape's output dimensions (see [`reshape_dims`]); an unsolved `-1` is a fresh
    /// symbol.
    fn reshape(
        &mut self,
        input: Option<&[Sym]>,
        target: &[Sym],
        allowzero: bool,
    ) -> Option<Vec<Sym>> {
        let dims = reshape_dims(input, target, allowzero)?;
        Some(
            dims.into_iter()
                .map(|d| d.unwrap_or_else(|| self.fresh()))
                .collect(),
        )
    }

    fn concat(&mut self, node: &Node, axis: i64) -> Out {
        let inputs: Vec<Out> = (0..node.inputs.len()).map(|k| self.get(node, k)).collect();
        let t0 = inputs.first().and_then(|i| i.0);
        let Some(shapes) = inputs
            .iter()
            .map(|i| i.1.clone())
            .collect::<Option<Vec<Vec<Sym>>>>()
        else {
            return (t0, None, None);
        };
        let rank = shapes[0].len();
        let Some(ax) = norm_axis(axis, rank).filter(|_| shapes.iter().all(|s| s.len() == rank))
        else {
            return (t0, None, None);
        };
        let mut dims = shapes[0].clone();
        for (d, dim) in dims.iter_mut().enumerate() {
            if d == ax {
                let sizes: Option<Vec<i64>> = shapes
                    .iter()
                    .map(|s| all_known(&s[d..=d]).map(|v| v[0]))
                    .collect();
                *dim = match sizes.and_then(|s| s.iter().try_fold(0i64, |a, &b| a.checked_add(b))) {
                    Some(total) => Sym::Known(total),
                    None => self.fresh(),
                };
            } else if let Some(k) = shapes
                .iter()
                .map(|s| s[d])
                .find(|s| matches!(s, Sym::Known(_)))
            {
                // Inputs must agree off the axis, so a known size anywhere is the size.
                *dim = k;
            }
        }
        let data = (rank == 1)
            .then(|| {
                inputs
                    .iter()
                    .map(|i| i.2.clone())
                    .collect::<Option<Vec<_>>>()
                    .map(|parts| parts.concat())
            })
            .flatten();
        (t0, Some(dims), data)
    }

    fn slice(&mut self, node: &Node, s: &crate::ops::Slice) -> Out {
        let (t0, d0, x0) = self.get(node, 0);
        let known = |v: &Vec<i64>| v.iter().map(|&x| Sym::Known(x)).collect::<Vec<_>>();
        let param = |k: usize| self.get(node, k).2;
        // Starts and ends may hold symbols (`x[..., :Shape(k)[2]]`); axes and steps may not.
        let (starts, ends, axes, steps) = match (&s.starts, &s.ends) {
            (Some(st), Some(en)) => (Some(known(st)), Some(known(en)), s.axes.clone(), None),
            _ => (
                param(1),
                param(2),
                param(3).as_deref().and_then(all_known),
                param(4).as_deref().and_then(all_known),
            ),
        };
        let has = |k: usize| node.inputs.get(k).copied().flatten().is_some();
        let (Some(dims), Some(starts), Some(ends)) = (d0, starts, ends) else {
            return (t0, None, None);
        };
        if s.starts.is_none() && ((has(3) && axes.is_none()) || (has(4) && steps.is_none())) {
            return (t0, None, None);
        }
        let rank = dims.len();
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if axes.len() != starts.len() || ends.len() != starts.len() || steps.len() != starts.len() {
            return (t0, None, None);
        }
        let mut out = dims.clone();
        let mut ranges = vec![None; rank];
        for i in 0..starts.len() {
            let Some(ax) = norm_axis(axes[i], rank) else {
                return (t0, None, None);
            };
            out[ax] = match (dims[ax], starts[i], ends[i]) {
                (Sym::Known(n), Sym::Known(start), Sym::Known(end)) => {
                    match slice_range(n, start, end, steps[i]) {
                        Some((first, count)) => {
                            ranges[ax] = Some((first, count, steps[i]));
                            Sym::Known(count)
                        }
                        None => return (t0, None, None),
                    }
                }
                // The whole of an unknown dimension.
                (v @ Sym::Var(_), Sym::Known(0), Sym::Known(end))
                    if end >= i64::MAX / 2 && steps[i] == 1 =>
                {
                    v
                }
                _ => self.fresh(),
            };
        }
        let sliced_axes: Vec<usize> = axes.iter().filter_map(|&a| norm_axis(a, rank)).collect();
        let data = match (x0, rank) {
            (Some(x), 1) if !sliced_axes.contains(&0) => Some(x),
            (Some(x), 1) => ranges[0].map(|(first, count, step)| {
                (0..count).map(|k| x[(first + k * step) as usize]).collect()
            }),
            _ => None,
        };
        (t0, Some(out), data)
    }

    fn gather(&mut self, node: &Node, axis: i64) -> Out {
        let (t0, d0, x0) = self.get(node, 0);
        let (_, di, xi) = self.get(node, 1);
        let (Some(d), Some(di)) = (d0, di) else {
            return (t0, None, None);
        };
        let Some(ax) = norm_axis(axis, d.len()) else {
            return (t0, None, None);
        };
        let mut dims = d[..ax].to_vec();
        dims.extend(&di);
        dims.extend(&d[ax + 1..]);
        let data = match (x0, xi.as_deref().and_then(all_known), d.as_slice()) {
            (Some(x), Some(idx), [Sym::Known(n)]) if di.len() <= 1 => idx
                .iter()
                .map(|&i| {
                    let i = if i < 0 { i + n } else { i };
                    (0..*n).contains(&i).then(|| x[i as usize])
                })
                .collect(),
            _ => None,
        };
        (t0, Some(dims), data)
    }
}
