#!/usr/bin/env bash
# Makes tests/golden/gguf/{quants,expected}.gguf with ggml's own quantizers, dequantizers and GGUF
# writer: builds ggml's base library from a ggml checkout (GGML_SRC; not part of this project) with
# -ffp-contract=off, as vortex's library is built, so that to_float's multiply-adds round as ours
# do, then builds and runs make_gguf_golden.c against it.
#
#   GGML_SRC=/path/to/ggml tests/golden/gguf/make_gguf_golden.sh
#
# Made with ggml d99724f2 (github.com/ggml-org/ggml).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GGML_SRC:?set GGML_SRC to a ggml checkout}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_BUILD_TESTS=OFF \
  -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_C_FLAGS=-ffp-contract=off \
  -DCMAKE_CXX_FLAGS=-ffp-contract=off >/dev/null
cmake --build "$work/build" --target ggml-base -j"$(nproc)" >/dev/null
lib=$(find "$work/build" -name 'libggml-base.a' | head -1)
cc -O2 -ffp-contract=off -I"$src/include" "$here/make_gguf_golden.c" "$lib" -lm -lstdc++ -lpthread -fopenmp -o "$work/make"
"$work/make" "$here/quants.gguf" "$here/expected.gguf"
ls -l "$here/quants.gguf" "$here/expected.gguf"
