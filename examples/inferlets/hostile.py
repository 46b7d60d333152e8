"""Attacks on the host, one per input {"attack": name}; each must end the run
with an error (never take the server down, never leak a page)."""

import folio
from wit_world.imports import contexts as raw


def main(input):
    attack = input["attack"]
    # Every attack holds a computed context first: its pages must come back.
    held = folio.Context(system="You are a target.")
    held.user("Hold these pages. " * 20).flush()
    if attack == "trap":
        # A BaseException escapes the entry point: the component traps.
        raise KeyboardInterrupt("trap")
    if attack == "spin":
        while True:
            pass
    if attack == "alloc":
        hog = []
        while True:
            hog.append(bytearray(16 << 20))
    if attack == "dropped":
        ctx = folio.Context()
        handle = ctx._raw
        ctx.drop()
        handle.flush()
        return "unreachable"
    if attack == "forged":
        fake = raw.Context.__new__(raw.Context)
        fake.handle = 7777
        fake.flush()
        return "unreachable"
    if attack == "contexts":
        kept = []
        while True:
            kept.append(folio.Context())
    if attack == "pages":
        # Long contexts (each its own text: the same text would share pages, which
        # the quota counts once) until the run's page quota stops it.
        kept = []
        while True:
            kept.append(folio.Context().append(f"{len(kept)} pages " * 300).flush())
    if attack == "flood":
        while True:
            folio.emit("x" * 65536)
    if attack == "drip":
        # A piece every ~20 ms until the caller hangs up (or the time limit).
        while True:
            folio.emit("drip")
            t = folio.elapsed_us()
            while folio.elapsed_us() - t < 20000:
                pass
    if attack == "long_generate":
        # One generation of thousands of tokens (sampled: no end of text this early),
        # whole: tokens keep coming while the caller hangs up.
        ctx = folio.Context().append("the quick brown fox " * 10)
        ctx.generate(max_tokens=3000, temperature=1.0, seed=1)
        return "generated"
    if attack == "jobs":
        # One context named 10 000 times in one job list, each job with a grammar.
        ctx = folio.Context().append("hi there").flush()
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        folio.generate_all([(ctx, {"max_tokens": 2, "json_schema": schema})] * 10000)
        return "generated"
    raise ValueError(f"unknown attack {attack}")
