#!/usr/bin/env python3
"""The official `openai` Python client against a running `folio serve`.

Usage: python scripts/test_openai.py http://127.0.0.1:PORT/v1

Prints one line per check; the first failed check raises (exit status 1).
crates/folio-cli/tests/openai_client.rs runs it against a fresh server.
"""

import json
import math
import re
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

if len(sys.argv) != 2:
    sys.exit("usage: test_openai.py BASE_URL (e.g. http://127.0.0.1:8080/v1)")

client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0, timeout=120)
START = time.monotonic()
# Names this run's cache salts and starts its salted prompt, so that a server that
# already ran this script has nothing cached for them.
RUN = uuid.uuid4().hex[:12]


def ok(what):
    print(f"ok  {time.monotonic() - START:6.2f}s  {what}", flush=True)


def user(text):
    return [{"role": "user", "content": text}]


def check_usage(usage, where):
    assert usage is not None, f"{where}: no usage"
    assert usage.prompt_tokens > 0, f"{where}: prompt_tokens = {usage.prompt_tokens}"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, (
        f"{where}: total_tokens {usage.total_tokens} != "
        f"{usage.prompt_tokens} + {usage.completion_tokens}"
    )
    details = usage.prompt_tokens_details
    assert details is not None, f"{where}: usage has no prompt_tokens_details: {usage}"
    assert isinstance(details.cached_tokens, int), (
        f"{where}: cached_tokens is {details.cached_tokens!r}, not an int"
    )
    assert 0 <= details.cached_tokens <= usage.prompt_tokens, (
        f"{where}: cached_tokens {details.cached_tokens} outside 0..={usage.prompt_tokens}"
    )


# --- models.list ------------------------------------------------------------------
models = client.models.list().data
assert len(models) == 1, f"models.list: {len(models)} models: {models}"
MODEL = models[0].id
assert isinstance(MODEL, str) and MODEL, f"models.list: id {MODEL!r}"
assert models[0].object == "model", f"models.list: object {models[0].object!r}"
ok(f"models.list: one model, {MODEL!r}")

# --- completions.create -------------------------------------------------------------
c = client.completions.create(
    model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0
)
assert c.object == "text_completion", f"completions: object {c.object!r}"
assert c.model == MODEL, f"completions: model {c.model!r} != {MODEL!r}"
assert len(c.choices) == 1, f"completions: {len(c.choices)} choices"
assert isinstance(c.choices[0].text, str) and c.choices[0].text, (
    f"completions: text {c.choices[0].text!r}"
)
assert c.choices[0].finish_reason in ("stop", "length"), (
    f"completions: finish_reason {c.choices[0].finish_reason!r}"
)
check_usage(c.usage, "completions")
assert c.usage.completion_tokens > 0, f"completions: usage {c.usage}"
ok(f"completions.create: {c.choices[0].text!r} ({c.choices[0].finish_reason}, usage {c.usage.prompt_tokens}+{c.usage.completion_tokens}, cached {c.usage.prompt_tokens_details.cached_tokens})")

# --- completions streamed, with usage ---------------------------------------------------
chunks = list(
    client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
)
*body, last = chunks
assert last.choices == [], f"completions stream: the last chunk has choices: {last}"
check_usage(last.usage, "completions stream (last chunk)")
assert all(len(ch.choices) == 1 and ch.usage is None for ch in body), (
    f"completions stream: chunks {body}"
)
streamed = "".join(ch.choices[0].text for ch in body)
assert streamed == c.choices[0].text, (
    f"completions stream: {streamed!r} != not streamed {c.choices[0].text!r}"
)
assert last.usage.completion_tokens == c.usage.completion_tokens, (
    f"completions stream: usage {last.usage} != not streamed {c.usage}"
)
ok(f"completions stream: {len(chunks)} chunks, {streamed!r}")

# --- chat.completions.create, not streamed ------------------------------------------
r = client.chat.completions.create(
    model=MODEL, messages=user("Name three colors."), max_tokens=16, temperature=0
)
assert r.object == "chat.completion", f"chat: object {r.object!r}"
assert len(r.choices) == 1, f"chat: {len(r.choices)} choices"
m = r.choices[0].message
assert m.role == "assistant", f"chat: role {m.role!r}"
assert isinstance(m.content, str) and m.content, f"chat: content {m.content!r}"
assert r.choices[0].finish_reason in ("stop", "length"), (
    f"chat: finish_reason {r.choices[0].finish_reason!r}"
)
check_usage(r.usage, "chat")
ok(f"chat.completions.create: {m.content!r}")

# --- chat streamed, with usage --------------------------------------------------------
chunks = list(
    client.chat.completions.create(
        model=MODEL,
        messages=user("Write one sentence about the sea."),
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
)
assert chunks, "chat stream: no chunks"
*body, last = chunks
assert last.choices == [], f"chat stream: the last chunk has choices: {last}"
check_usage(last.usage, "chat stream (last chunk)")
assert last.usage.completion_tokens > 0, f"chat stream: usage {last.usage}"
for ch in body:
    assert ch.object == "chat.completion.chunk", f"chat stream: object {ch.object!r}"
    assert ch.usage is None, f"chat stream: usage before the last chunk: {ch}"
    assert len(ch.choices) == 1 and ch.choices[0].index == 0, f"chat stream: chunk {ch}"
assert len({ch.id for ch in chunks}) == 1, "chat stream: chunks with different ids"
streamed = "".join(ch.choices[0].delta.content or "" for ch in body)
assert streamed, "chat stream: the deltas are empty"
finishes = [ch.choices[0].finish_reason for ch in body if ch.choices[0].finish_reason]
assert finishes in (["stop"], ["length"]), f"chat stream: finish reasons {finishes}"
# The same request not streamed gives the same text and usage (temperature 0).
whole = client.chat.completions.create(
    model=MODEL, messages=user("Write one sentence about the sea."), max_tokens=16, temperature=0
)
assert whole.choices[0].message.content == streamed, (
    f"chat stream: streamed {streamed!r} != not streamed {whole.choices[0].message.content!r}"
)
assert whole.usage.completion_tokens == last.usage.completion_tokens, (
    f"chat stream: usage {last.usage} != not streamed {whole.usage}"
)
ok(f"chat stream: {len(chunks)} chunks, {streamed!r}, usage {last.usage.prompt_tokens}+{last.usage.completion_tokens}")

# --- predicted outputs: the prediction is drafted from; the answer is unchanged ---------
predicted = client.chat.completions.create(
    model=MODEL,
    messages=user("Write one sentence about the sea."),
    max_tokens=16,
    temperature=0,
    prediction={"type": "content", "content": streamed},
)
assert predicted.choices[0].message.content == streamed, (
    f"prediction: {predicted.choices[0].message.content!r} != {streamed!r}"
)
d = predicted.usage.completion_tokens_details
assert d is not None and d.accepted_prediction_tokens > 0, f"prediction: usage {predicted.usage}"
ok(f"prediction: {d.accepted_prediction_tokens} predicted tokens accepted, {d.rejected_prediction_tokens} rejected")

# --- n = 3 -----------------------------------------------------------------------------
r = client.chat.completions.create(
    model=MODEL, messages=user("Tell me a fact."), max_tokens=8, temperature=1, seed=7, n=3
)
assert sorted(ch.index for ch in r.choices) == [0, 1, 2], (
    f"n=3: indexes {[ch.index for ch in r.choices]}"
)
for ch in r.choices:
    assert isinstance(ch.message.content, str), f"n=3: choice {ch}"
    assert ch.finish_reason in ("stop", "length"), f"n=3: finish_reason {ch.finish_reason!r}"
check_usage(r.usage, "n=3")
ok(f"n=3: {[ch.message.content for ch in r.choices]}")

# --- stop ----------------------------------------------------------------------------------
STOP_PROMPT = "Once upon a time, in a small village by the river,"
greedy = client.completions.create(
    model=MODEL, prompt=STOP_PROMPT, max_tokens=32, temperature=0
).choices[0].text
stop_word = None
for w in re.findall(r"[A-Za-z]{3,}", greedy):
    at = greedy.find(w)  # the first place the stop string matches, even inside a word
    if at >= 8:
        stop_word = w
        break
assert stop_word, f"stop: no word to stop at in the greedy output {greedy!r}"
s = client.completions.create(
    model=MODEL, prompt=STOP_PROMPT, max_tokens=32, temperature=0, stop=[stop_word]
)
text = s.choices[0].text
assert stop_word not in text, f"stop: {stop_word!r} is in {text!r}"
assert s.choices[0].finish_reason == "stop", (
    f"stop: finish_reason {s.choices[0].finish_reason!r} (text {text!r}, stop {stop_word!r})"
)
assert text == greedy[: greedy.find(stop_word)], (
    f"stop: {text!r} is not the greedy output {greedy!r} up to {stop_word!r}"
)
ok(f"stop: {stop_word!r} ends {greedy!r} at {text!r}")

# --- seed ------------------------------------------------------------------------------------
def seeded(seed):
    return client.chat.completions.create(
        model=MODEL,
        messages=user("Write a short poem about autumn."),
        max_tokens=32,
        temperature=1.0,
        seed=seed,
    ).choices[0].message.content


a, b = seeded(1234), seeded(1234)
assert a == b, f"seed: seed 1234 gave {a!r} then {b!r}"
other = seeded(4321)
ok(f"seed: 1234 twice gives {a!r}; 4321 gives {'a different' if other != a else 'the same'} text")

# --- chat logprobs ------------------------------------------------------------------------
r = client.chat.completions.create(
    model=MODEL,
    messages=user("Name three colors."),
    max_tokens=8,
    temperature=0,
    logprobs=True,
    top_logprobs=3,
)
content = r.choices[0].logprobs.content
assert content, f"chat logprobs: no content entries: {r.choices[0].logprobs}"
assert len(content) == r.usage.completion_tokens, (
    f"chat logprobs: {len(content)} entries for {r.usage.completion_tokens} tokens"
)
for i, e in enumerate(content):
    assert isinstance(e.token, str), f"chat logprobs[{i}]: token {e.token!r}"
    assert e.logprob <= 0 and math.isfinite(e.logprob), f"chat logprobs[{i}]: logprob {e.logprob}"
    assert len(e.top_logprobs) == 3, f"chat logprobs[{i}]: {len(e.top_logprobs)} top_logprobs"
    tops = [t.logprob for t in e.top_logprobs]
    assert tops == sorted(tops, reverse=True), f"chat logprobs[{i}]: not descending: {tops}"
    assert all(t <= 0 for t in tops), f"chat logprobs[{i}]: top logprob > 0: {tops}"
    assert abs(e.logprob - tops[0]) < 1e-5, (
        f"chat logprobs[{i}]: greedy token {e.token!r} has {e.logprob}, the best has {tops[0]}"
    )
    assert e.bytes is None or bytes(e.bytes).decode("utf-8", "replace") == e.token, (
        f"chat logprobs[{i}]: bytes {e.bytes} do not spell {e.token!r}"
    )
joined = "".join(e.token for e in content)
assert joined == r.choices[0].message.content, (
    f"chat logprobs: tokens join to {joined!r}, content is {r.choices[0].message.content!r}"
)
ok(f"chat logprobs: {len(content)} tokens, {[e.token for e in content]}")

# --- legacy completions: echo and logprobs ------------------------------------------------
FOX = "The quick brown fox jumps over the lazy dog"
c = client.completions.create(model=MODEL, prompt=FOX, max_tokens=0, echo=True, logprobs=2)
ch = c.choices[0]
assert ch.text == FOX, f"echo max_tokens=0: text {ch.text!r}"
lp = ch.logprobs
assert lp is not None, "echo max_tokens=0: no logprobs"
assert "".join(lp.tokens) == FOX, f"echo max_tokens=0: tokens {lp.tokens} join to something else"
assert len(lp.tokens) == c.usage.prompt_tokens, (
    f"echo max_tokens=0: {len(lp.tokens)} tokens, usage says {c.usage.prompt_tokens}"
)
assert len(lp.token_logprobs) == len(lp.tokens), f"echo: token_logprobs {lp.token_logprobs}"
assert lp.token_logprobs[0] is None, f"echo: token_logprobs[0] = {lp.token_logprobs[0]!r}"
for i, v in enumerate(lp.token_logprobs[1:], 1):
    assert isinstance(v, float) and v <= 0, f"echo: token_logprobs[{i}] = {v!r}"
assert lp.top_logprobs[0] is None, f"echo: top_logprobs[0] = {lp.top_logprobs[0]!r}"
for i, t in enumerate(lp.top_logprobs[1:], 1):
    assert isinstance(t, dict) and len(t) == 2, f"echo: top_logprobs[{i}] = {t!r}"
    assert max(t.values()) >= lp.token_logprobs[i] - 1e-5 or lp.tokens[i] in t, (
        f"echo: top_logprobs[{i}] = {t!r}, token {lp.tokens[i]!r} has {lp.token_logprobs[i]}"
    )
offsets = [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
assert lp.text_offset == offsets, f"echo: text_offset {lp.text_offset} != {offsets}"
assert c.usage.completion_tokens == 0, f"echo max_tokens=0: usage {c.usage}"
check_usage(c.usage, "echo max_tokens=0")
ok(f"echo max_tokens=0 logprobs=2: {len(lp.tokens)} prompt tokens scored")

c = client.completions.create(
    model=MODEL, prompt=FOX, max_tokens=4, echo=True, logprobs=1, temperature=0
)
ch = c.choices[0]
assert ch.text.startswith(FOX), f"echo max_tokens=4: text {ch.text!r}"
assert len(ch.text) > len(FOX), f"echo max_tokens=4: nothing generated: {ch.text!r}"
lp = ch.logprobs
assert "".join(lp.tokens) == ch.text, f"echo max_tokens=4: tokens {lp.tokens} != {ch.text!r}"
assert len(lp.tokens) == c.usage.prompt_tokens + c.usage.completion_tokens, (
    f"echo max_tokens=4: {len(lp.tokens)} tokens, usage {c.usage}"
)
assert lp.token_logprobs[0] is None, f"echo max_tokens=4: token_logprobs[0] = {lp.token_logprobs[0]!r}"
assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[1:]), (
    f"echo max_tokens=4: token_logprobs {lp.token_logprobs}"
)
assert all(isinstance(t, dict) and len(t) == 1 for t in lp.top_logprobs[1:]), (
    f"echo max_tokens=4: top_logprobs {lp.top_logprobs}"
)
offsets = [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
assert lp.text_offset == offsets, f"echo max_tokens=4: text_offset {lp.text_offset} != {offsets}"
ok(f"echo max_tokens=4 logprobs=1: {ch.text!r}")

# --- prefix cache --------------------------------------------------------------------------
LONG = "The old lighthouse keeper climbed the winding stairs every night at dusk. " * 45
first = client.completions.create(
    model=MODEL, prompt=LONG + "Then he lit the lamp and", max_tokens=4, temperature=0
)
check_usage(first.usage, "cache, first")
assert first.usage.prompt_tokens >= 500, f"cache: only {first.usage.prompt_tokens} prompt tokens"
second = client.completions.create(
    model=MODEL, prompt=LONG + "In the morning the fog", max_tokens=4, temperature=0
)
check_usage(second.usage, "cache, second")
assert second.usage.prompt_tokens_details.cached_tokens > 0, (
    f"cache: the second request shares {first.usage.prompt_tokens - 8}+ tokens "
    f"but cached_tokens = 0: {second.usage}"
)
ok(
    f"prefix cache: {first.usage.prompt_tokens} tokens, cached "
    f"{first.usage.prompt_tokens_details.cached_tokens} then "
    f"{second.usage.prompt_tokens_details.cached_tokens}"
)

# --- cache_salt ----------------------------------------------------------------------------
SALTED = f"{RUN}: " + "A caravan of camels crossed the silent desert under a pale moon. " * 45


def salted(salt):
    extra = {"cache_salt": f"{salt}-{RUN}"} if salt is not None else None
    return client.completions.create(
        model=MODEL, prompt=SALTED, max_tokens=2, temperature=0, extra_body=extra
    ).usage


u_a = salted("tenant-a")
check_usage(u_a, "cache_salt, tenant-a")
assert u_a.prompt_tokens >= 500, f"cache_salt: only {u_a.prompt_tokens} prompt tokens"
u_b = salted("tenant-b")
assert u_b.prompt_tokens_details.cached_tokens == 0, (
    f"cache_salt: tenant-b reused tenant-a's cache: {u_b}"
)
u_a2 = salted("tenant-a")
assert u_a2.prompt_tokens_details.cached_tokens > 0, (
    f"cache_salt: tenant-a's second request found nothing cached: {u_a2}"
)
# Without a salt the prompt may share its first few tokens (the run's id) with an
# earlier run's; it must not find the ~600 tokens the salted requests cached.
u_none = salted(None)
assert u_none.prompt_tokens_details.cached_tokens < 32, (
    f"cache_salt: a request without a salt reused a salted cache: {u_none}"
)
ok(
    f"cache_salt: a {u_a.prompt_tokens_details.cached_tokens}, "
    f"b {u_b.prompt_tokens_details.cached_tokens}, "
    f"a again {u_a2.prompt_tokens_details.cached_tokens}, "
    f"none {u_none.prompt_tokens_details.cached_tokens} (of {u_a.prompt_tokens})"
)

# --- errors ------------------------------------------------------------------------------
try:
    client.completions.create(model=MODEL, prompt="hello " * 10000, max_tokens=4)
    raise AssertionError("a 10000-token prompt was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400, f"too long: status {e.status_code}"
    assert isinstance(e.body, dict), f"too long: the error body is {e.body!r}"
    assert "context" in str(e.body.get("message", "")).lower(), (
        f"too long: the message does not mention the context window: {e.body}"
    )
    assert e.code == "context_length_exceeded", f"too long: code {e.code!r}"
    ok(f"too long: 400 {e.body['message']}")

try:
    client.chat.completions.create(
        model=MODEL, messages=user("hi"), max_tokens=4, temperature=-1
    )
    raise AssertionError("temperature -1 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400, f"temperature -1: status {e.status_code}"
    assert e.param == "temperature", f"temperature -1: param {e.param!r} ({e.body})"
    ok(f"temperature -1: 400 {e.body['message'] if isinstance(e.body, dict) else e}")

# --- structured output and tool calls -----------------------------------------------------
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
for temp in (0.0, 1.0):
    r = client.chat.completions.create(
        model=MODEL, messages=user("Invent a person."), max_tokens=100, temperature=temp, seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    # Ended by the grammar (not cut by max_tokens), so the JSON is whole.
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    person = json.loads(r.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int), person
ok(f"response_format json_schema: {person}")

r = client.chat.completions.create(
    model=MODEL, messages=user("Give a person's name and age as a JSON object."), max_tokens=200, temperature=0,
    response_format={"type": "json_object"},
)
assert r.choices[0].finish_reason == "stop", r.choices[0]
cat = json.loads(r.choices[0].message.content)
assert isinstance(cat, dict), cat
ok(f"response_format json_object: {cat}")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
# Seeded: sampled at temperature 1, about one seed in thirty writes a second call and
# runs into max_tokens (finish_reason "length"), so an unseeded request failed now and
# then.
r = client.chat.completions.create(
    model=MODEL, messages=user("What is the weather in Paris?"), tools=[WEATHER],
    tool_choice="required", max_tokens=60, seed=2,
)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls", choice
call = choice.message.tool_calls[0]
args = json.loads(call.function.arguments)
assert call.function.name == "get_weather" and set(args) == {"city", "unit"}, call
ok(f"tool_choice required: {call.function.name}({args})")

stream = client.chat.completions.create(
    model=MODEL, messages=user("Weather in Oslo?"), tools=[WEATHER],
    tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=60, seed=2,
    stream=True,
)
name, pieces, finish = None, [], None
for chunk in stream:
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            name = name or tc.function.name
            pieces.append(tc.function.arguments or "")
        finish = c.finish_reason or finish
args = json.loads("".join(pieces))
assert name == "get_weather" and finish == "tool_calls" and set(args) == {"city", "unit"}, (name, pieces, finish)
ok(f"named tool call streamed in {len(pieces)} argument deltas: {args}")

# `required` calls stream too: each call's name once it is whole, then its arguments as
# they are generated; greedy, they reassemble to the whole answer's calls.
whole = client.chat.completions.create(
    model=MODEL, messages=user("Weather in Rome and in Oslo?"), tools=[WEATHER],
    tool_choice="required", max_tokens=80, temperature=0,
)
stream = client.chat.completions.create(
    model=MODEL, messages=user("Weather in Rome and in Oslo?"), tools=[WEATHER],
    tool_choice="required", max_tokens=80, temperature=0, stream=True,
)
calls, deltas, finish = {}, 0, None
for chunk in stream:
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            deltas += 1
            got = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            got["id"] = got["id"] or tc.id
            got["name"] = got["name"] or (tc.function.name if tc.function else None)
            got["args"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.finish_reason or finish
want = whole.choices[0].message.tool_calls
assert finish == whole.choices[0].finish_reason == "tool_calls", (finish, whole.choices[0])
assert len(calls) == len(want) and deltas > 2 * len(want), (calls, deltas)
for k, w in enumerate(want):
    assert calls[k]["name"] == w.function.name and calls[k]["id"], (calls[k], w)
    assert json.loads(calls[k]["args"]) == json.loads(w.function.arguments), (calls[k], w)
ok(f"required tool calls streamed in {deltas} deltas: {[(c['name'], c['args']) for c in calls.values()]}")

# parallel_tool_calls=False: the grammar holds `required` to exactly one call, where the
# same request in parallel mode (above) may write several.
r = client.chat.completions.create(
    model=MODEL, messages=user("Weather in Rome and in Oslo?"), tools=[WEATHER],
    tool_choice="required", parallel_tool_calls=False, max_tokens=80, temperature=0,
)
choice = r.choices[0]
assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
one = json.loads(choice.message.tool_calls[0].function.arguments)
assert choice.message.tool_calls[0].function.name == "get_weather" and set(one) == {"city", "unit"}, choice
ok(f"parallel_tool_calls=False: one call, {one} (parallel: {len(want)})")

# `auto`: the model's own Hermes-style blocks are parsed out of its text. The default
# model never writes them by itself, so a regex (vLLM's guided_regex) makes it write
# content, then two blocks; the real server parses them, whole and streamed.
HERMES = (r'Let me check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
          r'\{"city": "(Paris|Oslo)", "unit": "c"\}\}\n</tool_call>\n<tool_call>\n'
          r'\{"name": "get_weather", "arguments": \{"city": "Rome", "unit": "f"\}\}\n</tool_call>')
auto = dict(model=MODEL, messages=user("Weather in Paris and Rome?"), tools=[WEATHER],
            tool_choice="auto", max_tokens=400, temperature=0, extra_body={"guided_regex": HERMES})
whole = client.chat.completions.create(**auto)
choice = whole.choices[0]
assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check.", choice
want = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
assert len(want) == 2 and want[1] == ("get_weather", {"city": "Rome", "unit": "f"}), want
content, calls, deltas, finish = "", {}, 0, None
for chunk in client.chat.completions.create(**auto, stream=True):
    for c in chunk.choices:
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            deltas += 1
            got = calls.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            got["id"] = got["id"] or tc.id
            got["name"] = got["name"] or (tc.function.name if tc.function else None)
            got["args"] += (tc.function.arguments or "") if tc.function else ""
        finish = c.finish_reason or finish
assert finish == "tool_calls" and content.strip() == "Let me check." and "<tool" not in content, (finish, content)
assert [(c["name"], json.loads(c["args"])) for c in calls.values()] == want, (calls, want)
# An `auto` call goes out whole once its block closes (only then is it known to be a
# call): its id and name, then its arguments whole.
assert all(c["id"] for c in calls.values()) and deltas == 2 * len(want), (calls, deltas)
ok(f"tool_choice auto: content {content.strip()!r}, {len(want)} Hermes calls streamed in {deltas} deltas")

try:
    client.chat.completions.create(
        model=MODEL, messages=user("hi"), max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "frob"}}},
    )
    raise AssertionError("a schema that does not compile was accepted")
except openai.BadRequestError as e:
    assert e.param == "response_format", e.body
    ok(f"bad schema: 400 {e.body['message']}")

# --- many json_schema outputs, validated --------------------------------------------------
# Each schema bounds its output (short strings, few items, bounded numbers), so every
# answer must end by the grammar ("stop") well before max_tokens; each is then checked
# with jsonschema. A "stop" output that fails validation is a server bug: those are
# gathered in INVALID and reported whole.
# A `number` has no bound on its digits but a multipleOf (a power of two, which Python
# divides exactly): SmolLM2 otherwise runs on into 2.1212121...
S = {"type": "string", "maxLength": 12}
INT = {"type": "integer", "minimum": 0, "maximum": 100}
NUM = {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.25}


def obj(props, required=None):
    return {
        "type": "object",
        "properties": props,
        "required": list(props) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS = [
    ("word", obj({"word": S})),
    ("count", obj({"count": INT})),
    ("temperature", obj({"celsius": {"type": "number", "minimum": -40, "maximum": 50, "multipleOf": 0.5}})),
    ("flag", obj({"enabled": {"type": "boolean"}})),
    ("nothing", obj({"value": {"type": "null"}})),
    ("version", obj({"version": {"const": "v1"}, "build": {"type": "integer", "minimum": 1, "maximum": 999}})),
    ("color", obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("code", obj({"code": {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"}})),
    ("zip", obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("hex color", obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("date", obj({"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}})),
    ("initials", obj({"initials": {"type": "string", "pattern": "^[A-Z]{2,3}$"}})),
    ("person", obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("point", obj({"x": NUM, "y": NUM})),
    ("rgb", obj({c: {"type": "integer", "minimum": 0, "maximum": 255} for c in ("r", "g", "b")})),
    ("price", obj({"amount": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.25}, "currency": {"enum": ["USD", "EUR", "GBP"]}})),
    ("rating", obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "comment": {"type": "string", "maxLength": 16}})),
    ("percent", obj({"percent": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.5}})),
    ("negative", obj({"below_zero": {"type": "integer", "minimum": -50, "maximum": -1}})),
    ("exclusive", obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}})),
    ("tags", obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}})),
    ("scores", obj({"scores": {"type": "array", "items": INT, "minItems": 2, "maxItems": 4}})),
    ("exactly two", obj({"pair": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 2}})),
    ("bools", obj({"bits": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4}})),
    ("maybe empty", obj({"items": {"type": "array", "items": S, "maxItems": 2}})),
    ("matrix", obj({"rows": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}}})),
    ("tuple", obj({"entry": {"type": "array", "prefixItems": [S, INT, {"type": "boolean"}], "items": False, "minItems": 3, "maxItems": 3}})),
    ("top-level array", {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 1, "maxItems": 4}),
    ("top-level enum", {"enum": ["yes", "no", "maybe"]}),
    ("top-level integer", {"type": "integer", "minimum": 10, "maximum": 20}),
    ("top-level string", {"type": "string", "pattern": "^[a-z]{4}$"}),
    ("address", obj({"street": S, "city": S, "geo": obj({"lat": {"type": "number", "minimum": -90, "maximum": 90, "multipleOf": 0.25}, "lon": {"type": "number", "minimum": -180, "maximum": 180, "multipleOf": 0.25}})})),
    ("company", obj({"name": S, "ceo": obj({"name": S, "since": {"type": "integer", "minimum": 1990, "maximum": 2025}})})),
    ("deep", obj({"a": obj({"b": obj({"c": obj({"d": {"type": "integer", "minimum": 0, "maximum": 9}})})})})),
    ("team", obj({"team": {"type": "array", "minItems": 1, "maxItems": 3, "items": obj({"name": {"type": "string", "maxLength": 10}, "lead": {"type": "boolean"}})}})),
    ("order", obj({"id": {"type": "string", "pattern": "^ord-[0-9]{4}$"}, "lines": {"type": "array", "minItems": 1, "maxItems": 2, "items": obj({"sku": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}})}})),
    ("optional nickname", obj({"name": S, "nickname": S}, required=["name"])),
    ("all optional", obj({"a": {"type": "boolean"}, "b": {"type": "integer", "minimum": 0, "maximum": 5}}, required=[])),
    ("optional nested", obj({"id": INT, "meta": obj({"note": S})}, required=["id"])),
    ("optional list", obj({"title": S, "labels": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3}}, required=["title"])),
    ("string or int", obj({"value": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "integer", "minimum": 0, "maximum": 99}]}})),
    ("nullable", obj({"middle_name": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]}})),
    ("type list", obj({"score": {"type": ["integer", "null"], "minimum": 0, "maximum": 10}})),
    ("shape", obj({"shape": {"anyOf": [
        obj({"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5}}),
        obj({"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 10}}),
    ]}})),
    ("one of", obj({"pick": {"oneOf": [{"const": 1}, {"const": "one"}, {"type": "boolean"}]}})),
    ("anyOf enums", {"anyOf": [{"enum": ["north", "south"]}, {"enum": ["east", "west"]}]}),
    ("consts", obj({"kind": {"const": "event"}, "version": {"const": 2}, "ok": {"const": True}})),
    ("enum mixed", obj({"level": {"enum": [1, 2, 3, "max", None]}})),
    ("enum list", obj({"days": {"type": "array", "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]}, "minItems": 1, "maxItems": 3}})),
    ("short strings", obj({"first": {"type": "string", "minLength": 2, "maxLength": 5}, "last": {"type": "string", "maxLength": 6}})),
    ("empty string", obj({"blank": {"type": "string", "maxLength": 0}})),
    ("single char", obj({"letter": {"type": "string", "pattern": "^[a-z]$"}})),
    ("phone", obj({"phone": {"type": "string", "pattern": "^\\+[0-9]{2} [0-9]{3} [0-9]{4}$"}})),
    ("ip", obj({"ip": {"type": "string", "pattern": "^[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}$"}})),
    ("email", obj({"email": {"type": "string", "pattern": "^[a-z]{2,6}@[a-z]{2,6}\\.(com|org)$"}})),
    ("defs", {
        "$defs": {"pet": obj({"name": S, "species": {"enum": ["cat", "dog", "fish"]}})},
        **obj({"owner": S, "pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "minItems": 1, "maxItems": 2}}),
    }),
    ("recipe", obj({
        "title": S,
        "minutes": {"type": "integer", "minimum": 1, "maximum": 240},
        "vegan": {"type": "boolean"},
        "steps": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 3},
    })),
    ("book", obj({
        "isbn": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{5}$"},
        "pages": {"type": "integer", "minimum": 1, "maximum": 2000},
        "genre": {"enum": ["fiction", "poetry", "science"]},
        "sequel": {"anyOf": [{"type": "string", "maxLength": 12}, {"type": "null"}]},
    }, required=["isbn", "pages", "genre"])),
    ("sensor", obj({
        "id": {"type": "string", "pattern": "^s[0-9]{2}$"},
        "readings": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125}, "minItems": 1, "maxItems": 4},
        "status": {"enum": ["ok", "fault"]},
        "error": {"type": "null"},
    })),
]
assert len(SCHEMAS) >= 50, len(SCHEMAS)
assert len({name for name, _ in SCHEMAS}) == len(SCHEMAS), "schema names repeat"


def structured(i, name, schema):
    r = client.chat.completions.create(
        model=MODEL, messages=user(f"Give an example of a {name} as JSON."),
        max_tokens=200, temperature=0.7, seed=1000 + i,
        response_format={"type": "json_schema", "json_schema": {
            "name": re.sub(r"[^A-Za-z0-9_-]", "_", name), "schema": schema, "strict": True}},
    )
    return r.choices[0].finish_reason, r.choices[0].message.content


began = time.monotonic()
with ThreadPoolExecutor(max_workers=8) as pool:
    answers = list(pool.map(lambda a: structured(*a), [(i, n, s) for i, (n, s) in enumerate(SCHEMAS)]))
took = time.monotonic() - began
CUT, INVALID = [], []
for (name, schema), (finish, content) in zip(SCHEMAS, answers):
    if finish != "stop":
        CUT.append((name, finish, content))
        continue
    try:
        jsonschema.validate(json.loads(content), schema)
    except (ValueError, jsonschema.ValidationError) as e:
        INVALID.append((name, schema, content, str(e).splitlines()[0]))
for name, finish, content in CUT:
    print(f"CUT  {name}: finish_reason {finish!r}: {content!r}", flush=True)
for name, schema, content, why in INVALID:
    print(f"INVALID  {name}: {why}\n  schema: {json.dumps(schema)}\n  output: {content!r}", flush=True)
assert not CUT, f"json_schema: {len(CUT)} outputs not ended by the grammar: {[c[0] for c in CUT]}"
assert not INVALID, f"json_schema: {len(INVALID)} outputs fail their schema (server bug): {[v[0] for v in INVALID]}"
ok(f"json_schema: {len(SCHEMAS)} schemas, all valid, {took:.1f} s")

# Bounded: with `[a-z]+` SmolLM2 runs on ("httpsshttpss...") to max_tokens for about
# one seed in eight.
EMAIL = r"[a-z]{1,10}@[a-z]{1,10}\.com"
r = client.chat.completions.create(
    model=MODEL, messages=user("Write an email address."), max_tokens=40, temperature=0.7, seed=5,
    extra_body={"guided_regex": EMAIL},
)
content = r.choices[0].message.content
assert r.choices[0].finish_reason == "stop", r.choices[0]
assert re.fullmatch(EMAIL, content), f"guided_regex: {content!r} does not match {EMAIL}"
ok(f"guided_regex: {content!r}")

r = client.chat.completions.create(
    model=MODEL, messages=user("Name a color."), max_tokens=10, temperature=0.7, seed=6,
    extra_body={"guided_choice": ["red", "green", "blue"]},
)
content = r.choices[0].message.content
assert r.choices[0].finish_reason == "stop", r.choices[0]
assert content in ("red", "green", "blue"), f"guided_choice: {content!r}"
ok(f"guided_choice: {content!r}")

BOOKING = {
    "type": "function",
    "function": {
        "name": "book_table",
        "description": "Book a table at a restaurant",
        "parameters": obj({
            "restaurant": {"type": "string", "maxLength": 16},
            "guests": {"type": "integer", "minimum": 1, "maximum": 12},
            "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            "terrace": {"type": "boolean"},
            "diet": {"type": "array", "items": {"enum": ["vegan", "halal", "kosher"]}, "maxItems": 2},
        }, required=["restaurant", "guests", "time"]),
    },
}
r = client.chat.completions.create(
    model=MODEL, messages=user("Book a table for four at Luigi's at 8pm."), tools=[BOOKING],
    tool_choice={"type": "function", "function": {"name": "book_table"}},
    max_tokens=120, temperature=0.7, seed=8, n=3,
)
assert len(r.choices) == 3, f"tool call n=3: {len(r.choices)} choices"
calls = []
for ch in r.choices:
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    assert call.function.name == "book_table", call
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, BOOKING["function"]["parameters"])
    calls.append(args)
ok(f"named tool call, n=3: 3 argument sets valid: {calls}")

# --- embeddings.create --------------------------------------------------------------
# The client asks for base64 unless told otherwise (and decodes it): both formats here.
def unit(v, where):
    norm = math.sqrt(sum(x * x for x in v))
    assert abs(norm - 1.0) < 1e-4, f"{where}: norm {norm}"


e = client.embeddings.create(model=MODEL, input="The capital of France is Paris.")
assert e.object == "list", f"embeddings: object {e.object!r}"
assert len(e.data) == 1 and e.data[0].index == 0, f"embeddings: data {e.data}"
DIM = len(e.data[0].embedding)
assert DIM > 0, "embeddings: an empty vector"
unit(e.data[0].embedding, "embeddings (string)")
assert e.usage.prompt_tokens > 0 and e.usage.total_tokens == e.usage.prompt_tokens, e.usage
texts = ["first", "The capital of France is Paris.", "a third, longer input of a few words"]
es = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
assert [d.index for d in es.data] == [0, 1, 2], f"embeddings (list): {es.data}"
for d in es.data:
    assert len(d.embedding) == DIM, f"embeddings (list): length {len(d.embedding)} != {DIM}"
    unit(d.embedding, f"embeddings (list) {d.index}")
same = max(abs(a - b) for a, b in zip(es.data[1].embedding, e.data[0].embedding))
assert same < 1e-6, f"embeddings: the list's input 1 differs from it alone by {same}"
try:
    client.embeddings.create(model=MODEL, input="x", dimensions=DIM + 1)
    raise AssertionError("embeddings: dimensions != the hidden size was accepted")
except openai.BadRequestError as err:
    assert err.param == "dimensions", f"embeddings: param {err.param!r} ({err.body})"
ok(f"embeddings.create: {DIM} dimensions, unit norm, a list of 3 in order")

print(f"all checks passed in {time.monotonic() - START:.1f}s")
