//! Converting GGUF tensors: dequantization to f32, and repacking of quantized weights into
//! the layouts of onnxruntime's `com.microsoft::MatMulNBits` and
//! `com.microsoft::GatherBlockQuantized` *without requantization* — the repacked weights
//! dequantize (by the operators' formula `(q - zero_point) * scale` in f32) to the values ggml
//! dequantizes, exactly for Q4_0 and Q8_0, and within the bound below for Q4_1.
//!
//! References: onnxruntime `docs/ContribOperators.md` (`com.microsoft.MatMulNBits`,
//! `com.microsoft.GatherBlockQuantized`), `onnxruntime/contrib_ops/cpu/quantization/
//! gather_block_quantized.cc`; ggml `ggml-common.h` for the source blocks ([`crate::blocks`]).
//!
//! # The nibble trap
//!
//! A ggml 4-bit block keeps element `j` in the low nibble of byte `j` and element `j + 16` in
//! its high nibble. onnxruntime packs elements `2j` (low) and `2j + 1` (high) into byte `j`.
//! The 16 bytes of codes are therefore re-paired, never copied.
//!
//! # Scales and zero points are f32
//!
//! GGUF stores scales (and Q4_1 minimums) as f16; the outputs here hold them as f32, the
//! type of the activations in an f32 package. The widening is exact, so nothing is lost, at
//! twice the bytes for the (small) scale tensors.
//!
//! # Per format
//!
//! A GGUF weight with `dims = [K, N]` (K fastest) is N rows of K/32 blocks: row `n` is exactly
//! MatMulNBits' column `n` (`B[n, block, ..]`), and exactly embedding row `n`.
//!
//! | ggml | MatMulNBits (block_size 32) | GatherBlockQuantized (block_size 32) |
//! |---|---|---|
//! | Q4_0 | bits 4, codes re-paired, no zero points (default 8 = ggml's offset) | bits 4, same bytes, no zero points (default 8) |
//! | Q8_0 | bits 8, code `q + 128` (`q ^ 0x80`), packed uint8 zero points 128 | bits 8, code `q + 128`, no zero points (default 128) |
//! | Q4_1 | bits 4, codes re-paired, f32 zero points `-m / d` | not representable (below) |
//! | Q4_K | bits 4, each sub-block of 32 a block: scale `d·sc`, f32 zero point `dmin·m / (d·sc)` | bits 8, **requantized** symmetric, default zero points |
//! | Q5_K | bits 8, **requantized** (below), uint8 zero points | bits 8, **requantized** symmetric |
//! | Q6_K | bits 8, **requantized** (below), zero points 128 | bits 8, **requantized** symmetric |
//!
//! **K-quants.** A Q4_K sub-block is `(d·sc)·q - dmin·m` with both products exact, the same
//! form as Q4_1's `q·d + m`, so the same bound holds with `m` the sub-block's `-dmin·m` and
//! `d` its `d·sc`. Q5_K's 5-bit codes need 8 bits, and onnxruntime's CPU `MatMulNBits` takes
//! no float zero points with 8 bits, so its 32 values (exact in f32) are requantized to int8
//! with a uint8 zero point over `[min(v, 0), max(v, 0)]`: each moves by at most
//! `range / 510`, a sixteenth of a Q5_K step. A Q6_K sub-block of 16 has its own scale and
//! the fast kernels take blocks of 32 with one scale each: its 32 values are requantized to
//! symmetric int8 (`s = max|v| / 127`), moving each by at most `s / 2`, an eighth of the
//! coarser Q6_K step. [`MatMulNBitsWeight::requantized`] reports the largest change.
//!
//! **Q4_1 bound.** ggml computes `g = q·d + m`, where `q·d` is exact in f32 (11-bit times
//! 4-bit significands), so `g` is the exact value rounded once. With `z = fl(-m / d)` and
//! `u = 2⁻²⁴` (f32 unit roundoff), to first order in `u`:
//! - the operator's formula `r = fl(fl(q - z)·d)` (oxgen's reference kernel) gives
//!   `|r - g| ≤ u·(|m| + 3|g|)`;
//! - onnxruntime 1.32's CPU kernel, which evaluates `q·d + fl(-z·d)` (checked bitwise on
//!   SmolLM2's `blk.0.attn_q.weight`), gives `|r - g| ≤ 2u·(|m| + |g|)`, and exactly `g`
//!   whenever `fl(-z·d) = m` (90% of SmolLM2's Q4_1 blocks; no nearby `z` does better).
//!
//! These are absolute errors of a few ulps of the block's minimum or value, not bounds in
//! ulps of `g`, which cancellation can make tiny while `m` is not. The property tests check
//! both.
//!
//! A block whose scale is zero (all values `m`) would give `z = ±inf`; it is rewritten as
//! codes 1, scale `d + m` (that is `m`), zero point -0, which yields ggml's value exactly,
//! signed zeros included, under both evaluation orders.
//!
//! **Q4_1 has no GatherBlockQuantized form.** That operator takes integer zero points only
//! (uint8, `value = (q - zp) * scale`), and a Q4_1 minimum is in general not an integer
//! multiple of its scale. [`gather_block_quantized`] refuses it; dequantize the table
//! ([`crate::GgufFile::dequantize`]) for a plain `Gather` instead.

use std::mem::size_of;

use oxgen_tensor::{AlignedBuf, DType, Tensor};

use crate::blocks::{
    self, AffineSubBlocks, Block, BlockMxfp4, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5K, BlockQ6K,
    BlockQ8_0, QK, QK_K,
};
use crate::{GgmlType, GgufError, TensorInfo};

/// A weight in `com.microsoft::MatMulNBits` layout, with the node's attributes.
#[derive(Debug, Clone)]
pub struct MatMulNBitsWeight {
    /// Attribute `K`: input features (the GGUF `ne[0]`).
    pub k: usize,
    /// Attribute `N`: output features (the GGUF `ne[1]`).
    pub n: usize,
    /// Attribute `bits`: 4 or 8.
    pub bits: u32,
    /// Attribute `block_size`: 32.
    pub block_size: usize,
    /// Input `B`: uint8 `[N, K / 32, 32 * bits / 8]`, codes packed low bits first.
    pub b: Tensor,
    /// Input `scales`: f32 `[N * K / 32]`.
    pub scales: Tensor,
    /// Input `zero_points`: `None` (the default `2^(bits - 1)` is right), uint8
    /// `[N * K / 32]` for 8 bits, or f32 `[N * K / 32]` for Q4_1, Q4_K and Q5_K.
    pub zero_points: Option<Tensor>,
    /// For a weight that had to be requantized (Q6_K): how far it moved.
    pub requantized: Option<Requantized>,
}

/// The cost of a requantization: the largest change of any weight, and the largest weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Requantized {
    pub max_abs_error: f32,
    pub max_abs: f32,
}

/// An embedding table in `com.microsoft::GatherBlockQuantized` layout, for attributes
/// `gather_axis = 0`, `quantize_axis = 1` (the last axis), `block_size`, `bits`, and no
/// `zero_points` input (the default `2^(bits - 1)` is exact for Q4_0 and Q8_0).
#[derive(Debug, Clone)]
pub struct GatherBlockQuantizedWeight {
    /// Rows (the vocabulary; GGUF `ne[1]`).
    pub rows: usize,
    /// Elements per row (the hidden size; GGUF `ne[0]`).
    pub k: usize,
    /// Attribute `bits`: 4 or 8.
    pub bits: u32,
    /// Attribute `block_size`: 32.
    pub block_size: usize,
    /// Input `data`: uint8 `[rows, k * bits / 8]`, codes packed low bits first.
    pub data: Tensor,
    /// Input `scales`: f32 `[rows, k / 32]`.
    pub scales: Tensor,
    /// For a K-quant table (requantized to int8): how far it moved.
    pub requantized: Option<Requantized>,
}

/// Zero-filled bytes for a tensor's converted data, failing cleanly if refused.
fn alloc(tensor: &str, bytes: usize) -> Result<AlignedBuf, GgufError> {
    let mut buf = AlignedBuf::default();
    buf.try_resize(bytes).map_err(|_| GgufError::Alloc {
        file: Default::default(),
        tensor: tensor.to_string(),
        bytes,
    })?;
    Ok(buf)
}

fn make_tensor(dtype: DType, dims: &[usize], buf: AlignedBuf) -> Tensor {
    Tensor::from_buf(dtype, dims, buf).expect("buffers are allocated for exactly these dims")
}

fn unsupported(tensor: &str, ty: GgmlType, operation: &'static str, hint: String) -> GgufError {
    GgufError::Unsupported {
        file: Default::default(),
        tensor: tensor.to_string(),
        ggml_type: ty,
        operation,
        hint,
    }
}

/// A tensor dequantized to f32 in ONNX shape; `data` is its validated data.
pub(crate) fn dequantize_tensor(t: &TensorInfo, data: &[u8]) -> Result<Tensor, GgufError> {
    if !blocks::DEQUANTIZABLE.contains(&t.ggml_type) {
        return Err(unsupported(
            &t.name,
            t.ggml_type,
            "dequantize",
            format!(
                "supported types are {:?}",
                blocks::DEQUANTIZABLE.map(GgmlType::name)
            ),
        ));
    }
    let too_big = || GgufError::Alloc {
        file: Default::default(),
        tensor: t.name.clone(),
        bytes: usize::MAX,
    };
    let numel = usize::try_from(t.n_elements).map_err(|_| too_big())?;
    let bytes = numel.checked_mul(4).ok_or_else(too_big)?;
    let mut buf = alloc(&t.name, bytes)?;
    let out: &mut [f32] = bytemuck::cast_slice_mut(buf.as_mut_bytes());
    let done = blocks::dequantize(t.ggml_type, data, out);
    debug_assert!(
        done,
        "DEQUANTIZABLE lists the types blocks::dequantize handles"
    );
    Ok(make_tensor(DType::F32, &t.onnx_dims(), buf))
}

/// `(K, N)` of a 2-D weight with `dims = [K, N]` of type `ty`, checked against `data`.
fn weight_dims(
    tensor: &str,
    ty: GgmlType,
    dims: &[u64],
    data: &[u8],
    layout: &str,
) -> Result<(usize, usize), GgufError> {
    let bad = |problem: String| GgufError::BadShape {
        file: Default::default(),
        tensor: tensor.to_string(),
        dims: dims.to_vec(),
        problem,
    };
    let &[k, n] = dims else {
        return Err(bad(format!("{layout} needs a 2-D weight [K, N]")));
    };
    let block = u64::from(ty.block_elems()).max(QK as u64);
    if k == 0 || n == 0 || k % block != 0 {
        return Err(bad(format!(
            "{layout} needs a non-empty {ty} weight whose K is a multiple of {block}"
        )));
    }
    let expected = (k / u64::from(ty.block_elems()))
        .checked_mul(n)
        .and_then(|b| b.checked_mul(ty.block_bytes().into()));
    if expected != Some(data.len() as u64) {
        return Err(bad(format!(
            "{} bytes of {ty} data do not hold {k} × {n} elements",
            data.len()
        )));
    }
    // Both are at most the byte length of `data`.
    Ok((k as usize, n as usize))
}

/// ggml's 16 code bytes (element `j` low, `j + 16` high) re-paired into onnxruntime's order
/// (element `2j` low, `2j + 1` high).
pub fn q4_to_onnx_order(qs: &[u8; QK / 2]) -> [u8; QK / 2] {
    let code = |i: usize| {
        if i < QK / 2 {
            qs[i] & 0x0F
        } else {
            qs[i - QK / 2] >> 4
        }
    };
    std::array::from_fn(|j| code(2 * j) | (code(2 * j + 1) << 4))
}

/// Codes and scales of `blocks` blocks of `B`, per block: `(code bytes, scale, zero point)`.
struct Repacked {
    codes: AlignedBuf,
    scales: AlignedBuf,
    zero_points: Option<AlignedBuf>,
}

/// Repacks blocks of `B` as blocks of 32 (`B::ELEMS / 32` per `B`): `each(block, j, codes)`
/// writes sub-block `j`'s `code_bytes` code bytes and returns its scale and zero point.
fn repack_blocks<B: Block>(
    tensor: &str,
    data: &[u8],
    code_bytes: usize,
    float_zero_points: bool,
    mut each: impl FnMut(&B, usize, &mut [u8]) -> (f32, f32),
) -> Result<Repacked, GgufError> {
    let subs = B::ELEMS / QK;
    let n_blocks = data.len() / size_of::<B>() * subs;
    let mut codes = alloc(tensor, n_blocks * code_bytes)?;
    let mut scales = alloc(tensor, n_blocks * 4)?;
    let mut zps = if float_zero_points {
        Some(alloc(tensor, n_blocks * 4)?)
    } else {
        None
    };
    let scale_out: &mut [f32] = bytemuck::cast_slice_mut(scales.as_mut_bytes());
    let mut zp_out: Option<&mut [f32]> = zps
        .as_mut()
        .map(|z| bytemuck::cast_slice_mut(z.as_mut_bytes()));
    for (i, out) in codes
        .as_mut_bytes()
        .chunks_exact_mut(code_bytes)
        .enumerate()
    {
        let (scale, zp) = each(&blocks::read_block::<B>(data, i / subs), i % subs, out);
        scale_out[i] = scale;
        if let Some(z) = zp_out.as_deref_mut() {
            z[i] = zp;
        }
    }
    Ok(Repacked {
        codes,
        scales,
        zero_points: zps,
    })
}

type RepackFn = fn(&str, &[u8]) -> Result<Repacked, GgufError>;

fn repack_q4_0(tensor: &str, data: &[u8]) -> Result<Repacked, GgufError> {
    repack_blocks::<BlockQ4_0>(tensor, data, QK / 2, false, |b, _, out| {
        out.copy_from_slice(&q4_to_onnx_order(&b.qs));
        (b.d.to_f32(), 8.0)
    })
}

fn repack_q8_0(tensor: &str, data: &[u8]) -> Result<Repacked, GgufError> {
    repack_blocks::<BlockQ8_0>(tensor, data, QK, false, |b, _, out| {
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            // q + 128 as a byte: flipping the sign bit maps -128..=127 onto 0..=255.
            *o = (q as u8) ^ 0x80;
        }
        (b.d.to_f32(), 128.0)
    })
}

/// Q4_1: `q·d + m = (q - z)·d` with `z = -m / d`; zero-scale blocks become codes 1, scale
/// `d + m` (= `m`, with ggml's signed zero), zero point -0.
fn repack_q4_1(tensor: &str, data: &[u8]) -> Result<Repacked, GgufError> {
    repack_blocks::<BlockQ4_1>(tensor, data, QK / 2, true, |b, _, out| {
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        if d == 0.0 {
            out.fill(0x11);
            // ggml's `d·q + m` with `d = ±0` is `d + m`, signed zeros included (a -0 minimum
            // gives +0 unless the scale is -0 too). A zero point of -0 keeps that sign under
            // both `(1 - z)·s` and onnxruntime's `1·s + (-z·s)`.
            (d + m, -0.0)
        } else {
            out.copy_from_slice(&q4_to_onnx_order(&b.qs));
            (d, -m / d)
        }
    })
}

/// Q4_K, without requantization: each sub-block of 32 as `(q - z)·s` with scale `s = d·sc`
/// and float zero point `z = (dmin·m) / s`, the 4-bit codes re-paired into onnxruntime's order
/// (element `2p` low, `2p + 1` high). A zero scale (every value `-dmin·m`) becomes codes 1,
/// scale `s - dmin·m`, zero point -0: ggml's value with its signed zero, as for Q4_1.
fn repack_q4_k(tensor: &str, data: &[u8]) -> Result<Repacked, GgufError> {
    repack_blocks::<BlockQ4K>(tensor, data, QK / 2, true, |b, j, out| {
        let (scale, min) = b.sub_block(j);
        if scale == 0.0 {
            out.fill(0x11);
            return (scale - min, -0.0);
        }
        for (p, o) in out.iter_mut().enumerate() {
            *o = b.code(j, 2 * p) | b.code(j, 2 * p + 1) << 4;
        }
        (scale, min / scale)
    })
}

/// Q5_K and Q6_K, requantized to int8 blocks of 32 (see the module docs): each 32 values
/// (exact in f32) become codes `round(v / s) + z`. Q6_K is symmetric (`s = max|v| / 127`,
/// `z = 128`); Q5_K, whose sub-blocks are offset by their minimum, is asymmetric over the
/// range `[min(v, 0), max(v, 0)]` (`s = range / 255`, `z = round(-lo / s)`, a uint8 zero point
/// per block). Zero points come back as f32 (whole numbers); returns the largest change.
fn requantize_int8<B: Block>(
    tensor: &str,
    data: &[u8],
    asymmetric: bool,
) -> Result<(Repacked, Requantized), GgufError> {
    let mut cost = Requantized {
        max_abs_error: 0.0,
        max_abs: 0.0,
    };
    let mut values = [0f32; QK_K];
    let r = repack_blocks::<B>(tensor, data, QK, true, |b, j, out| {
        if j == 0 {
            b.dequantize(&mut values);
        }
        let v = &values[j * QK..][..QK];
        let (lo, hi) = v
            .iter()
            .fold((0f32, 0f32), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let (scale, zp) = if asymmetric {
            let scale = (hi - lo) / 255.0;
            let zp = if scale > 0.0 {
                (-lo / scale).round().clamp(0.0, 255.0)
            } else {
                128.0
            };
            (scale, zp)
        } else {
            (hi.max(-lo) / 127.0, 128.0)
        };
        for (o, &x) in out.iter_mut().zip(v) {
            let q = if scale > 0.0 {
                ((x / scale).round() + zp).clamp(0.0, 255.0)
            } else {
                zp
            };
            *o = q as u8;
            cost.max_abs_error = cost.max_abs_error.max(((q - zp) * scale - x).abs());
        }
        cost.max_abs = cost.max_abs.max(hi.max(-lo));
        (scale, zp)
    })?;
    Ok((r, cost))
}

/// Repacks a 2-D quantized weight (`dims = [K, N]`, K fastest) for `MatMulNBits`, block size
/// 32: Q4_0, Q4_1 and Q4_K to 4 bits and Q8_0 to 8 bits without requantization; Q5_K and
/// Q6_K requantized to 8 bits (see the module docs).
pub fn matmul_nbits(
    tensor: &str,
    ty: GgmlType,
    dims: &[u64],
    data: &[u8],
) -> Result<MatMulNBitsWeight, GgufError> {
    let bits = match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => 4,
        GgmlType::Q8_0 | GgmlType::Q5_K | GgmlType::Q6_K => 8,
        _ => {
            return Err(unsupported(
                tensor,
                ty,
                "repack for MatMulNBits",
                "Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K repack; keep a float weight as a \
                 MatMul initializer (GgufFile::dequantize)"
                    .into(),
            ));
        }
    };
    let (k, n) = weight_dims(tensor, ty, dims, data, "MatMulNBits")?;
    let kb = k / QK;
    let (r, requantized) = match ty {
        GgmlType::Q4_0 => (repack_q4_0(tensor, data)?, None),
        GgmlType::Q4_1 => (repack_q4_1(tensor, data)?, None),
        GgmlType::Q8_0 => (repack_q8_0(tensor, data)?, None),
        GgmlType::Q4_K => (repack_q4_k(tensor, data)?, None),
        GgmlType::Q5_K => {
            let (r, cost) = requantize_int8::<BlockQ5K>(tensor, data, true)?;
            (int_zero_points(r), Some(cost))
        }
        _ => {
            let (r, cost) = requantize_int8::<BlockQ6K>(tensor, data, false)?;
            (int_zero_points(r), Some(cost))
        }
    };
    let zero_points = if let Some(z) = r.zero_points {
        Some(if requantized.is_some() {
            make_tensor(DType::U8, &[n * kb], z)
        } else {
            tensor_f32_1d(z, n * kb)
        })
    } else if bits == 8 {
        let mut z = alloc(tensor, n * kb)?;
        z.as_mut_bytes().fill(128);
        Some(make_tensor(DType::U8, &[n * kb], z))
    } else {
        None
    };
    Ok(MatMulNBitsWeight {
        k,
        n,
        bits,
        block_size: QK,
        b: make_tensor(DType::U8, &[n, kb, QK * bits as usize / 8], r.codes),
        scales: tensor_f32_1d(r.scales, n * kb),
        zero_points,
        requantized,
    })
}

/// Requantized codes with their whole-number f32 zero points as uint8 ones (onnxruntime's CPU
/// `MatMulNBits` takes no float zero points with 8 bits).
fn int_zero_points(r: Repacked) -> Repacked {
    let zero_points = r.zero_points.map(|z| {
        let values: &[f32] = bytemuck::cast_slice(z.as_bytes());
        let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
        AlignedBuf::from_bytes(&bytes)
    });
    Repacked { zero_points, ..r }
}

fn tensor_f32_1d(buf: AlignedBuf, len: usize) -> Tensor {
    make_tensor(DType::F32, &[len], buf)
}

/// Repacks an embedding table (`dims = [K, rows]`, K fastest) for `GatherBlockQuantized`:
/// Q4_0 to 4 bits, Q8_0 to 8 bits, block size 32, default zero points (module docs). Q4_1
/// and float tables are refused with a hint.
pub fn gather_block_quantized(
    tensor: &str,
    ty: GgmlType,
    dims: &[u64],
    data: &[u8],
) -> Result<GatherBlockQuantizedWeight, GgufError> {
    let (bits, repack): (u32, RepackFn) = match ty {
        GgmlType::Q4_0 => (4, repack_q4_0),
        GgmlType::Q8_0 => (8, repack_q8_0),
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            return gather_block_quantized_k(tensor, ty, dims, data);
        }
        GgmlType::Q4_1 => {
            return Err(unsupported(
                tensor,
                ty,
                "repack for GatherBlockQuantized",
                "its zero points must be integers, and a Q4_1 minimum is not an integer \
                 multiple of its scale; dequantize the table (GgufFile::dequantize) for a \
                 plain Gather"
                    .into(),
            ));
        }
        _ => {
            return Err(unsupported(
                tensor,
                ty,
                "repack for GatherBlockQuantized",
                "only Q4_0 and Q8_0 repack without requantization; dequantize the table \
                 (GgufFile::dequantize) for a plain Gather"
                    .into(),
            ));
        }
    };
    let (k, rows) = weight_dims(tensor, ty, dims, data, "GatherBlockQuantized")?;
    let r = repack(tensor, data)?;
    Ok(GatherBlockQuantizedWeight {
        rows,
        k,
        bits,
        block_size: QK,
        data: make_tensor(DType::U8, &[rows, k * bits as usize / 8], r.codes),
        scales: make_tensor(DType::F32, &[rows, k / QK], r.scales),
        requantized: None,
    })
}

/// A K-quant table for `GatherBlockQuantized`, requantized to symmetric int8 blocks of 32
/// (default zero point 128): the operator takes integer zero points and one scale per block,
/// which Q4_K's and Q5_K's minimums and Q6_K's scales per 16 are not. A quarter of the f32
/// table's bytes; each value moves by at most half a step of its new scale.
fn gather_block_quantized_k(
    tensor: &str,
    ty: GgmlType,
    dims: &[u64],
    data: &[u8],
) -> Result<GatherBlockQuantizedWeight, GgufError> {
    let (k, rows) = weight_dims(tensor, ty, dims, data, "GatherBlockQuantized")?;
    let (r, cost) = match ty {
        GgmlType::Q4_K => requantize_int8::<BlockQ4K>(tensor, data, false)?,
        GgmlType::Q5_K => requantize_int8::<BlockQ5K>(tensor, data, false)?,
        _ => requantize_int8::<BlockQ6K>(tensor, data, false)?,
    };
    Ok(GatherBlockQuantizedWeight {
        rows,
        k,
        bits: 8,
        block_size: QK,
        data: make_tensor(DType::U8, &[rows, k], r.codes),
        scales: make_tensor(DType::F32, &[rows, k / QK], r.scales),
        requantized: Some(cost),
    })
}

/// MXFP4 expert matrices in com.microsoft::QMoE's `fp4` layout (what `oxgen_kernels::mxfp4`
/// multiplies as stored): codes `[experts, k, n / 2]`, row `k` holding every output's code
/// for input `k`, two per byte with the even output in the low nibble, and e8m0 scales
/// `[experts, n, k / 32]`. The codes and exponents are ggml's, moved, not requantized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QMoeMxfp4 {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

/// Gathers MXFP4 GGUF tensors of `experts × rows × k` (ggml dims `[k, rows, experts]`, each
/// row `k / 32` [`BlockMxfp4`]s) into [`QMoeMxfp4`] of `n = parts.len() · rows` outputs,
/// taking output row `r` of an expert from part `r % parts.len()`, row `r / parts.len()`: one
/// part is copied in order; gpt-oss's gate and up (llama.cpp stores them apart) interleave
/// into the `(gate, up)` pairs of SwiGLU's fused projection.
///
/// # Panics
/// If a part does not hold `experts × rows × k / 32` blocks, or `k` is not a multiple of 32
/// (callers check the tensor infos first).
pub fn mxfp4_to_qmoe(parts: &[&[u8]], experts: usize, rows: usize, k: usize) -> QMoeMxfp4 {
    let blocks = k / QK;
    let block_bytes = size_of::<BlockMxfp4>();
    assert!(
        k.is_multiple_of(QK),
        "{k} inputs are not whole MXFP4 blocks"
    );
    for part in parts {
        assert_eq!(
            part.len(),
            experts * rows * blocks * block_bytes,
            "MXFP4 part size"
        );
    }
    let n = parts.len() * rows;
    let mut codes = vec![0u8; experts * k * n.div_ceil(2)];
    let mut scales = vec![0u8; experts * n * blocks];
    for e in 0..experts {
        for r in 0..n {
            let (part, row) = (parts[r % parts.len()], r / parts.len());
            for b in 0..blocks {
                let block: BlockMxfp4 = blocks::read_block(part, (e * rows + row) * blocks + b);
                scales[(e * n + r) * blocks + b] = block.e;
                for i in 0..QK {
                    let kk = b * QK + i;
                    let at = (e * k + kk) * n.div_ceil(2) + r / 2;
                    codes[at] |= block.code(i) << ((r % 2) * 4);
                }
            }
        }
    }
    QMoeMxfp4 { codes, scales }
}

#[cfg(test)]
mod mxfp4_tests {
    use super::*;

    /// Interleaving two parts and reading the result back as the kernel does gives each
    /// part's dequantized values at their rows.
    #[test]
    fn mxfp4_parts_interleave_into_the_qmoe_layout() {
        let (experts, rows, k) = (2, 3, 64);
        let part = |seed: u8| -> Vec<u8> {
            (0..experts * rows * (k / QK) * 17)
                .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) | 0x70)
                .collect()
        };
        let (gate, up) = (part(1), part(2));
        let q = mxfp4_to_qmoe(&[&gate, &up], experts, rows, k);
        let n = 2 * rows;
        let dense = |data: &[u8]| {
            let mut out = vec![0f32; experts * rows * k];
            blocks::dequantize_blocks::<BlockMxfp4>(data, &mut out);
            out
        };
        let (g, u) = (dense(&gate), dense(&up));
        for e in 0..experts {
            for r in 0..n {
                for kk in 0..k {
                    let byte = q.codes[(e * k + kk) * (n / 2) + r / 2];
                    let code = (byte >> ((r % 2) * 4)) & 0xF;
                    // A block of this code and exponent, dequantized as ggml does.
                    let e8 = q.scales[(e * n + r) * (k / QK) + kk / QK];
                    let one = BlockMxfp4 {
                        e: e8,
                        qs: [code; 16],
                    };
                    let mut values = [0f32; QK];
                    one.dequantize(&mut values);
                    let got = values[0];
                    let src = if r % 2 == 0 { &g } else { &u };
                    let want = src[(e * rows + r / 2) * k + kk];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "expert {e} row {r} input {kk}"
                    );
                }
            }
        }
    }
}
