#!/usr/bin/env python3
"""Sentences per second of a sentence encoder: oxgen (the Python wheel's `oxgen.Embedder`)
against ONNX Runtime running the same `model.onnx` in the same run, at batch 1 and at batch
32 of mixed lengths.

oxgen runs each sequence at its own length (no padding); ONNX Runtime takes a batch padded
to its longest sequence, as sentence-transformers and optimum feed it. The sentences are the
100 of `crates/testkit/thirdparty/embeddings/minilm_reference.json` (12 to 256 tokens),
batched in their order. Each configuration runs `--rounds` times, alternating oxgen and ONNX
Runtime; the table gives medians and the ratio. With `--int8`, ONNX Runtime's
`quantize_dynamic` form of the graph (written once into a sibling package folder,
`MODEL_DIR-int8`) is timed on both too.

    bench/embed.py MODEL_DIR [--threads 2] [--rounds 5] [--int8] [--json-out F]
        [--llama-server BIN --gguf F32.gguf [--gguf-q8 Q8_0.gguf]]

Needs the oxgen wheel, onnxruntime and numpy; ONNX Runtime is given oxgen's token ids, so
both compute the same sequences. With `--llama-server` (built by
`LLAMA_CPP_SERVER=1 bench/peers/build_llama_cpp.sh`), llama.cpp's server is timed too on
GGUF files of the same checkpoint (llama.cpp's `convert_hf_to_gguf.py`, which needs torch, so
they are made by hand: see docs/PERFORMANCE.md): one process per file with `--embedding
--pooling mean`, 32 parallel slots, given the same token ids through `/v1/embeddings` (one
request per batch; the server decodes a request's sequences together).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import time
import urllib.request

import numpy as np
import onnxruntime as ort

import oxgen

HERE = os.path.dirname(os.path.abspath(__file__))
SENTENCES = os.path.join(
    HERE, "../crates/testkit/thirdparty/embeddings/minilm_reference.json"
)


def ort_session(path, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_embed(session, batch_ids):
    """Mean-pooled, normalized embeddings of a padded batch (what sentence-transformers does)."""
    longest = max(len(ids) for ids in batch_ids)
    ids = np.zeros((len(batch_ids), longest), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(batch_ids):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if any(i.name == "token_type_ids" for i in session.get_inputs()):
        feeds["token_type_ids"] = np.zeros_like(ids)
    states = session.run(None, feeds)[0]
    summed = (states * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return summed / np.linalg.norm(summed, axis=1, keepdims=True)


class LlamaServer:
    """llama.cpp's server on a GGUF, embedding token ids with mean pooling (normalized)."""

    def __init__(self, binary, gguf, threads):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = subprocess.Popen(
            [binary, "-m", gguf, "--embedding", "--pooling", "mean", "-t", str(threads),
             "-tb", str(threads), "-c", "16384", "-np", "32", "-b", "4096", "-ub", "4096",
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health") as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"llama-server on {gguf} did not come up")

    def embed(self, batch_ids):
        body = json.dumps({"input": batch_ids}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/embeddings", body,
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as r:
            data = json.load(r)["data"]
        return np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])])

    def close(self):
        self.process.terminate()
        self.process.wait()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--int8", action="store_true")
    p.add_argument("--json-out")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    p.add_argument("--gguf", help="the checkpoint as an f32 GGUF, for --llama-server")
    p.add_argument("--gguf-q8", help="the checkpoint as a Q8_0 GGUF, for --llama-server")
    args = p.parse_args()

    with open(SENTENCES) as f:
        sentences = json.load(f)["sentences"]
    embedder = oxgen.Embedder(args.model, backend="native", threads=args.threads)
    # Both runners take oxgen's ids, so they compute the same sequences.
    ids = [embedder.tokenize(s) for s in sentences]
    graph = os.path.join(args.model, "model.onnx")
    peers = {"ort f32": ort_session(graph, args.threads)}
    mine_runners = {"oxgen f32": embedder}
    if args.int8:
        package = args.model.rstrip("/") + "-int8"
        int8 = os.path.join(package, "model.onnx")
        if not os.path.exists(int8):
            import shutil

            from onnxruntime.quantization import QuantType, quantize_dynamic

            shutil.copytree(args.model, package, ignore=shutil.ignore_patterns("model.onnx*"))
            quantize_dynamic(graph, int8, weight_type=QuantType.QInt8)
        peers["ort int8"] = ort_session(int8, args.threads)
        mine_runners["oxgen int8"] = oxgen.Embedder(package, backend="native", threads=args.threads)

    servers = {}
    if args.llama_server:
        servers["llama.cpp f32"] = LlamaServer(args.llama_server, args.gguf, args.threads)
        if args.gguf_q8:
            servers["llama.cpp q8_0"] = LlamaServer(args.llama_server, args.gguf_q8, args.threads)

    # The same vectors, before timing anything.
    mine = embedder.embed(ids[:8])
    theirs = ort_embed(peers["ort f32"], ids[:8])
    worst = float(((mine * theirs).sum(1)).min())
    assert worst > 0.9999, worst
    for name, server in servers.items():
        agree = float(((mine * server.embed(ids[:8])).sum(1)).min())
        print(f"worst cosine oxgen f32 vs {name}: {agree:.7f}")
        assert agree > 0.999, (name, agree)

    runs = {}
    for batch in (1, 32):
        batches = [ids[i : i + batch] for i in range(0, len(ids), batch)]
        for _ in range(args.rounds):
            for name, mine in mine_runners.items():
                runs.setdefault((name, batch), []).append(
                    timed(lambda: [mine.embed(b) for b in batches])
                )
            for name, session in peers.items():
                runs.setdefault((name, batch), []).append(
                    timed(lambda: [ort_embed(session, b) for b in batches])
                )
            for name, server in servers.items():
                runs.setdefault((name, batch), []).append(
                    timed(lambda: [server.embed(b) for b in batches])
                )
    for server in servers.values():
        server.close()
    rows = []
    print(f"{len(ids)} sentences, {sum(map(len, ids))} tokens, {args.threads} threads, "
          f"{args.rounds} rounds (median); worst cosine oxgen vs ort {worst:.7f}")
    rate_of = lambda key: len(ids) / statistics.median(runs[key])
    print(f"{'runner':<14} {'batch':>5} {'sentences/s':>12} {'oxgen / ort':>12} {'oxgen / llama.cpp':>18}")
    for (name, batch), times in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rate = rate_of((name, batch))
        kind = name.split()[-1]
        rows.append({"runner": name, "batch": batch, "sentences_per_s": rate, "times": times})
        ratio = f"{rate / rate_of(('ort ' + kind, batch)):>11.2f}x" if name.startswith("oxgen") else ""
        # oxgen's int8 against llama.cpp's 8-bit form (Q8_0): each runtime's own int8.
        llama = ("llama.cpp " + ("f32" if kind == "f32" else "q8_0"), batch)
        versus = f"{rate / rate_of(llama):>17.2f}x" if name.startswith("oxgen") and llama in runs else ""
        print(f"{name:<14} {batch:>5} {rate:>12.1f} {ratio:>12} {versus}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
