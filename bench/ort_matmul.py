#!/usr/bin/env python3
"""GFLOP/s of onnxruntime's f32 MatMul on a sentence encoder's shapes, the peer of
`cargo run --release -p oxgen-kernels --example f32_gemm -- THREADS COPIES`.

    bench/ort_matmul.py [--threads 2] [--copies 40]

One graph holds `--copies` MatMul nodes on the same input, each with its own constant weight
(more than the L2 caches hold, as a model's layers are), so one run is that many products;
nine rounds of five runs, the median round per product is printed. Needs onnxruntime, onnx
and numpy.
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = [(384, 1536), (384, 384), (1536, 384)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--copies", type=int, default=40)
    args = p.parse_args()
    rng = np.random.default_rng(1)
    for m in [13, 32, 70, 150, 256]:
        for k, n in SHAPES:
            weights = [
                numpy_helper.from_array(rng.random((k, n), dtype=np.float32), f"b{i}")
                for i in range(args.copies)
            ]
            nodes = [
                helper.make_node("MatMul", ["a", f"b{i}"], [f"c{i}"])
                for i in range(args.copies)
            ]
            graph = helper.make_graph(
                nodes,
                "matmuls",
                [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                [
                    helper.make_tensor_value_info(f"c{i}", TensorProto.FLOAT, [m, n])
                    for i in range(args.copies)
                ],
                weights,
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(
                model.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            a = rng.random((m, k), dtype=np.float32)
            for _ in range(5):
                session.run(None, {"a": a})
            rounds = []
            for _ in range(9):
                start = time.perf_counter()
                for _ in range(5):
                    session.run(None, {"a": a})
                rounds.append((time.perf_counter() - start) / 5 / args.copies)
            t = sorted(rounds)[4]
            print(
                f"{m}x{k}x{n} threads {args.threads} copies {args.copies}: "
                f"{t * 1e6:.1f} us {2 * m * k * n / t / 1e9:.1f} GFLOP/s"
            )


if __name__ == "__main__":
    main()
