#!/usr/bin/env bash
# Peak resident memory of folio and llama.cpp on the same model and the same work: a
# 512-token prompt, then 128 generated tokens, 2 threads. folio runs `folio generate
# --ctx 640 --max-tokens 128 --ignore-eos` on the prompt; llama.cpp runs `llama-bench
# -p 512 -n 128 -r 1 -fa 1` (what the issue's figures came from). Each is measured by
# GNU time (`Maximum resident set size`), in alternating rounds. Then the steady
# figure: each as a server holding the same 640 tokens of K/V (`folio serve --ctx 640
# --kv-pages 40`, `llama-server -c 640 -np 1`), its VmRSS idle after one such request.
#
#   scripts/memory.sh [MODEL.gguf ...]   # default: the default model, and Gemma 3 270M
#                                        # Q4_K_M when scripts/fetch_gemma.sh fetched it
#   ROUNDS=3 scripts/memory.sh
#
# Needs /usr/bin/time (Debian's `time`), a release build, and llama.cpp built by
# scripts/build_llama.sh. `folio bench` prints folio's own figures (load time,
# resident memory after the load, peaks) beside its speeds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    models=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
    [ -f models/gemma-3-270m-q4_k_m.gguf ] && models+=(models/gemma-3-270m-q4_k_m.gguf)
fi
[ -x /usr/bin/time ] || { echo "memory.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
cargo build --release -q -p folio-cli
eval "$(scripts/build_llama.sh)"
bin=target/llama/build/bin
prompt=$(mktemp)
trap 'rm -f "$prompt"' EXIT
# 512 tokens of plain English on both tokenizers is about 520 words.
python3 -c "
import random; random.seed(1)
w='the of and to in is was for on that with as by at from his her an which be this are or it had not but what all were when we there can more'.split()
print(' '.join(random.choice(w) for _ in range(520)))" >"$prompt"

peak() { # command... → peak RSS in MiB
    /usr/bin/time -f '%M' "$@" 2>&1 >/dev/null | tail -1 | awk '{printf "%.0f", $1 / 1024}'
}

# Steady resident memory: an idle server after one request (the same prompt, then 128
# tokens), read from /proc/PID/status (VmRSS) a second after the answer. Both hold
# 640 tokens of K/V: folio `serve --ctx 640 --kv-pages 40` (pages of 16 tokens),
# llama.cpp `llama-server -c 640 -np 1 -fa on`. (folio's default pool holds eight
# contexts, and on huge pages its first request faults in up to one 2048-token chunk
# of it: 45 MiB for SmolLM2.)
steady() { # port command... → VmRSS in MiB of the server, idle after one request
    local port=$1
    shift
    "$@" >/dev/null 2>&1 &
    local pid=$!
    python3 - "$port" "$prompt" <<'PY' || { kill "$pid"; wait "$pid" 2>/dev/null; return 1; }
import json, sys, time, urllib.request
port, prompt = sys.argv[1], open(sys.argv[2]).read()
base = f"http://127.0.0.1:{port}"
for _ in range(600):
    try:
        urllib.request.urlopen(base + "/health", timeout=1).read()
        break
    except Exception:
        time.sleep(0.2)
body = json.dumps({"prompt": prompt, "max_tokens": 128, "temperature": 0, "ignore_eos": True}).encode()
req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=600).read()
time.sleep(1)
PY
    awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

folio_peak() {
    peak target/release/folio generate --model "$1" --threads 2 --ctx 640 --max-tokens 128 \
        --ignore-eos <"$prompt"
}
llama_peak() {
    LD_LIBRARY_PATH=$bin peak "$bin/llama-bench" -m "$1" -p 512 -n 128 -r 1 -fa 1 -t 2
}
folio_steady() {
    steady 18641 target/release/folio serve --model "$1" --threads 2 --ctx 640 --kv-pages 40 \
        --port 18641
}
llama_steady() {
    LD_LIBRARY_PATH=$bin steady 18642 "$bin/llama-server" -m "$1" -t 2 -c 640 -np 1 -fa on \
        --port 18642
}

median() { # numbers... → the middle one (of an even count, the lower of the two)
    printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"
}

table() { # what → a row per model: folio's and llama.cpp's medians, rounds alternating
    echo "| model | folio $1 MiB | llama.cpp $1 MiB | folio / llama.cpp |"
    echo "|---|---|---|---|"
    for m in "${models[@]}"; do
        f=() l=()
        for _ in $(seq "$ROUNDS"); do
            f+=("$("folio_$1" "$m")")
            l+=("$("llama_$1" "$m")")
        done
        fm=$(median "${f[@]}")
        lm=$(median "${l[@]}")
        echo "| $(basename "$m") | $fm (${f[*]}) | $lm (${l[*]}) | $(python3 -c "print(f'{$fm / $lm:.2f}x')") |"
    done
}

table peak
echo
table steady
