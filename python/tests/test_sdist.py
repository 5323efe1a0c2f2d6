"""The sdist builds away from the repository: `setup.py sdist` carries the C
library's tree (csrc/) and the DLPack header, a wheel is built from the
archive alone, and the module it holds converts."""
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (cmd, r.returncode, r.stdout[-4000:], r.stderr[-4000:])
    return r


def test_a_wheel_built_from_the_sdist_alone_converts(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=PYTHON_DIR)
    (archive,) = dist.glob("arraybridge-*.tar.gz")
    with tarfile.open(archive) as t:
        names = t.getnames()
    top = names[0].split("/")[0]
    for need in ("csrc/CMakeLists.txt", "csrc/include/arraybridge/arraybridge.h", "csrc/src/convert.c",
                 "csrc/converters/host/gather.c", "csrc/third_party/dlpack/dlpack.h", "src/module.c"):
        assert "%s/%s" % (top, need) in names, "the sdist lacks %s" % need

    # Unpacked where no repository is above it, built without the CUDA
    # backend (the quick build; the module builds with it in make test).
    with tarfile.open(archive) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(tmp_path / "unpacked", filter="data")
        else:
            t.extractall(tmp_path / "unpacked")
    env = dict(os.environ, AB_PY_CMAKE_ARGS="-DAB_WITH_CUDA=OFF", AB_PY_BUILD_DIR=str(tmp_path / "cbuild"))
    env.pop("AB_PY_SIMCUDA", None)
    wheels = tmp_path / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         str(tmp_path / "unpacked" / top)], env=env, cwd=str(tmp_path))
    (wheel,) = wheels.glob("arraybridge-*.whl")
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)])
    check = (
        "import numpy as np, arraybridge as ab\n"
        "assert ab.__file__.startswith(%r), ab.__file__\n"
        "a = np.arange(12, dtype=np.float32).reshape(3, 4)\n"
        "b = ab.convert_memory(a.T, 'numpy', 'numpy', dtype='float64')\n"
        "assert b.dtype == np.float64 and (b == a.T).all()\n"
        "print('ok')\n" % str(target)
    )
    r = run([sys.executable, "-c", check], env=dict(os.environ, PYTHONPATH=str(target)), cwd=str(tmp_path))
    assert r.stdout.strip() == "ok"


def test_a_build_from_the_repository_hands_cmake_the_header_ab_dlpack_include_dir_names(tmp_path):
    """setup.py's messages say to set AB_DLPACK_INCLUDE_DIR, but a build
    from the repository never passed it on (only an sdist's own header),
    so CMake failed where .deps/ and the system had none. A stand-in cmake
    on PATH records what it is asked to configure with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "cmake-args"
    fake = bin_dir / "cmake"
    fake.write_text('#!/bin/sh\nprintf "%%s\\n" "$@" > %s\nexit 3\n' % argv_file)
    fake.chmod(0o755)
    include = tmp_path / "my include"
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]), AB_DLPACK_INCLUDE_DIR=str(include),
               AB_PY_BUILD_DIR=str(tmp_path / "cbuild"))
    env.pop("AB_PY_SIMCUDA", None)
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "-b", str(tmp_path / "out"), "-t", str(tmp_path / "tmp")], cwd=PYTHON_DIR,
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "building the C library with CMake failed" in r.stderr, r.stderr[-2000:]
    args = argv_file.read_text().splitlines()
    assert args[:2] == ["-S", os.path.dirname(PYTHON_DIR)], args
    assert "-DAB_DLPACK_INCLUDE_DIR=%s" % include in args, args


def test_an_sdist_refused_for_want_of_a_header_leaves_nothing_to_stop_the_next(tmp_path):
    """Without a DLPack header the sdist is refused; it used to be refused
    after copying the C tree into the release tree, which it left behind,
    and every later sdist then failed on the copy (File exists) until the
    folder was removed by hand. A release tree an interrupted sdist left
    is not packed into the next."""
    env = dict(os.environ, AB_DEPS_DIR=str(tmp_path / "no-deps"))
    env.pop("AB_DLPACK_INCLUDE_DIR", None)
    for inc in ("/usr/local/include", "/usr/include"):  # where setup.py looks outside the repository
        path = os.path.join(inc, "dlpack", "dlpack.h")
        if os.path.exists(path) and re.search(r"#define\s+DLPACK_MAJOR_VERSION\s+[1-9]", open(path).read()):
            pytest.skip("%s is a DLPack >= 1.0 header setup.py would find, so it cannot be made to find none" % path)
    before = set(os.listdir(PYTHON_DIR))
    r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "refused")], cwd=PYTHON_DIR,
                       env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "no DLPack >= 1.0 header for the sdist" in r.stderr, r.stderr[-2000:]
    left = sorted(n for n in set(os.listdir(PYTHON_DIR)) - before if n.startswith("arraybridge-"))
    assert left == [], "the refused sdist left %s in python/" % left
    version = run([sys.executable, "setup.py", "--version"], cwd=PYTHON_DIR).stdout.split()[-1]
    stale = os.path.join(PYTHON_DIR, "arraybridge-%s" % version)
    try:
        os.makedirs(os.path.join(stale, "csrc", "cmake"))  # as an interrupted sdist leaves it
        with open(os.path.join(stale, "stale.txt"), "w") as f:
            f.write("left by an interrupted sdist\n")
        dist = tmp_path / "dist"
        run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=PYTHON_DIR)
    finally:
        shutil.rmtree(stale, ignore_errors=True)
    (archive,) = dist.glob("arraybridge-*.tar.gz")
    with tarfile.open(archive) as t:
        names = t.getnames()
    assert "arraybridge-%s/stale.txt" % version not in names, "the stale release tree was packed"
    assert "arraybridge-%s/csrc/CMakeLists.txt" % version in names
