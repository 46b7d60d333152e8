#!/usr/bin/env python3
"""folio replicas behind a router on a multi-turn chat replay (issue 41's benchmark).

Many users chat at once (arriving --arrival-ms apart), each conversation growing turn by turn: every turn sends the
whole conversation so far (a short shared system prompt, the user's turns, the model's
own earlier answers) and waits for the answer before the next. Greedy, short
max_tokens, the same replay for every mode, so every mode computes the same tokens.
Modes, each on a fresh cluster from scripts/cluster.sh (empty caches), in turn each
round (the order rotates):

  single       one `folio serve` replica, one thread, asked directly
  cache_aware  2 replicas (one thread each) behind smg --policy cache_aware
  sticky       2 replicas behind smg --policy cache_aware with sticky sessions
               (`cluster.sh up --sticky`, docs/cluster.md's advice for chat): each
               conversation's id in X-SMG-Routing-Key, new ones to the replica with
               fewest requests in flight
  round_robin  2 replicas (one thread each) behind smg --policy round_robin
  nginx        2 replicas behind nginx, consistent hash of the first turn
  split        2 replicas asked directly (no router), user u on replica u % 2: the
               even, sticky split a router should approach
  POLICY       (with --modes) 2 replicas behind smg --policy POLICY; POLICY+--flag=value
               adds smg flags for that mode alone (cache_aware+--cache-threshold=0.5)

Figures per mode (medians over rounds): the aggregate prefix-cache hit rate (the sum
over replicas of vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in
tokens, read from each replica's /metrics after the replay), TTFT p50 and p90 of the
streamed requests (send to first content), throughput (completion tokens / replay
wall time) and requests per second; where the CPU went (CPU seconds per 1000
completion tokens of the replicas, the router and this client, and the share of the
machine busy); then the ratios to `single` with issue 41's targets (hit rate >= 0.9x,
TTFT p50 <= 1.1x, throughput >= 1.8x). Prints Markdown.

    python3 scripts/bench_cluster.py --reps 3 [--model models/gemma-3-270m-q4_k_m.gguf]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")

SYSTEM = "You are a concise assistant. Answer in two or three short sentences."
TOPICS = [
    "the water cycle", "how bicycles stay upright", "why owls hunt at night",
    "glaciers and sea level", "how a piano makes sound", "lighthouse keepers",
    "cactus adaptations", "geostationary satellites", "honeybee dances",
    "desert night temperatures", "submarine ballast tanks", "violin strings",
    "comet tails", "old-growth forests", "suspension bridges", "tide pools",
    "volcanic islands", "paper making", "the first railways", "coral reefs",
    "sourdough starters", "wind turbines", "migratory birds", "ancient libraries",
]
FOLLOW_UPS = [
    "Why does that happen?",
    "Give me one concrete example.",
    "What is a common misconception about it?",
    "How would you explain it to a child?",
    "What changed about it in the last century?",
    "Summarize everything so far in one sentence.",
    "What should I read next about it?",
    "Name one number worth remembering about it.",
]


def first_turn(user):
    topic = TOPICS[user % len(TOPICS)]
    return f"User {user} here. I am curious about {topic}. Tell me the basics of {topic}."


def cluster(run_dir, *args):
    env = dict(os.environ, FOLIO_CLUSTER_DIR=run_dir)
    out = subprocess.run([CLUSTER, *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"cluster.sh {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def read(path):
    with open(path) as f:
        return f.read().strip()


def metric_sum(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


TICK = os.sysconf("SC_CLK_TCK")


def session_cpu(sid):
    """CPU seconds (user + system) of every live process in session SID: a replica, or
    the router with its workers (cluster.sh starts each with setsid)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # session id, after state, ppid, pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def machine_cpu():
    """(busy, total) CPU seconds of the whole machine so far."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / TICK, sum(ticks) / TICK


def stream_chat(port, messages, max_tokens, conversation):
    """(ttft seconds, completion tokens, answer text) of one streamed chat turn. The
    conversation's id goes in smg's routing-key header, which only smg's sticky modes
    read (--sticky-sessions, the manual policy)."""
    body = {
        "model": "folio",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-SMG-Routing-Key": conversation},
    )
    t0 = time.perf_counter()
    first = None
    text, tokens, chunks = [], None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ev.get("error"):
                raise RuntimeError(f"error event: {data}")
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for c in ev.get("choices", []):
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    chunks += 1
                    text.append(piece)
    if first is None:
        raise RuntimeError("no content in the stream")
    return first - t0, tokens if tokens is not None else chunks, "".join(text)


def replay(ports, users, turns, max_tokens, arrival):
    """Every user's conversation, user u starting u * arrival seconds in and sent to
    ports[u % len(ports)]; (ttfts, completion tokens, seconds, answers)."""
    ttfts, tokens, answers, errors = [], [0], {}, []
    lock = threading.Lock()

    def user(u):
        time.sleep(u * arrival)
        messages = [{"role": "system", "content": SYSTEM}]
        for t in range(turns):
            ask = first_turn(u) if t == 0 else FOLLOW_UPS[(u + t - 1) % len(FOLLOW_UPS)]
            messages.append({"role": "user", "content": ask})
            try:
                ttft, n, text = stream_chat(ports[u % len(ports)], messages, max_tokens, f"user-{u}")
            except Exception as e:  # noqa: BLE001 - reported, the mode fails
                with lock:
                    errors.append(f"user {u} turn {t}: {e}")
                return
            messages.append({"role": "assistant", "content": text})
            with lock:
                ttfts.append(ttft)
                tokens[0] += n
                answers[(u, t)] = text

    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = time.perf_counter() - t0
    if errors:
        sys.exit("requests failed:\n" + "\n".join(errors[:10]))
    return ttfts, tokens[0], secs, answers


def run_mode(mode, args):
    # POLICY+--flag=value+...: that smg policy with these flags besides --smg-args.
    mode, *flags = mode.split("+")
    # sticky: cache_aware with `cluster.sh up --sticky` (docs/cluster.md's advice for chat).
    sticky = ["--sticky"] if mode == "sticky" else []
    replicas = 1 if mode == "single" else 2
    policy = "cache_aware" if sticky else mode
    router_kind = {"nginx": "nginx", "single": "none", "split": "none"}.get(mode, "smg")
    with tempfile.TemporaryDirectory(prefix=f"folio-cluster-{mode}-") as run_dir:
        extra = []
        if router_kind == "smg":
            for a in args.smg_args.split() + [p for f in flags for p in f.split("=", 1)]:
                extra += ["--router-arg", a]
        cluster(run_dir, "up", "--replicas", str(replicas), "--router", router_kind,
                *(["--policy", policy] if router_kind == "smg" else []), "--port", "0", "--threads", "1",
                *sticky, *extra)
        try:
            ports = [read(os.path.join(run_dir, f"replica-{i}.port")) for i in range(replicas)]
            router = [w.split("=", 1)[1] for w in read(os.path.join(run_dir, "cluster.env")).split()
                      if w.startswith("ROUTER_PORT=")][0]
            direct = router_kind == "none"
            sids = {"replicas": [int(read(os.path.join(run_dir, f"replica-{i}.pid"))) for i in range(replicas)],
                    "router": [] if direct else [int(read(os.path.join(run_dir, "router.pid")))]}
            before = {k: sum(session_cpu(s) for s in v) for k, v in sids.items()}
            client0, machine0 = os.times(), machine_cpu()
            ttfts, tokens, secs, answers = replay(ports if direct else [router], args.users, args.turns, args.max_tokens,
                                                   args.arrival_ms / 1000)
            client1, machine1 = os.times(), machine_cpu()
            cpu = {k: sum(session_cpu(s) for s in v) - before[k] for k, v in sids.items()}
            cpu["client"] = (client1.user + client1.system) - (client0.user + client0.system)
            busy = (machine1[0] - machine0[0]) / (machine1[1] - machine0[1])
            hits = sum(metric_sum(p, "vllm:prefix_cache_hits_total") for p in ports)
            queries = sum(metric_sum(p, "vllm:prefix_cache_queries_total") for p in ports)
            served = [metric_sum(p, "folio:request_success_total") for p in ports]
        finally:
            cluster(run_dir, "down")
    ttfts.sort()
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p90": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        "tok_s": tokens / secs,
        "req_s": len(ttfts) / secs,
        "secs": secs,
        "served": served,
        # CPU seconds per 1000 completion tokens, by part, and the machine's busy share.
        "cpu_per_1k": {k: 1000 * v / tokens for k, v in cpu.items()},
        "busy": busy,
        "answers": answers,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF for every replica (default: cluster.sh's, the default model)")
    ap.add_argument("--users", type=int, default=48)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--arrival-ms", type=float, default=0,
                    help="user u starts u times this after the first (0: all at once)")
    ap.add_argument("--reps", type=int, default=3, help="rounds; every mode runs once a round")
    ap.add_argument("--modes", default="single,cache_aware,sticky,round_robin,nginx,split",
                    help="single, sticky, nginx, split, or any smg policy (2 replicas behind it)")
    ap.add_argument("--smg-args", default="", help="more smg flags for the 2-replica modes")
    ap.add_argument("--json", help="also write every round's figures here")
    args = ap.parse_args()
    if args.model:
        os.environ["FOLIO_MODEL"] = os.path.abspath(args.model)
    modes = args.modes.split(",")
    rounds = {m: [] for m in modes}
    reference = None
    for r in range(args.reps):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for m in order:
            fig = run_mode(m, args)
            # Greedy and the same replay: every mode must give the same answers.
            if reference is None:
                reference = fig["answers"]
            elif fig["answers"] != reference:
                diff = [k for k in reference if fig["answers"].get(k) != reference[k]]
                print(f"warning: {m} answered {len(diff)} turns differently, e.g. {diff[:3]}",
                      file=sys.stderr)
            del fig["answers"]
            rounds[m].append(fig)
            print(f"round {r + 1} {m}: hit {fig['hit_rate']:.3f} ttft p50 {fig['ttft_p50'] * 1000:.0f} ms "
                  f"{fig['tok_s']:.1f} tok/s {fig['req_s']:.2f} req/s in {fig['secs']:.1f} s, "
                  f"requests per replica {[int(s) for s in fig['served']]}; CPU s per 1k tokens "
                  f"{ {k: round(v, 2) for k, v in fig['cpu_per_1k'].items()} }, machine busy {fig['busy']:.0%}",
                  file=sys.stderr)

    def med(m, k):
        return statistics.median(f[k] for f in rounds[m])

    load = os.getloadavg()
    print(f"{os.path.basename(os.environ.get('FOLIO_MODEL', 'the default model'))}: "
          f"{args.users} users x {args.turns} turns, one arriving every {args.arrival_ms:g} ms, "
          f"max_tokens {args.max_tokens}, greedy, streamed; {args.reps} round(s), modes in turn; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print("| mode | prefix-hit rate | TTFT p50 (ms) | TTFT p90 (ms) | completion tok/s | req/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in modes:
        print(f"| {m} | {med(m, 'hit_rate'):.3f} | {med(m, 'ttft_p50') * 1000:.0f} | "
              f"{med(m, 'ttft_p90') * 1000:.0f} | {med(m, 'tok_s'):.1f} | {med(m, 'req_s'):.2f} |")
    print("\nWhere the CPU went: CPU seconds per 1000 completion tokens (user + system, medians) and the "
          "share of the machine's cores busy during the replay.\n")
    print("| mode | replicas | router | client | machine busy |")
    print("|---|---:|---:|---:|---:|")
    for m in modes:
        part = {k: statistics.median(f["cpu_per_1k"][k] for f in rounds[m]) for k in ("replicas", "router", "client")}
        print(f"| {m} | {part['replicas']:.2f} | {part['router']:.2f} | {part['client']:.2f} | "
              f"{med(m, 'busy'):.0%} |")
    if "single" in modes:
        print("\n| vs single | hit rate (target >= 0.9x) | TTFT p50 (<= 1.1x) | throughput (>= 1.8x) |")
        print("|---|---:|---:|---:|")
        base = {k: med("single", k) for k in ("hit_rate", "ttft_p50", "tok_s")}
        for m in modes:
            if m == "single":
                continue
            hr = med(m, "hit_rate") / base["hit_rate"] if base["hit_rate"] else float("nan")
            print(f"| {m} | {hr:.2f}x | {med(m, 'ttft_p50') / base['ttft_p50']:.2f}x | "
                  f"{med(m, 'tok_s') / base['tok_s']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds, "loadavg": load}, f, indent=1)


if __name__ == "__main__":
    main()
