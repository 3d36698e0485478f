#!/usr/bin/env python3
"""Exercises `oxgen serve` with the official `openai` Python client.

Usage: python openai_client.py BASE_URL MODEL_ID [API_KEY]
  BASE_URL  e.g. http://127.0.0.1:8123/v1
  MODEL_ID  the id the server serves, e.g. SmolLM2-135M-Instruct
  API_KEY   the server's --api-key, if it was started with one

Prints `ok NAME` per check passed; exits 0 when all pass, otherwise prints
`FAILED NAME: reason` and exits 1.
"""

import json
import os
import sys
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import jsonschema
import openai
from pydantic import BaseModel, Field

if len(sys.argv) not in (3, 4):
    sys.exit(__doc__)

BASE_URL = sys.argv[1].rstrip("/")
MODEL = sys.argv[2]
API_KEY = sys.argv[3] if len(sys.argv) == 4 else None
ROOT = BASE_URL[: -len("/v1")] if BASE_URL.endswith("/v1") else BASE_URL

client = openai.OpenAI(
    base_url=BASE_URL, api_key=API_KEY or "unused", max_retries=0, timeout=60
)

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me a short fact about the moon."},
]


def http(path, body=None):
    """GET (or POST `body` as JSON) ROOT + path; returns (status, parsed JSON)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(ROOT + path, data=data)
    req.add_header("Content-Type", "application/json")
    if API_KEY:
        req.add_header("Authorization", f"Bearer {API_KEY}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_ready(seconds=120):
    deadline = time.monotonic() + seconds
    while True:
        try:
            status, _ = http("/health")
            if status == 200:
                return
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{ROOT}/health did not answer 200 within {seconds} s")
        time.sleep(0.2)


def chat(**kw):
    args = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 16}
    args.update(kw)
    return client.chat.completions.create(**args)


def expect_error(cls, status, **kw):
    """Runs chat(**kw), which must raise `cls` with `status`; returns the exception."""
    try:
        r = chat(**kw)
    except cls as e:
        assert e.status_code == status, f"status {e.status_code}, wanted {status}"
        assert isinstance(e.body, dict), f"error body is not an object: {e.body!r}"
        full = e.response.json()
        assert set(full) == {"error"}, f"error envelope: {full}"
        for key in ("message", "type", "param", "code"):
            assert key in full["error"], f"error has no '{key}': {full}"
        assert full["error"]["message"], f"empty error message: {full}"
        return e
    except openai.APIError as e:
        raise AssertionError(f"wanted {cls.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"wanted {cls.__name__}, but the request succeeded: {r}")


def greedy_content(r):
    c = r.choices[0].message.content
    assert isinstance(c, str) and c, f"content is empty or not a string: {c!r}"
    return c


# --- the checks ---------------------------------------------------------------------------


def check_models():
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids, f"{MODEL!r} not in {ids}"
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL, f"retrieve gave {m.id!r}"


def check_chat():
    r = chat()
    assert r.object == "chat.completion", f"object {r.object!r}"
    assert r.model == MODEL, f"model {r.model!r}"
    assert len(r.choices) == 1, f"{len(r.choices)} choices"
    c = r.choices[0]
    assert c.index == 0, f"index {c.index}"
    assert c.message.role == "assistant", f"role {c.message.role!r}"
    content = greedy_content(r)
    assert c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}"
    u = r.usage
    assert u is not None, "no usage"
    assert u.prompt_tokens > 0, f"prompt_tokens {u.prompt_tokens}"
    assert 1 <= u.completion_tokens <= 16, f"completion_tokens {u.completion_tokens}"
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}"
    if c.finish_reason == "length":
        assert u.completion_tokens == 16, f"finish 'length' after {u.completion_tokens}"
    again = greedy_content(chat())
    assert again == content, f"greedy differs between calls: {content!r} vs {again!r}"


def check_message_forms():
    r = chat(
        messages=[
            {"role": "developer", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
        ],
        max_tokens=8,
    )
    greedy_content(r)
    parts = chat(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Tell me a short "},
                    {"type": "text", "text": "fact about the moon."},
                ],
            },
        ]
    )
    # Text parts are joined, so this is the same prompt as MESSAGES.
    plain = chat()
    assert greedy_content(parts) == greedy_content(plain), "text parts differ from plain strings"
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens, "text parts: prompt_tokens differ"
    # A conversation with an earlier assistant turn.
    r = chat(
        messages=[
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name a fruit."},
        ],
        max_tokens=8,
    )
    greedy_content(r)


def check_stream():
    want = chat(max_tokens=16)
    chunks = list(
        chat(max_tokens=16, stream=True, stream_options={"include_usage": True})
    )
    assert len(chunks) >= 3, f"only {len(chunks)} chunks"
    ids = {ch.id for ch in chunks}
    assert len(ids) == 1, f"chunk ids differ: {ids}"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks), "chunk object"
    first = chunks[0]
    assert first.choices and first.choices[0].delta.role == "assistant", f"first chunk {first}"
    *body, last = chunks
    assert last.choices == [], f"last chunk has choices: {last}"
    assert last.usage is not None, "last chunk has no usage"
    assert last.usage.completion_tokens > 0, f"usage {last.usage}"
    assert last.usage.completion_tokens == want.usage.completion_tokens, (
        f"stream usage {last.usage} vs {want.usage}"
    )
    assert last.usage.prompt_tokens == want.usage.prompt_tokens, "stream prompt_tokens"
    for ch in body:
        assert ch.usage is None, f"usage before the last chunk: {ch}"
        assert len(ch.choices) == 1, f"chunk with {len(ch.choices)} choices"
        assert ch.choices[0].index == 0, "chunk choice index"
    finishes = [ch.choices[0].finish_reason for ch in body if ch.choices[0].finish_reason]
    assert len(finishes) == 1, f"finish reasons {finishes}"
    assert finishes[0] == want.choices[0].finish_reason, (
        f"stream finish {finishes[0]!r} vs {want.choices[0].finish_reason!r}"
    )
    assert body[-1].choices[0].finish_reason is not None, "finish_reason is not on the last choice chunk"
    text = "".join(ch.choices[0].delta.content or "" for ch in body)
    assert text == greedy_content(want), f"stream {text!r} vs non-stream {want.choices[0].message.content!r}"
    # Without stream_options no chunk has usage and none is choice-less.
    plain = list(chat(max_tokens=4, stream=True))
    assert all(ch.usage is None and ch.choices for ch in plain), "usage sent without include_usage"


def check_stop():
    base = greedy_content(chat(max_tokens=24))
    words = base.split()
    assert len(words) >= 4, f"greedy output too short to pick a stop word: {base!r}"
    # A word in the middle whose first occurrence is not at the start.
    stop = next((w for w in words[2:] if base.find(w) > 0), None)
    assert stop is not None, f"no usable stop word in {base!r}"
    cut = base[: base.index(stop)]
    r = chat(max_tokens=24, stop=[stop])
    c = r.choices[0]
    assert c.finish_reason == "stop", f"finish_reason {c.finish_reason!r} with stop={stop!r}"
    assert stop not in (c.message.content or ""), f"stop string {stop!r} in {c.message.content!r}"
    assert c.message.content == cut, f"stop={stop!r}: {c.message.content!r}, wanted {cut!r}"
    # The same stop string given as a plain string, and streamed.
    r = chat(max_tokens=24, stop=stop, stream=True)
    chunks = list(r)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == cut, f"streamed stop={stop!r}: {text!r}, wanted {cut!r}"
    fin = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert fin == ["stop"], f"streamed stop finish reasons {fin}"


def seeded(kw, seeds):
    return [chat(seed=s, **kw).choices[0].message.content for s in seeds]


def distinct_outputs(kw, seeds):
    """The texts for `seeds`, stopping once two differ."""
    outs = set()
    for s in seeds:
        outs.add(chat(seed=s, **kw).choices[0].message.content)
        if len(outs) > 1:
            break
    return outs


def check_seed():
    # Plain OpenAI parameters: temperature 1 must sample, so different seeds must not all
    # give the same text, while one seed always gives the same text.
    kw = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 16}
    a, b = seeded(kw, [1234, 1234])
    assert a == b, f"same seed, different outputs: {a!r} vs {b!r}"
    outs = distinct_outputs(kw, range(1, 7))
    assert len(outs) > 1, (
        f"seeds 1..6 at temperature=1.0, top_p=0.95 all gave {outs} (sampling does not sample)"
    )


def check_seed_top_k():
    # The same with the server's `top_k` extension set to 0 (no top-k cut), which rules out
    # the package's top-k default.
    kw = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 16, "extra_body": {"top_k": 0}}
    a, b = seeded(kw, [1234, 1234])
    assert a == b, f"same seed, different outputs: {a!r} vs {b!r}"
    outs = distinct_outputs(kw, range(1, 7))
    assert len(outs) > 1, f"seeds 1..6 at temperature=1.0, top_k=0 all gave {outs}"


def check_logprobs():
    # This prompt ends with the end-of-sequence token well within 24 tokens, so the EOS
    # entry is covered; the server reports an entry for every generated token, EOS included.
    r = chat(
        messages=[
            {"role": "system", "content": "Answer with a single word."},
            {"role": "user", "content": "Say yes."},
        ],
        max_tokens=24,
        logprobs=True,
        top_logprobs=3,
    )
    c = r.choices[0]
    assert c.logprobs is not None and c.logprobs.content is not None, "no logprobs.content"
    entries = c.logprobs.content
    n = r.usage.completion_tokens
    assert len(entries) == n, f"{len(entries)} logprob entries for {n} completion tokens"
    for i, e in enumerate(entries):
        assert e.logprob <= 0, f"entry {i}: logprob {e.logprob}"
        assert isinstance(e.token, str), f"entry {i}: token {e.token!r}"
        assert e.bytes == list(e.token.encode()), f"entry {i}: bytes {e.bytes} for {e.token!r}"
        top = e.top_logprobs
        assert len(top) == 3, f"entry {i}: {len(top)} top_logprobs"
        lps = [t.logprob for t in top]
        assert lps == sorted(lps, reverse=True), f"entry {i}: top not descending {lps}"
        assert all(lp <= 0 for lp in lps), f"entry {i}: positive top logprob {lps}"
        assert abs(e.logprob - top[0].logprob) <= 1e-6, (
            f"entry {i}: greedy chose {e.token!r} ({e.logprob}) but top is {top[0].token!r} ({top[0].logprob})"
        )
        assert e.token == top[0].token, f"entry {i}: token {e.token!r} vs top {top[0].token!r}"
    content = greedy_content(r)
    if c.finish_reason == "stop":
        # Ended by EOS: its entry is last, and the others spell the content.
        spelled = "".join(e.token for e in entries[:-1])
        if content.isascii():
            assert spelled == content, f"tokens spell {spelled!r}, content {content!r}"
        assert entries[-1].token not in content, f"EOS token {entries[-1].token!r} in content"
    else:
        assert len(entries) == 24, f"finish {c.finish_reason!r} after {len(entries)} tokens"
    # Same text as without logprobs.
    plain = chat(messages=[
        {"role": "system", "content": "Answer with a single word."},
        {"role": "user", "content": "Say yes."},
    ], max_tokens=24)
    assert greedy_content(plain) == content, "logprobs changed the output"
    assert plain.choices[0].logprobs is None, "logprobs returned without being asked for"
    # logprobs without top_logprobs: entries with no alternatives.
    r = chat(max_tokens=4, logprobs=True)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens, "logprobs=True alone: entry count"
    assert all(e.top_logprobs == [] for e in entries), "logprobs=True alone: top_logprobs not empty"


def check_n():
    r = chat(n=2, max_tokens=12)
    assert len(r.choices) == 2, f"{len(r.choices)} choices"
    assert [c.index for c in sorted(r.choices, key=lambda c: c.index)] == [0, 1], "indices"
    a, b = (c.message.content for c in sorted(r.choices, key=lambda c: c.index))
    assert a and a == b, f"greedy n=2 differ: {a!r} vs {b!r}"
    one = chat(max_tokens=12)
    assert a == greedy_content(one), f"n=2 {a!r} vs n=1 {one.choices[0].message.content!r}"
    assert r.usage.completion_tokens == 2 * one.usage.completion_tokens, (
        f"n=2 usage {r.usage.completion_tokens} vs 2 x {one.usage.completion_tokens}"
    )
    assert r.usage.prompt_tokens == one.usage.prompt_tokens, "n=2 prompt_tokens"


def check_completions():
    prompt = "The capital of France is"
    kw = {"model": MODEL, "max_tokens": 8, "temperature": 0}
    r = client.completions.create(prompt=prompt, **kw)
    assert r.object == "text_completion", f"object {r.object!r}"
    assert len(r.choices) == 1, f"{len(r.choices)} choices"
    text = r.choices[0].text
    assert isinstance(text, str) and text, f"text {text!r}"
    assert r.choices[0].finish_reason in ("stop", "length"), f"finish {r.choices[0].finish_reason!r}"
    u = r.usage
    assert u is not None and u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 8, f"usage {u}"
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}"

    chunks = list(client.completions.create(prompt=prompt, stream=True, **kw))
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert streamed == text, f"stream {streamed!r} vs non-stream {text!r}"
    fin = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert fin == [r.choices[0].finish_reason], f"stream finish reasons {fin}"

    status, tok = http("/tokenize", {"prompt": prompt})
    assert status == 200, f"/tokenize answered {status}: {tok}"
    ids = tok["tokens"]
    assert ids and all(isinstance(i, int) for i in ids), f"tokens {ids}"
    assert tok["count"] == len(ids), f"count {tok['count']} for {len(ids)} ids"
    assert tok["max_model_len"] > 0, f"max_model_len {tok['max_model_len']}"
    assert tok["count"] == u.prompt_tokens, f"/tokenize count {tok['count']} vs usage {u.prompt_tokens}"
    by_ids = client.completions.create(prompt=ids, **kw)
    assert by_ids.choices[0].text == text, f"token-id prompt {by_ids.choices[0].text!r} vs {text!r}"
    assert by_ids.usage.prompt_tokens == len(ids), f"token-id prompt usage {by_ids.usage}"


def check_errors():
    e = expect_error(openai.NotFoundError, 404, model="no-such-model")
    assert e.body["code"] == "model_not_found", f"body {e.body}"
    assert e.response.json()["error"]["code"] == "model_not_found", f"{e.response.json()}"
    assert e.code == "model_not_found" and e.param == "model", f"code {e.code!r} param {e.param!r}"

    e = expect_error(openai.BadRequestError, 400, temperature=-1)
    assert e.param == "temperature", f"param {e.param!r}"
    assert e.type == "invalid_request_error", f"type {e.type!r}"

    e = expect_error(openai.BadRequestError, 400, n=1000)
    assert e.param == "n", f"param {e.param!r}"
    e = expect_error(openai.BadRequestError, 400, max_tokens=-5)
    assert e.param == "max_tokens", f"param {e.param!r}"
    e = expect_error(openai.BadRequestError, 400, logprobs=True, top_logprobs=99)
    assert e.param == "top_logprobs", f"param {e.param!r}"

    # A field the server does not implement is ignored and named in a header; one whose
    # meaning would change the answer (audio output) is refused.
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, extra_body={"frobnicate": 1}
    )
    assert raw.headers.get("x-oxgen-ignored-fields") == "frobnicate", f"{raw.headers}"
    greedy_content(raw.parse())
    e = expect_error(openai.BadRequestError, 400, audio={"voice": "alloy", "format": "wav"})
    assert e.param == "audio", f"param {e.param!r}"

    e = expect_error(
        openai.BadRequestError,
        400,
        messages=[
            {"role": "user", "content": "What is the weather?"},
            {"role": "tool", "content": "sunny"},
        ],
    )
    assert "tool_call_id" in e.body["message"], f"message {e.body['message']!r}"
    assert e.param == "messages[1].tool_call_id", f"param {e.param!r}"

    e = expect_error(
        openai.BadRequestError,
        400,
        messages=[{"role": "user", "content": "word " * 9000}],
        max_tokens=1,
    )
    assert e.code == "context_length_exceeded", f"code {e.code!r}: {e.body}"
    assert e.param == "messages", f"param {e.param!r}"

    e = expect_error(openai.BadRequestError, 400, temperature=5, stream=True)
    assert e.param == "temperature", f"param {e.param!r}"

    if API_KEY:
        bad = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY + "-wrong", max_retries=0, timeout=60)
        for call in (
            lambda: bad.models.list(),
            lambda: bad.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4),
        ):
            try:
                call()
            except openai.AuthenticationError as e:
                assert e.status_code == 401, f"status {e.status_code}"
                assert e.code == "invalid_api_key", f"code {e.code!r}"
            else:
                raise AssertionError("a wrong API key was accepted")
        greedy_content(chat(max_tokens=4))  # the good key works

    # The server still answers normally.
    greedy_content(chat(max_tokens=8))


# Nested objects, arrays, enums and integer bounds; strings and arrays bounded so a sampled
# answer ends well within max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "pets": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["cat", "dog", "fish"]},
                    "legs": {"type": "integer", "minimum": 0, "maximum": 4},
                },
                "required": ["kind", "legs"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "age", "mood", "pets"],
    "additionalProperties": False,
}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}


def check_json_schema():
    def one(seed):
        r = chat(messages=ASK_PERSON, temperature=1, seed=seed, max_tokens=300,
                 response_format=PERSON_FORMAT)
        c = r.choices[0]
        assert c.finish_reason == "stop", f"seed {seed}: {c.finish_reason}: {c.message.content!r}"
        jsonschema.validate(json.loads(c.message.content), PERSON)
        return c.message.content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(20)))
    assert len(set(answers)) > 1, f"20 seeds gave one answer: {answers[0]!r}"

    # Cut short by max_tokens: finish_reason length, and what was generated (a prefix).
    r = chat(messages=ASK_PERSON, max_tokens=5, response_format=PERSON_FORMAT)
    c = r.choices[0]
    assert c.finish_reason == "length" and c.message.content.startswith("{"), c
    assert r.usage.completion_tokens == 5, r.usage

    # Streamed, the pieces join into the same kind of document.
    stream = chat(messages=ASK_PERSON, temperature=1, seed=7, max_tokens=300, stream=True,
                  response_format=PERSON_FORMAT)
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    jsonschema.validate(json.loads(text), PERSON)


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    name: str = Field(max_length=10)


class Owner(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    pets: list[Pet] = Field(max_length=2)


def check_parse():
    r = client.chat.completions.parse(
        model=MODEL, messages=ASK_PERSON, temperature=0, max_tokens=300, response_format=Owner
    )
    owner = r.choices[0].message.parsed
    assert isinstance(owner, Owner), f"parsed {owner!r} from {r.choices[0].message.content!r}"


def check_prediction():
    # The reply predicted exactly: its ids are proposed and kept; the text is unchanged.
    want = greedy_content(chat(max_tokens=32))
    r = chat(max_tokens=32, prediction={"type": "content", "content": want})
    assert greedy_content(r) == want, f"{r.choices[0].message.content!r} != {want!r}"
    details = r.usage.completion_tokens_details
    kept = details.accepted_prediction_tokens
    assert kept >= r.usage.completion_tokens // 2, f"{details}"
    assert details.rejected_prediction_tokens == 0, f"{details}"
    assert r.usage.prompt_tokens_details.cached_tokens >= 0, f"{r.usage}"


def check_json_object():
    r = chat(messages=ASK_PERSON, max_tokens=200, response_format={"type": "json_object"})
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict), c.message.content
    else:
        # Cut short by max_tokens: what came is the start of an object.
        assert c.finish_reason == "length" and c.message.content.startswith("{"), c


def check_guided():
    r = chat(extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}})
    assert r.choices[0].message.content in ("red", "green", "blue"), r.choices[0]
    r = chat(extra_body={"guided_regex": "[0-9]{3}-[a-z]{2}"}, max_tokens=20)
    content = r.choices[0].message.content
    assert len(content) == 6 and content[:3].isdigit() and content[3] == "-", content
    r = client.completions.create(model=MODEL, prompt="Colors:", max_tokens=8, temperature=0,
                                  extra_body={"guided_choice": ["red", "green"]})
    assert r.choices[0].text in ("red", "green"), r.choices[0]

    for body, param in [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
         "response_format.json_schema.schema"),
        ({"structured_outputs": {"regex": "["}}, "structured_outputs.regex"),
        ({"guided_grammar": "start: ("}, "guided_grammar"),
        ({"grammar": "root ::= \"a\""}, "grammar"),
        ({"guided_choice": ["a"], "guided_regex": "b"}, "guided_choice"),
    ]:
        e = expect_error(openai.BadRequestError, 400, extra_body=body)
        assert e.param == param, f"{body}: param {e.param!r}: {e.body}"
    greedy_content(chat(max_tokens=4))  # still serving


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "b": {"type": "integer", "minimum": -1000, "maximum": 1000},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def validated_calls(message, finish_reason):
    """The message's calls, each checked against its tool's schema; a call cut short by
    max_tokens (the last, with finish_reason 'length') is left out."""
    calls = list(message.tool_calls or [])
    if finish_reason == "length" and calls:
        calls = calls[:-1]
    for call in calls:
        assert call.type == "function", call
        assert call.id and call.id.startswith("call_"), f"id {call.id!r}"
        assert call.function.name in SCHEMAS, f"unknown function {call.function.name!r}"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return calls


def check_tools_required():
    for seed in range(4):
        r = chat(messages=ASK_WEATHER, tools=TOOLS, tool_choice="required",
                 parallel_tool_calls=False, temperature=1, seed=seed, max_tokens=120)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", f"seed {seed}: {c.finish_reason}: {c.message}"
        calls = validated_calls(c.message, c.finish_reason)
        assert len(calls) == 1, f"seed {seed}: parallel_tool_calls=false gave {c.message.tool_calls}"
        assert not c.message.content, f"content beside a required call: {c.message.content!r}"
    # A named function is the one called.
    r = chat(messages=[{"role": "user", "content": "What is 2 plus 3?"}], tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=120)
    c = r.choices[0]
    calls = validated_calls(c.message, c.finish_reason)
    assert calls and {x.function.name for x in calls} == {"add"}, c.message
    # Several calls where allowed (the default): each one whole validates.
    r = chat(messages=[{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}],
             tools=[WEATHER], tool_choice="required", max_tokens=200)
    c = r.choices[0]
    calls = validated_calls(c.message, c.finish_reason)
    assert len(calls) >= 2, f"one call only: {c.message.tool_calls} ({c.finish_reason})"
    assert len({x.id for x in c.message.tool_calls}) == len(c.message.tool_calls), "ids repeat"


def check_tools_stream():
    kw = dict(messages=ASK_WEATHER, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_tokens=120)
    want = chat(**kw).choices[0]
    # Deltas as OpenAI sends them: index, id and name first, then argument fragments.
    chunks = list(chat(stream=True, **kw))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    parts = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert parts, f"no tool-call deltas in {deltas}"
    first, rest = parts[0], parts[1:]
    assert first.index == 0 and first.id and first.function.name == "get_weather", first
    assert all(p.id is None and p.function.name is None for p in rest), rest
    assert len(rest) > 1, f"the arguments came in {len(rest)} piece(s)"
    arguments = (first.function.arguments or "") + "".join(p.function.arguments for p in rest)
    assert arguments == want.message.tool_calls[0].function.arguments, (arguments, want)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["tool_calls"], finishes
    # The client's stream helper accumulates them into the same message.
    with client.chat.completions.stream(model=MODEL, temperature=0, **kw) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.message.tool_calls[0].function.arguments == arguments, final
    assert final.finish_reason == "tool_calls", final


def check_tools_turns():
    r = chat(messages=ASK_WEATHER, tools=TOOLS, tool_choice="required",
             parallel_tool_calls=False, max_tokens=120)
    call = r.choices[0].message.tool_calls[0]
    history = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    r = chat(messages=history, tools=TOOLS, tool_choice="none", max_tokens=40)
    c = r.choices[0]
    assert not c.message.tool_calls, c.message
    greedy_content(r)
    # The rendered history (calls and results) counts in usage as /tokenize counts it.
    status, counted = http("/tokenize", {"model": MODEL, "messages": history, "tools": TOOLS,
                                         "tool_choice": "none"})
    assert status == 200, counted
    assert counted["count"] == r.usage.prompt_tokens, (counted["count"], r.usage)
    _, bare = http("/tokenize", {"model": MODEL, "messages": history})
    assert bare["count"] < counted["count"], "the tool definitions are not in the count"
    # auto: the model chooses; whatever it chose parses.
    r = chat(messages=ASK_WEATHER, tools=TOOLS, max_tokens=120)
    c = r.choices[0]
    if c.message.tool_calls:
        validated_calls(c.message, c.finish_reason)
        assert c.finish_reason in ("tool_calls", "length"), c
    else:
        assert c.message.content, c


def check_tools_errors():
    bad_params = {"type": "function", "function": {"name": "f", "parameters": [1, 2]}}
    bad_schema = {"type": "function",
                  "function": {"name": "f", "parameters": {"type": "object",
                                                           "properties": {"x": {"type": "nonsense"}}}}}
    for kw, param in [
        ({"tools": [bad_params]}, "tools[0].function.parameters"),
        ({"tools": [WEATHER, bad_schema], "tool_choice": "required"}, "tools[1].function.parameters"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
         "tools[0].function.name"),
    ]:
        e = expect_error(openai.BadRequestError, 400, **kw)
        assert e.param == param, f"{kw}: param {e.param!r}: {e.body}"
    greedy_content(chat(max_tokens=4))  # still serving


CHECKS = [
    ("models", check_models),
    ("chat", check_chat),
    ("message forms", check_message_forms),
    ("stream", check_stream),
    ("stop", check_stop),
    ("seed", check_seed),
    ("seed top_k=0", check_seed_top_k),
    ("logprobs", check_logprobs),
    ("n", check_n),
    ("completions", check_completions),
    ("errors", check_errors),
    ("json_schema", check_json_schema),
    ("parse", check_parse),
    ("prediction", check_prediction),
    ("json_object", check_json_object),
    ("guided", check_guided),
    ("tools required", check_tools_required),
    ("tools stream", check_tools_stream),
    ("tools turns", check_tools_turns),
    ("tools errors", check_tools_errors),
]


def main():
    started = time.monotonic()
    # OXGEN_CHECKS=tools runs only the checks whose name starts with it.
    only = os.environ.get("OXGEN_CHECKS", "")
    checks = [(name, check) for name, check in CHECKS if name.startswith(only)]
    try:
        wait_ready()
    except AssertionError as e:
        print(f"FAILED health: {e}")
        return 1
    failed = []
    for name, check in checks:
        try:
            check()
        except Exception as e:  # noqa: BLE001 - report any failure under the check's name
            traceback.print_exc()
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
            failed.append(name)
            continue
        print(f"ok {name}", flush=True)
    took = time.monotonic() - started
    if failed:
        print(f"{len(failed)} of {len(checks)} checks FAILED ({', '.join(failed)}) in {took:.1f} s")
        return 1
    print(f"all {len(checks)} checks passed in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
