#!/usr/bin/env python3
"""Exercises `oxgen serve`'s other protocols with their official clients: the `openai` SDK's
Responses API, the `anthropic` SDK's Messages API and the `ollama` Python client, as their
users call them (no hand-written JSON).

Usage: python protocols.py SERVER_URL MODEL_ID
  SERVER_URL  e.g. http://127.0.0.1:8123 (no /v1)
  MODEL_ID    the id the server serves

Prints `ok NAME` per check passed; exits 0 when all pass, otherwise prints
`FAILED NAME: reason` and exits 1.
"""

import json
import sys

from checks import run
from pydantic import BaseModel, Field

if len(sys.argv) != 3:
    sys.exit(__doc__)

SERVER = sys.argv[1].rstrip("/")
MODEL = sys.argv[2]
FACT = "Tell me a short fact about the moon."
QUESTION = "What is the weather like in Paris today?"
# Closed and bounded, so the small model's arguments end well within the token limit.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}


class Fact(BaseModel):
    """A fact about a topic."""

    topic: str = Field(max_length=16)
    true: bool


def check_responses():
    import openai

    client = openai.OpenAI(base_url=f"{SERVER}/v1", api_key="unused", max_retries=0, timeout=120)
    r = client.responses.create(model=MODEL, input=FACT, max_output_tokens=24, temperature=0)
    assert r.output_text, f"{r!r}"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"{r.usage!r}"

    # Streamed, accumulated by the SDK: the same text (greedy).
    with client.responses.stream(
        model=MODEL, input=FACT, max_output_tokens=24, temperature=0
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "response.output_text.delta" in kinds, kinds
    assert final.output_text == r.output_text, (final.output_text, r.output_text)

    # Structured: the SDK's parse() sends a strict json_schema and parses the reply.
    parsed = client.responses.parse(
        model=MODEL,
        input="Give me a fact about cats.",
        text_format=Fact,
        max_output_tokens=96,
        temperature=0,
    )
    assert isinstance(parsed.output_parsed, Fact), f"{parsed!r}"

    # A required function call, its output, then the answer.
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": WEATHER_SCHEMA,
            "strict": True,
        }
    ]
    asked = [{"role": "user", "content": QUESTION}]
    r = client.responses.create(
        model=MODEL,
        input=asked,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=96,
    )
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather", f"{r.output!r}"
    assert isinstance(json.loads(calls[0].arguments)["city"], str), f"{calls[0]!r}"
    answer = client.responses.create(
        model=MODEL,
        input=asked
        + list(r.output)
        + [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
        tools=tools,
        tool_choice="none",
        max_output_tokens=24,
    )
    assert answer.output_text, f"{answer!r}"

    # Stored, continued by id (its prefix served from the cache), fetched, deleted.
    first = client.responses.create(
        model=MODEL, input="My name is Ada. Say hello.", max_output_tokens=16, temperature=0
    )
    second = client.responses.create(
        model=MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=16,
        temperature=0,
    )
    assert second.usage.input_tokens > first.usage.input_tokens, (first.usage, second.usage)
    assert second.usage.input_tokens_details.cached_tokens > 0, f"{second.usage!r}"
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
        raise AssertionError("a deleted response was found")
    except openai.NotFoundError:
        pass


def check_anthropic():
    import anthropic

    client = anthropic.Anthropic(base_url=SERVER, api_key="unused", max_retries=0, timeout=120)
    greedy = {"temperature": 0}
    asked = [{"role": "user", "content": FACT}]
    m = client.messages.create(model=MODEL, max_tokens=24, messages=asked, extra_body=greedy)
    assert m.content and m.content[0].type == "text" and m.content[0].text, f"{m!r}"
    assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason

    with client.messages.stream(
        model=MODEL, max_tokens=24, messages=asked, extra_body=greedy
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == m.content[0].text, (final.content, m.content)
    assert final.stop_reason == m.stop_reason

    counted = client.messages.count_tokens(model=MODEL, messages=asked)
    used = (
        m.usage.input_tokens
        + (m.usage.cache_read_input_tokens or 0)
        + (m.usage.cache_creation_input_tokens or 0)
    )
    assert counted.input_tokens == used, (counted, m.usage)

    # tool_use then tool_result, with the call required (tool_choice any).
    tools = [
        {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "input_schema": WEATHER_SCHEMA,
        }
    ]
    weather = [{"role": "user", "content": QUESTION}]
    m = client.messages.create(
        model=MODEL,
        max_tokens=96,
        messages=weather,
        tools=tools,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses, f"{m!r}"
    assert uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str), uses
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}
    answer = client.messages.create(
        model=MODEL,
        max_tokens=24,
        tools=tools,
        messages=weather
        + [{"role": "assistant", "content": m.content}, {"role": "user", "content": [result]}],
    )
    assert answer.content and answer.content[0].type == "text", f"{answer!r}"

    # Errors are the SDK's exception types.
    for bad, kind in [
        (dict(model="claude-nonexistent"), anthropic.NotFoundError),
        (dict(model=MODEL, tools=tools, tool_choice={"type": "tool", "name": "nope"}),
         anthropic.BadRequestError),
    ]:
        try:
            client.messages.create(max_tokens=8, messages=asked, **bad)
            raise AssertionError(f"{bad} was accepted")
        except kind:
            pass


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: The city.
    """
    return f"sunny in {city}"


def check_ollama():
    import ollama

    client = ollama.Client(host=SERVER, timeout=120)
    options = {"temperature": 0, "num_predict": 24}
    asked = [{"role": "user", "content": FACT}]
    r = client.chat(model=MODEL, messages=asked, options=options)
    assert r.message.content and r.done, f"{r!r}"
    assert r.eval_count > 0 and r.prompt_eval_count > 0 and r.total_duration > 0, f"{r!r}"
    parts = list(client.chat(model=MODEL, messages=asked, options=options, stream=True))
    assert "".join(p.message.content for p in parts) == r.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])

    g = client.generate(model=MODEL, prompt=FACT, options=options)
    assert g.response == r.message.content, (g.response, r.message.content)

    assert [m.model for m in client.list().models] == [MODEL]
    shown = client.show(MODEL)
    assert "completion" in shown.capabilities and shown.template, f"{shown!r}"
    assert client.ps().models[0].model == MODEL

    # A schema as `format`.
    f = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a fact about cats."}],
        format=Fact.model_json_schema(),
        options={"temperature": 0, "num_predict": 96},
    )
    Fact.model_validate_json(f.message.content)

    # A tool call, its arguments an object the client validates. Ollama has no tool_choice
    # (the model decides), so the conversation shows three earlier rounds of calls, as an
    # agent's history would: the small model's greedy reply is then a call.
    history = []
    for city, weather in [("Rome", "sunny"), ("Oslo", "rainy"), ("Lima", "cloudy")]:
        history += [
            {"role": "user", "content": f"What is the weather like in {city} today?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}],
            },
            {"role": "tool", "content": f"{weather} in {city}", "tool_name": "get_weather"},
            {"role": "assistant", "content": f"It is {weather} in {city}."},
        ]
    history.append({"role": "user", "content": QUESTION})
    t = client.chat(
        model=MODEL,
        messages=history,
        tools=[get_weather],
        options={"temperature": 0, "num_predict": 64},
    )
    calls = t.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather", f"{t!r}"
    assert isinstance(calls[0].function.arguments["city"], str), f"{calls[0]!r}"
    reply = client.chat(
        model=MODEL,
        messages=history
        + [t.message, {"role": "tool", "content": "sunny", "tool_name": "get_weather"}],
        options=options,
    )
    assert reply.message.content, f"{reply!r}"

    try:
        client.chat(model="llama3:latest", messages=asked)
        raise AssertionError("an unknown model was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 404, e


CHECKS = [
    ("responses", check_responses),
    ("anthropic", check_anthropic),
    ("ollama", check_ollama),
]


if __name__ == "__main__":
    run(CHECKS)
