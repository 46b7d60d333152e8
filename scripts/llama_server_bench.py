#!/usr/bin/env python3
"""llama.cpp's own server under the load `folio bench --serve-figures` puts on folio.

Starts `llama-server` (built from the llama.cpp sources in llama-cpp-python's source
distribution) with 16 parallel slots on 127.0.0.1, then runs 16 client threads, each
sending requests with 64 output tokens (ignore_eos, greedy): once with distinct
100-token prompts and once with prompts sharing a 1000-token prefix. Prints one JSON
object: output tok/s and TTFT p50/p95 for each. Standard library only.

    python3 scripts/llama_server_bench.py --server PATH/llama-server --model M.gguf --threads 2
"""

import argparse
import json
import random
import subprocess
import threading
import time
import urllib.request


def post_stream(url, body):
    """Sends a streaming completion; returns (ttft seconds, tokens received)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.time()
    first, n = None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            msg = json.loads(line[6:])
            if msg.get("content") is not None and not msg.get("stop"):
                if first is None:
                    first = time.time() - t0
                n += 1
            if msg.get("stop"):
                break
    return first or 0.0, n


def run(url, prompts, clients, max_tokens):
    queue = list(prompts)
    lock = threading.Lock()
    ttfts, total = [], [0]

    def client():
        while True:
            with lock:
                if not queue:
                    return
                p = queue.pop()
            body = {"prompt": p, "n_predict": max_tokens, "stream": True, "ignore_eos": True,
                    "temperature": 0.0, "cache_prompt": True}
            ttft, n = post_stream(url, body)
            with lock:
                ttfts.append(ttft)
                total[0] += n

    t0 = time.time()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    ttfts.sort()
    pct = lambda p: ttfts[max(0, int(len(ttfts) * p + 0.999999) - 1)]
    return {"output_tok_s": total[0] / wall, "ttft_p50": pct(0.5), "ttft_p95": pct(0.95)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18931)
    ap.add_argument("--clients", type=int, default=16)
    args = ap.parse_args()
    n = args.clients
    ctx = n * 1200
    proc = subprocess.Popen(
        [args.server, "-m", args.model, "--host", "127.0.0.1", "--port", str(args.port), "-np", str(n),
         "-c", str(ctx), "-t", str(args.threads), "-tb", str(args.threads), "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{args.port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.2)
        rng = random.Random(7)
        ids = lambda k: [rng.randrange(1000, 20000) for _ in range(k)]
        prefix = ids(1000)
        distinct = [ids(100) for _ in range(n)]
        shared = [prefix + ids(100) for _ in range(n)]
        out = {
            "distinct": run(base + "/completion", distinct, n, 64),
            "shared": run(base + "/completion", shared, n, 64),
            "clients": n,
        }
        print(json.dumps(out))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
