#!/usr/bin/env bash
# Installs what building and testing arraybridge needs, from Debian's packages
# (and any packages named as arguments).
# Idempotent and quick when everything is present: apt-get runs only when a
# package is missing.
#
# The DLPack header must be >= 1.0. Debian bookworm ships 0.6, so when the
# system header is older we download libdlpack-dev from a newer Debian suite
# (AB_DLPACK_SUITE, default "trixie") with a private apt configuration that
# leaves the system's sources untouched, and unpack it into .deps/dlpack
# (AB_DEPS_DIR), where CMake looks first.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/retry.sh
. "$root/tools/retry.sh"
deps=${AB_DEPS_DIR:-$root/.deps}
suite=${AB_DLPACK_SUITE:-trixie}
packages=(build-essential cmake pkg-config libcriterion-dev
          ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libpng-dev doxygen valgrind)
# Packages named on the command line too (make test-clang: clang).
packages+=("$@")

# The Python module (python/, tested by make test) needs a CPython with its
# headers and venv; Debian's python3 has them in separate packages.
has_python_dev='import os, sys, sysconfig, venv, ensurepip
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
if ! command -v python3 >/dev/null || ! python3 -c "$has_python_dev" 2>/dev/null; then
  packages+=(python3 python3-dev python3-venv)
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-deps: installing ${missing[*]}"
  retry_update $sudo apt-get update -q || true # the install below fails by itself
  retry $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A CUDA toolkit, for the CUDA backend and its tests against the simulated
# runtime. Where none is installed (no nvcc on PATH or in /usr/local/cuda),
# NVIDIA's toolkit wheels from PyPI, pinned to CUDA 13.0 (nvcc, cudart with
# its static library, the CRT and CCCL headers, NVVM), are unpacked into
# .deps/cuda, which CMake uses only when it finds no other toolkit.
# Measured on 2026-11-24: 105 MB to download, 271 MB on disk, 5 s; Debian's
# nvidia-cuda-toolkit (CUDA 11.8, from non-free) is 52 packages, 1.6 GB to
# download and 5.4 GB on disk. AB_CUDA_TOOLKIT=none skips it (no CUDA
# backend; configure and make test then say so).
cuda_wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
             nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85)
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  :
elif [ "${AB_CUDA_TOOLKIT:-}" = none ]; then
  echo "setup-deps: NOTE: AB_CUDA_TOOLKIT=none: no CUDA toolkit, so no CUDA backend and none of its tests" >&2
elif [ ! -x "$deps/cuda/nvidia/cu13/bin/nvcc" ] || [ "$(cat "$deps/cuda/.wheels" 2>/dev/null)" != "${cuda_wheels[*]}" ]; then
  echo "setup-deps: no CUDA toolkit here: fetching NVIDIA's CUDA 13.0 toolkit wheels from PyPI into $deps/cuda (105 MB)"
  cwork=$(mktemp -d)
  rm -rf "$deps/cuda"
  if python3 -m venv "$cwork/venv" && "$cwork/venv/bin/pip" install -q --no-deps --target "$deps/cuda" "${cuda_wheels[@]}" &&
     [ -x "$deps/cuda/nvidia/cu13/bin/nvcc" ]; then
    echo "${cuda_wheels[*]}" > "$deps/cuda/.wheels"
  else
    rm -rf "$deps/cuda"
    echo "setup-deps: NOTE: could not fetch the CUDA toolkit wheels: the CUDA backend and its tests against the" \
         "simulated runtime will not be built (configure and make test say so)." >&2
  fi
  rm -rf "$cwork"
fi

dlpack_major() {
  sed -n 's/^#define DLPACK_MAJOR_VERSION \([0-9]*\).*/\1/p' "$1" 2>/dev/null | head -n1 || true
}

sys_major=$(dlpack_major /usr/include/dlpack/dlpack.h)
if [ -n "$sys_major" ] && [ "$sys_major" -ge 1 ]; then
  exit 0  # the system header is new enough; CMake finds it there
fi
# Already fetched from the suite asked for: nothing to do.
if [ -f "$deps/dlpack/usr/include/dlpack/dlpack.h" ] && [ "$(cat "$deps/dlpack/.suite" 2>/dev/null)" = "$suite" ]; then
  exit 0
fi

echo "setup-deps: fetching libdlpack-dev from Debian $suite (system header is ${sys_major:-absent}, need >= 1.0)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
  > "$work/sources.list"
apt_opts=(-q -o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o "APT::Sandbox::User=$(id -un)")
retry apt-get "${apt_opts[@]}" update >/dev/null # one source: nothing to go on with
(cd "$work" && retry apt-get "${apt_opts[@]}" download libdlpack-dev >/dev/null)
mkdir -p "$deps/dlpack.tmp"
dpkg-deb -x "$work"/libdlpack-dev_*.deb "$deps/dlpack.tmp"
major=$(dlpack_major "$deps/dlpack.tmp/usr/include/dlpack/dlpack.h")
if [ -z "$major" ] || [ "$major" -lt 1 ]; then
  echo "setup-deps: libdlpack-dev from $suite is not >= 1.0" >&2
  rm -rf "$deps/dlpack.tmp"
  exit 1
fi
echo "$suite" > "$deps/dlpack.tmp/.suite"
rm -rf "$deps/dlpack"
mv "$deps/dlpack.tmp" "$deps/dlpack"
echo "setup-deps: DLPack header $(sed -n 's/^#define DLPACK_MINOR_VERSION \([0-9]*\).*/'"$major"'.\1/p' "$deps/dlpack/usr/include/dlpack/dlpack.h") in $deps/dlpack"
