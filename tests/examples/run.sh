#!/usr/bin/env bash
# ctest examples_c / examples_python (label examples): what a user of an installed wsync does.
#
#   run.sh c|python BUILD_DIR SOURCE_DIR C_COMPILER SANITIZE(0/1) [PYTHON]
#
# Both install BUILD_DIR into a temporary prefix (cmake --install), then build examples/c
# against it in fresh build folders with find_package(wsync) (wsync::wsync, and
# wsync::wsync_static in a second folder), as examples/c/CMakeLists.txt does.
#  c:      runs examples/run_pair.sh: 2 trainers (statically linked) push 3 versions to 2 TP-2
#          workers (shared library), which check every element against the trainers' formula;
#          then again with the trainers writing the wrong version (--skew 1), which must fail
#          with the workers naming the elements (so the check can fail); and compiles worker.c
#          through the installed pkg-config file.
#  python: 1 C trainer, 2 receivers at TP 1: the C worker and examples/python/receiver.py
#          (--check, host buffers without torch) on the installed libwsync.so; both check every
#          element, and their checksums of each version must be equal.
# A sanitizer build (SANITIZE=1) builds the examples with -fsanitize=address,undefined as the
# library was; the python mode then needs the ASan runtime preloaded (scripts/sanitize.sh does
# that for label python) and skips (77) otherwise. Exit 0 on success, 77 on skip.
set -euo pipefail
mode=$1 build=$2 src=$3 cc=$4 sanitize=$5 python=${6:-python3}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# an ASan runtime preloaded for python (scripts/sanitize.sh) goes to python only: cmake, make
# and bash are not built for it
preload=${LD_PRELOAD:-}
unset LD_PRELOAD

if [ "$mode" = python ] && [ "$sanitize" = 1 ] && [[ "$preload" != *asan* ]]; then
    echo "SKIP: the installed libwsync.so is built with ASan and python3 is not: run this test"
    echo "with the ASan runtime preloaded (scripts/sanitize.sh does, for label python)"
    exit 77
fi

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; exit 1; }
pc=$(find "$tmp/prefix" -name wsync.pc)
config=$(find "$tmp/prefix" -name wsyncConfig.cmake)
[ -n "$pc" ] && [ -n "$config" ] || { echo "FAIL: the install has no wsync.pc or wsyncConfig.cmake"; exit 1; }
echo "installed: ${pc#$tmp/prefix/} ${config#$tmp/prefix/}"

flags="-Wall -Wextra -Werror"
[ "$sanitize" = 1 ] && flags="$flags -fsanitize=address,undefined -fno-omit-frame-pointer"
for kind in shared static; do
    static=OFF
    [ $kind = static ] && static=ON
    # a fresh configure that knows the prefix only through CMAKE_PREFIX_PATH
    if ! cmake -S "$src/examples/c" -B "$tmp/$kind" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
            -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" -DWSYNC_EXAMPLES_STATIC=$static \
            >"$tmp/$kind.log" 2>&1 ||
       ! cmake --build "$tmp/$kind" >>"$tmp/$kind.log" 2>&1; then
        cat "$tmp/$kind.log"
        echo "FAIL: examples/c did not build against the installed package ($kind)"
        exit 1
    fi
done
# the shared build's programs must load the installed libwsync.so, the static ones none
# (ldd's output read whole: grep -q ending a pipe early would fail it under pipefail)
deps=$(ldd "$tmp/shared/worker")
if ! grep -q "$tmp/prefix/.*libwsync.so" <<<"$deps"; then
    echo "$deps"; echo "FAIL: shared worker does not use the installed libwsync.so"; exit 1
fi
deps=$(ldd "$tmp/static/trainer")
if grep -q libwsync <<<"$deps"; then
    echo "FAIL: the static trainer loads libwsync.so"; exit 1
fi

run_pair=$src/examples/run_pair.sh
if [ "$mode" = c ]; then
    SENDERS=2 RECEIVERS=2 TP=2 VERSIONS=3 PY_PAIR=0 TIMEOUT=60 \
        bash "$run_pair" "$tmp/static" "$tmp/shared" | tee "$tmp/pair.log"
    for r in 0 1; do
        n=$(grep -c "^\[worker$r\] worker $r (tp $r/2): version [123], .*every element right" "$tmp/pair.log" || true)
        [ "$n" = 3 ] || { echo "FAIL: worker $r reported $n of 3 versions right"; exit 1; }
    done

    echo "--- trainers writing version v+1's weights as v: the workers must say so"
    if SENDERS=2 RECEIVERS=2 TP=2 VERSIONS=1 SKEW=1 PY_PAIR=0 TIMEOUT=60 \
            bash "$run_pair" "$tmp/static" "$tmp/shared" >"$tmp/skew.log" 2>&1; then
        cat "$tmp/skew.log"; echo "FAIL: wrong weights passed the workers' check"; exit 1
    fi
    grep -q "worker 0: version 1: model.embed_tokens.weight element 0 (of param model.embed_tokens.weight) is 0x[0-9a-f]*, expected" "$tmp/skew.log" &&
        grep -q "worker 1 (tp 1/2): version 1, 19 targets, checksum [0-9a-f]*, WRONG" "$tmp/skew.log" ||
        { cat "$tmp/skew.log"; echo "FAIL: the workers did not name the wrong elements"; exit 1; }
    echo "ok: the workers refused the wrong version"

    echo "--- pkg-config"
    if command -v pkg-config >/dev/null; then
        export PKG_CONFIG_PATH=$(dirname "$pc")
        # shellcheck disable=SC2046,SC2086
        "$cc" $flags -I"$src/examples/c" -o "$tmp/worker-pc" "$src/examples/c/worker.c" \
            $(pkg-config --cflags --libs wsync) -Wl,-rpath,"$(pkg-config --variable=libdir wsync)"
        out=$("$tmp/worker-pc" --tp 0 2>&1 || true)   # a usage error, after loading libwsync.so
        grep -q -- "--tp must be >= 1" <<<"$out" ||
            { echo "FAIL: the pkg-config build of worker.c does not run"; exit 1; }
        echo "ok: worker.c builds and runs with \$(pkg-config --cflags --libs wsync)"
    else
        echo "pkg-config not installed: its check skipped"
    fi
    echo "PASS"
    exit 0
fi

# python: a C trainer into the C worker and the Python receiver, which must agree
if ! "$python" -c 'import sys; assert sys.version_info >= (3, 8)'; then
    echo "SKIP: $python is missing or older than 3.8"; exit 77
fi
lib=$(find "$tmp/prefix" -name libwsync.so -print -quit)
if [ -n "$preload" ]; then
    printf '#!/bin/sh\nLD_PRELOAD="%s" exec "%s" "$@"\n' "$preload" "$python" >"$tmp/python"
    chmod +x "$tmp/python"
    python=$tmp/python
fi
PYTHONPATH=$src/python WSYNC_LIBRARY=$lib PYTHON=$python \
    SENDERS=1 RECEIVERS=2 TP=1 VERSIONS=3 PY_RECEIVERS=1 PY_PAIR=0 TIMEOUT=60 \
    bash "$run_pair" "$tmp/shared" | tee "$tmp/pair.log"
for v in 1 2 3; do
    c=$(sed -n "s/^\[worker0\] .*version $v, 19 targets, checksum \([0-9a-f]*\), every element right$/\1/p" "$tmp/pair.log")
    p=$(sed -n "s/^\[pyreceiver1\] .*version $v, 19 targets, checksum \([0-9a-f]*\), every element right$/\1/p" "$tmp/pair.log")
    if [ -z "$c" ] || [ "$c" != "$p" ]; then
        echo "FAIL: version $v: C worker checksum '$c', Python receiver '$p'"; exit 1
    fi
done
echo "PASS: the Python receiver and the C worker hold the same bytes of every version"
