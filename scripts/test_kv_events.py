"""A KV-event subscriber for `folio serve --kv-events` (vLLM's wire format, `vllm`
keys), driven by crates/folio-server/tests/http/kv_events.rs.

It binds a SUB socket on a free loopback port and prints `PORT <n>`; the server
connects to it. It records every message until the test writes one JSON line on
stdin: {"block_size", "seed", "indexed" (pages /v1/kv shows indexed), "prompts"
(token lists), "salts" (each prompt's cache_salt or null), "matched"
(/v1/cache/match's cached_tokens for each), "replay" (the replay endpoint)}. It then
drains what is left and checks:

  (a) every BlockStored key is reproduced from its token ids, parent and extra keys
      the way vLLM computes sha256_cbor keys (cbor2, canonical; NONE_HASH from the
      seed), and the events have the fields of vLLM's newest ones (medium "GPU",
      extra_keys one entry per block, group_idx 0);
  (b) sequence numbers run 0, 1, 2, ... with no gap, and the topic is constant;
  (c) the keys stored minus those removed (after the last AllBlocksCleared) are as
      many as the pages /v1/kv shows indexed, and for each prompt the run of its
      leading keys in that set covers the pages /v1/cache/match reports; a salted
      prompt's keys are computed as vLLM computes them for its cache_salt (the salt
      in the extra keys of the block at token 0 only), from the test's salts, not
      from the events';
  (d) the replay socket: pretending messages k..k+2 were lost, a DEALER asks for
      everything from k and gets messages k, k+1, ... up to the last, byte for byte
      as published, then the end marker (sequence number -1, empty payload).

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


def block_keys(none_hash, prompt, block_size, salt):
    """vLLM's keys of a prompt's full blocks: the salt goes into the extra keys of
    the block starting at token 0 only (generate_block_hash_extra_keys)."""
    prev, out = none_hash, []
    for j in range(len(prompt) // block_size):
        extra = (salt,) if (salt and j == 0) else None
        d = sha256_cbor((prev, tuple(prompt[j * block_size:(j + 1) * block_size]), extra))
        out.append(d)
        prev = d
    return out


def check_replay(ctx, endpoint, messages):
    """(d): ask the replay socket for what a subscriber that lost messages k.. misses."""
    if len(messages) < 4:
        fail(f"too few messages ({len(messages)}) to test replay")
    k = len(messages) // 2
    kept = messages[:k] + messages[k + 3:]  # the deliberate gap
    seqs = [int.from_bytes(m[1], "big") for m in kept]
    gap_at = next(i for i in range(1, len(seqs)) if seqs[i] != seqs[i - 1] + 1)
    start = seqs[gap_at - 1] + 1
    if start != k:
        fail(f"gap found at {start}, made at {k}")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        try:
            frames = dealer.recv_multipart()
        except zmq.Again:
            fail("replay: no end marker within 5 s")
        if len(frames) != 3 or frames[0] != b"":
            fail(f"replay answer of {len(frames)} frames: {frames!r}")
        _, seq_bytes, payload = frames
        if int.from_bytes(seq_bytes, "big", signed=True) == -1:
            if payload != b"":
                fail("replay end marker with a payload")
            break
        got.append((int.from_bytes(seq_bytes, "big"), payload))
    dealer.close(linger=0)
    want = [(int.from_bytes(m[1], "big"), m[2]) for m in messages[k:]]
    if got != want:
        fail(f"replay from {k} gave seqs {[s for s, _ in got]}, wanted {[s for s, _ in want]}")
    return len(got)


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

    replayed = check_replay(ctx, spec["replay"], messages)

    block_size = spec["block_size"]
    none_hash = sha256_cbor(spec["seed"])
    digests = {}  # wire key -> full 32-byte key (for parents)
    live = set()
    topics = set()
    n_stored = n_removed = n_cleared = n_salted = 0
    salts = {x for x in spec["salts"] if x}
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
                if len(ev) != 10:
                    fail(f"BlockStored has {len(ev)} items, not vLLM's newest 10: {ev!r}")
                _, keys, parent, tokens, bs, lora, medium, lora_name, extra, group = ev
                if bs != block_size or lora is not None or lora_name is not None:
                    fail(f"BlockStored block_size {bs}, lora {lora}, lora_name {lora_name}")
                if medium != "GPU" or group != 0:
                    fail(f"BlockStored medium {medium!r}, group_idx {group!r}")
                if not isinstance(extra, list) or len(extra) != len(keys):
                    fail(f"BlockStored: extra_keys {extra!r} for {len(keys)} keys")
                if any(e is not None for e in extra[1:]):
                    fail(f"BlockStored: extra keys past the first block: {extra!r}")
                if len(tokens) != len(keys) * block_size:
                    fail(f"BlockStored: {len(keys)} keys, {len(tokens)} tokens")
                if parent is None:
                    prev = none_hash
                elif parent in digests:
                    prev = digests[parent]
                else:
                    fail(f"BlockStored continues key {parent}, never stored")
                if extra[0] is not None:
                    if parent is not None or len(extra[0]) != 1 or extra[0][0] not in salts:
                        fail(f"BlockStored: extra keys {extra[0]!r} after parent {parent}")
                    n_salted += 1
                for j, key in enumerate(keys):
                    block = tokens[j * block_size:(j + 1) * block_size]
                    e = tuple(extra[j]) if extra[j] is not None else None
                    d = sha256_cbor((prev, tuple(block), e))
                    if low64(d) != key:
                        fail(f"key {key} is not vLLM's {low64(d)} for its tokens")
                    if key in live:
                        fail(f"key {key} stored twice without a removal")
                    digests[key] = d
                    live.add(key)
                    prev = d
                    n_stored += 1
            elif tag == "BlockRemoved":
                if len(ev) != 4 or ev[2] != "GPU" or ev[3] != 0:
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
    if salts and n_salted == 0:
        fail("salted prompts ran, but no BlockStored carried a salt")
    runs = zip(spec["prompts"], spec["salts"], spec["matched"])
    for p, (prompt, salt, matched) in enumerate(runs):
        held = 0
        for d in block_keys(none_hash, prompt, block_size, salt):
            if low64(d) not in live:
                break
            held += 1
        if held != matched // block_size:
            fail(f"prompt {p} (salt {salt!r}): the router sees {held} pages, "
                 f"/v1/cache/match {matched} tokens")
    print(
        f"OK {len(messages)} messages, {n_stored} stored, {n_removed} removed, "
        f"{n_cleared} cleared, {len(live)} held, {n_salted} salted runs, "
        f"{replayed} replayed",
        flush=True,
    )


if __name__ == "__main__":
    main()
