"""arraybridge: move DLPack tensors between host, CUDA and OpenCL memory.

    import numpy as np, arraybridge as ab
    t = ab.convert_memory(np.arange(6.0), "opencl:0")   # or "cuda", gpu_id=1
    back = np.from_dlpack(ab.convert_memory(t, "cpu"))

Tensors implement __dlpack__/__dlpack_device__, so NumPy, PyTorch, CuPy and
JAX take them zero-copy, and from_dlpack takes theirs. Errors raise
ValueError (bad arguments, missing devices), BufferError (a copy needed but
copy=False; unsupported dtype or route), MemoryError (out of memory) or
RuntimeError, with the library's message.
"""
from ._arraybridge import (  # noqa: F401
    DEVICE_AUTO,
    Tensor,
    __version__,
    best_device,
    convert_memory,
    device_info,
    devices,
    empty_cache,
    explain_route,
    from_dlpack,
    memory_stats,
    set_memory_limit,
)

__all__ = [
    "DEVICE_AUTO", "Tensor", "best_device", "convert_memory", "device_info", "devices", "empty_cache",
    "explain_route", "from_dlpack", "memory_stats", "set_memory_limit",
]
