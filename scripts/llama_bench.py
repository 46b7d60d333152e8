#!/usr/bin/env python3
"""llama.cpp's prefill and decode speed on a GGUF file, through llama-cpp-python.

Used by `folio bench` as the same-run baseline; prints one JSON line:
{"pp_tok_s": ..., "tg_tok_s": ..., "load_s": ..., "version": ...}
(`load_s`: the seconds `Llama(...)` took to load the model, repacking included.)

    python3 scripts/llama_bench.py MODEL THREADS PP TG REPS
"""
import json
import sys
import time

from llama_cpp import Llama, __version__

TEXT = ("The history of the printing press begins long before Gutenberg, with movable "
        "type made of baked clay and later cast in bronze. ")


def main():
    model, threads, pp, tg, reps = sys.argv[1], *map(int, sys.argv[2:6])
    t = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=pp + tg + 16, n_batch=pp, n_ubatch=pp,
                n_threads=threads, n_threads_batch=threads, verbose=False,
                flash_attn=True)
    load_s = time.perf_counter() - t
    base = llm.tokenize(TEXT.encode(), add_bos=False)
    toks = (base * (pp // len(base) + 1))[:pp]
    pp_s = []
    for _ in range(reps):
        llm.reset()
        t = time.perf_counter()
        llm.eval(toks)
        pp_s.append(pp / (time.perf_counter() - t))
    tg_s = []
    for _ in range(reps):
        llm.reset()
        llm.eval([toks[0]])
        t = time.perf_counter()
        for i in range(tg):
            llm.eval([toks[(i + 1) % len(toks)]])
        tg_s.append(tg / (time.perf_counter() - t))
    print(json.dumps({"pp_tok_s": sum(pp_s) / reps, "tg_tok_s": sum(tg_s) / reps,
                      "load_s": load_s, "version": __version__}))


if __name__ == "__main__":
    main()
