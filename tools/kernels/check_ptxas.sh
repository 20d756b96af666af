#!/usr/bin/env bash
# Recompiles the Hopper wgmma kernels of a configured build with ptxas's report and fails when
# ptxas serialized a wgmma pipeline ("wgmma.mma_async instructions are serialized", for any reason:
# C7514, an accumulator read while its product runs; C7513, an input register defined while a
# product runs) or spilled registers in a shipped kernel instance. Both leave the output correct,
# so only ptxas's report (or the timing) reveals them: session 6's int8fp8 v3 and v4 lost 20–30%
# to C7514, session 9's speculative-max variant 32% to C7513.
# Timeline instances (template argument kTimeline = true, "ILb1E" in the mangled name) may spill
# a few bytes: they run for diagnostics only.
#
#   tools/kernels/check_ptxas.sh BUILD_DIR
set -euo pipefail
build_dir=${1:?usage: check_ptxas.sh BUILD_DIR}
sources=(src/cuda/attention_wgmma.cu src/cuda/attention_wgmma_v2.cu src/cuda/attention_int8fp8.cu src/cuda/vae_conv3d_tc.cu)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0
for source in "${sources[@]}"; do
  command=$(ninja -C "$build_dir" -t commands | grep -F -- "-c $(cd "$(dirname "$0")/../.." && pwd)/$source" | head -1 || true)
  if [ -z "$command" ]; then
    echo "check_ptxas: no compile command for $source in $build_dir (not a CUDA build?)"
    exit 1
  fi
  report="$scratch/$(basename "$source").txt"
  # The same command, with ptxas's report and the object written to the scratch folder.
  (cd "$build_dir" && eval "$(echo "$command" | sed "s| -o [^ ]*| -o $scratch/object.o|; s| -c | -Xptxas -v -c |")") \
    >"$report" 2>&1 || { cat "$report"; echo "check_ptxas: $source does not compile"; exit 1; }
  serialized=$(grep -c "wgmma.mma_async instructions are serialized" "$report" || true)
  # "Compiling entry function 'NAME'" is followed by its stack/spill line.
  spilling=$(awk '/Compiling entry function/ { name = $0 } / bytes spill stores/ && $5 + 0 > 0 && name !~ /ILb1E/ { print name }' "$report")
  if [ "$serialized" -gt 0 ]; then
    echo "check_ptxas: $source: ptxas serialized wgmma pipelines:"
    grep "wgmma.mma_async instructions are serialized" "$report"
    failures=$((failures + 1))
  fi
  if [ -n "$spilling" ]; then
    echo "check_ptxas: $source: shipped kernels spill registers:"
    echo "$spilling"
    failures=$((failures + 1))
  fi
  echo "check_ptxas: $source: $(grep -c 'Compiling entry function' "$report") kernels, $serialized serialized"
done
exit $((failures > 0))
