"""Memory types (the frameworks the seed API names) and its exception.

Nothing here imports a framework: this module is what `import arraybridge`
loads besides the C extension.
"""
from enum import Enum


class MemoryType(Enum):
    """A framework whose arrays convert_memory takes and returns; the value is
    the name the seed API uses ('numpy', 'torch', ...)."""

    NUMPY = "numpy"
    CUPY = "cupy"
    TORCH = "torch"
    TENSORFLOW = "tensorflow"
    JAX = "jax"
    PYCLESPERANTO = "pyclesperanto"

    @property
    def display_name(self):
        """The framework's own spelling, as messages use it ('PyTorch')."""
        return _DISPLAY[self]

    @property
    def is_gpu(self):
        """Whether the framework is a GPU framework (all but NumPy), as the
        original defines GPU_MEMORY_TYPES; torch, JAX and TensorFlow also
        hold host memory here (gpu_id=None)."""
        return self is not MemoryType.NUMPY


_DISPLAY = {
    MemoryType.NUMPY: "NumPy",
    MemoryType.CUPY: "CuPy",
    MemoryType.TORCH: "PyTorch",
    MemoryType.TENSORFLOW: "TensorFlow",
    MemoryType.JAX: "JAX",
    MemoryType.PYCLESPERANTO: "pyclesperanto",
}

CPU_MEMORY_TYPES = frozenset(m for m in MemoryType if not m.is_gpu)
GPU_MEMORY_TYPES = frozenset(m for m in MemoryType if m.is_gpu)
SUPPORTED_MEMORY_TYPES = CPU_MEMORY_TYPES | GPU_MEMORY_TYPES
VALID_MEMORY_TYPES = frozenset(m.value for m in MemoryType)


# Members and their names to members: one dict look-up per call (Enum's own
# MemoryType(value) costs a microsecond, on every convert_memory).
_LOOKUP = {**{m.value: m for m in MemoryType}, **{m: m for m in MemoryType}}


def memory_type(value, what="memory type"):
    """A MemoryType from a member or its name; ValueError listing the valid
    names otherwise."""
    try:
        return _LOOKUP[value]
    except (KeyError, TypeError):  # TypeError: an unhashable value
        raise ValueError("Invalid %s %r. Available types: %s" % (what, value, sorted(VALID_MEMORY_TYPES))) from None


def id_of_device(device):
    """The id in an arraybridge device name: 1 for 'cuda:1' (every name the
    C core gives is 'family:id')."""
    return int(device.rpartition(":")[2])


class MemoryConversionError(Exception):
    """A conversion between two memory types failed.

    source_type, target_type: the names ('numpy', 'torch', ...); method: what
    was attempted (e.g. 'arraybridge.to_device'); reason: why it failed. The
    message names all four. The exception that caused it, if any, is
    __cause__ (a MemoryError there means out of memory).

    Made with one argument, that is the whole message, and the four
    attributes are None: code that re-raises an exception as
    type(e)(message) (Keras does, for an error inside a layer's call) gets
    a MemoryConversionError with its words, not a TypeError."""

    # TensorFlow's autograph (tf.function) re-raises an error from traced
    # code as a new one of its type only where the type's __init__ is
    # Exception's, else as its StagingError; an error with this attribute
    # it lets through as it is.
    ag_pass_through = True

    def __init__(self, source_type, target_type=None, method=None, reason=None):
        if target_type is None and method is None and reason is None:
            self.source_type = self.target_type = self.method = self.reason = None
            super().__init__(source_type)
            return
        self.source_type = getattr(source_type, "value", source_type)
        self.target_type = getattr(target_type, "value", target_type)
        self.method = method
        self.reason = reason
        super().__init__("Cannot convert from %s to %s using %s. Reason: %s"
                         % (self.source_type, self.target_type, method, reason))

    def __reduce__(self):
        # With the instance's attributes, as BaseException's own reduce
        # keeps them: notes (the OOM memory report) and anything a caller
        # set travel to another process too.
        state = dict(self.__dict__) or None
        if self.method is None and self.reason is None and self.target_type is None:
            return (type(self), self.args, state)
        return (type(self), (self.source_type, self.target_type, self.method, self.reason), state)


class OutOfMemoryError(MemoryConversionError, MemoryError, RuntimeError):
    """A MemoryConversionError for lack of memory: its __cause__ is the
    MemoryError behind it (arraybridge's pools, or the host), or the
    framework's own out-of-memory error. Also a MemoryError, and, as
    torch.cuda.OutOfMemoryError is, a RuntimeError whose message says "out
    of memory": `except MemoryError` catches it, and so does the page's
    idiom for torch's (`except RuntimeError as e: if "out of memory" in
    str(e)`)."""

    def __init__(self, source_type, target_type=None, method=None, reason=None):
        super().__init__(source_type, target_type, method, reason)
        if "out of memory" not in str(self.args[0] if self.args else "").lower():
            self.args = (str(self.args[0] if self.args else "") + " (out of memory)",)
