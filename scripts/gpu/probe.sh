#!/usr/bin/env bash
# What a GPU machine offers folio's GPU backend (issue 42): the GPU and driver, the CUDA
# libraries (libcuda, NVRTC, cuBLAS) and compiler, and whether Vulkan compute runs.
# Run it on the lent machine (DEVELOPERS.md, `device`) from the repository root, with
# target/vkprobe carried: `scripts/gpu/probe.sh --prepare` here first puts Debian's Vulkan
# loader and the probe there (the lent machine has no loader of its own), with the
# libraries NVIDIA's Vulkan driver (libGLX_nvidia.so.0, libEGL_nvidia.so.0) loads when a
# container lacks them (glvnd's dispatch library, X11's client libraries): on the H200
# lent on 2026-11-28 the loader found the driver's ICD file but "no drivers", which is
# what a driver library that fails to load gives. The device tool's notes (2026-12) say
# Vulkan ran on its H100 and H200 machines with the loader and glvnd's libraries
# (libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2) brought in and,
# where no driver is found, the driver's ICD file under /usr/local/nvidia named
# (VK_DRIVER_FILES): those are carried and tried too. lent.sh picks the first ICD file
# wgpu finds the GPU through.
set -u
if [ "${1:-}" = --prepare ]; then
    tmp=$(mktemp -d)
    pkgs="libvulkan1 libglvnd0 libegl1 libopengl0 libgl1 libglx0 libgles2 libx11-6 libxext6
        libxcb1 libxau6 libxdmcp6 libbsd0 libmd0"
    (cd "$tmp" && apt-get download $pkgs >/dev/null && for d in *.deb; do dpkg-deb -x "$d" root; done)
    mkdir -p target/vkprobe/lib
    cp -a "$tmp"/root/usr/lib/x86_64-linux-gnu/*.so.* target/vkprobe/lib/
    cp scripts/gpu/vulkan_probe.py target/vkprobe/
    rm -rf "$tmp"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
nvidia-smi -q | grep -i -E "cuda version"
ldconfig -p | grep -E "libcuda\.so|libnvrtc\.so|libcublas\.so|libvulkan" | sort -u
command -v nvcc && nvcc --version | tail -1
echo "NVIDIA_DRIVER_CAPABILITIES=${NVIDIA_DRIVER_CAPABILITIES:-}"
ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/nvidia/share/vulkan/icd.d 2>/dev/null
VK_LOADER_DEBUG=error python3 target/vkprobe/vulkan_probe.py
# Why a driver library would not load: its unresolved dependencies, with and without
# the carried ones; then the probe again with them, and with the EGL entry of the driver
# (headless) in place of the GLX one the ICD file names.
carried=$PWD/target/vkprobe/lib
for icd in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json \
    /usr/local/nvidia/share/vulkan/icd.d/*.json; do
    [ -f "$icd" ] || continue
    lib=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ICD"]["library_path"])' "$icd")
    case $lib in
        /*) path=$lib ;;
        *) path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}') ;;
    esac
    [ -f "$path" ] || path=""
    echo "$icd -> $lib (${path:-not found})"
    [ -n "$path" ] && ldd "$path" | grep "not found"
    [ -n "$path" ] && LD_LIBRARY_PATH=$carried ldd "$path" | grep "not found"
done
echo "with the carried libraries:"
LD_LIBRARY_PATH=$carried VK_LOADER_DEBUG=error python3 target/vkprobe/vulkan_probe.py
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$nv" ]; then
    echo "with the driver's own ICD file ($nv):"
    VK_DRIVER_FILES=$nv VK_ICD_FILENAMES=$nv LD_LIBRARY_PATH=$carried VK_LOADER_DEBUG=error \
        python3 target/vkprobe/vulkan_probe.py
fi
if ldconfig -p | grep -q libEGL_nvidia.so.0; then
    printf '{"file_format_version":"1.0.0","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.3.0"}}' \
        >/tmp/nvidia_egl_icd.json
    echo "with the driver's EGL library as the ICD:"
    VK_DRIVER_FILES=/tmp/nvidia_egl_icd.json VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json \
        LD_LIBRARY_PATH=$carried VK_LOADER_DEBUG=error python3 target/vkprobe/vulkan_probe.py
fi
