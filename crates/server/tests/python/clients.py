#!/usr/bin/env python3
"""Exercises `oxgen serve` with the client libraries people point at a local server:
LangChain's ChatOpenAI, LlamaIndex's OpenAILike and litellm's `openai/` provider, as their
users call them (no hand-written JSON).

Usage: python clients.py BASE_URL MODEL_ID
  BASE_URL  e.g. http://127.0.0.1:8123/v1
  MODEL_ID  the id the server serves

Runs offline: set LITELLM_LOCAL_MODEL_COST_MAP=True (litellm reads no network at import).
Prints `ok NAME` per check passed; exits 0 when all pass, otherwise prints
`FAILED NAME: reason` and exits 1.
"""

import json
import sys

from checks import run
from pydantic import BaseModel, Field

if len(sys.argv) != 3:
    sys.exit(__doc__)

BASE_URL = sys.argv[1].rstrip("/")
MODEL = sys.argv[2]
QUESTION = "What is the weather like in Paris today?"


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"sunny in {city}"


class Fact(BaseModel):
    """A fact about a topic."""

    topic: str = Field(max_length=16)
    true: bool


def check_langchain():
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=BASE_URL,
        api_key="unused",
        model=MODEL,
        temperature=0,
        max_tokens=24,
        max_retries=0,
        timeout=120,
    )
    # reasoning_effort is a field of its own in LangChain's payload.
    thinking = llm.bind(reasoning_effort="low")
    answer = thinking.invoke("Tell me a short fact about the moon.")
    assert isinstance(answer.content, str) and answer.content, f"{answer!r}"
    # Streaming gives the same text (greedy), chunk by chunk.
    chunks = list(thinking.stream("Tell me a short fact about the moon."))
    assert len(chunks) > 2, f"{len(chunks)} chunks"
    assert "".join(c.content for c in chunks) == answer.content

    weather = tool(get_weather)
    calling = llm.bind_tools([weather], tool_choice="required").bind(max_tokens=96)
    reply = calling.invoke(QUESTION)
    assert reply.tool_calls, f"no tool call: {reply!r}"
    call = reply.tool_calls[0]
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str), call

    structured = llm.bind(max_tokens=96).with_structured_output(Fact)
    fact = structured.invoke("Give me a fact about cats.")
    assert isinstance(fact, Fact), f"{fact!r}"


def check_llamaindex():
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        model=MODEL,
        api_base=BASE_URL,
        api_key="unused",
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=8192,
        max_tokens=96,
        temperature=0,
        max_retries=0,
        timeout=120,
    )
    reply = llm.chat([ChatMessage(role="user", content="Tell me a short fact about the moon.")])
    assert isinstance(reply.message.content, str) and reply.message.content, f"{reply!r}"
    tool = FunctionTool.from_defaults(fn=get_weather)
    response = llm.chat_with_tools([tool], user_msg=QUESTION, tool_required=True)
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert calls[0].tool_name == "get_weather", f"{calls!r}"
    assert isinstance(calls[0].tool_kwargs.get("city"), str), f"{calls!r}"


def check_litellm():
    import litellm

    common = dict(
        model=f"openai/{MODEL}",
        api_base=BASE_URL,
        api_key="unused",
        temperature=0,
        num_retries=0,
        timeout=120,
    )
    r = litellm.completion(
        messages=[{"role": "user", "content": "Tell me a short fact about the moon."}],
        max_tokens=24,
        **common,
    )
    content = r.choices[0].message.content
    assert isinstance(content, str) and content, f"{r!r}"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, f"{r.usage!r}"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city.",
                # Closed and bounded, so the small model's arguments end well within
                # max_tokens.
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 24}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    r = litellm.completion(
        messages=[{"role": "user", "content": QUESTION}],
        tools=tools,
        tool_choice="required",
        max_tokens=96,
        **common,
    )
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather", f"{r!r}"
    assert isinstance(json.loads(call.function.arguments)["city"], str), f"{call!r}"


CHECKS = [
    ("langchain", check_langchain),
    ("llamaindex", check_llamaindex),
    ("litellm", check_litellm),
]


if __name__ == "__main__":
    run(CHECKS)
