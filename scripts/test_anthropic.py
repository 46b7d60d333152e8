#!/usr/bin/env python3
"""The official `anthropic` Python client against a running `folio serve`'s Messages API.

Usage: python scripts/test_anthropic.py http://127.0.0.1:PORT

Prints one line per check; the first failed check raises (exit status 1).
crates/folio-cli/tests/openai_client.rs runs it against a fresh server.
"""

import sys
import time

import anthropic

if len(sys.argv) != 2:
    sys.exit("usage: test_anthropic.py BASE_URL (e.g. http://127.0.0.1:8080)")

client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
START = time.monotonic()
# Greedy, so whole and streamed answers can be compared. The SDK's 2.x `create` has no
# sampling arguments of its own; folio reads `temperature` from the body.
GREEDY = {"extra_body": {"temperature": 0}}


def ok(what):
    print(f"ok  {time.monotonic() - START:6.2f}s  {what}", flush=True)


def texts(message):
    return "".join(b.text for b in message.content if b.type == "text")


ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]

# A whole message.
m = client.messages.create(model="folio", max_tokens=24, messages=ASK, **GREEDY)
assert m.type == "message" and m.role == "assistant", m
assert m.id.startswith("msg_"), m.id
assert m.content and m.content[0].type == "text" and m.content[0].text, m.content
assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 24, m.usage
ok(f"messages.create: {m.stop_reason}, {m.usage.output_tokens} tokens: {texts(m)!r}")

# Streamed, greedy: the same text as the whole message, event by event.
with client.messages.stream(model="folio", max_tokens=24, messages=ASK, **GREEDY) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
assert streamed == texts(m), (streamed, texts(m))
assert texts(final) == streamed and final.stop_reason == m.stop_reason, final
assert final.usage.output_tokens == m.usage.output_tokens, final.usage
ok("messages.stream: the whole message's text and stop reason, delta by delta")

# A system prompt and a stop sequence that the answer is sure to reach.
m = client.messages.create(
    model="folio",
    max_tokens=64,
    system="You answer in full sentences.",
    messages=[{"role": "user", "content": "Describe the sea."}],
    stop_sequences=[" "],
    **GREEDY,
)
assert m.stop_reason == "stop_sequence" and m.stop_sequence == " ", (m.stop_reason, m.stop_sequence)
assert " " not in texts(m), texts(m)
ok(f"system and stop_sequences: stopped at {m.stop_sequence!r} after {texts(m)!r}")

# A forced tool call: a tool_use block whose input matches the schema.
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Oslo?"}]
forced = {"type": "tool", "name": "get_weather"}
m = client.messages.create(
    model="folio", max_tokens=48, messages=ASK_WEATHER, tools=TOOLS, tool_choice=forced,
    **GREEDY,
)
calls = [b for b in m.content if b.type == "tool_use"]
assert len(calls) == 1 and calls[0].name == "get_weather", m.content
assert isinstance(calls[0].input, dict) and isinstance(calls[0].input.get("city"), str), calls
assert m.stop_reason == "tool_use", m.stop_reason
ok(f"tool_choice tool: tool_use {calls[0].name}({calls[0].input})")

with client.messages.stream(
    model="folio", max_tokens=48, messages=ASK_WEATHER, tools=TOOLS, tool_choice=forced,
    **GREEDY,
) as s:
    final = s.get_final_message()
scalls = [b for b in final.content if b.type == "tool_use"]
assert [(c.name, c.input) for c in scalls] == [(c.name, c.input) for c in calls], final.content
assert final.stop_reason == "tool_use", final.stop_reason
ok("a streamed tool call (input_json_delta) adds up to the whole one")

# The tool's result goes back; the model answers on.
follow = ASK_WEATHER + [
    {"role": "assistant", "content": [c.model_dump() for c in m.content]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Rain, 8 C."}],
    },
]
m2 = client.messages.create(model="folio", max_tokens=24, messages=follow, tools=TOOLS, **GREEDY)
assert m2.content and m2.usage.input_tokens > m.usage.input_tokens, m2
ok(f"tool_result turn: {m2.stop_reason}, {texts(m2)!r}")

# count_tokens: the prompt a create would take (a create's usage splits it into
# input_tokens and cache_read_input_tokens).
n = client.messages.count_tokens(model="folio", messages=ASK)
u = client.messages.create(model="folio", max_tokens=2, messages=ASK, **GREEDY).usage
assert n.input_tokens == u.input_tokens + u.cache_read_input_tokens, (n, u)
with_system = client.messages.count_tokens(model="folio", messages=ASK, system="Be brief.")
assert with_system.input_tokens > 0, with_system
ok(f"messages.count_tokens: {n.input_tokens} tokens ({with_system.input_tokens} with a system prompt)")

# Extended thinking asked for: accepted, the answer has no thinking blocks.
t = client.messages.create(model="folio", max_tokens=16, messages=ASK,
                           thinking={"type": "enabled", "budget_tokens": 1024}, **GREEDY)
assert t.content and all(b.type == "text" for b in t.content), t.content
ok("thinking enabled: accepted, a plain answer")

# What folio cannot do is the SDK's BadRequestError with Anthropic's envelope.
try:
    client.messages.create(
        model="folio",
        max_tokens=8,
        messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
    )
    raise AssertionError("an image block was accepted")
except anthropic.BadRequestError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
ok("an image block: 400 invalid_request_error")
print("all anthropic checks passed")
