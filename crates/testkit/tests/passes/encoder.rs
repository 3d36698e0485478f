//! The encoder passes: spelled-out dynamic int8 products, erf GELUs and self-attention
//! fused into one op each, with the same bits as the ops they replace.

use super::*;

/// quantize_dynamic's activation side: `x` → codes `q`, scale `s`, zero point `z`, and the
/// scales' product `sw = s · ws`.
fn quantize_dynamic(b: &mut ModelBuilder, x: &str) {
    b.node(
        "DynamicQuantizeLinear",
        "",
        "dq",
        &[x],
        &["q", "s", "z"],
        vec![],
    );
    b.node("Mul", "", "scales", &["s", "ws"], &["sw"], vec![]);
}

/// `out = Cast(MatMulInteger(q, w, z, wz))` as float32, its nodes named after `name`.
fn int8_product(b: &mut ModelBuilder, name: &str, out: &str) {
    let acc = format!("{out}.acc");
    let float = vec![attr::int("to", 1)];
    b.node(
        "MatMulInteger",
        "",
        &format!("{name}.mmi"),
        &["q", "w", "z", "wz"],
        &[acc.as_str()],
        vec![],
    );
    b.node("Cast", "", &format!("{name}.cast"), &[&acc], &[out], float);
}

/// torch.onnx's erf GELU of `x`, `(x * (erf(x / c) + 1)) * half` (constants `c`, `one`,
/// `half`), into `out`; `e` names the erf's output.
fn erf_gelu(b: &mut ModelBuilder, name: &str, x: &str, e: &str, out: &str) {
    let v = |s: &str| format!("{name}.{s}");
    let (d, p, t) = (v("d"), v("p"), v("t"));
    b.node("Div", "", &v("div"), &[x, "c"], &[&d], vec![]);
    b.node("Erf", "", &v("erf"), &[&d], &[e], vec![]);
    b.node("Add", "", &v("plus"), &[e, "one"], &[&p], vec![]);
    b.node("Mul", "", &v("times"), &[x, &p], &[&t], vec![]);
    b.node("Mul", "", &v("halved"), &[&t, "half"], &[out], vec![]);
}

#[test]
fn spelled_out_int8_products_become_matmul_integer_to_float_with_the_same_bits() {
    // quantize_dynamic's form: y = Cast(MatMulInteger(q, W, zq, zw)) * (s * ws) + bias;
    // then the same product by a per-column scale constant without a bias; then one whose
    // Cast is also a graph output, which stays spelled out.
    let (k, n) = (40, 70);
    let mut rng = Rng::new(11);
    let weights: Vec<i8> = (0..k * n).map(|_| rng.next_u64() as i8).collect();
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.input("x", DType::F32, &[Dim::from("n"), Dim::Fixed(k)]);
    b.initializer("w", Tensor::from_slice([k, n], &weights).unwrap());
    b.initializer("wz", Tensor::from_slice([], &[3i8]).unwrap());
    b.initializer("ws", Tensor::scalar(0.0123f32));
    b.initializer("bias", random(&[n], 12));
    b.initializer("cs", random(&[n], 13));
    quantize_dynamic(&mut b, "x");
    int8_product(&mut b, "p1", "c");
    b.node("Mul", "", "scale", &["c", "sw"], &["p"], vec![]);
    b.node("Add", "", "bias", &["bias", "p"], &["y"], vec![]);
    int8_product(&mut b, "p2", "c2");
    b.node("Mul", "", "scale2", &["cs", "c2"], &["y2"], vec![]);
    int8_product(&mut b, "p3", "c3");
    b.node("Mul", "", "scale3", &["c3", "ws"], &["y3"], vec![]);
    for name in ["y", "y2", "y3", "c3"] {
        b.output(name, DType::F32, &[]);
    }
    let g = graph(&b);
    // 37 rows: a task's chunk of 32 and a tail; values of both signs.
    let x: Vec<f32> = (random(&[37, k], 14).as_slice::<f32>().unwrap().iter())
        .map(|v| v * 4.0 - 1.5)
        .collect();
    let feeds = [("x", Tensor::from_slice([37, k], &x).unwrap())];
    let before = run(g.clone(), &feeds);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.integer_products, 2, "{report:?}");
    let h = histogram(&g);
    assert_eq!(
        (
            h.get("MatMulIntegerToFloat"),
            h.get("MatMulInteger"),
            h.get("Cast"),
            h.get("Mul"),
            h.get("Add")
        ),
        (Some(&2), Some(&1), Some(&1), Some(&1), None),
        "{h:?}"
    );
    let after = run(g, &feeds);
    assert_same_bits(
        &before,
        &after,
        "the fused int8 product differs from its ops",
    );
}

#[test]
fn the_erf_gelu_of_an_int8_product_is_fused_too() {
    // quantize_dynamic's BERT MLP over dequantized int8 inputs (its embeddings): the biased
    // int8 product becomes MatMulIntegerToFloat, whose output the shape facts know as float32
    // (the scales' type, not the codes'), so its GELU fuses after it.
    let (k, n) = (40, 24);
    let mut rng = Rng::new(31);
    let weights: Vec<i8> = (0..k * n).map(|_| rng.next_u64() as i8).collect();
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.input("xi", DType::I8, &[Dim::from("n"), Dim::Fixed(k)]);
    b.initializer("xs", Tensor::scalar(0.031f32));
    b.initializer("w", Tensor::from_slice([k, n], &weights).unwrap());
    b.initializer("wz", Tensor::from_slice([], &[0i8]).unwrap());
    b.initializer("ws", Tensor::scalar(0.0123f32));
    b.initializer("bias", random(&[n], 32));
    b.initializer("c", Tensor::scalar(std::f32::consts::SQRT_2));
    b.initializer("one", Tensor::scalar(1f32));
    b.initializer("half", Tensor::scalar(0.5f32));
    b.node("DequantizeLinear", "", "deq", &["xi", "xs"], &["x"], vec![]);
    quantize_dynamic(&mut b, "x");
    int8_product(&mut b, "up", "c0");
    b.node("Mul", "", "scale", &["c0", "sw"], &["p0"], vec![]);
    b.node("Add", "", "biased", &["p0", "bias"], &["m"], vec![]);
    erf_gelu(&mut b, "act", "m", "e", "y");
    b.output("y", DType::F32, &[]);
    let g = graph(&b);
    let xi: Vec<i8> = (0..37 * k).map(|_| rng.next_u64() as i8).collect();
    let feeds = [("xi", Tensor::from_slice([37, k], &xi).unwrap())];
    let before = run(g.clone(), &feeds);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(
        (report.integer_products, report.erf_gelus),
        (1, 1),
        "{report:?}"
    );
    let h = histogram(&g);
    assert_eq!(
        (
            h.get("MatMulIntegerToFloat"),
            h.get("ErfGelu"),
            h.get("Erf")
        ),
        (Some(&1), Some(&1), None),
        "{h:?}"
    );
    let after = run(g, &feeds);
    assert_same_bits(&before, &after, "the fused int8 MLP differs from its ops");
}

#[test]
fn spelled_out_erf_gelus_become_one_op_with_the_same_bits() {
    // torch.onnx's GELU of a biased product, (x * (erf(x / c) + 1)) * 0.5 with x = h·W + bias;
    // then (u * 0.5) * (1 + erf(u / c)) of an input; then one whose erf is also a graph
    // output, which stays spelled out.
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.input("h", DType::F32, &[Dim::from("n"), Dim::Fixed(8)]);
    b.input("u", DType::F32, &[Dim::from("n"), Dim::Fixed(24)]);
    b.initializer("w", random(&[8, 24], 21));
    b.initializer("bias", random(&[24], 22));
    b.initializer("c", Tensor::scalar(std::f32::consts::SQRT_2));
    b.initializer("one", Tensor::scalar(1f32));
    b.initializer("half", Tensor::scalar(0.5f32));
    b.node("MatMul", "", "mm", &["h", "w"], &["m"], vec![]);
    b.node("Add", "", "biased", &["m", "bias"], &["x"], vec![]);
    erf_gelu(&mut b, "act", "x", "e", "y");
    b.node("Div", "", "div2", &["u", "c"], &["d2"], vec![]);
    b.node("Erf", "", "erf2", &["d2"], &["e2"], vec![]);
    b.node("Add", "", "plus2", &["one", "e2"], &["p2"], vec![]);
    b.node("Mul", "", "halved2", &["half", "u"], &["t2"], vec![]);
    b.node("Mul", "", "times2", &["p2", "t2"], &["y2"], vec![]);
    erf_gelu(&mut b, "act3", "u", "e3", "y3");
    for name in ["y", "y2", "y3", "e3"] {
        b.output(name, DType::F32, &[]);
    }
    let g = graph(&b);
    // Values around 0 and far out, where erf saturates; 37 rows of 24 (windows and a tail).
    let spread = |t: Tensor| {
        let v: Vec<f32> = (t.as_slice::<f32>().unwrap().iter().enumerate())
            .map(|(i, v)| (v - 0.5) * (1 + i % 13) as f32)
            .collect();
        Tensor::from_slice(t.dims(), &v).unwrap()
    };
    let feeds = [
        ("h", spread(random(&[37, 8], 23))),
        ("u", spread(random(&[37, 24], 24))),
    ];
    let before = run(g.clone(), &feeds);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.erf_gelus, 2, "{report:?}");
    let h = histogram(&g);
    assert_eq!(
        (h.get("ErfGelu"), h.get("Erf"), h.get("Add"), h.get("Mul")),
        (Some(&2), Some(&1), Some(&1), Some(&2)),
        "{h:?}"
    );
    let after = run(g, &feeds);
    assert_same_bits(&before, &after, "the fused erf GELU differs from its ops");
}

/// An encoder's self-attention as torch.onnx spells it, of `q`, `k`, `v` (`[b, s, 48]`, four
/// heads of 12, each plus its bias `q.bias`.. where `biased`) into `out`: `scale` is `(op,
/// constant, constant first)` and `mask_first` puts the mask before the scores in its `Add`
/// (none without a mask).
fn spelled_attention(
    b: &mut ModelBuilder,
    (p, biased): (&str, bool),
    (scale, c, c_first): (&str, &str, bool),
    mask: Option<(&str, bool)>,
    out: &str,
) {
    let n = |s: &str| format!("{p}.{s}");
    for (x, perm) in [
        ("q", [0, 2, 1, 3]),
        ("k", [0, 2, 3, 1]),
        ("v", [0, 2, 1, 3]),
    ] {
        let mut source = x.to_string();
        if biased {
            source = n(&format!("{x}.biased"));
            let (add, bias) = (n(&format!("{x}.add")), format!("{x}.bias"));
            b.node("Add", "", &add, &[x, &bias], &[&source], vec![]);
        }
        b.node(
            "Reshape",
            "",
            &n(&format!("{x}.split")),
            &[&source, "split"],
            &[&n(&format!("{x}3"))],
            vec![],
        );
        b.node(
            "Transpose",
            "",
            &n(&format!("{x}.heads")),
            &[&n(&format!("{x}3"))],
            &[&n(&format!("{x}4"))],
            vec![attr::ints("perm", &perm)],
        );
    }
    b.node(
        "MatMul",
        "",
        &n("qk"),
        &[&n("q4"), &n("k4")],
        &[&n("scores")],
        vec![],
    );
    let scale_in = if c_first {
        [c.to_string(), n("scores")]
    } else {
        [n("scores"), c.to_string()]
    };
    b.node(
        scale,
        "",
        &n("scale"),
        &[&scale_in[0], &scale_in[1]],
        &[&n("scaled")],
        vec![],
    );
    let probs_in = match mask {
        Some((m, first)) => {
            let ins = if first {
                [m.to_string(), n("scaled")]
            } else {
                [n("scaled"), m.to_string()]
            };
            b.node(
                "Add",
                "",
                &n("mask"),
                &[&ins[0], &ins[1]],
                &[&n("masked")],
                vec![],
            );
            n("masked")
        }
        None => n("scaled"),
    };
    b.node(
        "Softmax",
        "",
        &n("softmax"),
        &[&probs_in],
        &[&n("probs")],
        vec![attr::int("axis", -1)],
    );
    b.node(
        "MatMul",
        "",
        &n("pv"),
        &[&n("probs"), &n("v4")],
        &[&n("context")],
        vec![],
    );
    let perm = attr::ints("perm", &[0, 2, 1, 3]);
    b.node(
        "Transpose",
        "",
        &n("merge.t"),
        &[&n("context")],
        &[&n("context_t")],
        vec![perm],
    );
    b.node(
        "Reshape",
        "",
        &n("merge"),
        &[&n("context_t"), "merge"],
        &[out],
        vec![],
    );
}

#[test]
fn spelled_out_encoder_attention_becomes_one_op_with_the_same_bits() {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    let tokens = [Dim::from("b"), Dim::from("s"), Dim::Fixed(48)];
    for x in ["q", "k", "v"] {
        b.input(x, DType::F32, &tokens);
    }
    let mask_dims = [Dim::from("b"), Dim::Fixed(1), Dim::Fixed(1), Dim::from("s")];
    b.input("mask", DType::F32, &mask_dims);
    b.initializer("split", Tensor::from_slice([4], &[0i64, 0, 4, 12]).unwrap());
    b.initializer("merge", Tensor::from_slice([3], &[0i64, 0, 48]).unwrap());
    b.initializer("c", Tensor::scalar(12f32.sqrt()));
    b.initializer("inv_c", Tensor::scalar(1.0 / 12f32.sqrt()));
    for (x, seed) in [("q", 34), ("k", 35), ("v", 36)] {
        b.initializer(&format!("{x}.bias"), random(&[48], seed));
    }
    // Divided, masked and biased (BERT); multiplied with the constant first, the mask first in its
    // Add; unmasked and biased; and one whose scores are also an output, which stays spelled out.
    spelled_attention(
        &mut b,
        ("a", true),
        ("Div", "c", false),
        Some(("mask", false)),
        "y1",
    );
    spelled_attention(
        &mut b,
        ("b", false),
        ("Mul", "inv_c", true),
        Some(("mask", true)),
        "y2",
    );
    spelled_attention(&mut b, ("c", true), ("Mul", "inv_c", false), None, "y3");
    spelled_attention(
        &mut b,
        ("d", false),
        ("Div", "c", false),
        Some(("mask", false)),
        "y4",
    );
    for name in ["y1", "y2", "y3", "y4", "d.scores"] {
        b.output(name, DType::F32, &[]);
    }
    let g = graph(&b);
    // Two sequences of 13 tokens, the second padded after 9: its mask hides keys 9-12 with
    // the float minimum, as the BERT exports' (1 - mask) · f32::MIN does.
    let (batch, seq) = (2, 13);
    let mask: Vec<f32> = (0..batch * seq)
        .map(|i| {
            if i >= seq && i % seq >= 9 {
                f32::MIN
            } else {
                0.0
            }
        })
        .collect();
    let spread = |t: Tensor| {
        let v: Vec<f32> = (t.as_slice::<f32>().unwrap().iter())
            .map(|v| (v - 0.5) * 6.0)
            .collect();
        Tensor::from_slice(t.dims(), &v).unwrap()
    };
    let feeds = [
        ("q", spread(random(&[batch, seq, 48], 31))),
        ("k", spread(random(&[batch, seq, 48], 32))),
        ("v", spread(random(&[batch, seq, 48], 33))),
        (
            "mask",
            Tensor::from_slice([batch, 1, 1, seq], &mask).unwrap(),
        ),
    ];
    let before = run(g.clone(), &feeds);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.encoder_attentions, 3, "{report:?}");
    let h = histogram(&g);
    assert_eq!(
        (
            h.get("EncoderAttention"),
            h.get("Softmax"),
            h.get("Transpose"),
            h.get("Add")
        ),
        (Some(&3), Some(&1), Some(&4), Some(&1)),
        "{h:?}"
    );
    for threads in [1, 3] {
        let after = run_on(g.clone(), &feeds, threads);
        assert_same_bits(&before, &after, "the fused attention differs from its ops");
    }
    // Padded keys get no weight: the second sequence's rows attend to its first 9 keys only,
    // so changing the padded keys' values changes nothing there.
    let mut k = feeds[1].1.as_slice::<f32>().unwrap().to_vec();
    for t in 9..seq {
        k[(seq + t) * 48..][..48].fill(100.0);
    }
    let mut changed = feeds.clone();
    changed[1].1 = Tensor::from_slice([batch, seq, 48], &k).unwrap();
    let again = run(g, &changed);
    let (y, y2) = (
        before[0].as_slice::<f32>().unwrap(),
        again[0].as_slice::<f32>().unwrap(),
    );
    assert_eq!(y[seq * 48..], y2[seq * 48..]);
}
