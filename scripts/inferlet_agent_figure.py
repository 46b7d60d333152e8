#!/usr/bin/env python3
"""The agent figure of docs/inferlets.md, against a running `folio serve`: the
calculator loop of examples/inferlets/agent.py run as an inferlet, against the same
loop driven by a client over HTTP (/v1/chat/completions with the whole history each
turn, the tool calls under the same regex). Reports latency and tokens prefilled
(the client's: prompt tokens not found in the prefix cache; the inferlet's: its one
context's final length, each token computed once). Each round uses a new order of
the items, so no round reuses another's pages.

usage: scripts/inferlet_agent_figure.py URL AGENT.wasm [ROUNDS]
"""

import json
import sys
import time
import urllib.request

PRICES = {"apples": 3, "pears": 5, "plums": 7, "figs": 11, "kiwis": 13, "limes": 17}
ITEMS = ["apples", "pears", "plums", "figs", "kiwis", "limes"]


def post(url, body, ctype="application/json"):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def client_loop(base, items, salt):
    msgs = [
        {"role": "system", "content": "You are a careful accountant. Use the calculator for every addition."},
        {"role": "user", "content": "Add up the prices of: " + ", ".join(items) + ". Use calc(a + b), one addition per step."},
        {"role": "assistant", "content": f"lookup({items[0]}) = {PRICES[items[0]]}"},
    ]
    prefilled = 0

    def chat(regex):
        nonlocal prefilled
        r = post(f"{base}/v1/chat/completions", json.dumps({
            "messages": msgs, "max_tokens": 24, "temperature": 0, "guided_regex": regex,
            "cache_salt": salt,
        }).encode())
        u = r["usage"]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        prefilled += u["prompt_tokens"] - cached
        text = r["choices"][0]["message"]["content"]
        msgs.append({"role": "assistant", "content": text})
        return text

    steps = 0
    for item in items[1:]:
        msgs.append({"role": "user", "content": f"lookup({item}) = {PRICES[item]}. Next step."})
        call = chat(r"calc\([0-9]{1,5} \+ [0-9]{1,5}\)")
        a, _, b = call[len("calc("):-1].split()
        msgs.append({"role": "user", "content": f"calc({a} + {b}) = {int(a) + int(b)}"})
        steps += 1
    msgs.append({"role": "user", "content": "What is the total?"})
    chat(r"The total is [0-9]{1,6}\.")
    return steps, prefilled


def main():
    base, wasm = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    post(f"{base}/v1/inferlets?name=figagent", open(wasm, "rb").read(), "application/wasm")
    ti, tc = [], []
    for i in range(rounds + 1):
        # A new order each round, so no round finds the last one's pages; the
        # client's turns share a salt of their own (its prefix cache works within
        # the round, as a client's would).
        items = ITEMS[i % len(ITEMS):] + ITEMS[:i % len(ITEMS)]
        inp = json.dumps({"input": {"items": items, "max_steps": 8}}).encode()
        t = time.perf_counter()
        r = post(f"{base}/v1/inferlets/figagent/run", inp)
        a = time.perf_counter() - t
        out = [o["json"] for o in r["output"] if o["type"] == "json"]
        isteps, itoks = out[-1]["steps"], out[-1]["context_tokens"]
        t = time.perf_counter()
        csteps, ctoks = client_loop(base, items, f"client-{i}")
        c = time.perf_counter() - t
        if i == 0:
            continue  # warm-up
        ti.append(a)
        tc.append(c)
        print(f"round {i}: inferlet {isteps} tool steps in {a*1e3:.0f} ms, {itoks} tokens prefilled; "
              f"client over HTTP {csteps} steps in {c*1e3:.0f} ms, {ctoks} tokens prefilled")
    mi, mc = sorted(ti)[len(ti) // 2], sorted(tc)[len(tc) // 2]
    print(f"median: inferlet {mi*1e3:.0f} ms, client {mc*1e3:.0f} ms, speed-up {mc/mi:.2f}x")


if __name__ == "__main__":
    main()
