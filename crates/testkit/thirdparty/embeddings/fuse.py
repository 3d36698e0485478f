"""Writes a copy of a BERT sentence-encoder package whose graph has onnxruntime's fused
encoder ops, as onnxruntime's transformer optimizer makes them (`EmbedLayerNormalization`,
`SkipLayerNormalization`, `BiasGelu`), for the test that runs such a graph natively:

    python fuse.py SRC_PACKAGE DST_PACKAGE NUM_HEADS HIDDEN

Needs onnx, onnxruntime and sympy (no torch: the fusion alone, `opt_level=0`, skips the
onnxruntime pre-pass that would import it). Every other file of the package is copied.
"""

import shutil
import sys
from collections import Counter
from pathlib import Path

from onnxruntime.transformers.optimizer import optimize_model


def main():
    src, dst, heads, hidden = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("model.onnx", "model.onnx.data"))
    model = optimize_model(
        str(src / "model.onnx"), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0
    )
    ops = Counter(n.op_type for n in model.model.graph.node)
    for fused in ("EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"):
        if not ops[fused]:
            sys.exit(f"the optimizer made no {fused} node (ops: {dict(ops)})")
    model.save_model_to_file(str(tmp / "model.onnx"), use_external_data_format=True)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    print(dict(ops))


if __name__ == "__main__":
    main()
