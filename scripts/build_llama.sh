#!/usr/bin/env bash
# Builds llama.cpp, the speed baseline of `folio bench`, from the sources inside
# llama-cpp-python's sdist (PyPI), for this machine's ISA, into target/llama/:
#   target/llama/build/bin/{llama-server,llama-bench,llama-batched-bench,llama-quantize,
#                          libllama.so}
#   target/llama/venv   (python with llama-cpp-python's package over that libllama)
# and prints the environment `folio bench` reads to find them (scripts/bench.sh
# sources it). Does nothing that is already done.
#
# The ISA is found by executing instructions, not by reading /proc/cpuinfo: machines
# here list AVX-512 and fault on it (AMD Zen 4 with AVX-512 hidden), or list AMX and
# fault on it (Xeons). So GGML_NATIVE=OFF with explicit flags: AVX-512 (F, BW, VL,
# VBMI, VNNI, BF16) only when a zmm `vpdpbusd` runs, AVX2 otherwise, AMX always off.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
dir=target/llama
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

fetch() {
    if [ ! -d "$dir/src/llama_cpp" ]; then
        echo "build_llama: fetching llama-cpp-python $VERSION's sdist" >&2
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            --disable-pip-version-check "llama-cpp-python==$VERSION" -d "$dir/sdist"
        mkdir -p "$dir/src"
        tar xzf "$dir"/sdist/llama_cpp_python-*.tar.gz -C "$dir/src" --strip-components=1
    fi
}

if [ ! -x "$dir/build/bin/llama-batched-bench" ] || [ ! -x "$dir/build/bin/llama-server" ] \
    || [ ! -x "$dir/build/bin/llama-bench" ] || [ ! -x "$dir/build/bin/llama-quantize" ]; then
    fetch
    command -v cmake >/dev/null || python3 -m pip install --quiet cmake
    cat >"$dir/probe.c" <<'C'
#include <setjmp.h>
#include <signal.h>
static sigjmp_buf env;
static void on_ill(int s) { (void)s; siglongjmp(env, 1); }
int main(void) {
    signal(SIGILL, on_ill);
    if (sigsetjmp(env, 1)) return 1;
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpdpbusd %%zmm1, %%zmm1, %%zmm0" ::: "xmm0", "xmm1");
    return 0;
}
C
    isa=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
    if gcc -O0 "$dir/probe.c" -o "$dir/probe" && "$dir/probe"; then
        echo "build_llama: AVX-512 VNNI runs here: building for AVX-512" >&2
        isa+=(-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON)
    else
        echo "build_llama: AVX-512 does not run here: building for AVX2" >&2
        isa+=(-DGGML_AVX512=OFF)
    fi
    cmake -S "$dir/src/vendor/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF "${isa[@]}" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
        -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=ON >"$dir/cmake.log"
    cmake --build "$dir/build" -j"$(nproc)" \
        --target llama-server llama-bench llama-batched-bench llama-quantize llama \
        >"$dir/build.log"
fi

if [ ! -x "$dir/venv/bin/python" ]; then
    fetch
    python3 -m venv "$dir/venv"
    "$dir/venv/bin/pip" install --quiet --disable-pip-version-check numpy typing_extensions \
        diskcache jinja2
    # llama-cpp-python's Python package straight from the sdist, over the library above.
    site=$("$dir/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
    echo "$dir/src" >"$site/llama_cpp_src.pth"
fi

cat <<EOF
export LLAMA_CPP_LIB_PATH=$dir/build/bin
export FOLIO_LLAMA_PYTHON=$dir/venv/bin/python
export FOLIO_LLAMA_BENCH=$dir/build/bin/llama-bench
export FOLIO_LLAMA_BATCHED_BENCH=$dir/build/bin/llama-batched-bench
export FOLIO_LLAMA_SERVER=$dir/build/bin/llama-server
EOF
