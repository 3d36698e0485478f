//! The LLM weight ops and norms against onnxruntime 1.32 (the `ort_oracle`):
//! com.microsoft::MatMulNBits, com.microsoft::GatherBlockQuantized,
//! SimplifiedLayerNormalization, com.microsoft::SkipSimplifiedLayerNormalization and
//! com.microsoft::SkipLayerNormalization, and a BERT encoder's fused ops (com.microsoft::
//! EmbedLayerNormalization, BiasGelu, FastGelu, Gelu, Attention) over
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

use std::path::Path;

use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor, f16};
use oxgen_testkit::Rng;
use oxgen_testkit::compare::{Tolerance, mismatch};

const F32_MATMUL: Tolerance = Tolerance {
    rtol: 1e-5,
    atol: 1e-5,
};
const F32_NORM: Tolerance = Tolerance {
    rtol: 1e-5,
    atol: 1e-6,
};
const F16: Tolerance = Tolerance {
    rtol: 1e-3,
    atol: 1e-4,
};
const EXACT: Tolerance = Tolerance {
    rtol: 0.0,
    atol: 0.0,
};

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

/// Float values as a tensor of `dtype` (f32 or f16).
fn float_tensor(dims: &[usize], values: &[f32], dtype: DType) -> Tensor {
    match dtype {
        DType::F16 => {
            let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            Tensor::from_slice(dims, &h).unwrap()
        }
        _ => Tensor::from_slice(dims, values).unwrap(),
    }
}

fn fixed(dims: &[usize]) -> Vec<Dim> {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

fn as_f64(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F16 => t
            .as_slice::<f16>()
            .unwrap()
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::F32 => t
            .as_slice::<f32>()
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect(),
        other => panic!("no float view of {other}"),
    }
}

/// One model of independent cases, run by onnxruntime and natively.
struct Batch {
    builder: ModelBuilder,
    inputs: Vec<(String, Tensor)>,
    /// Per graph output: the case label and its tolerance.
    checks: Vec<(String, Tolerance)>,
}

impl Batch {
    fn new() -> Batch {
        let mut builder = ModelBuilder::new("oxgen-test");
        builder.opset("", 21).opset("com.microsoft", 1);
        Batch {
            builder,
            inputs: Vec::new(),
            checks: Vec::new(),
        }
    }

    fn input(&mut self, name: &str, t: Tensor) {
        self.builder.input(name, t.dtype(), &fixed(t.dims()));
        self.inputs.push((name.to_string(), t));
    }

    fn init(&mut self, name: &str, t: Tensor) {
        self.builder.initializer(name, t);
    }

    fn output(&mut self, name: &str, dtype: DType, dims: &[usize], case: String, tol: Tolerance) {
        self.builder.output(name, dtype, &fixed(dims));
        self.checks.push((case, tol));
    }

    /// Runs both backends, asserts every output within its tolerance and returns the largest
    /// absolute difference seen.
    fn run(self, what: &str) -> f64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        self.builder.save(&path, None).unwrap();
        let ort = oxgen_testkit::ort_oracle::run(&path, &self.inputs).unwrap();
        let mut native = oxgen_testkit::node_tests::native_session(&path).unwrap();
        let ours = native.run(self.inputs).unwrap();
        assert_eq!(ort.len(), self.checks.len());
        assert_eq!(ours.len(), self.checks.len());
        let mut failures = Vec::new();
        let (mut worst, mut margin) = (0f64, 0f64);
        for (((case, tol), (_, got)), want) in self.checks.iter().zip(&ours).zip(&ort) {
            if let Some(why) = mismatch(got, want, *tol) {
                failures.push(format!("{case}: {why}"));
            } else if got.dtype().is_float() {
                for (g, w) in as_f64(got).iter().zip(as_f64(want)) {
                    worst = worst.max((g - w).abs());
                    margin =
                        margin.max((g - w).abs() / (tol.atol + tol.rtol * w.abs()).max(1e-300));
                }
            }
        }
        assert!(failures.is_empty(), "{what}:\n{}", failures.join("\n"));
        eprintln!(
            "{what}: {} outputs agree; max abs diff {worst:e}, max diff / tolerance {margin:.3}",
            self.checks.len()
        );
        worst
    }
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

/// The native loader's error for a one-node model.
fn load_error(build: impl FnOnce(&mut ModelBuilder)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21).opset("com.microsoft", 1);
    build(&mut b);
    b.save(&path, None).unwrap();
    match oxgen_testkit::node_tests::native_session(Path::new(&path)) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e,
    }
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

/// The encoder ops refuse at load, naming the node, what they cannot run: an
/// EmbedLayerNormalization without its position table or with segment ids but no segment
/// table, and an Attention with a decoder's past (which `--backend auto` then runs on ONNX
/// Runtime).
#[test]
fn encoder_ops_refuse_what_they_cannot_run_at_load_naming_the_node() {
    let embed = |inputs: &'static [&'static str]| {
        load_error(|b| {
            for n in ["ids", "seg", "word", "pos", "segtab", "gamma", "beta"] {
                b.input(n, DType::F32, &fixed(&[2, 4]));
            }
            let outs = ["y", "mask_index"];
            b.node(
                "EmbedLayerNormalization",
                "com.microsoft",
                "embeddings",
                inputs,
                &outs,
                vec![],
            );
            b.output("y", DType::F32, &fixed(&[1, 2, 4]));
        })
    };
    let err = embed(&["ids", "", "word", "", "", "gamma", "beta"]);
    assert!(
        err.contains("embeddings") && err.contains("input 3"),
        "{err}"
    );
    let err = embed(&["ids", "seg", "word", "pos", "", "gamma", "beta"]);
    assert!(
        err.contains("embeddings") && err.contains("segment_embedding"),
        "{err}"
    );
    let err = load_error(|b| {
        for n in ["x", "w", "bias", "mask", "past"] {
            b.input(n, DType::F32, &fixed(&[1, 2, 4]));
        }
        let attrs = vec![attr::int("num_heads", 2)];
        let inputs = ["x", "w", "bias", "mask", "past"];
        b.node(
            "Attention",
            "com.microsoft",
            "self_attention",
            &inputs,
            &["y"],
            attrs,
        );
        b.output("y", DType::F32, &fixed(&[1, 2, 4]));
    });
    assert!(
        err.contains("self_attention") && err.contains("past"),
        "{err}"
    );
}

/// BiasGelu (erf GELU of `x + bias`), FastGelu (tanh GELU, with and without its bias) and
/// com.microsoft::Gelu, on rows short of and past the vector erf's window, in one model.
#[test]
fn bias_gelu_fast_gelu_and_gelu_match_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0007);
    let cases: [(&str, &[usize], bool); 7] = [
        ("BiasGelu", &[2, 3, 16], true),
        ("BiasGelu", &[1, 5, 67], true),
        ("BiasGelu", &[3, 384], true),
        ("FastGelu", &[2, 3, 16], true),
        ("FastGelu", &[4, 33], false),
        ("Gelu", &[2, 50], false),
        ("Gelu", &[1, 1, 1], false),
    ];
    for (i, &(op, dims, bias)) in cases.iter().enumerate() {
        let (x, b, y) = (format!("x{i}"), format!("b{i}"), format!("y{i}"));
        let total: usize = dims.iter().product();
        batch.input(
            &x,
            float_tensor(dims, &rng.floats(total, -4.0, 4.0), DType::F32),
        );
        let mut inputs = vec![x.as_str()];
        if bias {
            let n = dims[dims.len() - 1];
            batch.init(
                &b,
                float_tensor(&[n], &rng.floats(n, -1.0, 1.0), DType::F32),
            );
            inputs.push(&b);
        }
        batch.builder.node(
            op,
            "com.microsoft",
            &format!("node{i}"),
            &inputs,
            &[&y],
            vec![],
        );
        batch.output(
            &y,
            DType::F32,
            dims,
            format!("{op} {dims:?} bias {bias}"),
            F32_NORM,
        );
    }
    batch.run("BiasGelu, FastGelu and Gelu");
}

/// EmbedLayerNormalization as a BERT's embeddings use it: with and without segments, a
/// mask (its `mask_index` counts), positions given as `[1, seq]`, `[batch, seq]` or not at
/// all, and the optional sum of the embeddings before the norm.
#[test]
fn embed_layer_norm_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0008);
    let (vocab, max_pos, hidden) = (30usize, 12usize, 24usize);
    // (batch, seq, segments, mask, position ids' rows (0: none), outputs)
    let cases: [(usize, usize, bool, bool, usize, usize); 5] = [
        (2, 5, true, true, 0, 2),
        (1, 7, true, false, 1, 3),
        (2, 4, false, false, 1, 2),
        (3, 6, true, true, 3, 3),
        (1, 1, false, true, 0, 2),
    ];
    for (i, &(b, s, segments, mask, pos_rows, outputs)) in cases.iter().enumerate() {
        let name = |what: &str| format!("{what}{i}");
        let int = |dims: &[usize], values: Vec<i32>| Tensor::from_slice(dims, &values).unwrap();
        let ids: Vec<i32> = (0..b * s).map(|_| rng.below(vocab as u64) as i32).collect();
        batch.input(&name("ids"), int(&[b, s], ids));
        let mut inputs = vec![name("ids"), String::new()];
        if segments {
            let seg: Vec<i32> = (0..b * s).map(|_| rng.below(2) as i32).collect();
            batch.input(&name("seg"), int(&[b, s], seg));
            inputs[1] = name("seg");
        }
        for (what, rows) in [("word", vocab), ("pos", max_pos)] {
            let table = rng.floats(rows * hidden, -1.0, 1.0);
            batch.init(
                &name(what),
                float_tensor(&[rows, hidden], &table, DType::F32),
            );
            inputs.push(name(what));
        }
        inputs.push(String::new());
        if segments {
            let table = rng.floats(2 * hidden, -1.0, 1.0);
            batch.init(
                &name("segtab"),
                float_tensor(&[2, hidden], &table, DType::F32),
            );
            inputs[4] = name("segtab");
        }
        for (what, lo, hi) in [("gamma", 0.5, 1.5), ("beta", -0.5, 0.5)] {
            let v = rng.floats(hidden, lo, hi);
            batch.init(&name(what), float_tensor(&[hidden], &v, DType::F32));
            inputs.push(name(what));
        }
        if mask {
            let m: Vec<i32> = (0..b * s)
                .map(|t| i32::from(t % s < s - t / s % 2))
                .collect();
            batch.input(&name("mask"), int(&[b, s], m));
            inputs.push(name("mask"));
        } else if pos_rows > 0 {
            inputs.push(String::new());
        }
        if pos_rows > 0 {
            let p: Vec<i32> = (0..pos_rows * s)
                .map(|_| rng.below(max_pos as u64) as i32)
                .collect();
            batch.input(&name("posids"), int(&[pos_rows, s], p));
            inputs.push(name("posids"));
        }
        let outs = [name("y"), name("mask_index"), name("sum")];
        let outs: Vec<&str> = outs[..outputs].iter().map(String::as_str).collect();
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let attrs = vec![attr::float("epsilon", 1e-12)];
        batch.builder.node(
            "EmbedLayerNormalization",
            "com.microsoft",
            &name("node"),
            &inputs,
            &outs,
            attrs,
        );
        let label = |what: &str| {
            format!(
                "case {i} ({b}x{s}, segments {segments}, mask {mask}, positions {pos_rows}) {what}"
            )
        };
        batch.output(
            outs[0],
            DType::F32,
            &[b, s, hidden],
            label("output"),
            F32_NORM,
        );
        if outputs > 1 {
            batch.output(outs[1], DType::I32, &[b], label("mask_index"), EXACT);
        }
        if outputs > 2 {
            batch.output(
                outs[2],
                DType::F32,
                &[b, s, hidden],
                label("embedding_sum"),
                F32_NORM,
            );
        }
    }
    batch.run("EmbedLayerNormalization");
}

/// Attention as a BERT's fused self-attention: the mask forms (none, right-padded lengths,
/// end and start positions, a raw (batch, keys) and (batch, queries, keys) mask), causal,
/// Q, K and V of different widths, an attention bias, a custom scale and filter value.
#[test]
fn attention_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0009);
    // (batch, seq, input hidden, heads, qkv widths, mask form, unidirectional, attention bias)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        [usize; 3],
        &'static str,
        bool,
        bool,
    );
    let cases: [Case; 7] = [
        (2, 5, 32, 4, [32, 32, 32], "none", false, false),
        (2, 6, 16, 2, [16, 16, 16], "keys", false, false),
        (3, 4, 24, 3, [24, 24, 24], "lengths", true, false),
        (2, 5, 16, 2, [16, 16, 16], "spans", false, false),
        (2, 4, 16, 4, [16, 16, 24], "pairs", false, true),
        (1, 7, 64, 2, [64, 64, 64], "keys", true, true),
        (1, 1, 8, 1, [8, 8, 8], "lengths", false, false),
    ];
    for (i, &(b, s, hin, heads, [qw, kw, vw], mask, causal, with_bias)) in cases.iter().enumerate()
    {
        let name = |what: &str| format!("att_{what}{i}");
        let width = qw + kw + vw;
        batch.input(
            &name("x"),
            float_tensor(
                &[b, s, hin],
                &rng.floats(b * s * hin, -1.0, 1.0),
                DType::F32,
            ),
        );
        batch.init(
            &name("w"),
            float_tensor(
                &[hin, width],
                &rng.floats(hin * width, -0.5, 0.5),
                DType::F32,
            ),
        );
        batch.init(
            &name("bias"),
            float_tensor(&[width], &rng.floats(width, -0.2, 0.2), DType::F32),
        );
        let mut inputs = vec![name("x"), name("w"), name("bias"), String::new()];
        let int = |dims: &[usize], values: Vec<i32>| Tensor::from_slice(dims, &values).unwrap();
        // Each sequence b keeps its first s - b keys (at least one).
        let keep = |seq: usize| s - (seq % s).min(s - 1);
        let m = match mask {
            "lengths" => Some(int(&[b], (0..b).map(|q| keep(q) as i32).collect())),
            "spans" => Some(int(
                &[2 * b],
                (0..b)
                    .map(|_| s as i32)
                    .chain((0..b).map(|q| (s - keep(q)) as i32))
                    .collect(),
            )),
            "keys" => Some(int(
                &[b, s],
                (0..b * s).map(|t| i32::from(t % s < keep(t / s))).collect(),
            )),
            "pairs" => Some(int(
                &[b, s, s],
                (0..b * s * s)
                    .map(|t| i32::from((t + t / s) % 3 != 0 || t % s == 0))
                    .collect(),
            )),
            _ => None,
        };
        if let Some(m) = m {
            batch.input(&name("mask"), m);
            inputs[3] = name("mask");
        }
        if with_bias {
            inputs.push(String::new());
            let planes = heads;
            let v = rng.floats(planes * s * s, -1.0, 1.0);
            batch.input(&name("ab"), float_tensor(&[1, heads, s, s], &v, DType::F32));
            inputs.push(name("ab"));
        }
        while inputs.last().is_some_and(String::is_empty) {
            inputs.pop();
        }
        let mut attrs = vec![attr::int("num_heads", heads as i64)];
        if causal {
            attrs.push(attr::int("unidirectional", 1));
        }
        if vw != qw {
            attrs.push(attr::ints(
                "qkv_hidden_sizes",
                &[qw as i64, kw as i64, vw as i64],
            ));
        }
        if i == 5 {
            attrs.push(attr::float("scale", 0.3));
            attrs.push(attr::float("mask_filter_value", -500.0));
        }
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let y = name("y");
        batch.builder.node(
            "Attention",
            "com.microsoft",
            &name("node"),
            &inputs,
            &[&y],
            attrs,
        );
        let label = format!(
            "case {i}: {b}x{s}, {heads} heads, widths {qw}/{kw}/{vw}, mask {mask}, causal {causal}, bias {with_bias}"
        );
        batch.output(&y, DType::F32, &[b, s, vw], label, F32_MATMUL);
    }
    batch.run("Attention");
}
