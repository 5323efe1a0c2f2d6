"""Builds arraybridge._arraybridge against the C library of the same tree.

The library is configured and built with CMake (static, position-independent)
from the repository root one level up, into $AB_PY_BUILD_DIR (default
<repo>/build-python), and linked into the extension with the private link
flags its pkg-config file lists (OpenCL, the static CUDA runtime), so the
extension needs no libarraybridge.so at run time. The DLPack header comes
from the same CMake configuration (tools/setup-deps.sh provides it; run
`make deps` first on a fresh machine).

AB_PY_SIMCUDA=1 links the library against simcuda, a simulated CUDA runtime
(tests/simcuda), instead of cudart: for the module's CUDA tests on machines
without a GPU (make test-python). Never for an install that is used.
"""
import os
import re
import shlex
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class BuildWithLibrary(build_ext):
    def run(self):
        if not os.path.exists(os.path.join(REPO, "include", "arraybridge", "arraybridge.h")):
            sys.exit("arraybridge: build the extension from the repository (python/ next to include/ and src/)")
        build = os.environ.get("AB_PY_BUILD_DIR") or os.path.join(REPO, "build-python")
        cfg = ["cmake", "-S", REPO, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DAB_BUILD_TESTS=OFF",
               "-DAB_BUILD_BENCH=OFF", "-DAB_BUILD_EXAMPLES=OFF"]
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
            ext.include_dirs += [os.path.join(REPO, "include"), dlpack]
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
    cmdclass={"build_ext": BuildWithLibrary},
)
