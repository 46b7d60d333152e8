#!/usr/bin/env python3
"""The official `openai` Python client's Responses API against a running `folio serve`.

Usage: python scripts/test_responses.py http://127.0.0.1:PORT/v1

Prints one line per check; the first failed check raises (exit status 1).
crates/folio-cli/tests/openai_client.rs runs it against a fresh server.
"""

import json
import sys
import time

import jsonschema
import openai

if len(sys.argv) != 2:
    sys.exit("usage: test_responses.py BASE_URL (e.g. http://127.0.0.1:8080/v1)")

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id
START = time.monotonic()


def ok(what):
    print(f"ok  {time.monotonic() - START:6.2f}s  {what}", flush=True)


def stream_final(**kw):
    """The final response of `responses.stream`, completed or cut by max_output_tokens
    (`get_final_response` wants `response.completed`; a cut one ends `response.incomplete`)."""
    last = None
    with client.responses.stream(**kw) as s:
        for e in s:
            if e.type in ("response.completed", "response.incomplete"):
                last = e.response
    assert last is not None, "the stream ended without its final event"
    return last


def check_usage(u, where):
    assert u is not None, f"{where}: no usage"
    assert u.input_tokens > 0 and u.output_tokens > 0, f"{where}: {u}"
    assert u.total_tokens == u.input_tokens + u.output_tokens, f"{where}: {u}"
    assert 0 <= u.input_tokens_details.cached_tokens <= u.input_tokens, f"{where}: {u}"


# --- responses.create, whole --------------------------------------------------------
r = client.responses.create(
    model=MODEL, input="Name three colours.", instructions="Answer in one short line.",
    max_output_tokens=24, temperature=0,
)
assert r.object == "response" and r.id.startswith("resp_"), r
assert r.status in ("completed", "incomplete"), r.status
assert r.output[0].type == "message" and r.output[0].role == "assistant", r.output
assert r.output_text.strip(), f"empty output_text: {r}"
assert r.instructions == "Answer in one short line.", r.instructions
check_usage(r.usage, "create")
ok(f"responses.create: {r.output_text.strip()[:60]!r}, {r.usage.output_tokens} tokens")

# --- responses.stream: the same answer, in typed events --------------------------------
deltas = []
with client.responses.stream(
    model=MODEL, input="Name three colours.", instructions="Answer in one short line.",
    max_output_tokens=24, temperature=0,
) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = stream.get_final_response()
assert "".join(deltas) == final.output_text == r.output_text, (deltas, final.output_text)
check_usage(final.usage, "stream")
ok(f"responses.stream: {len(deltas)} deltas, the same text as the whole answer")

# --- create(stream=True): event order and sequence numbers ---------------------------
events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8,
                                      temperature=0, stream=True))
kinds = [e.type for e in events]
assert kinds[:2] == ["response.created", "response.in_progress"], kinds
assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
assert [e.sequence_number for e in events] == list(range(len(events))), "sequence numbers"
assert "response.output_text.done" in kinds and "response.output_item.done" in kinds, kinds
ok(f"stream=True: {len(events)} events, numbered 0..{len(events) - 1}")

# --- a chain of 5 turns: each continues the stored context, cached_tokens grows ---------
prev, cached, turns = None, -1, []
for i, question in enumerate([
    "My name is Ada. Remember it.",
    "What is two plus two?",
    "Name a large animal.",
    "Name a small one.",
    "What is my name?",
]):
    kw = dict(model=MODEL, input=question, max_output_tokens=20, temperature=0)
    if prev is not None:
        kw["previous_response_id"] = prev.id
    if i % 2:
        resp = stream_final(**kw)
    else:
        resp = client.responses.create(**kw)
    assert resp.previous_response_id == (prev.id if prev else None), resp.previous_response_id
    check_usage(resp.usage, f"turn {i + 1}")
    now = resp.usage.input_tokens_details.cached_tokens
    if prev is not None:
        # Everything the previous turn's context held is reused: its prompt and its
        # reply (but the last sampled token, which is never computed).
        held = prev.usage.input_tokens + prev.usage.output_tokens - 1
        assert now == held, f"turn {i + 1}: cached {now}, the previous context held {held}"
        assert now > cached, f"turn {i + 1}: cached_tokens {now} did not grow from {cached}"
        assert resp.usage.input_tokens > held, resp.usage
    cached, prev = now, resp
    turns.append(now)
ok(f"5-turn previous_response_id chain (2 streamed): cached_tokens {turns}")

# --- the chain answers as the whole conversation sent at once does --------------------
a = client.responses.create(model=MODEL, input="Name a fruit.", max_output_tokens=12,
                            temperature=0)
b = client.responses.create(model=MODEL, input="And a vegetable?", max_output_tokens=12,
                            temperature=0, previous_response_id=a.id)
whole = client.responses.create(model=MODEL, store=False, max_output_tokens=12, temperature=0,
                                input=[{"role": "user", "content": "Name a fruit."},
                                       {"role": "assistant", "content": a.output_text},
                                       {"role": "user", "content": "And a vegetable?"}])
assert b.output_text == whole.output_text, (b.output_text, whole.output_text)
ok(f"a continuation answers as the whole conversation: {b.output_text.strip()[:40]!r}")

# --- retrieve, delete, store=False ----------------------------------------------------
got = client.responses.retrieve(a.id)
assert got.id == a.id and got.output_text == a.output_text, got
client.responses.delete(a.id)
for call in (lambda: client.responses.retrieve(a.id),
             lambda: client.responses.create(model=MODEL, input="x", previous_response_id=a.id)):
    try:
        call()
        raise AssertionError("a deleted response was found")
    except openai.NotFoundError:
        pass
assert whole.store is False
try:
    client.responses.retrieve(whole.id)
    raise AssertionError("a response with store=False was kept")
except openai.NotFoundError:
    pass
ok("retrieve, delete (then 404), store=False keeps nothing")

# --- tools: a forced call, then its output continues the chain -------------------------
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}
call = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                               tools=[WEATHER], tool_choice="required", max_output_tokens=60,
                               temperature=0)
calls = [o for o in call.output if o.type == "function_call"]
assert calls and calls[0].name == "get_weather", call.output
assert "city" in json.loads(calls[0].arguments), calls[0].arguments
named = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=60, temperature=0)
assert [o.name for o in named.output if o.type == "function_call"] == ["get_weather"], named.output
after = client.responses.create(
    model=MODEL, previous_response_id=call.id, tools=[WEATHER], max_output_tokens=30,
    temperature=0,
    input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}],
)
assert after.output_text.strip(), after.output
assert after.usage.input_tokens_details.cached_tokens > 0, after.usage
ok(f"tools: {calls[0].name}({calls[0].arguments}); after its output: {after.output_text.strip()[:40]!r}")

with client.responses.stream(model=MODEL, input="Weather in Rome?", tools=[WEATHER],
                             tool_choice="required", max_output_tokens=60, temperature=0) as s:
    args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
    streamed = s.get_final_response()
fc = [o for o in streamed.output if o.type == "function_call"]
assert fc and fc[0].arguments == args, (fc, args)
ok(f"a streamed call: arguments {args}")

# --- text.format: a JSON schema ---------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}
j = client.responses.create(model=MODEL, input="Invent a person.", max_output_tokens=100,
                            temperature=0,
                            text={"format": {"type": "json_schema", "name": "person",
                                             "schema": SCHEMA, "strict": True}})
jsonschema.validate(json.loads(j.output_text), SCHEMA)
assert j.text.format.type == "json_schema", j.text
ok(f"text.format json_schema: {j.output_text}")

# --- a field folio does not implement is a 400 naming it --------------------------------
for field, value in [("top_logprobs", 2), ("truncation", "auto"), ("background", True)]:
    try:
        client.responses.create(model=MODEL, input="x", **{field: value})
        raise AssertionError(f"{field} was accepted")
    except openai.BadRequestError as e:
        assert e.body.get("param") == field, e.body
ok("top_logprobs, truncation auto, background: 400 naming the field")
print("all Responses API checks passed")
