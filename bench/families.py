"""Decode tok/s of the tiny family packages (crates/testkit/thirdparty/families/*-fp32), native
against ONNX Runtime (oxgen's ort backend) in the same run, interleaved, 3 rounds; prints a
Markdown table of the medians. Run from the repository root after
`cargo build --release -p oxgen-cli`, with the onnxruntime wheel in .cache/venv (scripts/test.sh
makes it). Hidden-64 models: this measures per-token overhead, not bandwidth."""
import json, subprocess, statistics, sys, os
fams = ["phi3-longrope","phi4-mini","gemma2","gemma3","llama3","mistral","qwen2","qwen3","granite","olmo","nemotron","ernie4_5","smollm3"]
# The venv's onnxruntime, relative to the repository root this runs from.
env = dict(os.environ, PATH=os.path.abspath(".cache/venv/bin") + ":" + os.environ["PATH"])
res = {}
for rnd in range(3):
    for f in fams:
        for be in ["native", "ort"]:
            out = subprocess.run(["target/release/oxgen","bench",f"crates/testkit/thirdparty/families/{f}-fp32","--backend",be,"--threads","2","--prompt-len","32","--gen-len","64","--runs","3","--json"],capture_output=True,text=True,env=env)
            try:
                d = json.loads(out.stdout)
            except Exception:
                print(f, be, out.stderr[-300:]); continue
            res.setdefault((f,be),[]).append(d["decode_tok_s"]["median"])
print("| package (fp32) | native tok/s | onnxruntime tok/s | ratio |")
print("|---|---|---|---|")
for f in fams:
    n = statistics.median(res[(f,"native")]); o = statistics.median(res[(f,"ort")])
    print(f"| {f} | {n:,.0f} | {o:,.0f} | {n/o:.2f}x |")
