"""A KV-event subscriber for `folio serve --kv-events` (vLLM's wire format, `vllm`
keys), driven by crates/folio-server/tests/http/kv_events.rs.

It binds a SUB socket on a free loopback port and prints `PORT <n>`; the server
connects to it. It records every message until the test writes one JSON line on
stdin: {"block_size", "seed", "indexed" (pages /v1/kv shows indexed), "prompts"
(token lists), "matched" (/v1/cache/match's cached_tokens for each)}. It then drains
what is left and checks:

  (a) every BlockStored key is reproduced from its token ids and parent the way vLLM
      computes sha256_cbor keys (cbor2, canonical; NONE_HASH from the seed);
  (b) sequence numbers run 0, 1, 2, ... with no gap, and the topic is constant;
  (c) the keys stored minus those removed (after the last AllBlocksCleared) are as
      many as the pages /v1/kv shows indexed, and for each prompt the run of its
      leading keys in that set covers the pages /v1/cache/match reports.

Prints `OK ...` and exits 0, or names the first failure and exits 1.
"""

import hashlib
import json
import sys
import threading

import cbor2
import msgpack
import zmq


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def low64(digest):
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def fail(msg):
    print("FAIL " + msg, flush=True)
    sys.exit(1)


def main():
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    print(f"PORT {port}", flush=True)

    done = threading.Event()
    spec = {}

    def read_stdin():
        line = sys.stdin.readline()
        spec.update(json.loads(line))
        done.set()

    threading.Thread(target=read_stdin, daemon=True).start()

    messages = []
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    quiet_after_done = 0
    while True:
        if poller.poll(100):
            messages.append(sub.recv_multipart())
            quiet_after_done = 0
        elif done.is_set():
            quiet_after_done += 1
            if quiet_after_done >= 10:  # one second without a message
                break

    block_size = spec["block_size"]
    none_hash = sha256_cbor(spec["seed"])
    digests = {}  # wire key -> full 32-byte key (for parents)
    live = set()
    topics = set()
    n_stored = n_removed = n_cleared = 0
    for i, parts in enumerate(messages):
        if len(parts) != 3:
            fail(f"message {i} has {len(parts)} frames")
        topic, seq_bytes, payload = parts
        topics.add(topic)
        seq = int.from_bytes(seq_bytes, "big")
        if len(seq_bytes) != 8 or seq != i:
            fail(f"message {i} has sequence number {seq} ({len(seq_bytes)} bytes)")
        batch = msgpack.unpackb(payload, raw=False)
        if not (isinstance(batch, list) and len(batch) == 3):
            fail(f"batch {i} is not [ts, events, dp_rank]: {batch!r}")
        ts, events, rank = batch
        if not isinstance(ts, float) or rank != 0:
            fail(f"batch {i}: ts {ts!r}, rank {rank!r}")
        for ev in events:
            tag = ev[0]
            if tag == "BlockStored":
                if len(ev) != 7:
                    fail(f"BlockStored has {len(ev)} items: {ev!r}")
                _, keys, parent, tokens, bs, lora, medium = ev
                if bs != block_size or lora is not None or medium is not None:
                    fail(f"BlockStored block_size {bs}, lora {lora}, medium {medium}")
                if len(tokens) != len(keys) * block_size:
                    fail(f"BlockStored: {len(keys)} keys, {len(tokens)} tokens")
                if parent is None:
                    prev = none_hash
                elif parent in digests:
                    prev = digests[parent]
                else:
                    fail(f"BlockStored continues key {parent}, never stored")
                for j, key in enumerate(keys):
                    block = tokens[j * block_size:(j + 1) * block_size]
                    d = sha256_cbor((prev, tuple(block), None))
                    if low64(d) != key:
                        fail(f"key {key} is not vLLM's {low64(d)} for its tokens")
                    if key in live:
                        fail(f"key {key} stored twice without a removal")
                    digests[key] = d
                    live.add(key)
                    prev = d
                    n_stored += 1
            elif tag == "BlockRemoved":
                if len(ev) != 3 or ev[2] is not None:
                    fail(f"BlockRemoved malformed: {ev!r}")
                for key in ev[1]:
                    if key not in live:
                        fail(f"key {key} removed but not held")
                    live.remove(key)
                    n_removed += 1
            elif tag == "AllBlocksCleared":
                if len(ev) != 1:
                    fail(f"AllBlocksCleared malformed: {ev!r}")
                live.clear()
                n_cleared += 1
            else:
                fail(f"unknown event {ev!r}")
    if len(topics) > 1:
        fail(f"topics changed: {topics}")
    if not messages or n_cleared < 1:
        fail("no AllBlocksCleared at the start")
    if n_removed == 0:
        fail("nothing was evicted: the pool is too large for this test")
    if len(live) != spec["indexed"]:
        fail(f"subscriber holds {len(live)} keys, /v1/kv shows {spec['indexed']} indexed pages")
    for p, (prompt, matched) in enumerate(zip(spec["prompts"], spec["matched"])):
        prev, held = none_hash, 0
        for j in range(len(prompt) // block_size):
            d = sha256_cbor((prev, tuple(prompt[j * block_size:(j + 1) * block_size]), None))
            if low64(d) not in live:
                break
            prev, held = d, held + 1
        if held != matched // block_size:
            fail(f"prompt {p}: the router sees {held} pages, /v1/cache/match {matched} tokens")
    print(
        f"OK {len(messages)} messages, {n_stored} stored, {n_removed} removed, "
        f"{n_cleared} cleared, {len(live)} held",
        flush=True,
    )


if __name__ == "__main__":
    main()
