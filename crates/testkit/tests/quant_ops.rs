//! The LLM weight ops and norms against onnxruntime 1.32 (the `ort_oracle`):
//! com.microsoft::MatMulNBits, com.microsoft::GatherBlockQuantized,
//! com.microsoft::MatMulIntegerToFloat, SimplifiedLayerNormalization, com.microsoft::SkipSimplifiedLayerNormalization and
//! com.microsoft::SkipLayerNormalization, over
//! their attribute and shape space, with seeded pseudo-random data. Needs `OXGEN_PYTHON`
//! (see `scripts/test.sh`).
//!
//! Each test puts all its cases into one model as independent nodes (one graph input and
//! output per case), so onnxruntime starts once per test instead of once per case; the model
//! lives in its own temporary folder. Every output is compared separately and named by its
//! case.
//!
//! Tolerances (`|native - ort| <= atol + rtol * |ort|`):
//! - MatMulNBits f32: rtol 1e-5, atol 1e-5. Both sides dequantize each weight to f32 and sum
//!   K products in f32, but in different orders and roundings (onnxruntime: `q * s - s * zp`
//!   blocks into MLAS SGEMM with FMA and SIMD partial sums; native: `(q - zp) * s`, one
//!   sequential accumulator). Outputs are O(1) with K <= 640 terms of |a·w| <= 0.4, so the
//!   reordering error is bounded by about K · 2^-24 · Σ|a·w| ≈ 1e-5 and is typically 1e-7.
//! - f16 (MatMulNBits, norms): rtol 1e-3, atol 1e-4: both compute in f32 and round once, so
//!   they differ by at most one f16 ulp (2^-10 relative) of the output.
//! - GatherBlockQuantized: exact — both compute `(q - zp) as f32 * scale` and round once.
//! - Norms f32: rtol 1e-5, atol 1e-6 (onnxruntime divides by the RMS, native multiplies by
//!   its inverse: a few ulps). The GELUs take the same bound: both evaluate erf or tanh to
//!   within an f32 ulp or two (onnxruntime in f32, native in f64 or its vector erf).
//!
//! The observed maximum differences are printed (`--nocapture`).

mod ops_batch;

use oxgen_onnx::writer::{ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::Rng;

use ops_batch::*;

/// Packs `bits`-bit codes low bits first (ContribOperators.md: for 4 bits, the first code
/// in the low nibble).
fn pack(codes: &[u8], bits: u32) -> Vec<u8> {
    let mut out = vec![0u8; (codes.len() * bits as usize).div_ceil(8)];
    for (i, &c) in codes.iter().enumerate() {
        let bit = i * bits as usize;
        out[bit / 8] |= c << (bit % 8);
    }
    out
}

/// Packs each row of `row_len` codes separately (rows start on a byte).
fn pack_rows(codes: &[u8], row_len: usize, bits: u32) -> Vec<u8> {
    codes.chunks(row_len).flat_map(|r| pack(r, bits)).collect()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Zp {
    None,
    Packed,
    Float,
}

struct NBitsCase {
    bits: u32,
    block: usize,
    k: usize,
    n: usize,
    zp: Zp,
    bias: bool,
    /// A's leading dimensions (the product is M).
    lead: Vec<usize>,
    dtype: DType,
}

/// Adds node `i` computing `case`.
fn add_matmul_nbits(batch: &mut Batch, rng: &mut Rng, i: usize, case: &NBitsCase) {
    let NBitsCase {
        bits, block, k, n, ..
    } = *case;
    let k_blocks = k.div_ceil(block);
    let blob = block * bits as usize / 8;
    // Codes past K in the padded last block are garbage on purpose: nobody may read them.
    let codes = rng.codes(n * k_blocks * block, bits);
    let (a, b, s) = (format!("a{i}"), format!("b{i}"), format!("s{i}"));
    let (z, bias, y) = (format!("z{i}"), format!("bias{i}"), format!("y{i}"));
    batch.init(
        &b,
        Tensor::from_slice([n, k_blocks, blob], &pack(&codes, bits)).unwrap(),
    );
    let scales = rng.floats(n * k_blocks, 0.01, 0.05);
    batch.init(&s, float_tensor(&[n, k_blocks], &scales, case.dtype));
    let mut inputs = vec![a.as_str(), b.as_str(), s.as_str()];
    match case.zp {
        Zp::None => {}
        Zp::Packed => {
            let zps = pack_rows(&rng.codes(n * k_blocks, bits), k_blocks, bits);
            let row = zps.len() / n;
            batch.init(&z, Tensor::from_slice([n, row], &zps).unwrap());
        }
        Zp::Float => {
            let zps = rng.floats(n * k_blocks, 0.0, (1 << bits) as f32);
            batch.init(&z, float_tensor(&[n, k_blocks], &zps, case.dtype));
        }
    }
    if case.zp != Zp::None {
        inputs.push(&z);
    }
    if case.bias {
        inputs.resize(5, "");
        inputs.push(&bias);
        batch.init(
            &bias,
            float_tensor(&[n], &rng.floats(n, -0.5, 0.5), case.dtype),
        );
    }
    let mut a_dims = case.lead.clone();
    a_dims.push(k);
    let m: usize = case.lead.iter().product();
    batch.input(
        &a,
        float_tensor(&a_dims, &rng.floats(m * k, -1.0, 1.0), case.dtype),
    );
    let attrs = vec![
        attr::int("K", k as i64),
        attr::int("N", n as i64),
        attr::int("bits", bits as i64),
        attr::int("block_size", block as i64),
        attr::int("accuracy_level", 0),
    ];
    batch.builder.node(
        "MatMulNBits",
        "com.microsoft",
        &format!("mm{i}"),
        &inputs,
        &[&y],
        attrs,
    );
    let mut y_dims = case.lead.clone();
    y_dims.push(n);
    let label = format!(
        "MatMulNBits q{bits} block {block} K {k} N {n} zp {:?} bias {} A {a_dims:?} {}",
        case.zp, case.bias, case.dtype
    );
    let tol = if case.dtype == DType::F16 {
        F16
    } else {
        F32_MATMUL
    };
    batch.output(&y, case.dtype, &y_dims, label, tol);
}

/// bits {4, 8} × block_size {16, .., 256} × zero points {none, packed, float} × bias
/// {no, yes} × M {1 as [1, K], 3 as [1, 3, K]} × K {a multiple of the block, 2.5 blocks
/// (a padded last block)}, N odd. Float zero points only with 4 bits: onnxruntime's CPU
/// kernel rejects them for 8 ("Only 4b quantization is supported for unpacked compute");
/// the native kernel's 8-bit float-zero-point path is checked by its kernel tests.
#[test]
fn matmul_nbits_f32_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0001);
    let mut i = 0;
    for bits in [4, 8] {
        for block in [16, 32, 64, 128, 256] {
            for zp in [Zp::None, Zp::Packed, Zp::Float] {
                if bits == 8 && zp == Zp::Float {
                    continue;
                }
                for (bias, lead) in [
                    (false, vec![1]),
                    (true, vec![1, 3]),
                    (true, vec![1]),
                    (false, vec![1, 3]),
                ] {
                    for k in [2 * block, 2 * block + block / 2] {
                        let n = [5, 7, 3][i % 3];
                        let case = NBitsCase {
                            bits,
                            block,
                            k,
                            n,
                            zp,
                            bias,
                            lead: lead.clone(),
                            dtype: DType::F32,
                        };
                        add_matmul_nbits(&mut batch, &mut rng, i, &case);
                        i += 1;
                    }
                }
            }
        }
    }
    batch.run("MatMulNBits f32");
}

/// f16 A, scales, float zero points and bias: onnxruntime widens to f32, computes and
/// rounds once, as the native kernel does.
#[test]
fn matmul_nbits_f16_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0002);
    let mut i = 0;
    for (bits, zp) in [
        (4, Zp::None),
        (4, Zp::Packed),
        (4, Zp::Float),
        (8, Zp::None),
        (8, Zp::Packed),
    ] {
        for (block, k, bias) in [(32, 80, true), (16, 48, false), (128, 384, true)] {
            let case = NBitsCase {
                bits,
                block,
                k,
                n: 9,
                zp,
                bias,
                lead: vec![3],
                dtype: DType::F16,
            };
            add_matmul_nbits(&mut batch, &mut rng, i, &case);
            i += 1;
        }
    }
    batch.run("MatMulNBits f16");
}

fn matmul_nbits_model(b: &mut ModelBuilder, name: &str, inputs: &[&str], bits: i64) {
    b.input("a", DType::F32, &fixed(&[1, 32]));
    b.initializer("b", Tensor::from_slice([4, 2, 8], &[0u8; 64]).unwrap());
    b.initializer("s", Tensor::from_slice([4, 2], &[1f32; 8]).unwrap());
    b.initializer("g", Tensor::from_slice([32], &[0i32; 32]).unwrap());
    let attrs = vec![
        attr::int("K", 32),
        attr::int("N", 4),
        attr::int("bits", bits),
        attr::int("block_size", 16),
    ];
    b.node("MatMulNBits", "com.microsoft", name, inputs, &["y"], attrs);
    b.output("y", DType::F32, &fixed(&[1, 4]));
}

#[test]
fn unsupported_matmul_nbits_inputs_and_attributes_fail_at_load_naming_the_node() {
    let err = load_error(|b| matmul_nbits_model(b, "mm_act_order", &["a", "b", "s", "", "g"], 4));
    assert!(
        err.contains("mm_act_order") && err.contains("g_idx"),
        "{err}"
    );
    let err = load_error(|b| matmul_nbits_model(b, "mm_3bit", &["a", "b", "s"], 3));
    assert!(err.contains("mm_3bit") && err.contains("bits"), "{err}");
}

struct GatherCase {
    bits: u32,
    block: usize,
    vocab: usize,
    /// Extra axes between the gathered one and the quantized one.
    mid: Vec<usize>,
    hidden: usize,
    zp: bool,
    dtype: DType,
    int32: bool,
}

fn add_gather(batch: &mut Batch, rng: &mut Rng, i: usize, case: &GatherCase) {
    let GatherCase {
        bits,
        block,
        vocab,
        hidden,
        ..
    } = *case;
    let rows = vocab * case.mid.iter().product::<usize>();
    let blocks = hidden.div_ceil(block);
    let lead: Vec<usize> = [vocab].iter().chain(&case.mid).copied().collect();
    let with = |last: usize| lead.iter().copied().chain([last]).collect::<Vec<_>>();
    let (d, idx, s, z, y) = (
        format!("d{i}"),
        format!("i{i}"),
        format!("s{i}"),
        format!("z{i}"),
        format!("y{i}"),
    );
    let data = pack(&rng.codes(rows * hidden, bits), bits);
    batch.init(
        &d,
        Tensor::from_slice(with(hidden * bits as usize / 8), &data).unwrap(),
    );
    batch.init(
        &s,
        float_tensor(
            &with(blocks),
            &rng.floats(rows * blocks, 0.01, 0.05),
            case.dtype,
        ),
    );
    let mut inputs = vec![d.as_str(), idx.as_str(), s.as_str()];
    if case.zp {
        let zps = pack_rows(&rng.codes(rows * blocks, bits), blocks, bits);
        batch.init(
            &z,
            Tensor::from_slice(with(zps.len() / rows), &zps).unwrap(),
        );
        inputs.push(&z);
    }
    // Negative indices count from the end.
    let indices: Vec<i64> = (0..6)
        .map(|_| rng.below(2 * vocab as u64) as i64 - vocab as i64)
        .collect();
    let index_tensor = if case.int32 {
        Tensor::from_slice(
            [2, 3],
            &indices.iter().map(|&v| v as i32).collect::<Vec<_>>(),
        )
        .unwrap()
    } else {
        Tensor::from_slice([2, 3], &indices).unwrap()
    };
    batch.input(&idx, index_tensor);
    let attrs = vec![
        attr::int("bits", bits as i64),
        attr::int("block_size", block as i64),
        attr::int("gather_axis", 0),
        attr::int("quantize_axis", lead.len() as i64),
    ];
    batch.builder.node(
        "GatherBlockQuantized",
        "com.microsoft",
        &format!("g{i}"),
        &inputs,
        &[&y],
        attrs,
    );
    let out_dims: Vec<usize> = [2, 3]
        .iter()
        .chain(&case.mid)
        .copied()
        .chain([hidden])
        .collect();
    let label = format!(
        "GatherBlockQuantized q{bits} block {block} data {:?} zp {} {} int32 {}",
        with(hidden),
        case.zp,
        case.dtype,
        case.int32
    );
    batch.output(&y, case.dtype, &out_dims, label, EXACT);
}

/// bits {4, 8} × block_size {16, 32, 128} × zero points {none, packed} × scales {f32, f16} ×
/// indices {int32, int64} with negative indices; hidden sizes that leave a short last block
/// and an odd block count (so 4-bit zero points pad each row), and one rank-3 table.
#[test]
fn gather_block_quantized_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0003);
    let mut i = 0;
    for bits in [4, 8] {
        for (block, hidden) in [(16, 48), (32, 80), (128, 256)] {
            for zp in [false, true] {
                for dtype in [DType::F32, DType::F16] {
                    let mid = if i % 5 == 0 { vec![2] } else { vec![] };
                    let case = GatherCase {
                        bits,
                        block,
                        vocab: 11,
                        mid,
                        hidden,
                        zp,
                        dtype,
                        int32: i % 2 == 0,
                    };
                    add_gather(&mut batch, &mut rng, i, &case);
                    i += 1;
                }
            }
        }
    }
    batch.run("GatherBlockQuantized");
}

fn gather_model(b: &mut ModelBuilder, name: &str, gather_axis: i64, quantize_axis: i64) {
    b.input("i", DType::I64, &fixed(&[2]));
    b.initializer("d", Tensor::from_slice([4, 16], &[0u8; 64]).unwrap());
    b.initializer("s", Tensor::from_slice([4, 1], &[1f32; 4]).unwrap());
    let attrs = vec![
        attr::int("bits", 4),
        attr::int("block_size", 32),
        attr::int("gather_axis", gather_axis),
        attr::int("quantize_axis", quantize_axis),
    ];
    b.node(
        "GatherBlockQuantized",
        "com.microsoft",
        name,
        &["d", "i", "s"],
        &["y"],
        attrs,
    );
    b.output("y", DType::F32, &fixed(&[2, 32]));
}

#[test]
fn unsupported_gather_axes_fail_at_load_naming_the_node() {
    let err = load_error(|b| gather_model(b, "embed_cols", 1, 1));
    assert!(
        err.contains("embed_cols") && err.contains("gather_axis"),
        "{err}"
    );
    let err = load_error(|b| gather_model(b, "embed_rows_quant", 0, 0));
    assert!(
        err.contains("embed_rows_quant") && err.contains("quantize_axis"),
        "{err}"
    );
    let err = load_error(|b| gather_model(b, "embed_neg", 0, -2));
    assert!(
        err.contains("embed_neg") && err.contains("quantize_axis"),
        "{err}"
    );
}

/// SimplifiedLayerNormalization (default domain): f32 over the last axis and over the last
/// two (axis 1), f16 with its f32 inv_std_var, default and explicit epsilon.
#[test]
fn simplified_layer_norm_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0004);
    let cases: [(&[usize], i64, Option<f32>, DType); 4] = [
        (&[2, 3, 16], -1, None, DType::F32),
        (&[2, 3, 16], 1, Some(1e-6), DType::F32),
        (&[4, 40], -1, Some(1e-5), DType::F16),
        (&[5, 3, 24], 2, None, DType::F16),
    ];
    for (i, &(dims, axis, eps, dtype)) in cases.iter().enumerate() {
        let rank = dims.len() as i64;
        let from = (if axis < 0 { axis + rank } else { axis }) as usize;
        let n: usize = dims[from..].iter().product();
        let total: usize = dims.iter().product();
        let (x, s, y, inv) = (
            format!("x{i}"),
            format!("s{i}"),
            format!("y{i}"),
            format!("inv{i}"),
        );
        batch.input(&x, float_tensor(dims, &rng.floats(total, -2.0, 2.0), dtype));
        batch.init(
            &s,
            float_tensor(&dims[from..], &rng.floats(n, 0.5, 1.5), dtype),
        );
        let mut attrs = vec![attr::int("axis", axis)];
        attrs.extend(eps.map(|e| attr::float("epsilon", e)));
        batch.builder.node(
            "SimplifiedLayerNormalization",
            "",
            &format!("sln{i}"),
            &[&x, &s],
            &[&y, &inv],
            attrs,
        );
        let tol = if dtype == DType::F16 { F16 } else { F32_NORM };
        let stat: Vec<usize> = dims
            .iter()
            .enumerate()
            .map(|(j, &d)| if j < from { d } else { 1 })
            .collect();
        batch.output(
            &y,
            dtype,
            dims,
            format!("SimplifiedLayerNormalization {dims:?} axis {axis} {dtype} Y"),
            tol,
        );
        // onnxruntime rounds an f16 input's inv_std_var through f16 before storing it as f32.
        batch.output(
            &inv,
            DType::F32,
            &stat,
            format!("SimplifiedLayerNormalization {dims:?} axis {axis} {dtype} inv_std_var"),
            tol,
        );
    }
    batch.run("SimplifiedLayerNormalization");
}

/// One skip-norm case, the `i`th: a node of `op` (`SkipSimplifiedLayerNormalization`, whose optional
/// inputs are `bias`, or `SkipLayerNormalization`, whose are `beta, bias`) on random data,
/// each optional input given or left out per `optional`, with `outputs` of its four outputs
/// (2: the residual sum alone), every named output compared with onnxruntime.
fn skip_norm_case(
    batch: &mut Batch,
    rng: &mut Rng,
    (op, i): (&str, usize),
    (dims, skip_dims): (&[usize], &[usize]),
    optional: &[bool],
    outputs: usize,
    dtype: DType,
) {
    let hidden = dims[dims.len() - 1];
    let total: usize = dims.iter().product();
    let name = |what: &str| format!("{op}_{what}{i}");
    let names: Vec<String> = [
        "x", "skip", "gamma", "opt0", "opt1", "y", "mean", "inv", "sum",
    ]
    .iter()
    .map(|n| name(n))
    .collect();
    batch.input(
        &names[0],
        float_tensor(dims, &rng.floats(total, -2.0, 2.0), dtype),
    );
    let skip_total: usize = skip_dims.iter().product();
    batch.input(
        &names[1],
        float_tensor(skip_dims, &rng.floats(skip_total, -1.0, 1.0), dtype),
    );
    batch.init(
        &names[2],
        float_tensor(&[hidden], &rng.floats(hidden, 0.5, 1.5), dtype),
    );
    let mut inputs = vec![names[0].as_str(), &names[1], &names[2]];
    // Inputs are positional: an unnamed slot stands for one left out before a given one.
    for (k, &given) in optional.iter().enumerate() {
        if given {
            batch.init(
                &names[3 + k],
                float_tensor(&[hidden], &rng.floats(hidden, -0.5, 0.5), dtype),
            );
            while inputs.len() < 3 + k {
                inputs.push("");
            }
            inputs.push(&names[3 + k]);
        }
    }
    let outs: Vec<&str> = match outputs {
        1 => vec![&names[5]],
        2 => vec![&names[5], "", "", &names[8]],
        3 => vec![&names[5], &names[6], &names[7]],
        _ => vec![&names[5], &names[6], &names[7], &names[8]],
    };
    let attrs = if i.is_multiple_of(2) {
        vec![attr::float("epsilon", 1e-6)]
    } else {
        vec![]
    };
    batch
        .builder
        .node(op, "com.microsoft", &name("node"), &inputs, &outs, attrs);
    let tol = if dtype == DType::F16 { F16 } else { F32_NORM };
    let mut stat = dims.to_vec();
    *stat.last_mut().unwrap() = 1;
    let label = |what: &str| {
        format!("{op} {dims:?} skip {skip_dims:?} optional {optional:?} {dtype} {what}")
    };
    for (k, &out) in outs.iter().enumerate().filter(|(_, o)| !o.is_empty()) {
        let (what, odt, odims) = match k {
            0 => ("output", dtype, dims),
            1 => ("mean", DType::F32, stat.as_slice()),
            2 => ("inv_std_var", DType::F32, stat.as_slice()),
            _ => ("input_skip_bias_sum", dtype, dims),
        };
        batch.output(out, odt, odims, label(what), tol);
    }
}

/// SkipSimplifiedLayerNormalization: skip of the input's shape or broadcast as `[seq,
/// hidden]`, with and without bias, 2-D and 3-D input, f32 and f16, and every combination of
/// optional outputs the LLM graphs use (`output` alone, with the residual sum, all four).
#[test]
fn skip_simplified_layer_norm_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0005);
    type Case<'a> = (&'a [usize], &'a [usize], bool, usize, DType);
    let cases: [Case; 6] = [
        (&[2, 3, 16], &[2, 3, 16], true, 4, DType::F32),
        (&[2, 3, 16], &[3, 16], false, 4, DType::F32),
        (&[5, 24], &[5, 24], true, 1, DType::F32),
        (&[1, 4, 32], &[1, 4, 32], false, 2, DType::F32),
        (&[2, 3, 32], &[2, 3, 32], true, 4, DType::F16),
        (&[1, 7, 40], &[1, 7, 40], false, 3, DType::F16),
    ];
    for (i, &(dims, skip_dims, bias, outputs, dtype)) in cases.iter().enumerate() {
        let op = "SkipSimplifiedLayerNormalization";
        skip_norm_case(
            &mut batch,
            &mut rng,
            (op, i),
            (dims, skip_dims),
            &[bias],
            outputs,
            dtype,
        );
    }
    batch.run("SkipSimplifiedLayerNormalization");
}

/// SkipLayerNormalization (LayerNorm with beta, not RMS): skip of the input's shape or
/// broadcast as `[seq, hidden]`, with and without beta and bias (a bias after a left-out
/// beta too), f32 and f16, and the optional outputs (`output` alone, the residual sum alone,
/// the statistics, all four).
#[test]
fn skip_layer_norm_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0006);
    type Case<'a> = (&'a [usize], &'a [usize], [bool; 2], usize, DType);
    let cases: [Case; 6] = [
        (&[2, 3, 16], &[2, 3, 16], [true, true], 4, DType::F32),
        (&[2, 3, 16], &[3, 16], [true, false], 1, DType::F32),
        (&[5, 24], &[5, 24], [false, true], 3, DType::F32),
        (&[1, 4, 32], &[1, 4, 32], [true, true], 2, DType::F32),
        (&[2, 3, 32], &[2, 3, 32], [true, true], 4, DType::F16),
        (&[1, 7, 40], &[1, 7, 40], [false, false], 3, DType::F16),
    ];
    for (i, &(dims, skip_dims, optional, outputs, dtype)) in cases.iter().enumerate() {
        let op = "SkipLayerNormalization";
        skip_norm_case(
            &mut batch,
            &mut rng,
            (op, i),
            (dims, skip_dims),
            &optional,
            outputs,
            dtype,
        );
    }
    batch.run("SkipLayerNormalization");
}

#[test]
fn skip_norm_with_too_many_inputs_fails_at_load_naming_the_node() {
    let err = load_error(|b| {
        for n in ["x", "s", "g", "b", "extra"] {
            b.input(n, DType::F32, &fixed(&[1, 4]));
        }
        b.node(
            "SkipSimplifiedLayerNormalization",
            "com.microsoft",
            "final_norm",
            &["x", "s", "g", "b", "extra"],
            &["y"],
            vec![],
        );
        b.output("y", DType::F32, &fixed(&[1, 4]));
    });
    assert!(err.contains("final_norm") && err.contains("extra"), "{err}");
}

/// com.microsoft::MatMulIntegerToFloat (what onnxruntime's optimizer and oxgen's int8 pass
/// make of `quantize_dynamic`'s products): uint8 `A` of rank 2 and 3 against int8 `B`, zero
/// points per tensor and per column, `b_scale` one or one per column, with and without a
/// bias. Both sides sum the same exact integers, then scale and add in f32 (onnxruntime may
/// fuse the two into one rounding): the norms' bound.
#[test]
fn matmul_integer_to_float_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0101);
    // (A's dims, n, per-column B scale and zero point, bias)
    let cases: [(&[usize], usize, bool, bool); 4] = [
        (&[3, 40], 70, false, true),
        (&[2, 5, 33], 64, true, true),
        (&[37, 19], 16, true, false),
        (&[1, 256], 130, false, false),
    ];
    for (i, &(a_dims, n, per_column, bias)) in cases.iter().enumerate() {
        let k = a_dims[a_dims.len() - 1];
        let name = |what: &str| format!("{what}{i}");
        let (a, bw, y) = (name("a"), name("b"), name("y"));
        let codes = rng.bytes(a_dims.iter().product());
        batch.input(&a, Tensor::from_slice(a_dims, &codes).unwrap());
        let weights: Vec<i8> = rng.bytes(k * n).into_iter().map(|v| v as i8).collect();
        batch.init(&bw, Tensor::from_slice([k, n], &weights).unwrap());
        let columns = if per_column { n } else { 1 };
        let b_dims: &[usize] = if per_column { &[n] } else { &[] };
        let scales = rng.floats(columns, 0.001, 0.02);
        let zeros: Vec<i8> = (0..columns).map(|_| (rng.below(9) as i8) - 4).collect();
        batch.init(&name("as"), Tensor::scalar(0.013f32));
        batch.init(&name("bs"), Tensor::from_slice(b_dims, &scales).unwrap());
        batch.init(&name("az"), Tensor::scalar(121u8));
        batch.init(&name("bz"), Tensor::from_slice(b_dims, &zeros).unwrap());
        let mut inputs = vec![
            a.clone(),
            bw,
            name("as"),
            name("bs"),
            name("az"),
            name("bz"),
        ];
        if bias {
            batch.init(
                &name("bias"),
                float_tensor(&[n], &rng.floats(n, -1.0, 1.0), DType::F32),
            );
            inputs.push(name("bias"));
        }
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let node = name("node");
        (batch.builder).node(
            "MatMulIntegerToFloat",
            "com.microsoft",
            &node,
            &inputs,
            &[&y],
            vec![],
        );
        let mut out_dims = a_dims.to_vec();
        *out_dims.last_mut().unwrap() = n;
        let case = format!("A {a_dims:?}, n {n}, per column {per_column}, bias {bias}");
        batch.output(&y, DType::F32, &out_dims, case, F32_NORM);
    }
    batch.run("MatMulIntegerToFloat");
}

/// MatMulIntegerToFloat with an empty inner or outer dimension (K = 0: every product is the
/// bias; N = 0: an empty output) runs natively on the packed and the loop paths (uint8 and
/// int8 `A`) instead of failing.
#[test]
fn matmul_integer_to_float_takes_empty_dimensions() {
    for ((k, n), a_int8) in [
        ((0, 4), false),
        ((0, 4), true),
        ((3, 0), false),
        ((3, 0), true),
    ] {
        let mut b = ModelBuilder::new("oxgen-test");
        b.opset("", 21).opset("com.microsoft", 1);
        let a_dtype = if a_int8 { DType::I8 } else { DType::U8 };
        b.input("a", a_dtype, &fixed(&[2, k]));
        b.initializer("b", Tensor::from_slice([k, n], &vec![1i8; k * n]).unwrap());
        b.initializer("as", Tensor::scalar(0.5f32));
        b.initializer("bs", Tensor::scalar(2f32));
        let bias: Vec<f32> = (0..n).map(|j| j as f32 + 0.25).collect();
        b.initializer("bias", Tensor::from_slice([n], &bias).unwrap());
        let inputs = ["a", "b", "as", "bs", "", "", "bias"];
        b.node(
            "MatMulIntegerToFloat",
            "com.microsoft",
            "mm",
            &inputs,
            &["y"],
            vec![],
        );
        b.output("y", DType::F32, &fixed(&[2, n]));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        b.save(&path, None).unwrap();
        let a = match a_int8 {
            true => Tensor::from_slice([2, k], &vec![3i8; 2 * k]).unwrap(),
            false => Tensor::from_slice([2, k], &vec![3u8; 2 * k]).unwrap(),
        };
        let mut session = oxgen_testkit::node_tests::native_session(&path).unwrap();
        let out = session.run(vec![("a".into(), a)]).unwrap();
        let y = &out[0].1;
        assert_eq!(y.dims(), [2, n], "k {k}, n {n}");
        let want: Vec<f32> = bias.iter().chain(&bias).copied().collect();
        assert_eq!(
            y.as_slice::<f32>().unwrap(),
            want.as_slice(),
            "k {k}, n {n}"
        );
    }
}
