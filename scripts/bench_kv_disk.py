#!/usr/bin/env python3
"""The disk tier's time to first token: a long prompt's prefix read back from disk after a restart, against computing it cold.

Each round, alternating:
  cold  a server started with an empty --kv-disk directory answers the prompt (prefill);
  disk  a server restarted (after SIGKILL) on a directory that holds the prompt's pages
        answers it again: its prefix is read back from disk.
Both servers run the same flags. Time to first token is measured on the client over a
streamed /v1/completions (greedy); the two answers must be byte-identical. With
--drop-caches (root) the OS page cache is dropped before each disk run, so the pages
come from the device, not from memory.

  scripts/bench_kv_disk.py [--tokens 4000] [--rounds 3] [--drop-caches]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(a, disk):
    port = free_port()
    p = subprocess.Popen(
        [a.folio, "serve", "--model", a.model, "--threads", str(a.threads), "--port", str(port),
         "--ctx", str(a.ctx), "--kv-disk", disk],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 120
    while time.time() < end:
        if p.poll() is not None:
            sys.exit(f"the server exited early (code {p.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return p, port
        except Exception:
            pass
        time.sleep(0.2)
    sys.exit("the server never became ready")


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def ask(port, prompt, max_tokens):
    """(seconds to the first token, text, cached prompt tokens) of one streamed completion."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, text, cached = None, [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            ev = json.loads(line[5:])
            for c in ev.get("choices", []):
                if c.get("text"):
                    first = first or time.perf_counter()
                    text.append(c["text"])
            if ev.get("usage"):
                cached = ev["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    return first - t0, "".join(text), cached


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folio", default=os.path.join(ROOT, "target/release/folio"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    prompt = [100 + (i * 7919) % 40000 for i in range(a.tokens)]
    work = tempfile.mkdtemp(prefix="folio-kv-disk-bench-")
    warm_dir = os.path.join(work, "warm")
    try:
        # Fill the disk directory once: the prompt's pages written behind, then SIGKILL.
        p, port = start(a, warm_dir)
        ask(port, prompt, a.max_tokens)
        want = (a.tokens - 1) // 16
        end = time.time() + 60
        while metric(port, "folio:kv_disk_pages") < want and time.time() < end:
            time.sleep(0.1)
        kill(p)
        rows = {"cold": [], "disk": []}
        texts = {}
        for r in range(a.rounds):
            for kind in ("cold", "disk"):
                d = os.path.join(work, f"cold{r}") if kind == "cold" else warm_dir
                if kind == "disk" and a.drop_caches:
                    subprocess.run(["sync"], check=True)
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("3\n")
                p, port = start(a, d)
                ttft, text, cached = ask(port, prompt, a.max_tokens)
                read = metric(port, "folio:kv_disk_read_seconds_total")
                kill(p)
                if kind == "cold":
                    shutil.rmtree(d, ignore_errors=True)
                texts.setdefault(kind, text)
                if text != texts["cold"]:
                    sys.exit(f"round {r}: the {kind} answer differs from the cold one")
                rows[kind].append((ttft, cached, read))
                print(f"round {r} {kind:4}: TTFT {ttft * 1000:8.1f} ms, cached {cached} tokens, "
                      f"disk read {read * 1000:.1f} ms", flush=True)
        cold = statistics.median(x[0] for x in rows["cold"])
        disk = statistics.median(x[0] for x in rows["disk"])
        print(f"\n{a.tokens}-token prompt, median of {a.rounds}: cold {cold * 1000:.1f} ms, "
              f"from disk after a restart {disk * 1000:.1f} ms = {disk / cold * 100:.1f}% of cold "
              f"({'page cache dropped' if a.drop_caches else 'page cache warm'}); answers byte-identical")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"tokens": a.tokens, "cold_ms": cold * 1000, "disk_ms": disk * 1000,
                           "ratio": disk / cold, "drop_caches": a.drop_caches, "rounds": rows}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
