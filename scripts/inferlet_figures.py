#!/usr/bin/env python3
"""The inferlet figures of docs/inferlets.md, against a running `folio serve`:
tokens/s of plain greedy generation through an inferlet (examples/inferlets/
generate.py) against the same prompt through /v1/completions, alternating.

usage: scripts/inferlet_figures.py URL GENERATE.wasm [ROUNDS] [MAX_TOKENS]
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
    max_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    post(f"{base}/v1/inferlets?name=figgen", open(wasm, "rb").read(), "application/wasm")
    # A prompt the model continues without an end-of-text (greedy: the same tokens
    # both ways).
    prompt = "Numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    inp = {"input": {"prompt": prompt, "max_tokens": max_tokens, "stream": False}}
    comp, inf = [], []
    for i in range(rounds + 1):
        t = time.perf_counter()
        c = post(f"{base}/v1/completions", json.dumps(body).encode())
        tc = time.perf_counter() - t
        t = time.perf_counter()
        r = post(f"{base}/v1/inferlets/figgen/run", json.dumps(inp).encode())
        ti = time.perf_counter() - t
        nc = c["usage"]["completion_tokens"]
        ni = [o["json"]["tokens"] for o in r["output"] if o["type"] == "json"][0]
        if i == 0:
            continue  # warm-up
        comp.append(nc / tc)
        inf.append(ni / ti)
        print(f"round {i}: completions {nc} tok in {tc*1e3:.0f} ms = {nc/tc:.1f} tok/s; "
              f"inferlet {ni} tok in {ti*1e3:.0f} ms = {ni/ti:.1f} tok/s "
              f"(instantiate {r['usage']['instantiate_ms']:.1f} ms)")
    mc, mi = sorted(comp)[len(comp) // 2], sorted(inf)[len(inf) // 2]
    print(f"median: completions {mc:.1f} tok/s, inferlet {mi:.1f} tok/s, ratio {mi/mc:.3f}")


if __name__ == "__main__":
    main()
