#!/usr/bin/env bash
# make soak: randomized host conversions (tests/stress/soak.c) under random
# settings of every switch that picks a host kernel, for a while.
#
#   tools/soak.sh [SECONDS=600] [PROGRAM=build/tests/stress_soak]
#
# The AB_HOST_* switches, AB_NUM_THREADS, AB_PARALLEL_MIN and the pool's
# switches are read once per process, so each run of the program gets its
# own draw of them (unset counts as one value: the library's own choice)
# and a seed of its own, and converts CASES random cases (SOAK_CASES,
# default 25) of up to SOAK_MAX_MIB MiB of result (default 40). A run
# fails where a case differs, the program crashes, it runs past
# SOAK_RUN_SECONDS (default 600: a hang), or the library says a drawn
# setting was ignored (a value this script misspelt would otherwise test
# the default under another name). Every failure is printed with the
# settings and the command that replays it. Exits 1 where any run failed,
# 0 otherwise; the last line counts runs and failures. SOAK_DEVICE
# (opencl:0, say) sends every case through that device (soak.c).
set -u
secs=${1:-600}
prog=${2:-build/tests/stress_soak}
cases=${SOAK_CASES:-25}
max_mib=${SOAK_MAX_MIB:-40}
run_secs=${SOAK_RUN_SECONDS:-600}
[ -x "$prog" ] || { echo "soak: $prog not built (make build)"; exit 2; }

pick() { # pick VALUE...: one of the arguments at random; "-" means unset
  local a=("$@")
  echo "${a[RANDOM % ${#a[@]}]}"
}

start=$(date +%s) runs=0 bad=0 seed_base=${SOAK_SEED:-$(( (RANDOM << 15) | RANDOM ))}
summary() { echo "soak: $runs runs of $cases cases (seeds $seed_base..$((seed_base + runs - 1))), $bad failed"; }
trap 'echo "soak: stopped"; summary; exit 130' INT TERM
export AB_LOG_LEVEL=error # the "ignored" lines
# no OpenCL drivers loaded unless the soak goes through an OpenCL device
case "${SOAK_DEVICE:-}" in opencl*) ;; *) export OCL_ICD_VENDORS=${OCL_ICD_VENDORS:-/nonexistent} ;; esac
while [ $(( $(date +%s) - start )) -lt "$secs" ]; do
  env=()
  for kv in \
    "AB_HOST_TILES $(pick - - sse2 ssse3 avx avx2 avx512 avx512vbmi)" \
    "AB_HOST_STREAMING $(pick - - 0 1 blocked trial)" \
    "AB_HOST_LINE_TILES $(pick - 0 1)" \
    "AB_HOST_U8_LANES $(pick - 0 1)" \
    "AB_HOST_CAST_TILES $(pick - 0 1)" \
    "AB_HOST_CAST_STREAMING $(pick - 0 1)" \
    "AB_HOST_CAST_PREFETCH $(pick - 0 1)" \
    "AB_HOST_PREFETCH $(pick - pages narrow off)" \
    "AB_HOST_WIDE_BLOCKS $(pick - 0 1)" \
    "AB_HOST_BLOCK_BUFFERS $(pick - 1 2)" \
    "AB_HOST_VENDOR $(pick - intel other)" \
    "AB_HOST_HUGEPAGES $(pick - 0)" \
    "AB_HOST_F16C $(pick - 0)" \
    "AB_NUM_THREADS $(pick - - 1 2 3 4)" \
    "AB_PARALLEL_MIN $(pick - - 64KiB 1MiB)" \
    "AB_POOL_THREAD_CACHE $(pick - 0)" \
    "AB_CONVERT_PLACE $(pick - host device)"; do
    set -- $kv
    [ "$2" = - ] || env+=("$1=$2")
  done
  seed=$(( seed_base + runs ))
  runs=$((runs + 1))
  out=$(timeout -k 10 "$run_secs" env "${env[@]}" "$prog" "$seed" "$cases" "$max_mib" 2>&1)
  rc=$?
  if [ $rc -eq 77 ]; then # SOAK_DEVICE does not exist: every run would skip
    printf '%s\n' "$out" | head -3
    echo "soak: $SOAK_DEVICE is missing; stopped"
    exit 2
  fi
  why="exit $rc"
  [ $rc -eq 124 ] && why="still running after ${run_secs}s"
  if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q 'ignored:'; then rc=1 why="a setting was ignored"; fi
  if [ $rc -ne 0 ]; then
    bad=$((bad + 1))
    echo "soak: run $runs failed ($why); replay: ${env[*]} $prog $seed $cases $max_mib"
    printf '%s\n' "$out" | grep -v '^stress_soak seed' | head -20
  fi
done
summary
[ $bad -eq 0 ]
