#!/usr/bin/env bash
# llama.cpp's own server test suite, against llama-server and against `folio serve`.
#
#   scripts/llama_suite.sh                 # both servers, the files in FILES below
#   scripts/llama_suite.sh folio           # one server (llama | folio)
#   LLAMA_SUITE_FILES="test_tokenize.py" LLAMA_SUITE_TIMEOUT=60 scripts/llama_suite.sh
#
# What it measures: how much of llama.cpp's server test suite (tools/server/tests, from
# the llama.cpp vendored in llama-cpp-python's sdist, which scripts/build_llama.sh
# fetches and builds) passes on folio, next to llama-server itself on the same model.
# Both runs use one local model, $FOLIO_SUITE_MODEL (default
# models/SmolLM2-135M-Instruct.Q4_1.gguf): the suite's Hugging Face downloads are
# patched to it (scripts/llama_suite/folio_patch.py, a pytest plugin over a copy of the
# tests under target/llama_suite/tests; the vendored sources are untouched). The suite
# was written for tiny story models, so tests that check a model's exact words fail on
# both servers: llama-server's column is the baseline, not 100%.
# folio is started through scripts/llama_suite/llama-server, a launcher that takes
# llama-server's flags and execs `folio serve` with the equivalent ones (the rest are
# logged as ignored), via LLAMA_SERVER_BIN_PATH, the variable the suite reads.
#
# Output, under target/llama_suite/: summary.md (per test file passed / failed /
# skipped / errors for each server, totals, and every folio failure with its category:
# (a) a gap in the OpenAI/Anthropic surface folio serves, (b) llama.cpp's own API,
# (c) model-specific, (d) launcher/flag gap), {llama,folio}.xml (JUnit), {llama,folio}.log
# (pytest's output). Tests marked slow (real models, minutes each) are deselected;
# each test has LLAMA_SUITE_TIMEOUT seconds (default 180). Tests run one at a time
# (on 2 busy cores: llama-server's run ~17 min, folio's ~4). A run of one server
# compares it with the other's last JUnit file. folio's categories come from rules
# reviewed by hand (OVERRIDES in scripts/llama_suite/summarize.py); a new failure
# that no rule covers lands in (a) with its assertion, to be looked at.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=$root/target/llama_suite
mkdir -p "$out"

# Test files that need no model beyond a small chat model. Not run: test_infill.py
# (/infill, an infill model), test_rerank.py (a reranker model), test_lora.py (LoRA
# adapters), test_vision_api.py (a vision model and its projector), test_speculative.py
# (a draft model), test_router.py, test_stream.py, test_proxy.py, test_mcp_servers.py,
# test_tools_builtin.py (llama-server's router mode, MCP and built-in tools),
# test_slot_save.py, test_kv_keep_only_active.py (/slots save/restore, llama.cpp's
# cache internals), test_sleep.py (--sleep-idle-seconds), test_compat_gcp.py (Vertex
# AI's environment mode).
FILES=${LLAMA_SUITE_FILES:-"test_basic.py test_chat_completion.py test_completion.py
  test_compat_anthropic.py test_compat_oai_responses.py test_ctx_shift.py
  test_embedding.py test_ignore_eos.py test_metrics.py test_security.py test_template.py
  test_tokenize.py test_tool_call.py"}
TIMEOUT=${LLAMA_SUITE_TIMEOUT:-180}
SERVERS=${*:-llama folio}
export FOLIO_SUITE_MODEL=${FOLIO_SUITE_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$FOLIO_SUITE_MODEL" ] || { echo "llama_suite: no model at $FOLIO_SUITE_MODEL" >&2; exit 1; }

# llama-server and the sources (does nothing when already built; folio alone needs
# only the sources).
src=$root/target/llama/src/vendor/llama.cpp/tools/server/tests
if [[ " $SERVERS " == *" llama "* ]] || [ ! -d "$src" ]; then
    scripts/build_llama.sh >/dev/null
fi
export LLAMA_SUITE_SRC=$src
# folio
[ -n "${FOLIO_BIN:-}" ] || { cargo build --release -p folio-cli; export FOLIO_BIN=$root/target/release/folio; }

# The suite's requirements (PyPI), plus pytest-timeout for the per-test limit.
venv=$out/venv
if [ ! -x "$venv/bin/pytest" ] || [ ! -f "$venv/.done" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$src/requirements.txt" \
        pytest-timeout
    touch "$venv/.done"
fi

# A fresh copy of the tests, with the plugin beside them.
rm -rf "$out/tests"
cp -r "$src" "$out/tests"
cp scripts/llama_suite/folio_patch.py "$out/tests/"

for server in $SERVERS; do
    case $server in
        llama) bin=$root/target/llama/build/bin/llama-server ;;
        folio) bin=$root/scripts/llama_suite/llama-server ;;
        *) echo "llama_suite: unknown server $server (llama | folio)" >&2; exit 2 ;;
    esac
    echo "llama_suite: $server ($bin)" >&2
    paths=()
    for f in $FILES; do paths+=("unit/$f"); done
    (cd "$out/tests" && LLAMA_SERVER_BIN_PATH=$bin PYTHONPATH=$out/tests \
        "$venv/bin/python" -m pytest -p folio_patch -p no:cacheprovider -m "not slow" \
        --timeout="$TIMEOUT" -o junit_logging=system-out -rfE -q --junitxml="$out/$server.xml" "${paths[@]}" \
        >"$out/$server.log" 2>&1) || true
    tail -n 1 "$out/$server.log" >&2
done

"$venv/bin/python" scripts/llama_suite/summarize.py "$out" $FILES >"$out/summary.md"
echo "llama_suite: $out/summary.md" >&2
