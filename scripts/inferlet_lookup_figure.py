#!/usr/bin/env python3
"""Prompt-lookup decoding as an inferlet (examples/inferlets/lookup.py: each draft
checked in one `score` pass) against plain greedy decoding of the same prompt
through /v1/completions with the server's own speculation off, on a prompt whose
continuation repeats it, against a running `folio serve`; alternating, one warm-up
round. The texts must be the same.

usage: scripts/inferlet_lookup_figure.py URL LOOKUP.wasm [ROUNDS] [MAX_TOKENS]
"""

import json
import sys
import time
import urllib.request


def post(url, body, ctype="application/json"):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    base, wasm = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 96
    post(f"{base}/v1/inferlets?name=figlookup", open(wasm, "rb").read(), "application/wasm")
    code = (
        "def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
        "def describe(width, height):\n    return f'{width}x{height}'\n"
    )
    plain, spec = [], []
    for i in range(rounds + 1):
        # A new salt-free prompt each round (a number in front): no reuse between rounds.
        prompt = f"# round {i}\n{code}\nThe same code with `width` renamed to `w`:\n\n"
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "speculative": False}
        t = time.perf_counter()
        c = post(f"{base}/v1/completions", json.dumps(body).encode())
        tc = time.perf_counter() - t
        inp = {"input": {"prompt": prompt, "max_tokens": max_tokens, "ngram": 3, "draft": 8}}
        t = time.perf_counter()
        r = post(f"{base}/v1/inferlets/figlookup/run", json.dumps(inp).encode())
        ti = time.perf_counter() - t
        out = [o["json"] for o in r["output"] if o["type"] == "json"][-1]
        same = out["text"] == c["choices"][0]["text"]
        n = c["usage"]["completion_tokens"]
        if i == 0:
            continue
        plain.append(n / tc)
        spec.append(out["tokens"] / ti)
        print(f"round {i}: greedy {n} tok {n/tc:.1f} tok/s; lookup inferlet {out['tokens']} tok "
              f"in {out['passes']} passes ({out['accepted']}/{out['drafted']} drafted accepted) "
              f"{out['tokens']/ti:.1f} tok/s; same text: {same}")
    mp, ms = sorted(plain)[len(plain) // 2], sorted(spec)[len(spec) // 2]
    print(f"median: greedy {mp:.1f} tok/s, lookup inferlet {ms:.1f} tok/s, ratio {ms/mp:.2f}")


if __name__ == "__main__":
    main()
