"""Helpers shared by the module's tests (imported from the tests' folder)."""
import pytest

import arraybridge as ab


def addr(a):
    """The address of a NumPy array's data."""
    return a.__array_interface__["data"][0]


def n_devices(kind):
    """How many devices of a type ("cuda", "opencl") the module sees."""
    return sum(d.startswith(kind + ":") for d in ab.devices())


def opencl(n=1):
    """Skips the test unless n OpenCL devices are there."""
    have = n_devices("opencl")
    if have < n:
        pytest.skip("needs %d OpenCL device(s), have %d (PoCL: apt-get install pocl-opencl-icd)" % (n, have))
