#!/usr/bin/env bash
# arraybridge on other CPUs' Linux, built with Debian's cross compilers:
#   tools/check-cross.sh aarch64   64-bit Arm (Graviton, Grace, Jetson,
#                                  Ampere); the suites run under qemu-user
#   tools/check-cross.sh i386      32-bit x86; the suites run natively (an
#                                  x86-64 kernel runs 32-bit programs)
#   tools/check-cross.sh armhf     32-bit Arm with hardware floating point
#                                  (ARMv7: Raspberry Pi OS 32-bit, i.MX
#                                  boards); the tests that are plain
#                                  programs (the fuzz corpora's replays, the
#                                  stress programs, abtool's check, the
#                                  install check) run under qemu-user, and
#                                  the demo. Not the Criterion suites:
#                                  Debian builds no Criterion for armhf.
#   tools/check-cross.sh s390x     64-bit IBM Z, the one big-endian CPU
#                                  Debian builds for: the same tests as
#                                  armhf (no Criterion for s390x either),
#                                  under qemu-user. Its first run found
#                                  abtool reading .npy data as it lay
#                                  (little-endian files misread) and the
#                                  tests' references taking an integer's
#                                  first bytes for its low ones.
#   tools/check-cross.sh musl      x86-64 with musl libc (Alpine), through
#                                  Debian's musl-gcc: the same tests as
#                                  armhf, run natively. Its first run found
#                                  the thread count taken from a pinned
#                                  caller's own mask (the process's was read
#                                  on glibc only) and abtool losing a write
#                                  error's reason.
#
# Why: every x86 kernel in converters/host/ sits behind __x86_64__ (but
# F16C's float16 conversions, which 32-bit x86 runs too), and what
# other CPUs run instead (the portable tiles, cast loops and the rules that
# choose them) is compiled and run nowhere else; the 32-bit targets add
# what 32 bits change: 4-byte size_t and pointers (every size check on the
# way to an allocation), 64-bit integers in pairs of registers, no
# __int128, and on i386 8-byte integers and doubles aligned to 4 in
# structs. The host backend only: no OpenCL ICD or CUDA toolkit for these
# is installed here.
#
# What it does:
#  1. installs the cross gcc and g++ (the install check compiles the header
#     from C++ too) and C library (gcc-aarch64-linux-gnu,
#     g++-aarch64-linux-gnu, libc6-dev-arm64-cross; the i686, armhf and
#     s390x ones alike; for musl, musl-tools and musl-dev), libc6-i386 for
#     i386 (the 32-bit loader the kernel starts its programs with), and for
#     the qemu targets qemu-user and qemu-user-binfmt from Debian, the
#     missing ones
#     (qemu-user-static, where installed, stands for the last two;
#     qemu-user-binfmt may register qemu for every architecture it ships
#     where systemd runs). The DLPack header comes from tools/setup-deps.sh
#     (the make test-<target> targets run it first);
#  2. where the Criterion suites run, downloads Criterion (the tests' framework) and
#     the libraries it needs for the target with a private apt
#     configuration (the system's architectures and package lists are left
#     alone) and unpacks them into $build/sysroot, with Debian's C and C++
#     libraries for qemu to load (but not the C library's or the kernel's
#     headers: the cross compiler has its own; nor, for i386, the C
#     library, which must be libc6-i386's);
#  3. (the qemu targets) makes sure the kernel runs the target's programs through
#     qemu (binfmt_misc): Criterion starts each test as a new process of the test
#     binary, which nothing else can route through qemu. Where a program of
#     the build does not run, it mounts binfmt_misc if need be and registers
#     Debian's qemu entry for the target (root, or sudo; it stays
#     registered, as qemu-user-binfmt would leave it);
#  4. configures cmake/<triplet>.cmake into $build and builds everything
#     (library, abtool, examples but the image one, which needs libpng;
#     tests (armhf, s390x and musl: the plain-program ones,
#     AB_TESTS_CRITERION=OFF);
#     benchmarks: built, not run), warnings as errors;
#  5. runs ctest, 25 minutes at most a suite (i386: natively, with the
#     sysroot's libraries). Under qemu test_parallel runs apart, without
#     fork_and_shutdown_leave_working_threads, which forks a process with
#     threads: qemu 7.2's user mode asserts in such a child (cpu_exec:
#     "cpu == current_cpu"), its own error, not the library's; the other
#     such fork tests skip themselves there (AB_TESTS_UNDER_QEMU). They
#     run natively in every other tier, i386's included. armhf and s390x
#     also run the demo under qemu, musl natively.
# Where the target's programs cannot be run through binfmt_misc (no root,
# or a container that refuses it), step 5 is replaced by the demo and
# `abtool info` under qemu, and the script says loudly that the suites did
# not run; AB_CROSS_REQUIRE_SUITES=1 (as .ci/run sets it) makes that a
# failure.
#
# Environment: AB_CROSS_BUILD (default build-<target>), JOBS.
set -euo pipefail

target=${1:-}
# triplet: the cross compiler's; multiarch: Debian's library folder; qemu:
# none where the kernel runs the programs itself; criterion: whether Debian
# has Criterion for the target (else only the plain-program tests run).
case "$target" in
  aarch64) triplet=aarch64-linux-gnu multiarch=aarch64-linux-gnu debarch=arm64 qemu_name=qemu-aarch64 criterion=1 ;;
  i386) triplet=i686-linux-gnu multiarch=i386-linux-gnu debarch=i386 qemu_name="" criterion=1 ;;
  armhf) triplet=arm-linux-gnueabihf multiarch=arm-linux-gnueabihf debarch=armhf qemu_name=qemu-arm criterion=0 ;;
  s390x) triplet=s390x-linux-gnu multiarch=s390x-linux-gnu debarch=s390x qemu_name=qemu-s390x criterion=0 ;;
  musl) triplet=x86_64-linux-musl multiarch=x86_64-linux-musl debarch=amd64 qemu_name="" criterion=0 ;;
  *) echo "usage: tools/check-cross.sh aarch64|i386|armhf|s390x|musl" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/retry.sh
. "$root/tools/retry.sh"
build=${AB_CROSS_BUILD:-$root/build-$target}
case "$build" in /*) ;; *) build=$root/$build ;; esac
sysroot=$build/sysroot
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
say() { echo "check-cross ($target): $*"; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---- 1. cross compiler and qemu ------------------------------------------
packages=("gcc-$triplet" "g++-$triplet" "libc6-dev-$debarch-cross")
qemu=()
if [ "$target" = musl ]; then
  packages=(musl-tools musl-dev)
elif [ -z "$qemu_name" ]; then
  packages+=(libc6-i386)
elif installed qemu-user-static; then # conflicts with qemu-user-binfmt, and does its job
  qemu=("$qemu_name-static")
else
  qemu=("$qemu_name")
  packages+=(qemu-user qemu-user-binfmt)
fi
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  retry_update $sudo apt-get update -q || true # the install below fails by itself
  retry $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The DLPack header, copied where nothing else is: -I/usr/include would put
# the build machine's C headers before the cross compiler's.
dlpack=$root/.deps/dlpack/usr/include/dlpack/dlpack.h
[ -f "$dlpack" ] || dlpack=/usr/include/dlpack/dlpack.h
[ -f "$dlpack" ] || { say "no DLPack header: run tools/setup-deps.sh (make test-$target does)" >&2; exit 1; }
mkdir -p "$build/dlpack-include/dlpack"
cp "$dlpack" "$build/dlpack-include/dlpack/dlpack.h"

# ---- 2. the target's Criterion in a sysroot of our own ----------------------
want="libcriterion-dev libc6 libstdc++6" # libstdc++6: the install check's C++ consumer
if [ "$criterion" = 1 ] && { [ ! -f "$sysroot/.packages" ] || [ "$(cat "$sysroot/.packages")" != "$debarch: $want" ]; }; then
  say "fetching $debarch packages ($want and what they need) into $sysroot"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  : > "$work/status"
  apt_opts=(-q -o "APT::Architecture=$debarch" -o "APT::Architectures::=$debarch"
            -o "Dir::State::Lists=$work/lists" -o "Dir::State::status=$work/status" -o "Dir::Cache=$work/cache"
            -o "APT::Sandbox::User=$(id -un)")
  indexes=complete
  retry_update apt-get "${apt_opts[@]}" update >/dev/null || indexes=partial
  # What it asks for must resolve whole from the indexes fetched (apt-cache
  # depends below leaves out a name it cannot find and says nothing).
  # shellcheck disable=SC2086
  apt-get "${apt_opts[@]}" -s install $want >/dev/null ||
    { say "cannot resolve $want for $debarch from the package indexes fetched" >&2; exit 1; }
  # Lines at column 0 are packages (virtual ones and alternatives are
  # indented or in angle brackets).
  # shellcheck disable=SC2086
  debs=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances $want | grep -E "^[a-z0-9][a-z0-9.+-]*(:$debarch)?\$" | sed "s/:$debarch\$//" | sort -u)
  # shellcheck disable=SC2086
  (cd "$work/debs" && retry apt-get "${apt_opts[@]}" download $debs >/dev/null)
  rm -rf "$sysroot"
  mkdir -p "$sysroot"
  for d in "$work"/debs/*.deb; do
    case "$(basename "$d")" in # headers the cross compiler has in its own versions
      libc6-dev_* | linux-libc-dev_* | libcrypt-dev_* | libnsl-dev_* | libtirpc-dev_* | rpcsvc-proto_*) continue ;;
    esac
    # i386 programs start with libc6-i386's loader, which takes only the C
    # library built with it (/lib32), not a sysroot's of another version.
    if [ -z "$qemu_name" ]; then case "$(basename "$d")" in libc6_*) continue ;; esac; fi
    dpkg-deb -x "$d" "$sysroot"
  done
  # Marked done only from complete indexes: after a partial update, the
  # next run fetches again.
  [ "$indexes" = partial ] || echo "$debarch: $want" > "$sysroot/.packages"
  rm -rf "$work"
  trap - EXIT
fi

# ---- 3. build ----------------------------------------------------------------
# Where the target's programs find their C library: the sysroot's where the
# Criterion suites run, else the cross compiler's (armhf:
# /usr/arm-linux-gnueabihf).
if [ "$criterion" = 1 ]; then libs=$sysroot; else libs=/usr/$triplet; fi
export QEMU_LD_PREFIX=$libs
with_criterion=OFF
[ "$criterion" = 1 ] && with_criterion=ON
under_qemu=OFF
[ -n "$qemu_name" ] && under_qemu=ON
PKG_CONFIG_SYSROOT_DIR=$sysroot \
PKG_CONFIG_LIBDIR=$sysroot/usr/lib/$multiarch/pkgconfig:$sysroot/usr/share/pkgconfig \
  cmake -S "$root" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/$triplet.cmake" \
    -DAB_CROSS_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DAB_WITH_OPENCL=OFF -DAB_WITH_CUDA=OFF \
    -DAB_BUILD_TESTS=ON -DAB_TESTS_CRITERION=$with_criterion -DAB_TESTS_UNDER_QEMU=$under_qemu -DAB_BUILD_BENCH=ON -DAB_DLPACK_INCLUDE_DIR="$build/dlpack-include" -DCMAKE_C_FLAGS=-Werror \
    > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
grep -E '^-- arraybridge' "$build/configure.log" || true
cmake --build "$build" -j "$jobs"

# ---- 4. can the kernel start the target's programs? ----------------------
# i386 programs load the sysroot's Criterion and the libraries it needs.
[ -n "$qemu_name" ] || export LD_LIBRARY_PATH="$sysroot/lib/$multiarch:$sysroot/usr/lib/$multiarch"
binfmt=/proc/sys/fs/binfmt_misc
runs() { "$build/abtool" info >"$build/runs.log" 2>&1; }
why=""
if ! runs && [ "$target" = musl ]; then
  why="abtool did not start ($(head -c 300 "$build/runs.log" | tr '\n' ' '))"
elif ! runs && [ -z "$qemu_name" ]; then
  why="abtool did not start ($(head -c 300 "$build/runs.log" | tr '\n' ' ')): does this kernel run 32-bit programs (IA32 emulation)?"
elif ! runs; then
  conf=/usr/lib/binfmt.d/$qemu_name.conf
  why="$target programs do not start here"
  {
    [ -e "$binfmt/register" ] || $sudo mount -t binfmt_misc binfmt_misc "$binfmt"
    # An entry of that name that does not run our programs (disabled, or an
    # interpreter this system lacks) is replaced by Debian's.
    if [ -e "$binfmt/$qemu_name" ]; then $sudo sh -c "echo -1 > '$binfmt/$qemu_name'"; fi
    $sudo sh -c "cat '$conf' > '$binfmt/register'"
  } 2>"$build/binfmt.log" || true
  if runs; then why=""; else why="$why; $(tr '\n' ' ' < "$build/binfmt.log")"; fi
fi

# ---- 5. run -----------------------------------------------------------------
# No OpenCL or CUDA backend in this build: their tests skip, as they do on
# any machine without those devices (make exports AB_TEST_EXPECT_OPENCL=2
# for the native build, which would make them fail).
export AB_TEST_EXPECT_OPENCL=0 AB_TEST_EXPECT_CUDA=0
if [ -n "$why" ]; then
  if [ -n "$qemu_name" ]; then
    "${qemu[@]}" "$build/abtool" info
    "${qemu[@]}" "$build/examples/ab_demo"
    say "NOT RUN: the test suites. The kernel could not be made to start $target programs through qemu" \
        "(binfmt_misc: $why); Criterion starts each test as a new process. Built for $target," \
        "and the demo ran under ${qemu[*]}."
  else
    say "NOT RUN: the test suites and the demo: $why. Built for $target."
  fi
  if [ "${AB_CROSS_REQUIRE_SUITES:-0}" = 1 ]; then exit 1; fi
elif [ "$target" = musl ]; then
  say "running the plain-program tests natively"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" --timeout 1500
  "$build/examples/ab_demo"
  say "the plain-program tests passed and the demo ran with musl (host backend only); NOT RUN: the Criterion" \
      "suites (Debian has no Criterion built for musl)"
elif [ -z "$qemu_name" ]; then
  say "running the test suites natively"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" --timeout 1500
  say "every suite passed on $target (host backend only)"
else
  say "running the test suites under $("${qemu[@]}" --version | head -n1)"
  ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" --timeout 1500 -E '^test_parallel$'
  if [ "$criterion" = 1 ]; then
    out=$(cd "$build/tests" && ./test_parallel --jobs=1 --short-filename --filter '!(parallel/fork_and_shutdown_*)' 2>&1) ||
      { echo "$out"; exit 1; }
    echo "$out" | tail -n1
    echo "$out" | grep -q 'Tested: [1-9]' || { say "test_parallel ran no test" >&2; exit 1; }
    say "every suite passed on $target (qemu-user; host backend only)"
  else
    "$build/examples/ab_demo"
    say "the plain-program tests passed and the demo ran on $target (qemu-user; host backend only);" \
        "NOT RUN: the Criterion suites (Debian has no Criterion for $target)"
  fi
fi
