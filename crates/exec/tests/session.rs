//! The native session: buffer reuse by liveness, peak activation bytes, errors naming nodes,
//! and identical results for any thread count.

use oxgen_exec::{ExecOptions, NativeSession};
use oxgen_graph::Graph;
use oxgen_onnx::writer::{Dim, ModelBuilder};
use oxgen_runtime::{RuntimeError, Session};
use oxgen_tensor::{DType, Tensor};

fn graph(b: &ModelBuilder) -> Graph {
    let bytes = prost::Message::encode_to_vec(&b.build());
    Graph::from_model(&oxgen_onnx::Model::from_bytes(bytes.into(), None).unwrap()).unwrap()
}

/// x -> Relu -> Neg -> Relu -> ... (`len` nodes), each value 4 KiB.
fn chain(len: usize) -> ModelBuilder {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("x", DType::F32, &[Dim::Symbolic("n".into())]);
    let names: Vec<String> = (0..=len)
        .map(|i| if i == 0 { "x".into() } else { format!("v{i}") })
        .collect();
    for i in 0..len {
        let op = if i % 2 == 0 { "Neg" } else { "Abs" };
        b.node(
            op,
            "",
            &format!("n{i}"),
            &[&names[i]],
            &[&names[i + 1]],
            vec![],
        );
    }
    b.output(&names[len], DType::F32, &[Dim::Symbolic("n".into())]);
    b
}

#[test]
fn dead_values_are_reused_and_the_peak_is_two_buffers() {
    let mut s = NativeSession::new(
        graph(&chain(10)),
        &ExecOptions {
            threads: 1,
            ..Default::default()
        },
    );
    let x = Tensor::from_slice([1024], &vec![1.5f32; 1024]).unwrap();
    let out = s.run(vec![("x".into(), x)]).unwrap();
    assert_eq!(out[0].1.as_slice::<f32>().unwrap()[0], 1.5);
    // Ten 4 KiB values, but at most an op's input and output are alive at once.
    assert_eq!(s.last_run().peak_activation_bytes, 2 * 4096);
    assert_eq!(s.last_run().nodes, 10);
}

#[test]
fn a_run_time_error_names_the_node_and_the_session_survives() {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("a", DType::F32, &[Dim::Symbolic("n".into())]);
    b.input("b", DType::F32, &[Dim::Symbolic("n".into())]);
    b.node("Add", "", "the_add", &["a", "b"], &["y"], vec![]);
    b.output("y", DType::F32, &[Dim::Symbolic("n".into())]);
    let mut s = NativeSession::new(graph(&b), &ExecOptions::default());
    let t = |n: usize| Tensor::from_slice([n], &vec![1.0f32; n]).unwrap();
    let err = s
        .run(vec![("a".into(), t(3)), ("b".into(), t(4))])
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("node 'the_add' (ai.onnx::Add, opset 21)") && msg.contains("cannot broadcast"),
        "{msg}"
    );
    let ok = s.run(vec![("a".into(), t(3)), ("b".into(), t(1))]).unwrap();
    assert_eq!(ok[0].1.as_slice::<f32>().unwrap(), &[2.0, 2.0, 2.0]);
    let err = s.run(vec![("a".into(), t(3))]).unwrap_err();
    assert!(matches!(err, RuntimeError::MissingInput { ref name } if name == "b"));
}

#[test]
fn matmul_results_do_not_depend_on_thread_count() {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("a", DType::F32, &[Dim::Fixed(33), Dim::Fixed(70)]);
    b.input("w", DType::F32, &[Dim::Fixed(70), Dim::Fixed(45)]);
    b.node("MatMul", "", "mm", &["a", "w"], &["y"], vec![]);
    b.output("y", DType::F32, &[Dim::Fixed(33), Dim::Fixed(45)]);
    let g = graph(&b);
    let a: Vec<f32> = (0..33 * 70)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0)
        .collect();
    let w: Vec<f32> = (0..70 * 45)
        .map(|i| ((i * 104_729 % 1000) as f32 - 500.0) / 91.0)
        .collect();
    let inputs = || {
        vec![
            ("a".into(), Tensor::from_slice([33, 70], &a).unwrap()),
            ("w".into(), Tensor::from_slice([70, 45], &w).unwrap()),
        ]
    };
    let one = NativeSession::new(
        g.clone(),
        &ExecOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .run(inputs())
    .unwrap();
    let three = NativeSession::new(
        g,
        &ExecOptions {
            threads: 3,
            ..Default::default()
        },
    )
    .run(inputs())
    .unwrap();
    assert_eq!(one[0].1.as_bytes(), three[0].1.as_bytes());
}

/// An f32 `MatMul` weight borrowed from the model's bytes (as a mapped file's are) is packed
/// at load into column tiles; the products are the bits of the same weight given as an input,
/// which is not packed.
#[test]
fn a_packed_f32_matmul_weight_gives_the_same_bits() {
    let (k, n) = (70usize, 130usize);
    let w: Vec<f32> = (0..k * n)
        .map(|i| ((i * 104_729 % 1000) as f32 - 500.0) / 91.0)
        .collect();
    let build = |as_input: bool| {
        let mut b = ModelBuilder::new("oxgen-test");
        b.opset("", 21);
        b.input("a", DType::F32, &[Dim::Symbolic("m".into()), Dim::Fixed(k)]);
        let w = Tensor::from_slice([k, n], &w).unwrap();
        if as_input {
            b.input("w", DType::F32, &[Dim::Fixed(k), Dim::Fixed(n)]);
        } else {
            b.initializer("w", w);
        }
        b.node("MatMul", "", "mm", &["a", "w"], &["y"], vec![]);
        b.output("y", DType::F32, &[Dim::Symbolic("m".into()), Dim::Fixed(n)]);
        graph(&b)
    };
    let options = ExecOptions {
        threads: 2,
        ..Default::default()
    };
    // The weight over bytes of its own, as a mapped file's tensors are.
    let mut g = build(false);
    let raw: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let shared = Tensor::from_bytes(DType::F32, [k, n], raw.into()).unwrap();
    assert!(shared.is_shared());
    let id = g.find("w").unwrap();
    g.initializers.insert(id, shared);
    let mut packed = NativeSession::new(g, &options);
    let mut plain = NativeSession::new(build(true), &options);
    let vector_kernel = oxgen_kernels::matmul::f32_kernel_available();
    assert_eq!(packed.packed_f32_bytes() > 0, vector_kernel);
    assert_eq!(plain.packed_f32_bytes(), 0);
    for m in [1, 5] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0)
            .collect();
        let a = Tensor::from_slice([m, k], &a).unwrap();
        let got = packed.run(vec![("a".into(), a.clone())]).unwrap();
        let w = Tensor::from_slice([k, n], &w).unwrap();
        let want = plain.run(vec![("a".into(), a), ("w".into(), w)]).unwrap();
        assert_eq!(got[0].1.as_bytes(), want[0].1.as_bytes(), "{m} rows");
    }
}

/// `MatMulNBits` with `accuracy_level` 4 quantizes activations to int8 unless the session is
/// exact; exact sessions compute what `accuracy_level` 0 computes, bit for bit.
#[test]
fn accuracy_level_4_uses_int8_activations_unless_exact() {
    let (k, n) = (64usize, 8usize);
    let model = |level: i64| {
        let mut b = ModelBuilder::new("oxgen-test");
        b.opset("", 21).opset("com.microsoft", 1);
        b.input("a", DType::F32, &[Dim::Fixed(2), Dim::Fixed(k)]);
        let codes: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 251) as u8).collect();
        b.initializer("w", Tensor::from_slice([n, k / 32, 16], &codes).unwrap());
        let scales: Vec<f32> = (0..n * 2).map(|i| 0.01 + i as f32 * 1e-3).collect();
        b.initializer("s", Tensor::from_slice([n * 2], &scales).unwrap());
        let attrs = vec![
            oxgen_onnx::writer::attr::int("K", k as i64),
            oxgen_onnx::writer::attr::int("N", n as i64),
            oxgen_onnx::writer::attr::int("bits", 4),
            oxgen_onnx::writer::attr::int("block_size", 32),
            oxgen_onnx::writer::attr::int("accuracy_level", level),
        ];
        b.node(
            "MatMulNBits",
            "com.microsoft",
            "mm",
            &["a", "w", "s"],
            &["y"],
            attrs,
        );
        b.output("y", DType::F32, &[Dim::Fixed(2), Dim::Fixed(n)]);
        graph(&b)
    };
    let a: Vec<f32> = (0..2 * k)
        .map(|i| ((i * 7919 % 200) as f32 - 100.0) / 33.0)
        .collect();
    let run = |g: Graph, exact: bool| {
        let mut s = NativeSession::new(g, &ExecOptions { threads: 1, exact });
        let out = s
            .run(vec![("a".into(), Tensor::from_slice([2, k], &a).unwrap())])
            .unwrap();
        out[0].1.as_slice::<f32>().unwrap().to_vec()
    };
    let f32_path = run(model(0), false);
    let int8 = run(model(4), false);
    assert_eq!(
        run(model(4), true),
        f32_path,
        "exact sessions ignore accuracy_level"
    );
    assert_ne!(int8, f32_path, "accuracy_level 4 quantizes activations");
    let scale = f32_path.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        int8.iter()
            .zip(&f32_path)
            .all(|(x, y)| (x - y).abs() < 0.02 * scale)
    );
}

/// onnxruntime-genai's builder ties Phi-4-mini's embedding to its output head: the embedding's
/// `GatherBlockQuantized` reads the head's int4 codes (through a `Reshape`), and the session
/// repacks those codes for the head's matmul. After repacking a weight the session hands its
/// file pages back to the OS, but not these: every embedding lookup would read them from disk
/// again (2-15 ms per token on a 1.5B model and on the default model).
#[cfg(target_os = "linux")]
#[test]
fn repacking_a_tied_output_head_keeps_the_embeddings_file_pages() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/families/phi4-mini-int4");
    let model = oxgen_onnx::Model::load(dir.join("model.onnx")).unwrap();
    let graph = Graph::from_model(&model).unwrap();
    let find = |name: &str| graph.initializers[&graph.find(name).unwrap()].clone();
    let (codes, scales) = (
        find("lm_head.MatMul.weight_Q4"),
        find("lm_head.MatMul.weight_scales"),
    );
    assert!(
        codes.is_shared(),
        "the codes are mapped from model.onnx.data"
    );
    let _session = NativeSession::new(
        graph,
        &ExecOptions {
            threads: 1,
            ..Default::default()
        },
    );
    let (resident, pages) = resident_pages(codes.as_bytes());
    assert!(pages >= 3, "the codes (18 KiB) span whole pages");
    assert_eq!(
        resident, pages,
        "the head's codes stay resident after loading"
    );
    // The lookup reads the scales (4.5 KiB) too; whether they span a whole page depends on
    // where they lie in the file.
    let (resident, pages) = resident_pages(scales.as_bytes());
    assert_eq!(
        resident, pages,
        "the head's scales stay resident after loading"
    );
}

/// Resident pages among those wholly inside `bytes`, and how many those are (`mincore`).
#[cfg(target_os = "linux")]
fn resident_pages(bytes: &[u8]) -> (usize, usize) {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
    let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
    let (start, end) = (addr.next_multiple_of(page), (addr + len) / page * page);
    if end <= start {
        return (0, 0);
    }
    let pages = (end - start) / page;
    let mut vec = vec![0u8; pages];
    // SAFETY: `start..end` lies inside `bytes`' mapping; `vec` has one byte per page.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore failed");
    (vec.iter().filter(|&&v| v & 1 == 1).count(), pages)
}

/// Gemma 2's final-logit softcap, as onnxruntime-genai's builder writes it after the output
/// head (`Div` by 30, `Tanh`, `Mul` by 30), keeps rows apart: the head is still the node a
/// prompt step asks for its last row alone, so the softcap runs on that row too.
#[test]
fn the_head_computes_the_last_row_alone_through_a_softcap() {
    for package in ["gemma2-fp32", "gemma2-int4"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testkit/thirdparty/families")
            .join(package);
        let model = oxgen_onnx::Model::load(dir.join("model.onnx")).unwrap();
        let (graph, _) = oxgen_exec::optimize(
            Graph::from_model(&model).unwrap(),
            None,
            &oxgen_exec::PassOptions::default(),
        );
        let ops: Vec<String> = (graph.nodes.iter().rev().take(3))
            .map(|n| format!("{:?}", n.op))
            .collect();
        assert!(ops[0].contains("Mul") && ops[1].contains("Tanh"), "{ops:?}");
        let session = NativeSession::new(
            graph,
            &ExecOptions {
                threads: 1,
                ..Default::default()
            },
        );
        let logits = (session.graph().outputs.iter())
            .position(|&v| session.graph().values[v.0].name == "logits")
            .unwrap();
        let head = session.row_wise_producer(logits).expect(package);
        let op = format!("{:?}", session.graph().nodes[head].op);
        assert!(op.starts_with("MatMul"), "{package}: {op}");
    }
}
