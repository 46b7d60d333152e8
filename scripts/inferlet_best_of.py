#!/usr/bin/env python3
"""Best-of-n as an inferlet (examples/inferlets/best_of_n.py: forks of one prefilled
question, all candidates generated at once with generate_all) against the same n
samples through `/v1/chat/completions` with `n`, against a running `folio serve`,
alternating, one warm-up round. The inferlet runs twice a round: ranking by mean
log-probability alone (the same work as `n`) and with its judge pass (n more forward
passes over a grading prompt, which a client would pay n more requests for).

usage: scripts/inferlet_best_of.py URL BEST_OF_N.wasm [ROUNDS] [N] [MAX_TOKENS]
"""

import json
import sys
import time
import urllib.request


def post(url, body, ctype="application/json"):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": ctype}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def median(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    base, wasm = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    max_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 32
    post(f"{base}/v1/inferlets?name=figbest", open(wasm, "rb").read(), "application/wasm")
    times = {"n": [], "inferlet": [], "inferlet+judge": []}
    for i in range(rounds + 1):
        # A new question each round: no round reuses another's prefix.
        q = f"Name a primary colour and say why, in round {i}."
        body = {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                {"role": "user", "content": q},
            ],
            "n": n,
            "max_tokens": max_tokens,
            "temperature": 0.8,
            "seed": 1000 + i,
        }
        t = time.perf_counter()
        c = post(f"{base}/v1/chat/completions", json.dumps(body).encode())
        tn = time.perf_counter() - t
        got = {"n": (tn, c["usage"]["completion_tokens"])}
        for key, judge in (("inferlet", False), ("inferlet+judge", True)):
            inp = {"input": {"prompt": q, "n": n, "max_tokens": max_tokens, "judge": judge}}
            t = time.perf_counter()
            r = post(f"{base}/v1/inferlets/figbest/run", json.dumps(inp).encode())
            ti = time.perf_counter() - t
            cands = [o["json"] for o in r["output"] if o["type"] == "json" and "candidate" in o["json"]]
            assert len(cands) == n, r
            got[key] = (ti, len(cands))
        if i == 0:
            continue  # warm-up
        line = []
        for k, (t, _) in got.items():
            times[k].append(t)
            line.append(f"{k} {t*1e3:.0f} ms")
        print(f"round {i}: " + ", ".join(line) + f" ({c['usage']['completion_tokens']} tokens for n)")
    mn = median(times["n"])
    out = ", ".join(f"{k} {median(v)*1e3:.0f} ms ({mn/median(v):.2f}x n)" for k, v in times.items())
    print(f"median of {rounds}: {out}")


if __name__ == "__main__":
    main()
