"""arraybridge: move arrays between NumPy, PyTorch, CuPy, JAX, TensorFlow and
pyclesperanto, host memory, CUDA GPUs and OpenCL devices, through one C core.

The seed API (the Python arraybridge's), framework objects in and out:

    from arraybridge import convert_memory, torch
    t = convert_memory(np_data, source_type='numpy', target_type='torch', gpu_id=0)
    a = convert_memory(t, 'torch', 'numpy')

    @torch(gpu_id=0, output_type='numpy')
    def layer(x): ...

The device-level API, arraybridge Tensors in and out (any DLPack producer):

    t = to_device(np.arange(6.0), "opencl:0", dtype="float32")
    back = np.from_dlpack(to_device(t, "cpu"))

`import arraybridge` imports no framework: each is imported when one of its
arrays is converted or it is named as a target. Device-level errors raise
ValueError (bad arguments, missing devices), BufferError (a copy needed but
copy=False; unsupported dtype or route), MemoryError (out of memory) or
RuntimeError; the seed API wraps them in MemoryConversionError.
"""
from ._arraybridge import (  # noqa: F401
    DEVICE_AUTO,
    Tensor,
    __version__,
    best_device,
    byte_view,
    convert_into,
    device_info,
    devices,
    empty,
    empty_cache,
    explain_route,
    from_dlpack,
    memory_stats,
    pool_summary,
    set_memory_limit,
    to_device,
)
from ._types import (  # noqa: F401
    CPU_MEMORY_TYPES,
    GPU_MEMORY_TYPES,
    SUPPORTED_MEMORY_TYPES,
    MemoryConversionError,
    MemoryType,
    OutOfMemoryError,
)
from ._convert import convert_memory, detect_memory_type  # noqa: F401
from ._cleanup import cleanup_all_gpu_frameworks  # noqa: F401
from ._decorators import cupy, jax, memory_types, numpy, pyclesperanto, tensorflow, torch  # noqa: F401
from ._stack import stack_slices, unstack_slices  # noqa: F401
from . import _dask

_dask.install()  # Tensor's Dask serializers, once distributed is imported (not imported here)

# Not the decorators numpy, cupy, torch, tensorflow, jax and pyclesperanto:
# `from arraybridge import *` would put them in place of the caller's own
# `import torch` (and its torch.zeros would be gone). They are imported by
# name, as the page does: `from arraybridge import torch as torch_decorator`.
__all__ = [
    # the seed API
    "convert_memory", "detect_memory_type", "MemoryType", "CPU_MEMORY_TYPES", "GPU_MEMORY_TYPES",
    "SUPPORTED_MEMORY_TYPES", "MemoryConversionError", "memory_types", "stack_slices", "unstack_slices",
    "cleanup_all_gpu_frameworks", "OutOfMemoryError",
    # the device level
    "DEVICE_AUTO", "Tensor", "to_device", "byte_view", "convert_into", "empty", "from_dlpack", "best_device", "device_info", "devices", "empty_cache",
    "explain_route", "memory_stats", "pool_summary", "set_memory_limit",
]
