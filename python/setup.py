"""Builds arraybridge._arraybridge against the C library of the same tree.

The library is configured and built with CMake (static, position-independent)
from the repository root one level up (or, in an sdist, from the copy of it
in csrc/), into $AB_PY_BUILD_DIR (default <that tree>/build-python), and
linked into the extension with the private link flags its pkg-config file
lists (the static CUDA runtime, -ldl: the OpenCL ICD loader is opened at
run time, not linked), so the extension needs no libarraybridge.so at run
time. The DLPack header comes from the same CMake
configuration (tools/setup-deps.sh provides it; run `make deps` first on a
fresh machine); an sdist carries the one it was made with.

AB_PY_SIMCUDA=1 links the library against simcuda, a simulated CUDA runtime
(tests/simcuda), instead of cudart: for the module's CUDA tests on machines
without a GPU (make test-python). Never for an install that is used.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CSRC = os.path.join(HERE, "csrc")
# What CMake needs of the repository to build the library alone (no tests,
# benchmarks, examples or abtool): what an sdist carries in csrc/.
C_TREE = ["CMakeLists.txt", "cmake", "include", "src", "backends", "converters"]


def is_c_tree(root):
    return os.path.exists(os.path.join(root, "include", "arraybridge", "arraybridge.h"))


def dlpack_header():
    """A DLPack >= 1.0 header: $AB_DLPACK_INCLUDE_DIR's, tools/setup-deps.sh's or the system's; or None."""
    deps = os.environ.get("AB_DEPS_DIR") or os.path.join(REPO, ".deps")
    places = [os.environ.get("AB_DLPACK_INCLUDE_DIR"), os.path.join(deps, "dlpack", "usr", "include"),
              "/usr/local/include", "/usr/include"]
    for inc in filter(None, places):
        path = os.path.join(inc, "dlpack", "dlpack.h")
        if os.path.exists(path):
            with open(path) as f:
                m = re.search(r"#define\s+DLPACK_MAJOR_VERSION\s+(\d+)", f.read())
            if m and int(m.group(1)) >= 1:
                return path
    return None


class SdistWithLibrary(sdist):
    """An sdist that builds anywhere: the C library's tree goes into csrc/,
    with the DLPack header (third_party/dlpack/dlpack.h); without one here it
    is refused."""

    def make_release_tree(self, base_dir, files):
        # Refused before anything is written, so a refusal leaves no
        # release tree behind.
        if not is_c_tree(REPO):
            sys.exit("arraybridge: make the sdist in the repository (python/ next to include/ and src/)")
        header = dlpack_header()
        if header is None:
            sys.exit("arraybridge: no DLPack >= 1.0 header for the sdist: run tools/setup-deps.sh (make deps), "
                     "or set AB_DLPACK_INCLUDE_DIR to the folder that holds dlpack/dlpack.h")
        # sdist's own temporary tree, removed after packing: what an
        # interrupted sdist left there would be packed too.
        shutil.rmtree(base_dir, ignore_errors=True)
        super().make_release_tree(base_dir, files)
        dst = os.path.join(base_dir, "csrc")
        for name in C_TREE:
            src = os.path.join(REPO, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(dst, name), ignore=shutil.ignore_patterns("__pycache__"))
            else:
                os.makedirs(dst, exist_ok=True)
                shutil.copy2(src, os.path.join(dst, name))
        os.makedirs(os.path.join(dst, "third_party", "dlpack"))
        shutil.copy2(header, os.path.join(dst, "third_party", "dlpack", "dlpack.h"))


def stale_cache(build, source):
    """Whether build/ was configured for another source tree (a checkout moved or
    copied): CMake refuses it, so it is configured afresh."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_HOME_DIRECTORY:"):
                    return os.path.realpath(line.split("=", 1)[1].strip()) != os.path.realpath(source)
    except OSError:
        pass
    return False


class BuildWithLibrary(build_ext):
    def run(self):
        # An sdist's own copy first: one unpacked inside another checkout
        # builds what it carries.
        source = CSRC if is_c_tree(CSRC) else REPO
        if not is_c_tree(source):
            sys.exit("arraybridge: build the extension from the repository (python/ next to include/ and src/) "
                     "or from an sdist of it (csrc/)")
        build = os.environ.get("AB_PY_BUILD_DIR") or os.path.join(source, "build-python")
        if stale_cache(build, source):
            print("arraybridge: %s was configured for another source tree; configuring it afresh" % build)
            os.remove(os.path.join(build, "CMakeCache.txt"))
            shutil.rmtree(os.path.join(build, "CMakeFiles"), ignore_errors=True)
        cfg = ["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DAB_BUILD_TESTS=OFF",
               "-DAB_BUILD_BENCH=OFF", "-DAB_BUILD_EXAMPLES=OFF", "-DAB_BUILD_TOOLS=OFF"]
        # The DLPack header: $AB_DLPACK_INCLUDE_DIR's where it is set (the
        # messages above and CMake's name it), else an sdist's own; else
        # CMake looks in $AB_DEPS_DIR (or .deps) and the system.
        bundled = os.path.join(source, "third_party")
        if os.environ.get("AB_DLPACK_INCLUDE_DIR"):
            cfg += ["-DAB_DLPACK_INCLUDE_DIR=" + os.environ["AB_DLPACK_INCLUDE_DIR"]]
        elif source == CSRC and os.path.exists(os.path.join(bundled, "dlpack", "dlpack.h")):
            cfg += ["-DAB_DLPACK_INCLUDE_DIR=" + bundled]
        sim = os.environ.get("AB_PY_SIMCUDA") == "1"
        if sim:
            # No kernels run under simcuda: build them for one architecture only.
            cfg += ["-DAB_BUILD_SIMCUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=75-real"]
        cfg += shlex.split(os.environ.get("AB_PY_CMAKE_ARGS", ""))
        lib = "arraybridge_simcuda" if sim else "arraybridge_static"
        try:
            subprocess.check_call(cfg)
            if sim:
                with open(os.path.join(build, "arraybridge.pc")) as f:
                    if "cudart_static" not in f.read():
                        sys.exit("arraybridge: AB_PY_SIMCUDA=1 needs the CUDA toolkit (no CUDA backend was configured)")
            subprocess.check_call(["cmake", "--build", build, "--target", lib, "-j", str(os.cpu_count() or 2)])
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit("arraybridge: building the C library with CMake failed (%s); on a fresh Debian machine run "
                     "`make deps` in the repository first" % e)
        dlpack = None
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("AB_DLPACK_INCLUDE_DIR:"):
                    dlpack = line.split("=", 1)[1].strip()
        private = []
        with open(os.path.join(build, "arraybridge.pc")) as f:
            for line in f:
                m = re.match(r"Libs\.private:(.*)", line)
                if m:
                    private = shlex.split(m.group(1))
        archive = os.path.join(build, "libarraybridge.a")
        if sim:
            archive = os.path.join(build, "libarraybridge_simcuda.a")
            private = [f for f in private if f != "-lcudart_static"] + ["-lm"]
        for ext in self.extensions:
            ext.include_dirs += [os.path.join(source, "include"), dlpack]
            ext.extra_objects += [archive]
            # setuptools relinks only when a dependency is newer than the
            # extension: without this a rebuilt library would not be linked in.
            ext.depends += [archive]
            # Everything of the library and of cudart stays private to the
            # extension: only PyInit__arraybridge is exported.
            ext.extra_link_args += private + ["-Wl,--exclude-libs,ALL"]
        # Always compile and link again: the build folder (python/build) is
        # shared by the cudart and simcuda variants, and setuptools' date
        # check would hand one the other's extension.
        self.force = True
        super().run()


setup(
    ext_modules=[Extension("arraybridge._arraybridge", sources=["src/module.c"],
                           extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                                               "-Wno-cast-function-type"])],
    cmdclass={"build_ext": BuildWithLibrary, "sdist": SdistWithLibrary},
)
