#!/usr/bin/env python3
"""Speculative decoding over HTTP, folio against llama.cpp's n-gram lookup decoding.

One request at a time, greedy, on the replays and free chat of
scripts/spec_workloads.json (chat messages through each server's chat template):
`folio serve` with drafts and the same server with `"speculative": false`;
llama.cpp's `llama-server` with `--spec-type ngram-mod` (its newest draft-model-free
mode) and without. Every round runs the four in turn (the order rotates), with a fresh
`cache_salt` for folio per round and mode, so no prefix cache or draft history is
carried over. Decode tok/s = (completion tokens - 1) / (last chunk - first chunk) of
the stream, measured the same way for both servers. Prints a Markdown table.

    python3 scripts/bench_spec_servers.py --folio target/release/folio \
        --llama-server target/llama/build/bin/llama-server --reps 3
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, secs=120):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"a server exited early (code {proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    sys.exit(f"server on {port} never became ready")


def stream(port, body):
    """(completion tokens, decode seconds, text) of one streamed chat completion."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    first = last = None
    text, tokens = [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for c in ev.get("choices", []):
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(piece)
    if tokens is None or first is None:
        sys.exit(f"no usage or no content from port {port}")
    return tokens, max(last - first, 1e-9), "".join(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folio", default=os.path.join(ROOT, "target/release/folio"))
    ap.add_argument("--llama-server", default=os.environ.get("FOLIO_LLAMA_SERVER"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    work = json.load(open(os.path.join(ROOT, "scripts/spec_workloads.json")))
    cases = [(r["kind"], [r["message"]]) for r in work["replays"]] + [("free chat", work["chat"])]

    procs, servers = [], {}
    try:
        port = free_port()
        p = subprocess.Popen([a.folio, "serve", "--model", a.model, "--threads", str(a.threads),
                              "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        wait_ready(port, p)
        servers["folio auto"] = (port, {})
        servers["folio off"] = (port, {"speculative": False})
        if a.llama_server:
            for name, extra in [("llama.cpp ngram-mod", ["--spec-type", "ngram-mod"]), ("llama.cpp off", [])]:
                port = free_port()
                env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(a.llama_server))
                p = subprocess.Popen([a.llama_server, "-m", a.model, "-t", str(a.threads), "-c", "4096",
                                      "-np", "1", "--port", str(port), "-fa", "on", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                procs.append(p)
                wait_ready(port, p)
                servers[name] = (port, {})
        names = list(servers)
        rates = {(k, n): [] for k, _ in cases for n in names}
        texts = {}
        for rnd in range(a.reps):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for kind, messages in cases:
                for name in order:
                    port, extra = servers[name]
                    toks = secs = 0.0
                    for i, m in enumerate(messages):
                        body = {"messages": [{"role": "user", "content": m}], "max_tokens": a.max_tokens,
                                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                                **extra}
                        if name.startswith("folio"):
                            body["cache_salt"] = f"round-{rnd}-{name}"
                        n, s, text = stream(port, body)
                        toks += n - 1
                        secs += s
                        texts.setdefault((kind, i, name.split()[0]), set()).add(text)
                    rates[(kind, name)].append(toks / secs)
        llama_differs = 0
        for key, seen in texts.items():
            if len(seen) != 1 and key[2] == "folio":
                sys.exit(f"{key}: folio gave different texts with and without drafts")
            llama_differs += len(seen) != 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()

    med = {k: statistics.median(v) for k, v in rates.items()}
    head = "| workload | " + " | ".join(f"{n} tok/s" for n in names) + " | folio auto/off |"
    if a.llama_server:
        head += " llama.cpp ngram/off | folio auto / llama.cpp ngram |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    out = {}
    for kind, _ in cases:
        row = [f"{med[(kind, n)]:.1f}" for n in names]
        line = f"| {kind} | " + " | ".join(row) + f" | {med[(kind, 'folio auto')] / med[(kind, 'folio off')]:.2f}x |"
        if a.llama_server:
            line += (f" {med[(kind, 'llama.cpp ngram-mod')] / med[(kind, 'llama.cpp off')]:.2f}x |"
                     f" {med[(kind, 'folio auto')] / med[(kind, 'llama.cpp ngram-mod')]:.2f}x |")
        print(line)
        out[kind] = {n: {"median": med[(kind, n)], "rounds": rates[(kind, n)]} for n in names}
    print(f"(medians of {a.reps} rounds; greedy, {a.max_tokens} tokens at most, one request at a time;"
          f" folio's texts identical with and without drafts; llama.cpp's differed on {llama_differs}"
          f" of {sum(1 for k in texts if k[2] == 'llama.cpp')} requests)")
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
