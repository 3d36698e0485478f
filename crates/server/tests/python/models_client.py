#!/usr/bin/env python3
"""Exercises `oxgen serve --models DIR` with the official `openai` client: every model is
reached by name through the same client.

Usage: python models_client.py BASE_URL CHAT_MODEL OTHER_CHAT_MODEL EMBED_MODEL
  BASE_URL  e.g. http://127.0.0.1:8123/v1

Checks, in this order (the caller's memory budget test counts on it: CHAT is the least
recently used when EMBED loads), that `models.list` names all three, that a chat completion
runs on CHAT and embeddings on it are a 400, that two concurrent requests for OTHER, not yet
loaded, both succeed with the same reply, that embeddings run on EMBED,
and that an unknown model is a 404 naming the models served. Prints `ok NAME` per check; exits 1 at the first failure.
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import openai

BASE_URL = sys.argv[1].rstrip("/")
CHAT, OTHER, EMBED = sys.argv[2], sys.argv[3], sys.argv[4]
client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0, timeout=120)


def check(name, ok, detail=""):
    if not ok:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok {name}")


def chat(model, text="Say hello."):
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=8,
        temperature=0,
    )
    return reply


ids = {m.id for m in client.models.list().data}
check("models_list", {CHAT, OTHER, EMBED} <= ids, ids)

reply = chat(CHAT)
check("chat_on_the_default_model", reply.model == CHAT and reply.usage.completion_tokens > 0, reply)

try:
    client.embeddings.create(model=CHAT, input="text")
    check("embeddings_on_a_language_model_is_400", False, "no error")
except openai.BadRequestError as e:
    check("embeddings_on_a_language_model_is_400", "language model" in str(e), e)

# Two requests at once for a model nobody has asked for yet: both answered (the caller checks
# that it loaded once).
with ThreadPoolExecutor(2) as pool:
    replies = list(pool.map(lambda _: chat(OTHER), range(2)))
check(
    "concurrent_requests_for_an_unloaded_model",
    all(r.model == OTHER and r.choices[0].message.content is not None for r in replies),
    replies,
)
check(
    "greedy_replies_agree",
    replies[0].choices[0].message.content == replies[1].choices[0].message.content,
    [r.choices[0].message.content for r in replies],
)

vectors = client.embeddings.create(model=EMBED, input=["a cat", "a dog"])
check(
    "embeddings_on_the_encoder",
    len(vectors.data) == 2 and len(vectors.data[0].embedding) == 384,
    vectors,
)

try:
    chat("no-such-model")
    check("unknown_model_is_404", False, "no error")
except openai.NotFoundError as e:
    body = e.response.json()["error"]
    check(
        "unknown_model_is_404",
        body["code"] == "model_not_found" and CHAT in body["message"],
        body,
    )
