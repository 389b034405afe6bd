#!/usr/bin/env bash
# Make the small folder a lent GPU machine needs (the device tool carries at most 64 MiB):
#
#   bash tests/gpu/pack.sh [BUILD_DIR] [DEST]
#
# From BUILD_DIR (default build-gpu: a CUDA build made here, e.g.
# `cmake -B build-gpu -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release && cmake --build
# build-gpu`) it copies the tools and GPU test programs, stripped, into DEST (default gpu-carry,
# ignored by git) in the same layout (bin/, tests/gpu/), libwsync.so.X.Y.Z stripped as
# lib/libwsync.so (no symlinks), plus the tiny models of ../shared/testdata (dense, Qwen3-MoE, DeepSeek-V3).
# Every program links the static library with every kernel in it, so the folder outgrows what
# the device tool carries: DEST.tgz, made beside it, is what to carry. On the machine:
# `tar xzf gpu-carry.tgz && WSYNC_TESTDATA=gpu-carry/testdata bash tests/gpu/run.sh gpu-carry`.
#
# $WSYNC_PACK_STEPS may name the run.sh steps (and "compare" for bench/compare.sh) one call will
# run, to carry only their programs: the whole set is near the carry limit, so a run split over
# calls takes one smaller carry each, e.g.
#   WSYNC_PACK_STEPS="kernels schemes fp8wire faults" bash tests/gpu/pack.sh build-gpu gpu-carry
#   WSYNC_PACK_STEPS="python netns bench moe delta" bash tests/gpu/pack.sh build-gpu gpu-carry-b
# (there: `tar xzf gpu-carry-b.tgz && WSYNC_TESTDATA=gpu-carry-b/testdata WSYNC_GPU_SKIP=...
# bash tests/gpu/run.sh gpu-carry-b`, skipping the steps the carry has no programs for).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD=${1:-build-gpu}
DEST=${2:-gpu-carry}
STEPS=${WSYNC_PACK_STEPS:-}
# what the steps named in $STEPS run (run.sh's step names; "compare": bench/compare.sh); no
# steps named: everything
wanted() {   # file name (wsync-bench, test_schemes, libwsync.so ...)
    [ -z "$STEPS" ] && return 0
    local step need
    for step in $STEPS; do
        case $step in
        kernels) need="test_kernels copy_model" ;;
        schemes) need="test_delta_kernels test_engine_cuda test_schemes wsync-engine wsync-demo" ;;
        fp8wire) need="test_fp8_wire_gpu" ;;
        faults) need="test_faults_cuda" ;;
        python) need="libwsync.so wsync-engine" ;;
        netns) need="netns_member" ;;
        bench | moe | delta | compare) need="wsync-bench" ;;
        store-cuda) need="test_schemes wsync-bench" ;;
        moe-baselines | baselines) need="" ;;
        *) echo "pack.sh: unknown step '$step' in WSYNC_PACK_STEPS (kernels schemes fp8wire" \
                "faults python netns bench moe moe-baselines store-cuda delta baselines compare)" >&2
           exit 2 ;;
        esac
        case " $need wsync-plan " in *" $1 "*) return 0 ;; esac
    done
    return 1
}
wanted - || true   # an unknown step fails here, before anything is written
rm -rf "$DEST" "$DEST.tgz"
mkdir -p "$DEST/bin" "$DEST/tests/gpu" "$DEST/testdata"
# the tools the GPU steps run (tests/gpu/*, bench/compare.sh): each links every kernel, ~6 MB
# compressed, so the others (wsync-info) stay behind to keep the carry under the device tool's
# 64 MiB; wsync-plan is small and handy there
for t in wsync-bench wsync-engine wsync-demo wsync-plan; do
    f=$BUILD/bin/$t
    [ -x "$f" ] && wanted "$t" && strip --strip-unneeded -o "$DEST/bin/$t" "$f"
done
for f in "$BUILD"/tests/gpu/test_* "$BUILD"/tests/gpu/netns_member "$BUILD"/tests/gpu/copy_model; do
    [ -x "$f" ] && wanted "$(basename "$f")" && strip --strip-unneeded -o "$DEST/tests/gpu/$(basename "$f")" "$f"
done
# the shared library, for the Python bindings (tests/gpu/test_python_torch.py): one plain file
lib=$(readlink -f "$BUILD/libwsync.so" 2>/dev/null || true)
if [ -n "$lib" ] && [ -f "$lib" ] && wanted libwsync.so; then
    mkdir -p "$DEST/lib"
    strip --strip-unneeded -o "$DEST/lib/libwsync.so" "$lib"
fi
for m in hf_qwen3_tiny hf_qwen3_moe_tiny hf_deepseek_v3_tiny; do
    for d in ../shared/testdata/$m shared/testdata/$m; do
        if [ -d "$d" ]; then cp -r "$d" "$DEST/testdata/"; break; fi
    done
done
# iproute2's `ip` and `tc` with the libraries they need beyond libc (the GPU machines have
# neither: the network-namespace steps make veth pairs with ip, the delta step's store-link rows
# limit lo with tc), each behind a wrapper that finds them
for tool in ip tc; do
    bin=$(PATH="$PATH:/usr/sbin:/sbin" command -v $tool) || continue
    mkdir -p "$DEST/iproute/lib"
    cp "$(readlink -f "$bin")" "$DEST/iproute/$tool.real"
    ldd "$bin" | awk '$3 ~ /^\// {print $3}' | grep -v -e '/libc\.so' -e '/ld-linux' |
        while read -r l; do cp "$(readlink -f "$l")" "$DEST/iproute/lib/$(basename "$l")"; done
    printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")\nLD_LIBRARY_PATH="$d/lib" exec "$d/%s.real" "$@"\n' \
        $tool > "$DEST/iproute/$tool"
    chmod +x "$DEST/iproute/$tool"
done
tar -czf "$DEST.tgz" "$DEST"
du -sh "$DEST" "$DEST.tgz"
# the device tool carries 64 MiB with the working tree: say so before a call fails on it
size=$(stat -c %s "$DEST.tgz")
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
    echo "pack.sh: $DEST.tgz is $((size / 1024 / 1024)) MiB, near the device tool's 64 MiB carry:" \
         "carry only what one call runs (WSYNC_PACK_STEPS, above), one carry per call" >&2
fi
