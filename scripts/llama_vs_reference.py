#!/usr/bin/env python3
"""Measures llama.cpp builds against the exact model: writes the "llama_cpp" figures of
crates/folio/tests/fixtures/reference_f64.json (made first by scripts/reference_f64.py).

For each build: teacher-force every case's seq = prompt_ids + greedy_ids the way
scripts/make_fixtures.py runs llama.cpp (one token per step, flash attention on, one
thread, logits of every step), then over every (position, token of the reference's
top-5) take |llama.cpp's logprob - the reference's|: "mean" and "max" are what
tests/it/fidelity_f64.rs holds folio to. Also: "greedy_same", the prompts whose
free-running greedy continuation (one token per step, as make_fixtures.py) equals the
reference's own ("reference_greedy_ids"); "top_differs", the teacher-forced positions
whose top token is not the reference's, with the largest gap between the reference's top
two among them ("top_differs_max_gap"); "per_case", each case's [sum, max, count] of
the same |differences| (the test forms a subset's figures from them);
"vs_llama_cpp_json", the same mean/max against llama_cpp.json's top-5 (which build made
that file: ~0 for the AVX2 one).

The builds: llama.cpp from llama-cpp-python 0.3.36's sdist (vendor/llama.cpp, commit
0c1e570), shared libraries loaded by the llama_cpp package through LLAMA_CPP_LIB_PATH;
SRC=llama_cpp_python-0.3.36/vendor/llama.cpp:

    # AVX-512 (GGML_NATIVE=OFF; AVX, AVX2, FMA, F16C, AVX512, VBMI, VNNI, BF16; no AMX)
    cmake -S $SRC -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
      -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON \
      -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
      -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON
    # AVX2 only
    cmake -S $SRC -B build-avx2 -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
      -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF \
      -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
    nice -n 19 cmake --build build-avx2 -j2 --target llama

    python3 scripts/llama_vs_reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
        avx512=/work/llama/build/bin avx2=/work/llama/build-avx2/bin

A build that needs an instruction the CPU lacks cannot be measured here: run it where it
can, the figures of the other builds are kept. A build named NAME-norepack is measured
with llama.cpp's weight repacking off (its `--no-repack`; the model's extra buffer types
unused): on K-quant models that is another summation order of the same commit, and
llama.cpp's range covers it.

--ref=FILE and --fixtures=FILE measure another reference and its llama.cpp fixtures (the
greedy comparison runs as many tokens as the reference's own continuation). Gemma 3 270M
(tests/it/fidelity_f64_gemma.rs), with llama-cpp-python's package from its sdist on
PYTHONPATH:

    LD_LIBRARY_PATH=... python3 scripts/llama_vs_reference.py \
        models/gemma-3-270m-q4_k_m.gguf avx512=.../build/bin avx2=.../build-avx2/bin \
        --ref=crates/folio/tests/fixtures/reference_f64_gemma3.json \
        --fixtures=crates/folio/tests/fixtures/llama_cpp_gemma3.json

--long (first argument) measures the long prompts of
crates/folio/tests/fixtures/reference_f64_long.json (scripts/reference_f64_long.py)
instead, and writes that file's "llama_cpp" figures: the prompt is prefilled as llama.cpp
prefills a prompt, in batches of 512 tokens (its default n_batch and n_ubatch; n_ctx
8192, flash attention on, one thread), with logits requested at the scored positions
only; mean/max/per_case as above over the scored positions' reference top-5, plus
"top_differs" (no greedy continuation for these).

    /work/llama/venv/bin/python scripts/llama_vs_reference.py --long \
        models/SmolLM2-135M-Instruct.Q4_1.gguf \
        avx512=/work/llama/build/bin avx2=/work/llama/build-avx2/bin
"""
import json
import os
import subprocess
import sys

import numpy as np

REF = "crates/folio/tests/fixtures/reference_f64.json"
REF_LONG = "crates/folio/tests/fixtures/reference_f64_long.json"
LONG_BATCH = 512
FIXTURES = "crates/folio/tests/fixtures/llama_cpp.json"


def log_softmax(row):
    row = row.astype(np.float64)
    m = row.max()
    return row - (m + np.log(np.exp(row - m).sum()))


def no_repack_if_asked(llama_cpp):
    """With FOLIO_LLAMA_NO_REPACK=1 (a build named ...-norepack), models load without
    llama.cpp's extra buffer types: its CPU backend's weight repacking is off, the
    configuration its `--no-repack` option selects."""
    if os.environ.get("FOLIO_LLAMA_NO_REPACK") != "1":
        return
    import llama_cpp.llama_cpp as low  # the module `Llama` reads its defaults from

    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params


def worker(model_path, ref_path, fixtures):
    """Runs in a process whose LLAMA_CPP_LIB_PATH names the build; prints its figures."""
    import llama_cpp
    from llama_cpp import Llama

    no_repack_if_asked(llama_cpp)

    ref = json.load(open(ref_path))
    fx = {c["name"]: c for c in json.load(open(fixtures))["cases"]}
    llm = Llama(model_path=model_path, n_ctx=2048, n_batch=2048, logits_all=True,
                n_threads=1, n_threads_batch=1, verbose=False, seed=0, flash_attn=True)
    eos = llm.token_eos()
    sum_d = max_d = 0.0
    n = 0
    fsum = fmax = 0.0
    fn = 0
    greedy_same = 0
    top_checked = 0
    top_differs = []
    max_gap = 0.0
    per_case = {}
    for case in ref["cases"]:
        csum, cmax, cn = 0.0, 0.0, 0
        seq = case["prompt_ids"] + case["greedy_ids"]
        llm.reset()
        for t in seq[:-1]:
            llm.eval([t])
        for i, top in enumerate(case["top5"]):
            lp = log_softmax(llm.scores[i])
            for tok, want in top:
                d = abs(float(lp[tok]) - want)
                csum += d
                cmax = max(cmax, d)
                cn += 1
            for tok, want in fx[case["name"]]["top5"][i]:
                d = abs(float(lp[tok]) - want)
                fsum += d
                fmax = max(fmax, d)
                fn += 1
            top_checked += 1
            if int(np.argmax(lp)) != top[0][0]:
                gap = top[0][1] - top[1][1]
                top_differs.append(f"{case['name']}@{i}")
                max_gap = max(max_gap, gap)
        per_case[case["name"]] = [round(csum, 6), round(cmax, 6), cn]
        sum_d += csum
        max_d = max(max_d, cmax)
        n += cn
        # Free-running greedy, one token per step.
        llm.reset()
        for t in case["prompt_ids"]:
            llm.eval([t])
        gen = []
        for _ in range(len(case["reference_greedy_ids"])):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(nxt)
            if nxt == eos:
                break
            llm.eval([nxt])
        greedy_same += gen == case["reference_greedy_ids"]
        print(f"{case['name']}: greedy {'=' if gen == case['reference_greedy_ids'] else '!='}"
              f" reference", file=sys.stderr)
    info = llama_cpp.llama_print_system_info()
    out = {
        "mean": round(sum_d / n, 6),
        "max": round(max_d, 6),
        "values": n,
        "greedy_same": f"{greedy_same} of {len(ref['cases'])}",
        "top_differs": f"{len(top_differs)} of {top_checked}",
        "top_differs_max_gap": round(max_gap, 6),
        "vs_llama_cpp_json": {"mean": round(fsum / fn, 6), "max": round(fmax, 6)},
        "per_case": per_case,
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": info.decode() if isinstance(info, bytes) else str(info),
    }
    print(json.dumps(out))


def worker_long(model_path, ref_path):
    """worker() for the long prompts: batched prefill, logits at the scored positions."""
    import llama_cpp
    from llama_cpp import Llama

    ref = json.load(open(ref_path))
    llm = Llama(model_path=model_path, n_ctx=8192, n_batch=LONG_BATCH, n_ubatch=LONG_BATCH,
                logits_all=False, n_threads=1, n_threads_batch=1, verbose=False, seed=0,
                flash_attn=True)
    ctx = llm._ctx.ctx
    n_vocab = llm.n_vocab()
    batch = llama_cpp.llama_batch_init(LONG_BATCH, 0, 1)
    sum_d = max_d = 0.0
    n = 0
    top_checked = 0
    top_differs = []
    max_gap = 0.0
    per_case = {}
    for case in ref["cases"]:
        ids = case["prompt_ids"]
        want = dict(zip(case["positions"], case["top5"]))
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        csum, cmax, cn = 0.0, 0.0, 0
        for a in range(0, len(ids), LONG_BATCH):
            chunk = ids[a:a + LONG_BATCH]
            batch.n_tokens = len(chunk)
            for j, t in enumerate(chunk):
                batch.token[j] = t
                batch.pos[j] = a + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = (a + j) in want
            rc = llama_cpp.llama_decode(ctx, batch)
            if rc != 0:
                sys.exit(f"llama_decode: {rc}")
            for j in range(len(chunk)):
                top = want.get(a + j)
                if top is None:
                    continue
                ptr = llama_cpp.llama_get_logits_ith(ctx, j)
                lp = log_softmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
                for tok, v in top:
                    d = abs(float(lp[tok]) - v)
                    csum += d
                    cmax = max(cmax, d)
                    cn += 1
                top_checked += 1
                if int(np.argmax(lp)) != top[0][0]:
                    top_differs.append(f"{case['name']}@{a + j}")
                    max_gap = max(max_gap, top[0][1] - top[1][1])
        per_case[case["name"]] = [round(csum, 6), round(cmax, 6), cn]
        sum_d += csum
        max_d = max(max_d, cmax)
        n += cn
        print(f"{case['name']}: mean {csum / cn:.4f} max {cmax:.4f}", file=sys.stderr)
    llama_cpp.llama_batch_free(batch)
    info = llama_cpp.llama_print_system_info()
    print(json.dumps({
        "mean": round(sum_d / n, 6),
        "max": round(max_d, 6),
        "values": n,
        "top_differs": f"{len(top_differs)} of {top_checked}",
        "top_differs_at": top_differs,
        "top_differs_max_gap": round(max_gap, 6),
        "per_case": per_case,
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": info.decode() if isinstance(info, bytes) else str(info),
    }))


def cmake_flags(lib):
    """The GGML_* switches of the build whose bin/ is lib, from its CMakeCache.txt."""
    cache = os.path.join(os.path.dirname(os.path.abspath(lib)), "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    keep = ("GGML_NATIVE", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512",
            "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AMX_TILE",
            "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_OPENMP", "CMAKE_BUILD_TYPE")
    flags = {}
    for line in open(cache):
        k, _, v = line.strip().partition("=")
        k = k.split(":")[0]
        if k in keep:
            flags[k] = v
    return " ".join(f"{k}={flags[k]}" for k in keep if k in flags)


def main():
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    argv = [a for a in sys.argv[1:] if not (a.startswith("--") and "=" in a)]
    fixtures = opts.get("fixtures", FIXTURES)
    if argv[0] == "--worker":
        worker(argv[1], opts.get("ref", REF), fixtures)
        return
    if argv[0] == "--worker-long":
        worker_long(argv[1], opts.get("ref", REF_LONG))
        return
    long = argv[0] == "--long"
    args = argv[1:] if long else argv
    ref_path = opts.get("ref", REF_LONG if long else REF)
    model_path = args[0]
    builds = [a.split("=", 1) for a in args[1:]]
    doc = json.load(open(ref_path))
    figures = doc.get("llama_cpp", {}).get("builds", {})
    for name, lib in builds:
        # The build's own ggml libraries, whatever LD_LIBRARY_PATH names or the build's
        # RUNPATH says (a copied build tree's RUNPATH is stale).
        ld = os.pathsep.join(p for p in (lib, os.environ.get("LD_LIBRARY_PATH")) if p)
        env = dict(os.environ, LLAMA_CPP_LIB_PATH=lib, LD_LIBRARY_PATH=ld,
                   FOLIO_LLAMA_NO_REPACK="1" if name.endswith("-norepack") else "0")
        mode = "--worker-long" if long else "--worker"
        r = subprocess.run([sys.executable, __file__, mode, model_path, f"--ref={ref_path}",
                            f"--fixtures={fixtures}"], env=env,
                           stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(f"{name}: failed ({r.returncode}), figures not updated", file=sys.stderr)
            continue
        fig = json.loads(r.stdout.strip().splitlines()[-1])
        fig = {"lib": lib, "flags": cmake_flags(lib), **fig}
        figures[name] = fig
        print(f"{name}: {json.dumps(fig)}", file=sys.stderr)
    how = ("teacher-forced one token per step, flash attention on, one thread (as "
           "scripts/make_fixtures.py); mean/max |llama.cpp logprob - reference logprob| "
           "over every position's reference top-5")
    if long:
        how = (f"prompt prefilled in batches of {LONG_BATCH} tokens (n_batch = n_ubatch = "
               f"{LONG_BATCH}, n_ctx 8192), flash attention on, f16 K/V, one thread, logits at "
               "the scored positions; mean/max |llama.cpp logprob - reference logprob| over "
               "every scored position's reference top-5")
    doc["llama_cpp"] = {
        "commit": "ggml-org/llama.cpp 0c1e570 (llama-cpp-python 0.3.36's sdist)",
        "how": how,
        "builds": figures,
    }
    if len(figures) == 1:
        doc["llama_cpp"]["note"] = (
            f"one build measured ({next(iter(figures))}): llama.cpp's range is that build's "
            "figures alone, the bound tests/it/fidelity_f64.rs holds folio to")
    with open(ref_path, "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
