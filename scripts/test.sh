#!/usr/bin/env bash
# Runs every test from a fresh clone: fetches the default model and Gemma 3 270M (the
# exact-model fidelity test of tests/it/fidelity_f64_gemma.rs runs it) if missing, then
# formatting, clippy and the whole test suite (tests run the real model; the server's
# tests use the official openai package and headless Chromium, which this installs;
# the inferlets' tests, Python guests built with componentize-py and JavaScript guests
# built with componentize-js, installed here too).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's start, in seconds from this script's: CI must stay well under 30 minutes
# on 2 cores, and these say where its time goes.
phase() { echo "test.sh: $* (at ${SECONDS} s)"; }
trap 'echo "test.sh: exit $? (at ${SECONDS} s)"' EXIT
phase "set-up"
scripts/setup.sh
scripts/fetch_gemma.sh
# The web page's test drives Debian's headless Chromium through chromedriver.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "installing chromium and chromium-driver (the web page's browser test)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# The cluster tests put replicas behind smg (PyPI, installed by scripts/cluster.sh into
# target/smg-venv) and behind Debian's nginx.
if ! command -v nginx >/dev/null; then
    echo "installing nginx-light (the cluster test's consistent-hash router)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
# The GPU backend's tests (crates/folio-gpu) run on Mesa's lavapipe, Vulkan on the
# CPU, where there is no GPU; without any adapter they skip, saying so.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    echo "installing mesa-vulkan-drivers (lavapipe: the GPU backend's tests on the CPU)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi
phase "fmt and clippy"
cargo fmt --all -- --check
# In the release profile: its build scripts and proc-macros are the test build's.
cargo clippy --release --all-targets --quiet -- -D warnings
# The example inferlets (Python guests, componentize-py installed into
# target/inferlet-venv from PyPI; JavaScript guests, componentize-js installed into
# target/inferlet-js from npm): the inferlets tests upload and run them. The first of
# each language installs its compiler; the rest are built two at a time (each build
# keeps one core busy).
phase "the example inferlets"
py="best_of_n agent json_extract chat hostile beam lookup score snapshot"
js="best_of_n json_extract agent chat beam lookup hostile snapshot"
scripts/build_inferlet.sh examples/inferlets/generate.py target/inferlets/generate.wasm
rc=0
scripts/build_inferlet.sh examples/inferlets/generate.js target/inferlets/generate_js.wasm || rc=$?
if [ "$rc" = 3 ]; then
    echo "skipping the JavaScript inferlets: npm could not install componentize-js"
    js=""
elif [ "$rc" != 0 ]; then
    exit "$rc"
fi
{
    for g in $py; do echo "examples/inferlets/$g.py target/inferlets/$g.wasm"; done
    for g in $js; do echo "examples/inferlets/$g.js target/inferlets/${g}_js.wasm"; done
} | xargs -P 2 -L 1 scripts/build_inferlet.sh
phase "cargo test"
cargo test --workspace --release --lib --bins --tests 2>&1
