#!/usr/bin/env python3
"""folio's chat-template rendering (minijinja) against Python's jinja2, set up the way
Hugging Face transformers renders chat templates, on random conversations. A dev tool,
not a dependency of folio.

    nice -n 19 /work/llama/venv/bin/python scripts/parity/template_parity.py [--n 10000]

The reference environment (as transformers documents and sets it): a sandboxed jinja2
environment with trim_blocks and lstrip_blocks on and the loop-controls extension; a
`tojson` filter that is Python's json.dumps without ASCII escaping (indent, separators
and sort_keys passed through); `raise_exception(msg)` raising a template error; the
special-token strings (bos_token, eos_token, ...) from the GGUF as variables; `tools`
(None when absent) and `add_generation_prompt`.

Templates checked:
  gguf       the model's own `tokenizer.chat_template` (the default model: SmolLM2's)
  chatml     folio's fallback for files without a template (CHATML in template.rs)
  probe      a template written for this harness (below) that uses what real templates
             use and the two above do not: whitespace control by trim_blocks and
             lstrip_blocks, tools through tojson, loop variables, namespace(), string
             methods, `is defined`, raise_exception
Identical strings, or an error from both, count as agreement.
"""

import argparse
import datetime
import json
import os
import random
import re
import sys
import time

import jinja2
import jinja2.ext
import jinja2.sandbox

sys.path.insert(0, os.path.dirname(__file__))
from common import DEFAULT_MODEL, ROOT, Folio, log  # noqa: E402

PROBE = """{%- set ns = namespace(system='', n=0) -%}
{%- if messages and messages[0]['role'] == 'system' %}
  {%- set ns.system = messages[0]['content'] | trim %}
{%- endif %}
{%- if tools %}
<tools>
{% for tool in tools %}
  {{ tool | tojson }}
{% endfor %}
</tools>
  {%- if tools | length > 1 %}
{{ tools[0] | tojson(indent=2) }}
  {%- endif %}
{% endif %}
{% if ns.system %}[SYS] {{ ns.system }}
{% endif %}
{% for message in messages %}
  {% if message['role'] == 'system' %}{% continue %}{% endif %}
  {% set ns.n = ns.n + 1 %}
  {% if message['role'] not in ['user', 'assistant', 'tool'] %}
    {{ raise_exception('unknown role ' + message['role']) }}
  {% endif %}
  {% if message['content'].startswith(' ') or message['content'].endswith('\\n') %}
<{{ message['role'] | upper }} edge>
  {% else %}
<{{ message['role'] | upper }}>
  {% endif %}
{{ message['content'].strip() }}{% if not loop.last %} ({{ loop.index }}/{{ loop.length }}){% endif %}

  {% if message['content'].split('\\n') | length > 2 %}
lines={{ message['content'].split('\\n') | length }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt is defined and add_generation_prompt %}
<ASSISTANT turn={{ ns.n }}>
{% endif %}
{{- eos_token if not add_generation_prompt else '' -}}
"""

# More of what real templates do: attribute access, slicing, macros, filters.
PROBE2 = """{%- macro render(m, idx) -%}
{{ idx }}:{{ m.role | title }}:{{ m.content | replace('\n', ' / ') | trim }}
{%- endmacro -%}
{%- set first = messages[0] if messages else none -%}
{%- if first is not none and first.role == 'system' -%}
  {%- set rest = messages[1:] -%}
  {{- 'SYSTEM=' + first.content.lstrip().rstrip() + '\n' -}}
{%- else -%}
  {%- set rest = messages -%}
{%- endif -%}
{%- for m in rest -%}
  {{- render(m, loop.index0) }}
  {%- if loop.previtem is defined and loop.previtem.role == m.role %} [repeat]{% endif %}
  {%- if m.content is string and m.content | length > 20 %} [{{ m.content[:5] }}...{{ m.content[-3:] }}]{% endif %}
{{ '\n' }}
{%- endfor -%}
roles={{ rest | map(attribute='role') | join(',') }}
users={{ rest | selectattr('role', 'equalto', 'user') | list | length }}
{%- if tools is not none %}
{% for t in tools %}{{ t.function.name }}{{ t.get('type', '?') }} {{ t | tojson(sort_keys=true) }}
{% endfor %}
{%- for k, v in (tools[0] if tools else {}).items() %}{{ k }}={{ v | tojson(separators=(',', ':')) }};{% endfor %}
{%- endif %}
{%- if add_generation_prompt %}
{{ bos_token ~ '|' ~ eos_token ~ '|' ~ (undefined_thing | default('none')) }}
{%- endif %}"""


def rust_chatml():
    """folio's CHATML constant, read from its source (a Rust string literal)."""
    src = open(os.path.join(ROOT, "crates/folio/src/tokenizer/template.rs")).read()
    m = re.search(r'pub const CHATML: &str = "((?:[^"\\]|\\.)*)";', src)
    return m.group(1).replace("\\n", "\n").replace("\\'", "'").replace('\\"', '"').replace("\\\\", "\\")


def reference_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


TEXTS = [
    "", " ", "\n", "hi", "Hello, world!", "  padded  ", "line one\nline two\nline three",
    "ends with newline\n", "\r\nwindows\r\n", "tab\there", "日本語のテキスト", "Привет, мир",
    "مرحبا بالعالم", "emoji 😀👍🏽🎉 and ZWJ 👨‍👩‍👧", "e\u0301 combining", "\u200b\ufeffzero width",
    "{{ not a tag }}", "{% if x %}raw{% endif %}", "{# comment #}", "<|im_start|>user\nfake<|im_end|>",
    "<|endoftext|>", "quotes ' \" and \\ backslash", "\x00\x01\x14 controls", "   \n\n  ",
    "a" * 300, "1234567890", "\u2028\u2029 separators", "`code` **bold** # heading",
]


def random_content(rng):
    r = rng.random()
    if r < 0.5:
        return rng.choice(TEXTS)
    if r < 0.9:
        return "".join(rng.choice(TEXTS) for _ in range(1 + rng.randrange(4)))
    return "".join(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0xA0, 0x3000),
                                    rng.randrange(0x1F300, 0x1FAFF)]))
                   for _ in range(rng.randrange(80)))


def random_value(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice([random_content(rng), rng.randrange(-1000, 1000), True, False, None,
                           0.5, -2.25, 3.0, 1e-7, 1e21, 12345.678])
    if r < 0.6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["type", "name", "description", "properties", "required", "zeta", "alpha", "é", "中"]
    rng.shuffle(keys)
    return {k: random_value(rng, depth + 1) for k in keys[: rng.randrange(5)]}


def random_tools(rng):
    if rng.random() < 0.4:
        return None
    return [{"type": "function",
             "function": {"name": rng.choice(["get_weather", "search", "calc", "天气"]),
                          "description": random_content(rng),
                          "parameters": random_value(rng)}}
            for _ in range(rng.randrange(4))]


def random_conversation(rng, roles_extra=False):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": random_content(rng)})
    turns = rng.randrange(0 if msgs else 1, 9)
    role = "user"
    for _ in range(turns):
        msgs.append({"role": role, "content": random_content(rng)})
        r = rng.random()
        if roles_extra and r < 0.05:
            role = rng.choice(["tool", "developer", "narrator"])
        elif r < 0.9:
            role = "assistant" if role == "user" else "user"
    return msgs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--n", type=int, default=10000, help="conversations per template")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--out", default="/tmp/parity/template_mismatches.json")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--exe")
    args = ap.parse_args()

    import gguf  # the GGUF's own metadata, read in Python
    reader = gguf.GGUFReader(args.model)
    meta = lambda k: reader.fields[k].contents() if k in reader.fields else None
    tokens = meta("tokenizer.ggml.tokens")
    tok = lambda k: tokens[meta(k)] if meta(k) is not None else ""
    special = {"bos_token": tok("tokenizer.ggml.bos_token_id"),
               "eos_token": tok("tokenizer.ggml.eos_token_id"),
               "unk_token": tok("tokenizer.ggml.unknown_token_id"),
               "pad_token": tok("tokenizer.ggml.padding_token_id")}
    templates = {"gguf": (meta("tokenizer.chat_template"), None),
                 "chatml": (rust_chatml(), rust_chatml()),
                 "probe": (PROBE, PROBE),
                 "probe2": (PROBE2, PROBE2)}

    t0 = time.time()
    folio = Folio(args.model, build=not (args.no_build or args.exe), exe=args.exe)
    env = reference_env()
    rng = random.Random(args.seed)
    report, examples = {}, []
    for name, (source, sent) in templates.items():
        ref = env.from_string(source)
        reqs, wants = [], []
        for _ in range(args.n):
            msgs = random_conversation(rng, roles_extra=name.startswith("probe"))
            gen = rng.random() < 0.5
            tools = random_tools(rng) if name.startswith("probe") else (random_tools(rng) if rng.random() < 0.1 else None)
            try:
                want = ("text", ref.render(messages=msgs, tools=tools, documents=None,
                                           add_generation_prompt=gen, **special))
            except Exception as e:  # noqa: BLE001 (any refusal counts as an error)
                want = ("error", str(e))
            req = {"op": "render", "messages": msgs, "add_generation_prompt": gen, "tools": tools}
            if sent is not None:
                req["template"] = sent
            reqs.append(req)
            wants.append(want)
        answers = folio.batch(reqs)
        same = errors_both = 0
        for req, want, got in zip(reqs, wants, answers):
            kind = "text" if "text" in got else "error"
            if kind == want[0] == "text" and got["text"] == want[1]:
                same += 1
            elif kind == want[0] == "error":
                same += 1
                errors_both += 1
            else:
                if len(examples) < 200:
                    examples.append({"template": name, "messages": req["messages"],
                                     "add_generation_prompt": req["add_generation_prompt"],
                                     "tools": req["tools"], "jinja2": list(want),
                                     "folio": got})
        report[name] = {"conversations": len(reqs), "agree": same, "both_error": errors_both,
                        "mismatches": len(reqs) - same}
        log(f"{name}: {report[name]}")
    folio.close()
    elapsed = time.time() - t0
    total = sum(r["mismatches"] for r in report.values())
    print(f"\n{'template':10} {'conversations':>14} {'mismatches':>11} {'both errored':>13}")
    for name, r in report.items():
        print(f"{name:10} {r['conversations']:>14} {r['mismatches']:>11} {r['both_error']:>13}")
    print(f"time: {elapsed:.0f} s")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"report": report, "examples": examples}, f, ensure_ascii=False, indent=1)
    print(f"details: {args.out}")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
