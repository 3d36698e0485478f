"""The oxgen Python package against the real default model.

Run by scripts/test.sh with OXGEN_DEFAULT_MODEL set (the imported SmolLM2-135M-Instruct),
OXGEN_EMBED_MODEL (the imported all-MiniLM-L6-v2) and
the wheel installed into its own venv, as `pytest crates/python/tests`.
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import oxgen

MODEL = os.environ["OXGEN_DEFAULT_MODEL"]
PROMPT = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def model():
    return oxgen.Model(MODEL, threads=2)


def cli_ids(prompt_text, n):
    """Greedy ids from the `oxgen` command the wheel installed, for the same raw prompt."""
    out = subprocess.run(
        [oxgen.cli(), "generate", MODEL, prompt_text, "--raw", "--max-new-tokens", str(n),
         "--temperature", "0", "--threads", "2", "--json"],
        check=True, stdout=subprocess.PIPE, text=True,
    )
    return json.loads(out.stdout)["token_ids"]


def test_generate_and_stream_give_the_cli_ids(model):
    text = "The capital of France is"
    want = cli_ids(text, 12)
    got = model.generate(text, max_new_tokens=12, temperature=0)
    assert got.token_ids == want
    assert got.finish_reason in ("stop", "length")
    assert got.usage["completion_tokens"] == len(want)
    assert got.text == model.tokenizer.decode(want)
    streamed = list(model.stream(text, max_new_tokens=12, temperature=0))
    assert [t.id for t in streamed] == want
    assert "".join(t.text for t in streamed) == got.text


def test_chat_messages_and_the_template(model):
    rendered = model.apply_chat_template(PROMPT)
    assert rendered.endswith("<|im_start|>assistant\n"), rendered
    by_messages = model.generate(PROMPT, max_new_tokens=8, temperature=0)
    by_text = model.generate(rendered, max_new_tokens=8, temperature=0)
    assert by_messages.token_ids == by_text.token_ids
    ids = model.tokenizer.encode(rendered)
    assert model.generate(ids, max_new_tokens=8, temperature=0).token_ids == by_text.token_ids


def test_template_keywords_reach_the_template():
    # Qwen3's template (the committed fixture), on the default model's weights: an empty
    # thought block opens the reply when thinking is off, by keyword or by the model's default.
    qwen3 = os.path.join(os.path.dirname(__file__), "..", "..", "testkit", "thirdparty",
                         "chat_templates", "templates", "qwen3.jinja")
    empty = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    m = oxgen.Model(MODEL, threads=2, chat_template=qwen3)
    assert m.apply_chat_template(PROMPT).endswith("<|im_start|>assistant\n")
    assert m.apply_chat_template(PROMPT, enable_thinking=False).endswith(empty)
    m = oxgen.Model(MODEL, threads=2, chat_template=qwen3,
                    chat_template_kwargs={"enable_thinking": False})
    assert m.apply_chat_template(PROMPT).endswith(empty)
    assert m.apply_chat_template(PROMPT, enable_thinking=True).endswith("assistant\n")
    with pytest.raises(oxgen.InvalidArgument, match="may not set 'documents'"):
        m.apply_chat_template(PROMPT, documents=[])


def test_chat_reuses_the_kv_of_earlier_turns(model):
    chat = model.chat("You are terse.")
    first = chat.send("Name a color.", max_new_tokens=8, temperature=0)
    second = chat.send("Another one.", max_new_tokens=8, temperature=0)
    assert first.text and second.text
    assert second.usage["prefix_reused"] > 0, second.usage
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "user", "assistant"]


def test_a_prompt_comes_back_from_the_disk_cache_in_another_model(tmp_path):
    prompt = [{"role": "user", "content": "Tell me about rivers and seas. " * 12}]
    first = oxgen.Model(MODEL, threads=2, kv_disk_cache=tmp_path, kv_disk_budget_mib=64)
    cold = first.generate(prompt, max_new_tokens=8, temperature=0)
    del first
    again = oxgen.Model(MODEL, threads=2, kv_disk_cache=str(tmp_path))
    warm = again.generate(prompt, max_new_tokens=8, temperature=0)
    assert warm.text == cold.text
    assert warm.usage["prefix_reused"] >= 64, warm.usage


LORA = os.path.join(os.path.dirname(__file__), "../../testkit/thirdparty/lora")


def test_lora_adapters_give_onnxruntime_genai_ids_alone_and_batched():
    oracle = json.load(open(os.path.join(LORA, "lora.json")))
    package = os.path.join(LORA, "llama3-lora-fp32")
    model = oxgen.Model(package, threads=2, max_loras=2,
                        lora={"a": os.path.join(LORA, "a.onnx_adapter")})
    info = model.load_adapter("b", os.path.join(LORA, "b-peft"))
    assert info["rank"] == 8 and [a["name"] for a in model.adapters()] == ["a", "b"]
    want = oracle["genai"]["fp32"]
    n = oracle["new_tokens"]
    for adapter in ["a", "b", None]:
        out = model.generate(oracle["prompt"], adapter=adapter, max_new_tokens=n,
                             temperature=0, ignore_eos=True)
        assert out.token_ids == want[adapter or "base"], adapter
    with pytest.raises(oxgen.InvalidArgument, match="no LoRA adapter named 'c'"):
        model.generate(oracle["prompt"], adapter="c", max_new_tokens=2)
    model.unload_adapter("b")
    assert [a["name"] for a in model.adapters()] == ["a"]


def test_the_batch_gives_each_prompts_own_ids(model):
    prompts = ["The capital of France is", "1, 2, 3,", [{"role": "user", "content": "Hi!"}]]
    alone = [model.generate(p, max_new_tokens=10, temperature=0).token_ids for p in prompts]
    batch = model.generate_batch(prompts, max_new_tokens=10, temperature=0)
    assert [c.token_ids for c in batch] == alone


def test_logits_are_a_numpy_array_whose_argmax_is_greedy(model):
    ids = model.tokenizer.encode("The capital of France is")
    logits = model.logits(ids)
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    assert logits.shape[0] == len(ids) and logits.shape[1] >= model.tokenizer.vocab_size
    first = model.generate(ids, max_new_tokens=1, temperature=0).token_ids[0]
    assert int(logits[-1].argmax()) == first


def test_structured_output(model):
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    out = model.generate(PROMPT, json_schema=schema, max_new_tokens=40, temperature=0)
    assert json.loads(out.text)["color"] in ("red", "blue"), out.text
    assert model.generate(PROMPT, choice=["yes", "no"], max_new_tokens=4).text in ("yes", "no")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


def test_a_required_tool_call_is_parsed_into_the_result(model):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    out = model.generate(ask, tools=[WEATHER], tool_choice="required", max_new_tokens=60,
                         temperature=0)
    assert len(out.tool_calls) >= 1, out.text
    call = out.tool_calls[0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    # Closed by default, as the server closes tools' parameters: only `city`.
    assert set(call["function"]["arguments"]) == {"city"}, call
    assert isinstance(call["function"]["arguments"]["city"], str)
    assert "<tool_call>" in out.text and "<tool_call>" not in out.content
    # A named function is the one called; without tools nothing is parsed out.
    named = model.generate(ask, tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}, max_new_tokens=60)
    assert [c["function"]["name"] for c in named.tool_calls] == ["get_weather"]
    plain = model.generate(ask, max_new_tokens=8, temperature=0)
    assert plain.tool_calls == [] and plain.content == plain.text and plain.reasoning is None
    # The batch takes tools too, and parses each reply.
    batch = model.generate_batch([ask, ask], tools=[WEATHER], tool_choice="required",
                                 max_new_tokens=60, temperature=0)
    called = [(c["function"]["name"], c["function"]["arguments"]) for c in out.tool_calls]
    for r in batch:
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in r.tool_calls] \
            == called
    with pytest.raises(oxgen.InvalidArgument, match="tool_choice"):
        model.generate(ask, tools=[WEATHER], tool_choice="sometimes")
    with pytest.raises(oxgen.InvalidArgument, match=r"tools\[0\]\.type"):
        model.generate(ask, tools=[{"type": "retrieval"}])


def test_the_batch_runs_more_prompts_than_its_slots(model):
    # max_batch 2: the engine runs two at a time and admits the rest as they finish.
    m = oxgen.Model(MODEL, threads=2, max_batch=2)
    prompts = ["The capital of France is", "1, 2, 3,", "Red, green,", "Once upon a time"]
    alone = [m.generate(p, max_new_tokens=6, temperature=0).token_ids for p in prompts]
    assert [c.token_ids for c in m.generate_batch(prompts, max_new_tokens=6, temperature=0)] \
        == alone


def test_cancel_from_another_thread(model):
    timer = threading.Timer(0.3, model.cancel)
    timer.start()
    started = time.monotonic()
    out = model.generate("Tell me a long story.", max_new_tokens=4000, ignore_eos=True,
                         temperature=0)
    timer.join()
    assert out.finish_reason == "cancelled", out
    assert time.monotonic() - started < 20
    assert 0 < out.usage["completion_tokens"] < 4000
    # The model still works.
    assert model.generate("Hi", max_new_tokens=2, temperature=0).token_ids


def test_bad_arguments_raise_oxgen_errors(model):
    with pytest.raises(oxgen.InvalidArgument, match="temperature"):
        model.generate("Hi", temperature=-1)
    with pytest.raises(oxgen.InvalidArgument, match="frobnicate"):
        model.generate("Hi", frobnicate=1)
    with pytest.raises(oxgen.InvalidArgument):
        model.generate("Hi", regex="[")
    with pytest.raises(oxgen.InvalidArgument, match="one constraint"):
        model.generate("Hi", regex="a", choice=["b"])
    with pytest.raises(oxgen.InvalidArgument):
        model.generate([{"role": "user"}])
    with pytest.raises(oxgen.InvalidArgument):
        model.generate(3.5)
    with pytest.raises(oxgen.ModelLoadError, match="no-such-folder"):
        oxgen.Model("/no-such-folder")
    with pytest.raises(oxgen.InvalidArgument, match="backend"):
        oxgen.Model(MODEL, backend="gpu")
    assert issubclass(oxgen.InvalidArgument, oxgen.Error)


def test_a_dropped_stream_frees_its_sequence(model):
    stream = model.stream("Count to a hundred:", max_new_tokens=50, temperature=0)
    next(stream)
    del stream
    # The model goes on generating after a stream was abandoned mid-way.
    assert model.generate("Hi", max_new_tokens=3, temperature=0).token_ids


def test_ctrl_c_cancels_a_generation():
    """A KeyboardInterrupt reaches Python promptly and the process goes on."""
    code = (
        "import os, signal, threading, oxgen\n"
        # A shell's background job starts with SIGINT ignored, and Python then installs no
        # handler of its own: put Python's back, as an interactive session has it.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"m = oxgen.Model({MODEL!r}, threads=2)\n"
        "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    m.generate('Tell me a long story.', max_new_tokens=4000, ignore_eos=True)\n"
        "    print('not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', m.generate('Hi', max_new_tokens=2).finish_reason)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         timeout=120)
    assert out.stdout.strip() in ("interrupted stop", "interrupted length"), out.stdout


def test_the_wheel_installs_the_oxgen_command():
    out = subprocess.run([oxgen.cli(), "--help"], stdout=subprocess.PIPE, text=True, check=True)
    assert "serve" in out.stdout


def test_speculative_decoding_keeps_the_text(model):
    prompt = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}]
    plain = model.generate(prompt, max_new_tokens=24, temperature=0)
    fast = oxgen.Model(MODEL, threads=2, speculative="prompt-lookup", spec_tokens=4)
    got = fast.generate(prompt, max_new_tokens=24, temperature=0)
    assert got.token_ids == plain.token_ids
    assert got.usage["spec_proposed"] >= got.usage["spec_accepted"] > 0
    streamed = list(fast.stream(prompt, max_new_tokens=24, temperature=0))
    assert [t.id for t in streamed] == plain.token_ids
    batch = fast.generate_batch([prompt, "1, 2, 3, 4,"], max_new_tokens=12, temperature=0)
    assert batch[0].token_ids == plain.token_ids[: len(batch[0].token_ids)]
    with pytest.raises(oxgen.InvalidArgument, match="prompt-lookup"):
        oxgen.Model(MODEL, speculative="lookahead")
    with pytest.raises(oxgen.InvalidArgument, match="spec_tokens"):
        oxgen.Model(MODEL, speculative="prompt-lookup", spec_tokens=0)


def test_an_int8_kv_cache_matches_the_cli(model):
    assert model.kv_dtype == "f32"
    small = oxgen.Model(MODEL, threads=2, kv_dtype="int8")
    assert small.kv_dtype == "int8"
    text = "The capital of France is"
    want = subprocess.run(
        [oxgen.cli(), "generate", MODEL, text, "--raw", "--max-new-tokens", "12",
         "--temperature", "0", "--threads", "2", "--kv-dtype", "int8", "--json"],
        check=True, stdout=subprocess.PIPE, text=True,
    )
    assert small.generate(text, max_new_tokens=12, temperature=0).token_ids == \
        json.loads(want.stdout)["token_ids"]
    with pytest.raises(oxgen.InvalidArgument, match="f32, f16, bf16 or int8"):
        oxgen.Model(MODEL, kv_dtype="q4")


EMBED_MODEL = os.environ["OXGEN_EMBED_MODEL"]
REFERENCE = os.path.join(
    os.path.dirname(__file__), "../../testkit/thirdparty/embeddings/minilm_reference.json"
)


def test_an_encoder_package_opens_as_an_embedder_giving_sentence_transformers_vectors():
    import base64

    embedder = oxgen.Model(EMBED_MODEL, threads=2)
    assert isinstance(embedder, oxgen.Embedder)
    assert (embedder.kind, embedder.dim, embedder.max_tokens) == ("embedding", 384, 256)
    with open(REFERENCE) as f:
        ref = json.load(f)
    want = np.frombuffer(base64.b64decode(ref["embeddings_f32_base64"]), dtype="<f4")
    want = want.reshape(-1, 384)[:20]
    got = embedder.embed(ref["sentences"][:20])
    assert got.shape == (20, 384) and got.dtype == np.float32
    cosines = (got * want).sum(1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.9999, cosines.min()
    # The same bits as the command's, and alone as in the batch.
    out = subprocess.run(
        [oxgen.cli(), "embed", EMBED_MODEL, ref["sentences"][3], "--threads", "2"],
        check=True, stdout=subprocess.PIPE, text=True,
    )
    assert np.array_equal(np.array(json.loads(out.stdout)["embedding"], dtype=np.float32), got[3])
    assert np.array_equal(embedder.embed(ref["sentences"][3])[0], got[3])


def test_rerank_and_embedder_errors():
    embedder = oxgen.Embedder(EMBED_MODEL, threads=2)
    docs = ["I like pizza.", "Berlin has 3.5 million inhabitants.", "Paris is in France."]
    assert embedder.tokenize("A man is eating food.") == [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]
    scores = embedder.rerank("How many people live in Berlin?", docs)
    assert len(scores) == 3 and int(np.argmax(scores)) == 1
    with pytest.raises(oxgen.InvalidArgument, match="more than the model's 256"):
        embedder.embed(["fine", "word " * 400])
    assert embedder.embed("word " * 400, truncate=True).shape == (1, 384)
    with pytest.raises(oxgen.InvalidArgument, match="empty"):
        embedder.embed([])
    with pytest.raises(oxgen.InvalidArgument, match="outside the vocabulary"):
        embedder.embed([[101, 10**6, 102]])
    with pytest.raises(oxgen.InvalidArgument, match="pooling"):
        oxgen.Embedder(EMBED_MODEL, pooling="median")


def test_a_decoder_package_embeds_from_its_final_hidden_states():
    embedder = oxgen.Embedder(MODEL, threads=2)
    assert (embedder.kind, embedder.dim) == ("embedding", 576)
    texts = ["A man is eating food.", "A dog runs in the park.", "A man eats."]
    got = embedder.embed(texts)
    assert got.shape == (3, 576)
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    # The command's bits (last-token pooled), and mean pooling when asked.
    out = subprocess.run(
        [oxgen.cli(), "embed", MODEL, texts[1], "--threads", "2"],
        check=True, stdout=subprocess.PIPE, text=True,
    )
    assert np.array_equal(np.array(json.loads(out.stdout)["embedding"], dtype=np.float32), got[1])
    mean = oxgen.Embedder(MODEL, threads=2, pooling="mean").embed(texts)
    assert not np.allclose(mean, got)
