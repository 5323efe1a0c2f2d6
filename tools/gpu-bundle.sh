#!/usr/bin/env bash
# Packs the CUDA programs of a build, with the shared libraries they load
# that a bare GPU machine may lack (Criterion and its dependencies, the
# OpenCL ICD loader), into one folder, for tools/gpu-check.sh to run there:
#
#   tools/gpu-bundle.sh [BUILD] [DEST]      (defaults: build, .gpu)
#   ... copy DEST to the GPU machine, then in the repository there:
#   AB_GPU_PREBUILT=DEST tools/gpu-check.sh
# gpu-check puts DEST/lib on its programs' library path itself; the
# benchmarks packed beside them (bench_host, bench_pool, bench_threads,
# bench_convert), run by hand, need it too:
#   LD_LIBRARY_PATH=$PWD/DEST/lib DEST/bench/bench_host
#
# The C library and glibc's own libraries stay out (the GPU machine's
# glibc must be as new as this one's or newer). Debug info is stripped,
# symbols are kept, so a crash there still names its function.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dest=${2:-$root/.gpu}
progs=(abtool tests/test_cuda tests/test_conformance_cuda tests/stress_threads bench/bench_cuda
       bench/bench_host bench/bench_pool bench/bench_threads bench/bench_convert)
grep -q cudart_static "$build/arraybridge.pc" 2>/dev/null ||
  { echo "gpu-bundle: $build has no CUDA backend" >&2; exit 2; }
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/tests" "$dest/bench"
for p in "${progs[@]}"; do
  [ -x "$build/$p" ] || { echo "gpu-bundle: $build/$p is missing" >&2; exit 2; }
  strip --strip-debug -o "$dest/$p" "$build/$p"
done
for p in "${progs[@]}"; do ldd "$build/$p"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$dest/lib/"; done
echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n) from $(git -C "$root" describe --always --dirty)," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(ldd --version | head -1)" > "$dest/BUILT"
du -sh "$dest"
