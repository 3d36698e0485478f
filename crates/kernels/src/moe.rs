//! Mixture of experts (com.microsoft::MoE and QMoE, as onnxruntime 1.32's CPU kernels
//! define them): each token's router logits pick `k` experts and their weights ([`route`]);
//! each picked expert computes `fc2(act(fc1(x)))` for the token; the token's output is the
//! weighted sum of its experts' outputs ([`moe`]).
//!
//! Expert matrices are f32, [`crate::nbits`] blocks (QMoE's integer form) or MXFP4
//! ([`crate::mxfp4`], QMoE's `fp4` form), each multiplied as stored, or repacked at load for
//! their kernel ([`Repacked`]: integer experts that take f32 activations interleaved, MXFP4
//! experts that take int8 activations in tiles; the same bits).
//!
//! Experts are computed where they are needed: a step's routes are grouped by expert, and
//! each expert that some token picked runs once over the rows of all its tokens, so its
//! weights stream once per step however many tokens share it ([`MoeStats`] counts them).
//! Experts no token picked are never read.
//!
//! The reduction contract (DESIGN.md §6): a token's result depends only on its own row and
//! logits. Its routes come from its logits alone; each expert projection is a matrix product
//! whose rows are independent of the others (the f32 dot product below, or the
//! [`crate::nbits`] kernels, under their own contracts); the weighted sum adds the token's
//! experts in route order (rank, best first), `out = w · y + out` rounded per step, from 0.
//! So a token alone, in a batch or in a prefill chunk gets the same bits at any thread count.
//!
//! Routing (onnxruntime `moe_cpu.cc`, `moe_quantization_cpu.cc`): ranks are by value, then
//! by the higher expert index on ties (`std::partial_sort` with `std::greater` on pairs).
//! - [`Routing::SoftmaxTopK`] (MoE): `p_j = e^(l_j - max) · (1 / Σ_j e^(l_j - max))` over
//!   every expert (summed in index order), the `k` largest, divided by their sum (in rank
//!   order, as a reciprocal) when `normalize`; routes of weight `<= 0` are skipped.
//! - [`Routing::TopKSoftmax`] (QMoE): the `k` largest logits, `e^(l - l_top)` over their sum
//!   (rank order, as a reciprocal); `normalize_routing_weights` does not apply.
//! - [`Routing::Given`] (QMoE's `router_weights`): the `k` largest logits pick, the given
//!   weights weigh (divided by their sum when `normalize`).
//!
//! QMoE drops routes of weight `<= 1e-8`.
//!
//! Activations, in f32: ReLU, GELU (tanh form, as onnxruntime's MoE), SiLU, identity, and
//! SwiGLU over interleaved pairs (`swiglu_fusion = 1`: gate at `2i`, linear at `2i + 1`):
//! `g = min(gate, limit)`, `l = clamp(linear, -limit, limit)`,
//! `g · sigmoid(alpha · g) · (l + beta)` (gpt-oss: alpha 1.702, beta 1, limit 7).

use std::ops::Range;

use crate::ThreadPool;
use crate::attention::lane_tree;
use crate::error::{KernelError, check_len, numel};
use crate::mem::f32_bytes;
use crate::mxfp4::{self, Mxfp4Packed, Mxfp4Weights};
use crate::nbits::{self, Interleaved, NBitsLayout, QuantWeights, ZeroPoints};
use crate::par::{par_row_parts, parts_for};
use crate::sigmoid::{sigmoid, sigmoid_slice};
use smallvec::SmallVec;

/// QMoE's floor: a route of weight at most this is dropped.
const QMOE_MIN_WEIGHT: f32 = 1e-8;

/// How a token's router logits become its routes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// MoE: softmax over every expert, then the `k` most probable.
    SoftmaxTopK { normalize: bool },
    /// QMoE: the `k` largest logits, then a softmax over those.
    TopKSoftmax,
    /// QMoE with `router_weights`: the `k` largest logits pick, the given weights weigh.
    Given { normalize: bool },
}

/// What the router decided for `tokens` tokens: `logits` (and `given` weights) hold
/// `tokens × experts` values, of which each token takes `k` routes by `routing`.
#[derive(Debug, Clone, Copy)]
pub struct Router<'a> {
    pub tokens: usize,
    pub logits: &'a [f32],
    pub given: Option<&'a [f32]>,
    pub k: usize,
    pub routing: Routing,
}

/// The activation between an expert's two projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Relu,
    /// `0.5 x (1 + tanh(sqrt(2 / π) (x + 0.044715 x³)))`.
    Gelu,
    Silu,
    Identity,
    /// Interleaved pairs (see the module doc).
    SwiGlu {
        alpha: f32,
        beta: f32,
        limit: f32,
    },
}

impl Activation {
    /// First-projection outputs per activation output: 2 for SwiGLU's pairs, else 1.
    pub fn fc1_factor(&self) -> usize {
        match self {
            Activation::SwiGlu { .. } => 2,
            _ => 1,
        }
    }

    /// `out` (one row of `inter` values) from `x` (one row of `inter * fc1_factor` values).
    fn apply(&self, x: &[f32], out: &mut [f32]) {
        match *self {
            Activation::Relu => {
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = if v < 0.0 { 0.0 } else { v };
                }
            }
            Activation::Gelu => {
                const C: f32 = 0.797_884_6;
                for (o, &v) in out.iter_mut().zip(x) {
                    *o = 0.5 * v * (1.0 + (C * (v + 0.044_715 * v * v * v)).tanh());
                }
            }
            Activation::Silu => {
                sigmoid_slice(x, out);
                for (o, &v) in out.iter_mut().zip(x) {
                    *o *= v;
                }
            }
            Activation::Identity => out.copy_from_slice(x),
            Activation::SwiGlu { alpha, beta, limit } => {
                for (o, pair) in out.iter_mut().zip(x.chunks_exact(2)) {
                    // Written so a NaN gate or linear value stays NaN.
                    let g = if pair[0] > limit { limit } else { pair[0] };
                    let l = if pair[1] > limit {
                        limit
                    } else if pair[1] < -limit {
                        -limit
                    } else {
                        pair[1]
                    };
                    *o = g * sigmoid(alpha * g) * (l + beta);
                }
            }
        }
    }
}

/// One projection's weights for every expert, one expert after another.
#[derive(Debug, Clone, Copy)]
pub enum ExpertMatrix<'a> {
    /// `[experts, n, k]` f32: output row `j` is `x · w[j]`.
    F32(&'a [f32]),
    /// One `MatMulNBits` matrix per expert ([`crate::nbits`]'s layout): codes
    /// `[experts, n, k_blocks, blob_size]`, scales `[experts, n, k_blocks]`, packed zero
    /// points `[experts, n, zp_row_bytes]` (none: the default). `int8` computes with int8
    /// activations ([`nbits::matmul_nbits_int8`]), else in f32 ([`nbits::matmul_nbits`]), on
    /// `interleaved` when given: the same experts repacked at load ([`Projection::interleave`]),
    /// one per expert, the same bits.
    Quant {
        layout: NBitsLayout,
        data: &'a [u8],
        scales: &'a [f32],
        zero_points: Option<&'a [u8]>,
        int8: bool,
        interleaved: Option<&'a [Interleaved]>,
    },
    /// One MXFP4 matrix per expert ([`crate::mxfp4`]'s layout): codes `[experts, k, n / 2]`,
    /// e8m0 scales `[experts, n, k / 32]`. `int8` computes with int8 activations
    /// ([`mxfp4::matmul_mxfp4_int8`], on `packed` when given: the same experts in the
    /// kernel's tiles, one per expert), else in f32 ([`mxfp4::matmul_mxfp4`]).
    Mxfp4 {
        codes: &'a [u8],
        scales: &'a [u8],
        int8: bool,
        packed: Option<&'a [Mxfp4Packed]>,
    },
}

/// A projection's experts repacked at load for the kernel that runs them
/// ([`Projection::repack`]), one per expert: the same bits as the stored matrices.
#[derive(Debug)]
pub enum Repacked {
    /// Integer experts that take f32 activations.
    Interleaved(Vec<Interleaved>),
    /// MXFP4 experts that take int8 activations.
    Mxfp4(Vec<Mxfp4Packed>),
}

impl<'a> ExpertMatrix<'a> {
    /// The matrices computing on `repacked`, the same experts repacked at load
    /// ([`Projection::repack`]) where it is their kernel's form; as they are otherwise.
    pub fn with_repacked(self, repacked: &'a Repacked) -> ExpertMatrix<'a> {
        match (self, repacked) {
            (
                ExpertMatrix::Quant {
                    layout,
                    data,
                    scales,
                    zero_points,
                    int8,
                    ..
                },
                Repacked::Interleaved(p),
            ) => ExpertMatrix::Quant {
                layout,
                data,
                scales,
                zero_points,
                int8,
                interleaved: Some(p),
            },
            (
                ExpertMatrix::Mxfp4 {
                    codes,
                    scales,
                    int8,
                    ..
                },
                Repacked::Mxfp4(p),
            ) => ExpertMatrix::Mxfp4 {
                codes,
                scales,
                int8,
                packed: Some(p),
            },
            (other, _) => other,
        }
    }
}

/// One of an expert's projections: `n` outputs from `k` inputs, and a bias `[experts, n]`.
#[derive(Debug, Clone, Copy)]
pub struct Projection<'a> {
    pub n: usize,
    pub k: usize,
    pub weights: ExpertMatrix<'a>,
    pub bias: Option<&'a [f32]>,
}

impl<'a> Projection<'a> {
    fn check(&self, experts: usize, what: &'static str) -> Result<(), KernelError> {
        let (n, k) = (self.n, self.k);
        match self.weights {
            ExpertMatrix::F32(w) => check_len(what, w.len(), numel(&[experts, n, k])?)?,
            ExpertMatrix::Quant {
                layout,
                data,
                scales,
                zero_points,
                interleaved,
                ..
            } => {
                if let Some(packed) = interleaved
                    && (packed.len() != experts || packed.iter().any(|p| *p.layout() != layout))
                {
                    return Err(KernelError::Shape(format!(
                        "{what}: {} interleaved experts for {experts} of {n}x{k}",
                        packed.len()
                    )));
                }
                if (layout.n, layout.k) != (n, k) {
                    return Err(KernelError::Shape(format!(
                        "{what}: quantized {}x{} matrices for a {n}x{k} projection",
                        layout.n, layout.k
                    )));
                }
                let blocks = numel(&[experts, n, layout.k_blocks])?;
                check_len(what, data.len(), numel(&[blocks, layout.blob_size])?)?;
                check_len("expert scales", scales.len(), blocks)?;
                if let Some(z) = zero_points {
                    let len = numel(&[experts, n, layout.zp_row_bytes])?;
                    check_len("expert zero points", z.len(), len)?;
                }
            }
            ExpertMatrix::Mxfp4 {
                codes,
                scales,
                packed,
                ..
            } => {
                if let Some(packed) = packed
                    && (packed.len() != experts || packed.iter().any(|p| p.dims() != (n, k)))
                {
                    return Err(KernelError::Shape(format!(
                        "{what}: {} packed MXFP4 experts for {experts} of {n}x{k}",
                        packed.len()
                    )));
                }
                if !n.is_multiple_of(2) || !k.is_multiple_of(mxfp4::BLOCK) {
                    return Err(KernelError::Shape(format!(
                        "{what}: MXFP4 experts need an even number of outputs and inputs in whole blocks \
                         of {}, got {n} x {k}",
                        mxfp4::BLOCK
                    )));
                }
                check_len(what, codes.len(), numel(&[experts, k, n / 2])?)?;
                let blocks = numel(&[experts, n, k / mxfp4::BLOCK])?;
                check_len("expert scales", scales.len(), blocks)?;
            }
        }
        if let Some(b) = self.bias {
            check_len("expert bias", b.len(), numel(&[experts, n])?)?;
        }
        Ok(())
    }

    /// Expert `e`'s matrix (after [`Projection::check`]).
    fn expert(&self, e: usize) -> Expert<'a> {
        let (n, k) = (self.n, self.k);
        match self.weights {
            ExpertMatrix::F32(w) => Expert::F32(&w[e * n * k..][..n * k]),
            ExpertMatrix::Quant {
                layout,
                data,
                scales,
                zero_points,
                int8,
                interleaved,
            } => {
                if let (Some(packed), false) = (interleaved, int8) {
                    return Expert::Interleaved(&packed[e]);
                }
                let blocks = n * layout.k_blocks;
                let zp_len = n * layout.zp_row_bytes;
                let w = QuantWeights {
                    layout,
                    data: &data[e * blocks * layout.blob_size..][..blocks * layout.blob_size],
                    scales: &scales[e * blocks..][..blocks],
                    zero_points: zero_points.map_or(ZeroPoints::Default, |z| {
                        ZeroPoints::Packed(&z[e * zp_len..][..zp_len])
                    }),
                };
                Expert::Quant(w, int8)
            }
            ExpertMatrix::Mxfp4 {
                codes,
                scales,
                int8,
                packed,
            } => {
                let (c, s) = (k * (n / 2), n * (k / mxfp4::BLOCK));
                let w = Mxfp4Weights {
                    n,
                    k,
                    codes: &codes[e * c..][..c],
                    scales: &scales[e * s..][..s],
                };
                match (int8, packed) {
                    (true, Some(packed)) => Expert::Mxfp4Packed(w, &packed[e]),
                    _ => Expert::Mxfp4(w, int8),
                }
            }
        }
    }

    /// Expert `e`'s weights as the byte ranges they lie in (codes or values, scales, zero
    /// points).
    pub fn expert_ranges(&self, e: usize) -> SmallVec<[&'a [u8]; 3]> {
        match self.expert(e) {
            Expert::F32(w) => smallvec::smallvec![f32_bytes(w)],
            Expert::Quant(w, _) => {
                let mut r: SmallVec<[&[u8]; 3]> = smallvec::smallvec![w.data, f32_bytes(w.scales)];
                if let ZeroPoints::Packed(z) = w.zero_points {
                    r.push(z);
                }
                r
            }
            Expert::Mxfp4(w, _) => smallvec::smallvec![w.codes, w.scales],
            Expert::Mxfp4Packed(_, p) => smallvec::smallvec![p.bytes()],
            Expert::Interleaved(w) => w.ranges(),
        }
    }

    /// Every expert's matrix repacked for its kernel: integer experts that take f32
    /// activations interleaved ([`nbits::Interleaved`], where the kernel runs them), MXFP4
    /// experts that take int8 activations in tiles ([`Mxfp4Packed`]); `None` for the others.
    pub fn repack(&self, experts: usize) -> Result<Option<Repacked>, KernelError> {
        self.check(experts, "expert projection")?;
        match self.weights {
            ExpertMatrix::Quant { int8: false, .. } => {
                let mut packed = Vec::with_capacity(experts);
                for e in 0..experts {
                    let Expert::Quant(w, _) = self.expert(e) else {
                        return Ok(None);
                    };
                    match Interleaved::pack(&w)? {
                        Some(p) => packed.push(p),
                        None => return Ok(None),
                    }
                }
                Ok(Some(Repacked::Interleaved(packed)))
            }
            ExpertMatrix::Mxfp4 { int8: true, .. } => {
                let packed = (0..experts).map(|e| match self.expert(e) {
                    Expert::Mxfp4(w, _) | Expert::Mxfp4Packed(w, _) => Mxfp4Packed::pack(&w),
                    _ => unreachable!("MXFP4 experts"),
                });
                Ok(Some(Repacked::Mxfp4(packed.collect::<Result<_, _>>()?)))
            }
            _ => Ok(None),
        }
    }

    /// Bytes of one expert's weights (what a run of it streams).
    pub fn expert_bytes(&self) -> usize {
        match self.weights {
            ExpertMatrix::F32(_) => self.n * self.k * 4,
            ExpertMatrix::Quant {
                layout,
                zero_points,
                ..
            } => {
                let rows = layout.n;
                rows * (layout.k_blocks * (layout.blob_size + 4))
                    + zero_points.map_or(0, |_| rows * layout.zp_row_bytes)
            }
            ExpertMatrix::Mxfp4 { .. } => self.k * self.n / 2 + self.n * self.k / mxfp4::BLOCK,
        }
    }

    /// `out (m × n) = x (m × k) · expert e's weightsᵀ + bias`.
    fn run(
        &self,
        e: usize,
        x: &[f32],
        m: usize,
        out: &mut [f32],
        pool: &ThreadPool,
    ) -> Result<(), KernelError> {
        let (n, k) = (self.n, self.k);
        let bias = self.bias.map(|b| &b[e * n..][..n]);
        match self.expert(e) {
            Expert::F32(w) => {
                let parts = parts_for(pool, m * n, k);
                let (rows_per_task, col_parts) = if parts <= m {
                    (m.div_ceil(parts), 1)
                } else {
                    (1, parts.div_ceil(m).min(n))
                };
                par_row_parts(pool, out, n, rows_per_task, col_parts, |i, cols, row| {
                    dot_rows(&x[i * k..][..k], w, cols, bias, row);
                });
                Ok(())
            }
            Expert::Quant(w, true) => nbits::matmul_nbits_int8(x, m, &w, bias, out, pool),
            Expert::Quant(w, false) => nbits::matmul_nbits_f32(x, m, &w, bias, out, pool),
            Expert::Interleaved(w) => nbits::matmul_interleaved_f32(x, m, w, bias, out, pool),
            Expert::Mxfp4(w, false) => mxfp4::matmul_mxfp4(x, m, &w, bias, out, pool),
            Expert::Mxfp4(w, true) => mxfp4::matmul_mxfp4_int8(x, m, &w, None, bias, out, pool),
            Expert::Mxfp4Packed(w, p) => {
                mxfp4::matmul_mxfp4_int8(x, m, &w, Some(p), bias, out, pool)
            }
        }
    }
}

/// One expert's matrix of an [`ExpertMatrix`] (and, for codes as stored, whether it takes
/// int8 activations).
enum Expert<'a> {
    F32(&'a [f32]),
    Quant(QuantWeights<'a, f32>, bool),
    Interleaved(&'a Interleaved),
    Mxfp4(Mxfp4Weights<'a>, bool),
    /// Int8 activations on the packed tiles.
    Mxfp4Packed(Mxfp4Weights<'a>, &'a Mxfp4Packed),
}

/// `row[c] = x · w[cols.start + c] (+ bias)`: each dot product in eight lanes (element `d`
/// into lane `d % 8`, ascending, multiply then add) summed by the attention kernels' lane
/// tree; the bias after.
fn dot_rows(x: &[f32], w: &[f32], cols: Range<usize>, bias: Option<&[f32]>, row: &mut [f32]) {
    let k = x.len();
    for (o, j) in row.iter_mut().zip(cols) {
        let wj = &w[j * k..][..k];
        let mut lanes = [0f32; 8];
        let (xc, wc) = (x.chunks_exact(8), wj.chunks_exact(8));
        let (xr, wr) = (xc.remainder(), wc.remainder());
        for (a, b) in xc.zip(wc) {
            for l in 0..8 {
                lanes[l] += a[l] * b[l];
            }
        }
        for (l, (a, b)) in xr.iter().zip(wr).enumerate() {
            lanes[l] += a * b;
        }
        let dot = lane_tree(lanes);
        *o = bias.map_or(dot, |b| dot + b[j]);
    }
}

/// Every expert's two projections and the activation between them.
#[derive(Debug, Clone, Copy)]
pub struct Experts<'a> {
    pub count: usize,
    /// `inter * activation.fc1_factor()` outputs from `hidden` inputs.
    pub fc1: Projection<'a>,
    /// `hidden` outputs from `inter` inputs.
    pub fc2: Projection<'a>,
    pub activation: Activation,
}

impl Experts<'_> {
    /// `(hidden, inter)`.
    fn dims(&self) -> (usize, usize) {
        (self.fc1.k, self.fc2.k)
    }

    fn check(&self) -> Result<(), KernelError> {
        let (hidden, inter) = self.dims();
        let factor = self.activation.fc1_factor();
        if self.fc1.n != inter * factor || self.fc2.n != hidden {
            return Err(KernelError::Shape(format!(
                "experts of {} -> {} -> {} features do not chain: the first projection must \
                 give {} ({inter} x {factor}) and the second {hidden}",
                self.fc1.k,
                self.fc1.n,
                self.fc2.n,
                inter * factor
            )));
        }
        self.fc1.check(self.count, "first expert projection")?;
        self.fc2.check(self.count, "second expert projection")
    }

    /// Weight bytes one expert streams per run (both projections).
    pub fn expert_bytes(&self) -> usize {
        self.fc1.expert_bytes() + self.fc2.expert_bytes()
    }
}

/// What a step's routing did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoeStats {
    /// Routes taken (token, expert pairs of nonzero weight).
    pub routes: usize,
    /// Distinct experts computed: each streamed its weights once.
    pub experts: usize,
    /// Weight bytes those experts streamed.
    pub bytes: usize,
}

/// A route that is not taken (its weight was dropped).
const DROPPED: u32 = u32::MAX;

/// Token `logits`' `k` routes into `experts` and `weights` (rank order; a dropped route has
/// expert [`u32::MAX`]). `given` holds `router_weights` for [`Routing::Given`].
pub fn route(
    logits: &[f32],
    given: Option<&[f32]>,
    k: usize,
    routing: Routing,
    experts: &mut [u32],
    weights: &mut [f32],
) {
    let n = logits.len();
    let softmax = matches!(routing, Routing::SoftmaxTopK { .. });
    // Values ranked: probabilities for MoE, logits for QMoE.
    let mut probs = SmallVec::<[f32; 128]>::from_slice(logits);
    if softmax {
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let mut sum = 0f32;
        for p in probs.iter_mut() {
            *p = (*p - max).exp();
            sum += *p;
        }
        let inv = 1.0 / sum;
        for p in probs.iter_mut() {
            *p *= inv;
        }
    }
    // Rank by value, then by the higher index; -0 ranks as 0, a NaN as larger than any value.
    let key = |j: usize| {
        let v = probs[j];
        (if v == 0.0 { 0.0 } else { v }, j)
    };
    let mut order = SmallVec::<[u32; 128]>::from_iter(0..n as u32);
    let greater = |a: &u32, b: &u32| {
        let ((va, ia), (vb, ib)) = (key(*a as usize), key(*b as usize));
        vb.total_cmp(&va).then(ib.cmp(&ia))
    };
    let k = k.min(n);
    if k < n {
        order.select_nth_unstable_by(k, greater);
    }
    order[..k].sort_unstable_by(greater);
    let top = &order[..k];
    for (e, &j) in experts.iter_mut().zip(top) {
        *e = j;
    }
    let (experts, weights) = (&mut experts[..k], &mut weights[..k]);
    let floor = match routing {
        Routing::SoftmaxTopK { normalize } => {
            for (w, &j) in weights.iter_mut().zip(top) {
                *w = probs[j as usize];
            }
            if normalize {
                scale_by_inverse_sum(weights);
            }
            0.0
        }
        Routing::TopKSoftmax => {
            let best = top.first().map_or(0.0, |&j| logits[j as usize]);
            for (w, &j) in weights.iter_mut().zip(top) {
                *w = (logits[j as usize] - best).exp();
            }
            scale_by_inverse_sum(weights);
            QMOE_MIN_WEIGHT
        }
        Routing::Given { normalize } => {
            let given = given.unwrap_or(&[]);
            for (w, &j) in weights.iter_mut().zip(top) {
                *w = given.get(j as usize).copied().unwrap_or(0.0);
            }
            if normalize {
                scale_by_inverse_sum(weights);
            }
            QMOE_MIN_WEIGHT
        }
    };
    for (e, &w) in experts.iter_mut().zip(weights.iter()) {
        // A NaN weight is dropped too.
        if w.is_nan() || w <= floor {
            *e = DROPPED;
        }
    }
}

/// `w *= 1 / Σ w` (summed in order), or all 0 when the sum is 0.
fn scale_by_inverse_sum(w: &mut [f32]) {
    let sum: f32 = w.iter().sum();
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for w in w.iter_mut() {
        *w *= inv;
    }
}

/// Scratch [`moe`] needs: `(f32 values, u32 indices)`.
pub fn scratch_len(tokens: usize, k: usize, experts: &Experts) -> (usize, usize) {
    let (hidden, inter) = experts.dims();
    let routes = tokens * k;
    let rows = tokens * (hidden + experts.fc1.n + inter + hidden);
    (
        routes + routes * hidden + rows,
        2 * routes + experts.count + 1,
    )
}

/// `out` (`tokens × hidden`) = each token's routed experts on its row of `x`, weighed (see
/// the module doc). Returns what the routing did; `computed(e)` is told each expert once it
/// has run.
pub fn moe(
    x: &[f32],
    router: Router,
    experts: &Experts,
    out: &mut [f32],
    (values, indices): (&mut [f32], &mut [u32]),
    pool: &ThreadPool,
    computed: &mut dyn FnMut(usize),
) -> Result<MoeStats, KernelError> {
    let Router {
        tokens,
        logits,
        given,
        k,
        routing,
    } = router;
    experts.check()?;
    let (hidden, inter) = experts.dims();
    let count = experts.count;
    if k == 0 || k > count {
        return Err(KernelError::Shape(format!(
            "k = {k} experts per token, of {count}: must be 1..={count}"
        )));
    }
    check_len("MoE input", x.len(), numel(&[tokens, hidden])?)?;
    check_len("router logits", logits.len(), numel(&[tokens, count])?)?;
    if let Some(g) = given {
        check_len("router weights", g.len(), tokens * count)?;
    }
    check_len("MoE output", out.len(), tokens * hidden)?;
    let (need_values, need_indices) = scratch_len(tokens, k, experts);
    if values.len() < need_values || indices.len() < need_indices {
        return Err(KernelError::Length {
            what: "MoE scratch",
            expected: need_values,
            actual: values.len(),
        });
    }
    let routes = tokens * k;
    let (weights, values) = values.split_at_mut(routes);
    let (slots, values) = values.split_at_mut(routes * hidden);
    let (rows, values) = values.split_at_mut(tokens * hidden);
    let (h1, values) = values.split_at_mut(tokens * experts.fc1.n);
    let (act, y) = values.split_at_mut(tokens * inter);
    let (chosen, indices) = indices.split_at_mut(routes);
    let (order, starts) = indices.split_at_mut(routes);
    let starts = &mut starts[..count + 1];

    for t in 0..tokens {
        route(
            &logits[t * count..][..count],
            given.map(|g| &g[t * count..][..count]),
            k,
            routing,
            &mut chosen[t * k..][..k],
            &mut weights[t * k..][..k],
        );
    }
    // Routes grouped by expert (a counting sort, in route order within an expert).
    starts.fill(0);
    for &e in chosen.iter().filter(|&&e| e != DROPPED) {
        starts[e as usize + 1] += 1;
    }
    for e in 0..count {
        starts[e + 1] += starts[e];
    }
    let mut next: SmallVec<[u32; 128]> = starts[..count].iter().copied().collect();
    for (r, &e) in chosen.iter().enumerate() {
        if e != DROPPED {
            order[next[e as usize] as usize] = r as u32;
            next[e as usize] += 1;
        }
    }
    let mut stats = MoeStats::default();
    let fc1_n = experts.fc1.n;
    for e in 0..count {
        let mine = &order[starts[e] as usize..starts[e + 1] as usize];
        let m = mine.len();
        if m == 0 {
            continue;
        }
        stats.experts += 1;
        stats.routes += m;
        for (row, &r) in rows.chunks_exact_mut(hidden).zip(mine) {
            row.copy_from_slice(&x[(r as usize / k) * hidden..][..hidden]);
        }
        experts
            .fc1
            .run(e, &rows[..m * hidden], m, &mut h1[..m * fc1_n], pool)?;
        for (a, h) in act
            .chunks_exact_mut(inter)
            .zip(h1.chunks_exact(fc1_n))
            .take(m)
        {
            experts.activation.apply(h, a);
        }
        experts
            .fc2
            .run(e, &act[..m * inter], m, &mut y[..m * hidden], pool)?;
        for (yr, &r) in y.chunks_exact(hidden).zip(mine) {
            slots[r as usize * hidden..][..hidden].copy_from_slice(yr);
        }
        computed(e);
    }
    stats.bytes = stats.experts * experts.expert_bytes();
    for (t, o) in out.chunks_exact_mut(hidden).enumerate() {
        o.fill(0.0);
        for r in t * k..(t + 1) * k {
            if chosen[r] == DROPPED {
                continue;
            }
            let w = weights[r];
            for (o, &v) in o.iter_mut().zip(&slots[r * hidden..][..hidden]) {
                *o += w * v;
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
#[path = "moe_tests.rs"]
mod tests;
