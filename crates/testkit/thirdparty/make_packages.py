"""Builds oxgen's third-party ONNX language-model test packages (see README.md next to this file).

A tiny random-weight Llama (transformers `LlamaForCausalLM`, hidden 64, 2 layers, 4 heads,
2 KV heads, MLP 128, vocab 291 = the test fixture tokenizer) is saved in the Hugging Face
format, then turned into three packages by the real third-party tools:

  builder-int4/  onnxruntime-genai model builder, `-p int4 -e cpu`
  builder-fp32/  onnxruntime-genai model builder, `-p fp32 -e cpu`
  optimum/       optimum-onnx `optimum-cli export onnx --task text-generation-with-past`

and each package is stepped greedily with onnxruntime (a 5-token prompt, then 8 decode steps
feeding the KV cache back) to print the ids a Rust test can compare with.

Tool versions used to make the committed packages (Python 3.11.7, CPU only):

  torch 2.15.0+cu132        transformers 4.57.6      tokenizers 0.22.2    safetensors 0.8.0
  onnxruntime-genai 0.18.0  onnxruntime 1.32.0       onnx 1.23.2          onnx-ir 1.1.0
  onnxscript 0.7.2          optimum 2.1.0            optimum-onnx 0.1.0   numpy 2.4.6

onnxruntime-genai 0.18.0's builder imports `Qwen3_5ForConditionalGeneration` and
`Qwen3_5MoeForConditionalGeneration` from transformers, which 4.57.6 (the newest that
optimum-onnx 0.1.0 accepts) lacks; the script runs the builder in a subprocess with those two
names stubbed as empty classes (unused by the Llama path), i.e. the equivalent of
`python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4|fp32 -e cpu -c CACHE`.

Rerun (from the repository root, with a venv holding the versions above):

  /tmp/tpvenv/bin/python crates/testkit/thirdparty/make_packages.py [--work /tmp/oxgen-thirdparty]

It rewrites tokenizer/, builder-int4/, builder-fp32/ and optimum/ next to this file; the
Hugging Face checkpoint and the tools' raw outputs stay in the work folder.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))

# The prompt the sanity check feeds (BOS, then arbitrary byte and merge tokens) and how many
# greedy steps follow it.
PROMPT = [0, 75, 104, 263, 290]
DECODE_STEPS = 8
HEAD_SIZE = 16

# ---------------------------------------------------------------------------------------------
# The fixture tokenizer: a Python copy of `crates/testkit/src/fixtures.rs`, module `tokenizer`
# (`json()` and `config_json()`). serde_json without `preserve_order` keeps object keys sorted,
# and its pretty printer indents by two spaces, as `json.dumps(sort_keys=True, indent=2)`.
# ---------------------------------------------------------------------------------------------

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = 0, 2
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġ", "a"), ("i", "n"), ("Ġt", "he"), ("e", "r"), ("o", "n"),
    ("Ġ", "s"), ("e", "n"), ("a", "t"), ("o", "r"), ("Ġ", "w"), ("Ġ", "o"), ("i", "s"),
    ("a", "n"), ("Ġ", "c"), ("e", "s"), ("Ġ", "b"), ("e", "d"), ("i", "t"), ("Ġ", "f"),
    ("a", "r"), ("Ġ", "p"), ("in", "g"), ("Ġ", "m"), ("o", "u"), ("Ġ", "h"), ("Ġ", "i"),
    ("l", "l"), ("Ġa", "n"), ("Ġan", "d"), ("Ġ", "d"),
]
VOCAB_SIZE = len(SPECIAL) + 256 + len(MERGES)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def byte_chars():
    """GPT-2's reversible byte -> printable char table."""
    out, extra = [], 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            out.append(chr(b))
        else:
            extra += 1
            out.append(chr(255 + extra))
    return out


def tokenizer_json():
    vocab = {s: i for i, s in enumerate(SPECIAL)}
    for b, c in enumerate(byte_chars()):
        vocab[c] = len(SPECIAL) + b
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    assert len(vocab) == VOCAB_SIZE
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(SPECIAL)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [f"{a} {b}" for a, b in MERGES],
        },
    }


def tokenizer_config_json():
    return {
        "bos_token": SPECIAL[BOS],
        "eos_token": SPECIAL[EOS],
        "unk_token": SPECIAL[BOS],
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer",
    }


def dump(value, path):
    # serde_json::to_string_pretty: sorted keys (BTreeMap), two-space indent, no trailing newline.
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def write_tokenizer(folder):
    os.makedirs(folder, exist_ok=True)
    dump(tokenizer_json(), os.path.join(folder, "tokenizer.json"))
    dump(tokenizer_config_json(), os.path.join(folder, "tokenizer_config.json"))


# ---------------------------------------------------------------------------------------------
# The Hugging Face checkpoint
# ---------------------------------------------------------------------------------------------


def make_hf(hf_dir, tok_dir):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        # Plain RoPE spelled out: the genai builder 0.18.0 (written against transformers 5's
        # `rope_parameters`) iterates `config.rope_scaling` and fails on the null 4.x default.
        rope_scaling={"rope_type": "default"},
        tie_word_embeddings=False,
        hidden_act="silu",
        # Wider than the default 0.02 so the logits spread (top-1 margins well above float
        # noise) and greedy decoding does not collapse into one repeated token.
        initializer_range=0.2,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=EOS,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()
    # Norm weights start at 1; give them some spread too so a runtime that skips them is caught.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.generation_config = GenerationConfig(
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=EOS, do_sample=False, max_length=256
    )
    if os.path.exists(hf_dir):
        shutil.rmtree(hf_dir)
    model.save_pretrained(hf_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), os.path.join(hf_dir, name))

    # Reference: transformers' own greedy decode with its KV cache.
    with torch.no_grad():
        out = model.generate(
            torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
            max_new_tokens=DECODE_STEPS + 1, min_new_tokens=DECODE_STEPS + 1, do_sample=False,
        )
        logits = model(torch.tensor([PROMPT])).logits[0, -1]
    top = torch.topk(logits, 2).values
    print(f"transformers: last prompt logits std {logits.std():.3f}, top-1 margin {top[0] - top[1]:.3f}")
    return out[0, len(PROMPT):].tolist(), logits.numpy()


# ---------------------------------------------------------------------------------------------
# The tools
# ---------------------------------------------------------------------------------------------

BUILDER_SHIM = """
import runpy, sys, transformers
for n in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"):
    if not hasattr(transformers, n):
        setattr(transformers, n, type(n, (), {}))
sys.argv = ["onnxruntime_genai.models.builder"] + sys.argv[1:]
runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")
"""

KEEP = {
    "model.onnx", "model.onnx.data", "genai_config.json", "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
}


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def keep_runtime_files(raw, dest):
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    kept, dropped = [], []
    for name in sorted(os.listdir(raw)):
        (kept if name in KEEP or name.endswith(".data") else dropped).append(name)
    for name in kept:
        shutil.copy(os.path.join(raw, name), os.path.join(dest, name))
    print(f"{os.path.relpath(dest, HERE)}: kept {kept}, dropped {dropped}")


def make_builder(hf_dir, work, precision):
    raw = os.path.join(work, f"builder-{precision}")
    if os.path.exists(raw):
        shutil.rmtree(raw)
    cache = os.path.join(work, f"builder-cache-{precision}")
    run([sys.executable, "-c", BUILDER_SHIM, "-i", hf_dir, "-o", raw, "-p", precision, "-e", "cpu", "-c", cache])
    keep_runtime_files(raw, os.path.join(HERE, f"builder-{precision}"))


def make_optimum(hf_dir, work):
    raw = os.path.join(work, "optimum")
    if os.path.exists(raw):
        shutil.rmtree(raw)
    cli = os.path.join(os.path.dirname(sys.executable), "optimum-cli")
    run([cli, "export", "onnx", "--model", hf_dir, "--task", "text-generation-with-past", raw])
    names = os.listdir(raw)
    if "model.onnx" not in names:
        raise SystemExit(f"optimum wrote no model.onnx: {sorted(names)}")
    keep_runtime_files(raw, os.path.join(HERE, "optimum"))


# ---------------------------------------------------------------------------------------------
# Sanity checks
# ---------------------------------------------------------------------------------------------

ONNX_TYPES = {1: "float32", 6: "int32", 7: "int64", 10: "float16", 16: "bfloat16"}


def describe(package):
    import onnx

    model = onnx.load(os.path.join(package, "model.onnx"), load_external_data=False)

    def dims(t):
        return [d.dim_param or d.dim_value for d in t.type.tensor_type.shape.dim]

    print(f"  opsets: {[(o.domain or 'ai.onnx', o.version) for o in model.opset_import]}")
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            print(f"  {kind:6} {v.name}: {ONNX_TYPES.get(v.type.tensor_type.elem_type, v.type.tensor_type.elem_type)} {dims(v)}")
    ops = Counter((n.domain + "." if n.domain else "") + n.op_type for n in model.graph.node)
    print(f"  ops ({sum(ops.values())} nodes): {dict(sorted(ops.items()))}")
    size = sum(os.path.getsize(os.path.join(package, f)) for f in os.listdir(package))
    print(f"  files: {[(f, os.path.getsize(os.path.join(package, f))) for f in sorted(os.listdir(package))]}")
    print(f"  total {size} bytes")


def greedy_ort(package):
    """Prompt, then DECODE_STEPS single-token steps; KV fed back at exactly the grown length."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(os.path.join(package, "model.onnx"), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    past = {}
    for name, meta in inputs.items():
        if name.startswith("past_key_values."):
            _, heads, _, head_size = meta.shape
            # The builder leaves the head size symbolic ('kv_cache_dim'); 64 / 4 heads.
            head_size = head_size if isinstance(head_size, int) else HEAD_SIZE
            past[name] = np.zeros((1, heads, 0, head_size), dtype=np.float32)
    ids, length, out_ids, first = list(PROMPT), 0, [], None
    for _ in range(DECODE_STEPS + 1):
        end = length + len(ids)
        feeds = {"input_ids": np.array([ids], dtype=np.int64), **past}
        if "attention_mask" in inputs:
            feeds["attention_mask"] = np.ones((1, end), dtype=np.int64)
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(length, end, dtype=np.int64)[None, :]
        out = dict(zip(names, session.run(None, feeds)))
        for name in past:
            past[name] = out[name.replace("past_key_values.", "present.")]
        logits = out["logits"][0, -1]
        first = logits if first is None else first
        top2 = np.sort(logits)[-2:]
        nxt = int(np.argmax(logits))
        out_ids.append(nxt)
        print(f"    step {len(out_ids) - 1}: id {nxt} logit {logits[nxt]:.4f} margin {top2[1] - top2[0]:.4f}")
        ids, length = [nxt], end
    return out_ids, first


def int4_float_compute(package, work):
    """A scratch copy of the int4 model with accuracy_level 0 on every MatMulNBits: the same
    4-bit weights, but onnxruntime multiplies in float32 instead of quantizing activations to
    int8 (accuracy_level 4, as the builder writes for CPU, where the CPU supports it)."""
    import onnx

    folder = os.path.join(work, "builder-int4-acc0")
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    model = onnx.load(os.path.join(package, "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
    onnx.save(model, os.path.join(folder, "model.onnx"))
    shutil.copy(os.path.join(package, "model.onnx.data"), os.path.join(folder, "model.onnx.data"))
    return folder


def greedy_genai(package):
    import onnxruntime_genai as og

    model = og.Model(package)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + DECODE_STEPS + 1, min_length=0)
    generator = og.Generator(model, params)
    generator.append_tokens(PROMPT)
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/oxgen-thirdparty", help="scratch folder (HF checkpoint, raw tool outputs, caches)")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)

    import importlib.metadata as md

    for pkg in ("torch", "transformers", "tokenizers", "safetensors", "onnxruntime-genai", "onnxruntime",
                "onnx", "onnx-ir", "onnxscript", "optimum", "optimum-onnx", "numpy"):
        print(f"{pkg} {md.version(pkg)}")
    print(f"python {sys.version.split()[0]}")

    tok_dir = os.path.join(HERE, "tokenizer")
    write_tokenizer(tok_dir)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert len(tok) == VOCAB_SIZE, len(tok)
    print(f"tokenizer: prompt {PROMPT} decodes to {tok.decode(PROMPT)!r}; 'the cat' -> {tok.encode('the cat')}")

    hf_dir = os.path.join(args.work, "hf")
    reference, reference_logits = make_hf(hf_dir, tok_dir)
    print(f"transformers greedy ids: {reference}")

    make_builder(hf_dir, args.work, "int4")
    make_builder(hf_dir, args.work, "fp32")
    make_optimum(hf_dir, args.work)

    results = {"transformers": reference}
    total = 0
    for name in ("builder-int4", "builder-fp32", "optimum"):
        package = os.path.join(HERE, name)
        print(f"\n== {name}")
        describe(package)
        print("  onnxruntime greedy:")
        results[name], logits = greedy_ort(package)
        print(f"  prompt logits max |onnxruntime - transformers|: {abs(logits - reference_logits).max():.3g}")
        print(f"  onnxruntime greedy ids: {results[name]}")
        if name.startswith("builder"):
            genai = greedy_genai(package)
            print(f"  onnxruntime-genai greedy ids: {genai}")
            results[name + " (genai)"] = genai
        if name == "builder-int4":
            folder = int4_float_compute(package, args.work)
            print("  onnxruntime greedy with MatMulNBits accuracy_level=0 (float compute on the int4 weights):")
            results[name + " (acc 0)"], acc0 = greedy_ort(folder)
            print(f"  prompt logits max |accuracy_level 4 - accuracy_level 0|: {abs(logits - acc0).max():.3g}")
            print(f"  ids: {results[name + ' (acc 0)']}")
        total += sum(os.path.getsize(os.path.join(package, f)) for f in os.listdir(package))

    print(f"\nprompt ids: {PROMPT}; {DECODE_STEPS + 1} greedy ids (the prompt's next token, then {DECODE_STEPS} decode steps):")
    for name, ids in results.items():
        print(f"  {name:24} {ids}")
    print(f"packages total {total} bytes")


if __name__ == "__main__":
    main()
