#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain, with cargo-afl (AFL++ built by
# cargo-afl itself; no nightly, no LLVM plugins).
#
#   scripts/fuzz.sh <target> <seconds>     fuzz one target for that long
#   scripts/fuzz.sh <target> cmin          minimise its corpus into fuzz/corpus/<target>
#   scripts/fuzz.sh list                   the targets
#
# Targets: gguf tokenizer template snapshot http (fuzz/src/<target>.rs says what each
# does). Starts from fuzz/corpus/<target>/ (seeds: `cargo run --release -p folio-fuzz
# --example seeds`); AFL's state goes to target/fuzz/<target>/ (queue, crashes,
# hangs, fuzzer_stats). The run ends with its figures and the crashes and hangs found;
# the exit status is 1 when there are any. `.ci/run` replays the committed corpus
# (fuzz/tests/replay.rs), so a crash's input copied into the corpus stays a test.
#
# Needs: `cargo install cargo-afl && cargo afl config --build` once (the script does
# both when cargo-afl is missing). Builds into target/afl (instrumented, apart from
# the normal builds). Runs at nice 19, one core.
set -euo pipefail
# All in one function, read whole before it runs: editing this file while a run goes
# on cannot change what the run does next.
main() {
    cd "$(dirname "$0")/.."
    targets="gguf tokenizer template snapshot http"
    if [[ "${1:-}" == list ]]; then echo "$targets"; exit 0; fi
    if [[ $# -ne 2 ]] || ! grep -qw -- "$1" <<<"$targets"; then
        echo "usage: scripts/fuzz.sh <$(tr ' ' '|' <<<"$targets")> <seconds|cmin>" >&2
        exit 2
    fi
    target=$1
    what=$2
    if ! cargo afl --version >/dev/null 2>&1; then
        cargo install cargo-afl
        cargo afl config --build
    fi
    export CARGO_TARGET_DIR=target/afl
    nice -n 19 cargo afl build --release -p folio-fuzz --features afl --bin folio-fuzz
    bin=target/afl/release/folio-fuzz
    corpus=fuzz/corpus/$target
    out=target/fuzz/$target
    # The model the targets load, by absolute path (AFL runs the binary from anywhere).
    export FOLIO_FUZZ_MODEL="${FOLIO_FUZZ_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
    # No core-dump handler or CPU-frequency checks here (a shared container).
    export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1

    if [[ "$what" == cmin ]]; then
        queue=$out/default/queue
        [[ -d $queue ]] || { echo "no queue in $queue: fuzz $target first" >&2; exit 1; }
        tmp=$(mktemp -d)
        cp "$corpus"/* "$queue"/id* "$tmp"/ 2>/dev/null || true
        rm -rf "$out/cmin"
        nice -n 19 cargo afl cmin -i "$tmp" -o "$out/cmin" -t 5000 -- "$bin" "$target" >/dev/null
        rm -rf "$tmp"
        # Seeds and regression inputs (crash-*) keep their names; the rest of the corpus
        # becomes the minimised set, less what duplicates them and inputs over 32 KiB
        # (variants of the 100 KB tiny model: the committed corpus stays small).
        find "$corpus" -type f ! -name 'seed-*' ! -name 'crash-*' -delete
        kept=$(sha256sum "$corpus"/* | cut -d' ' -f1)
        i=0
        for f in "$out"/cmin/*; do
            [[ $(stat -c %s "$f") -le 32768 ]] || continue
            sum=$(sha256sum "$f" | cut -d' ' -f1)
            grep -q "$sum" <<<"$kept" && continue
            cp "$f" "$corpus/$(printf 'min-%04d' "$i")"
            i=$((i + 1))
        done
        echo "$target: $(ls "$corpus" | wc -l) inputs, $(du -sh "$corpus" | cut -f1) in $corpus"
        exit 0
    fi

    [[ "$what" =~ ^[0-9]+$ ]] || { echo "seconds must be a number" >&2; exit 2; }
    # A fresh run each time; the last one's state stays in $out.prev.
    rm -rf "$out.prev"
    if [[ -d $out ]]; then mv "$out" "$out.prev"; fi
    mkdir -p "$out"
    # -t: a run over 2 s is a hang worth reporting; -m none: the model is mapped, not read.
    nice -n 19 cargo afl fuzz -i "$corpus" -o "$out" -V "$what" -t 2000 -m none -- "$bin" "$target" >"$out/afl.log" 2>&1 || {
        tail -30 "$out/afl.log" >&2
        exit 1
    }
    stats=$out/default/fuzzer_stats
    grep -E '^(run_time|execs_done|execs_per_sec|corpus_count|saved_crashes|saved_hangs|bitmap_cvg|stability) ' "$stats"
    crashes=$(find "$out/default/crashes" -type f -name 'id*' | wc -l)
    hangs=$(find "$out/default/hangs" -type f -name 'id*' | wc -l)
    echo "$target: $crashes crashes, $hangs hangs (inputs under $out/default/crashes and hangs)"
    [[ $crashes -eq 0 && $hangs -eq 0 ]]
}
main "$@"
