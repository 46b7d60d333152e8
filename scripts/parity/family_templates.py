#!/usr/bin/env python3
"""The model families' chat templates rendered by folio (minijinja) against Python's
jinja2 set up as transformers sets it (template_parity.reference_env), on random
conversations with system, user, assistant and tool messages, tool calls and `tools`.

    nice -n 19 /work/llama/venv/bin/python scripts/parity/family_templates.py [--n 2000]
    /work/llama/venv/bin/python scripts/parity/family_templates.py --write-fixture

The templates are the model publishers' (copies under crates/folio/tests/fixtures/
templates/, taken from llama.cpp's models/templates/). `strftime_now` is pinned to
2025-01-15 10:20:30 on both sides (folio's `ChatTemplate::with_now`), so dates agree.

--write-fixture writes crates/folio/tests/fixtures/family_templates.json (a few
conversations per template and jinja2's text or error), checked by
crates/folio/tests/it/family_templates.rs.
"""

import argparse
import datetime
import json
import os
import random
import string
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import template_parity as tp  # noqa: E402
from common import DEFAULT_MODEL, ROOT, Folio, log  # noqa: E402

TEMPLATES = os.path.join(ROOT, "crates", "folio", "tests", "fixtures", "templates")
OUT = os.path.join(ROOT, "crates", "folio", "tests", "fixtures", "family_templates.json")
NOW = datetime.datetime(2025, 1, 15, 10, 20, 30)
NOW_EPOCH = int(NOW.replace(tzinfo=datetime.timezone.utc).timestamp())

# template file → (bos_token, eos_token) as the family's GGUF names them.
FAMILIES = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("<|endoftext|>", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("<|endoftext|>", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
}


def reference_env():
    env = tp.reference_env()
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def call_id(rng):
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(9))


def random_arguments(rng):
    args = {rng.choice(["location", "query", "expr", "城市"]): tp.random_content(rng)[:40]
            for _ in range(rng.randrange(3))}
    if rng.random() < 0.3:
        args["n"] = rng.randrange(100)
    # transformers passes a dict; OpenAI clients send a JSON string.
    return args if rng.random() < 0.7 else json.dumps(args, ensure_ascii=False)


def assistant_text(rng):
    text = tp.random_content(rng)
    if rng.random() < 0.15:
        text = f"<think>\n{tp.random_content(rng)}\n</think>\n\n{text}"
    return text


def family_conversation(rng, tools):
    """System (sometimes), then turns of user / assistant, with tool calls and tool
    results when there are tools; now and then a role out of place."""
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": tp.random_content(rng)})
    turns = 1 + rng.randrange(4)
    for t in range(turns):
        msgs.append({"role": "user", "content": tp.random_content(rng)})
        if tools and rng.random() < 0.5:
            calls = []
            for _ in range(1 + (rng.random() < 0.3)):
                tool = rng.choice(tools)["function"]
                calls.append({"id": call_id(rng), "type": "function",
                              "function": {"name": tool["name"], "arguments": random_arguments(rng)}})
            msgs.append({"role": "assistant", "content": "", "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": json.dumps({"result": tp.random_content(rng)[:30]}, ensure_ascii=False)})
        if t + 1 < turns or rng.random() < 0.3:
            msgs.append({"role": "assistant", "content": assistant_text(rng)})
    if rng.random() < 0.05 and msgs:
        i = rng.randrange(len(msgs))
        msgs[i] = dict(msgs[i], role=rng.choice(["user", "assistant", "narrator"]))
    return msgs


def family_tools(rng):
    if rng.random() < 0.5:
        return None
    tools = tp.random_tools(rng)
    return tools or None


# Tool-use variants: transformers renders them only when the request has tools (a
# tokenizer's named "tool_use" template), and they iterate `tools` unguarded.
TOOLS_ONLY = {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"}


def cases_for(rng, n, tools_only=False):
    out = []
    for _ in range(n):
        tools = family_tools(rng)
        while tools_only and not tools:
            tools = family_tools(rng)
        out.append((family_conversation(rng, tools), rng.random() < 0.6, tools))
    return out


def render_reference(env, source, bos, eos, msgs, gen, tools):
    try:
        return {"text": env.from_string(source).render(
            messages=msgs, tools=tools, add_generation_prompt=gen, bos_token=bos, eos_token=eos)}
    except Exception as e:  # noqa: BLE001 (any refusal counts as an error)
        return {"error": str(e)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="conversations per template")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--write-fixture", action="store_true")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", default="/tmp/parity/family_template_mismatches.json")
    args = ap.parse_args()

    env = reference_env()
    rng = random.Random(args.seed)
    if args.write_fixture:
        fixture = {"about": "The families' chat templates (tests/fixtures/templates/) rendered by "
                            "Python's jinja2 set up as transformers renders chat templates, "
                            f"strftime_now pinned to {NOW.isoformat()} (epoch {NOW_EPOCH}). Made "
                            "by scripts/parity/family_templates.py --write-fixture; checked by "
                            "crates/folio/tests/it/family_templates.rs.",
                   "now": NOW_EPOCH, "cases": []}
        for name, (bos, eos) in FAMILIES.items():
            source = open(os.path.join(TEMPLATES, name)).read()
            fixed = [([{"role": "user", "content": "hi"}], True, None),
                     ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "日本語 😀"},
                       {"role": "assistant", "content": "ok"}, {"role": "user", "content": "\n x \n"}], False, None)]
            if name in TOOLS_ONLY:
                fixed = [(m, g, cases_for(random.Random(1), 1, True)[0][2]) for m, g, _ in fixed]
            for msgs, gen, tools in fixed + cases_for(rng, 10, name in TOOLS_ONLY):
                fixture["cases"].append({"template": name, "bos_token": bos, "eos_token": eos,
                                         "messages": msgs, "add_generation_prompt": gen, "tools": tools,
                                         **render_reference(env, source, bos, eos, msgs, gen, tools)})
        with open(OUT, "w") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=0)
            f.write("\n")
        errors = sum(1 for c in fixture["cases"] if "error" in c)
        print(f"{OUT}: {len(fixture['cases'])} cases ({errors} refused by the template)")
        return

    t0 = time.time()
    folio = Folio(DEFAULT_MODEL, build=not args.no_build)
    report, examples = {}, []
    for name, (bos, eos) in FAMILIES.items():
        source = open(os.path.join(TEMPLATES, name)).read()
        reqs, wants = [], []
        for msgs, gen, tools in cases_for(rng, args.n, name in TOOLS_ONLY):
            wants.append(render_reference(env, source, bos, eos, msgs, gen, tools))
            reqs.append({"op": "render", "messages": msgs, "add_generation_prompt": gen, "tools": tools,
                         "template": source, "bos_token": bos, "eos_token": eos, "now": NOW_EPOCH})
        answers = folio.batch(reqs)
        same = both_err = 0
        for req, want, got in zip(reqs, wants, answers):
            if "text" in want and got.get("text") == want["text"]:
                same += 1
            elif "error" in want and "error" in got:
                same += 1
                both_err += 1
            elif len(examples) < 300:
                examples.append({"template": name, "messages": req["messages"], "tools": req["tools"],
                                 "add_generation_prompt": req["add_generation_prompt"],
                                 "jinja2": want, "folio": got})
        report[name] = {"conversations": len(reqs), "mismatches": len(reqs) - same, "both_error": both_err}
        log(f"{name}: {report[name]}")
    folio.close()
    print(f"\n{'template':52} {'conversations':>13} {'mismatches':>10} {'both errored':>12}")
    for name, r in report.items():
        print(f"{name:52} {r['conversations']:>13} {r['mismatches']:>10} {r['both_error']:>12}")
    print(f"time: {time.time() - t0:.0f} s")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"report": report, "examples": examples}, f, ensure_ascii=False, indent=1)
    print(f"details: {args.out}")
    sys.exit(1 if any(r["mismatches"] for r in report.values()) else 0)


if __name__ == "__main__":
    main()
