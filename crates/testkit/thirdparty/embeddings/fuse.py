"""Writes a copy of a BERT sentence-encoder package whose graph has onnxruntime's fused
encoder ops, for the test that runs such a graph natively:

    python fuse.py SRC_PACKAGE DST_PACKAGE NUM_HEADS HIDDEN

onnxruntime's transformer optimizer makes `EmbedLayerNormalization`, `SkipLayerNormalization`
and `BiasGelu`; its attention fusion looks for the subgraph a PyTorch export writes, which
`oxgen import` does not, so this script then puts each layer's self-attention into one
`Attention` node as that fusion would (the Q, K and V weights and biases side by side, the
raw `attention_mask` as `mask_index`). Needs onnx, onnxruntime and sympy (no torch: the
fusion alone, `opt_level=0`, skips the onnxruntime pre-pass that would import it). Every
other file of the package is copied.
"""

import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper
from onnxruntime.transformers.optimizer import optimize_model


def fuse_attention(graph, heads):
    """Replaces layer L's nodes from `lL.query.matmul` to `lL.merged` (the names `oxgen
    import` gives them) with one com.microsoft `Attention` node."""
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    mask = helper.make_node("Cast", ["attention_mask"], ["mask_index.i32"], to=6, name="mask_index.cast")
    new_nodes = []
    for layer in range(1000):
        first, last = producer.get(f"l{layer}.query.matmul"), producer.get(f"l{layer}.merged")
        if first is None or last is None:
            break
        weights, biases = [], []
        for part in ("query", "key", "value"):
            w_name = producer[f"l{layer}.{part}.matmul"].input[1]
            b_name = producer[f"l{layer}.{part}"].input[1]
            weights.append(numpy_helper.to_array(inits[w_name]))
            biases.append(numpy_helper.to_array(inits[b_name]))
        graph.initializer.extend([
            numpy_helper.from_array(np.concatenate(weights, axis=1), f"l{layer}.qkv.weight"),
            numpy_helper.from_array(np.concatenate(biases), f"l{layer}.qkv.bias"),
        ])
        new_nodes.append(helper.make_node(
            "Attention",
            [first.input[0], f"l{layer}.qkv.weight", f"l{layer}.qkv.bias", "mask_index.i32"],
            [f"l{layer}.merged"],
            name=f"l{layer}.attention",
            domain="com.microsoft",
            num_heads=heads,
        ))
    # Each layer's old nodes: everything `lL.merged` depends on after the layer's input.
    replaced = {}
    for new in new_nodes:
        stop, todo = new.input[0], [new.output[0]]
        while todo:
            value = todo.pop()
            node = producer.get(value)
            if value == stop or node is None or id(node) in replaced:
                continue
            replaced[id(node)] = new if value == new.output[0] else None
            todo.extend(node.input)
    out = [mask]
    for n in graph.node:
        if id(n) not in replaced:
            out.append(n)
        elif replaced[id(n)] is not None:
            out.append(replaced[id(n)])
    # What only the old attention read (the additive mask) is dead now.
    while True:
        used = {i for n in out for i in n.input} | {o.name for o in graph.output}
        live = [n for n in out if any(o in used for o in n.output)]
        if len(live) == len(out):
            break
        out = live
    del graph.node[:]
    graph.node.extend(out)
    names = {i for n in graph.node for i in n.input}
    keep = [i for i in graph.initializer if i.name in names]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return len(new_nodes)


def main():
    src, dst, heads, hidden = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("model.onnx", "model.onnx.data"))
    model = optimize_model(
        str(src / "model.onnx"), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0
    )
    if not fuse_attention(model.model.graph, heads):
        sys.exit("no self-attention named as `oxgen import` names it (lN.query.matmul .. lN.merged)")
    ops = Counter(n.op_type for n in model.model.graph.node)
    for fused in ("EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "Attention"):
        if not ops[fused]:
            sys.exit(f"the optimizer made no {fused} node (ops: {dict(ops)})")
    model.save_model_to_file(str(tmp / "model.onnx"), use_external_data_format=True)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    print(dict(ops))


if __name__ == "__main__":
    main()
