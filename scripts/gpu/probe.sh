#!/usr/bin/env bash
# What a GPU machine offers folio's GPU backend (issue 42): the GPU and driver, the CUDA
# libraries (libcuda, NVRTC, cuBLAS) and compiler, and whether Vulkan compute runs.
# Run it on the lent machine (DEVELOPERS.md, `device`) from the repository root, with
# target/vkprobe carried: `scripts/gpu/probe.sh --prepare` here first puts Debian's Vulkan
# loader and the probe there (the lent machine has no loader of its own).
set -u
if [ "${1:-}" = --prepare ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libvulkan1 >/dev/null && dpkg-deb -x libvulkan1_*.deb root)
    mkdir -p target/vkprobe/lib
    cp -a "$tmp"/root/usr/lib/x86_64-linux-gnu/libvulkan.so.1* target/vkprobe/lib/
    cp scripts/gpu/vulkan_probe.py target/vkprobe/
    rm -rf "$tmp"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
nvidia-smi -q | grep -i -E "cuda version"
ldconfig -p | grep -E "libcuda\.so|libnvrtc\.so|libcublas\.so|libvulkan" | sort -u
command -v nvcc && nvcc --version | tail -1
echo "NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-}"
ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null
VK_LOADER_DEBUG=error python3 target/vkprobe/vulkan_probe.py
