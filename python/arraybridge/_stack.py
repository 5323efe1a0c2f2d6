"""stack_slices and unstack_slices: 2-D slices <-> one 3-D array."""
from . import _arraybridge as _ab
from ._convert import convert_memory, detect_memory_type
from ._frameworks import ADAPTERS, element_name, failure, float8_name, no_export, why_no_memory
from ._types import MemoryConversionError, MemoryType, id_of_device, memory_type as _memory_type


def stack_slices(slices, memory_type, gpu_id=None):
    """One 3-D array of memory_type on gpu_id ([Z, Y, X]) from a list (any
    iterable: a 3-D array gives its planes) of 2-D arrays of any mix of
    frameworks and devices.

    The result is allocated once, on the target, and each slice is copied
    (cast to the first slice's dtype where it differs) straight into its
    plane by the C core: no per-slice arrays of the target framework and no
    3-D host array in between. ValueError for an empty list (or None), a slice that is
    not 2-D or slices of different shapes; MemoryConversionError when a
    conversion fails or the target device does not exist."""
    mt = _memory_type(memory_type, "memory_type")
    # a tuple, a generator, a 3-D array's planes too; None is the seed's
    # "empty list" ValueError, as before
    slices = [] if slices is None else list(slices)
    if not slices:
        raise ValueError("Cannot stack empty list of slices")
    shape = None
    for i, s in enumerate(slices):
        sh = tuple(getattr(s, "shape", ()))
        if len(sh) != 2:
            raise ValueError("Slice at index %d is not a 2D array. All slices must be 2D." % i)
        if shape is not None and sh != shape:
            raise ValueError("Slice at index %d has shape %s; slice 0 has %s. All slices must have one shape."
                             % (i, sh, shape))
        shape = sh
    # float8 slices stack as they are (the C core casts none to or from float8)
    dtype = element_name(slices[0]) or float8_name(slices[0])
    adapter = ADAPTERS[mt]
    try:
        first = detect_memory_type(slices[0])
    except ValueError as e:  # as any other slice's: an arraybridge.Tensor, say
        raise MemoryConversionError("stack", mt, "detect_memory_type", "slice 0: %s" % e) from e
    mod = adapter.module(first, mt)
    device = adapter.target_device(gpu_id, mod, first, mt)
    full = (len(slices),) + shape
    try:
        if dtype is None:
            raise ValueError("slice 0's dtype %r is not one arraybridge converts" % (getattr(slices[0], "dtype", None),))
        if mt is MemoryType.PYCLESPERANTO:
            # The result lives in pyclesperanto's own OpenCL context: allocate it
            # there and write the planes into its buffer.
            adapter.check(full, dtype)
            out = adapter.create(mod, full, dtype, id_of_device(device))
        else:
            out = _ab.empty(full, dtype, device)
        for i, s in enumerate(slices):
            _into(out, s, i)
    except (ValueError, TypeError, BufferError, MemoryError, RuntimeError, IndexError) as e:
        raise failure("stack", mt, "arraybridge.convert_into", "%s: %s" % (type(e).__name__, e), e,
                      ADAPTERS.values()) from e  # a slice's framework's own out-of-memory error too
    if mt is MemoryType.PYCLESPERANTO:
        return out
    if gpu_id is None and not adapter.has_host:
        gpu_id = id_of_device(device)
    try:
        return adapter.from_tensor(out, mod, gpu_id)
    except Exception as e:  # the framework's own refusal (NumPy has no bfloat16, say)
        raise failure("stack", mt, "%s from_dlpack" % mt.value, "%s: %s" % (type(e).__name__, e), e, (adapter,)) from e


def _into(out, s, i):
    """Slice s into out[i]: where s's memory is in pieces (a JAX array over
    several devices) its whole value; a slice with no memory to move is a
    ValueError with its adapter's reason (convert_memory's rules)."""
    adapter = ADAPTERS[MemoryType(detect_memory_type(s))]
    try:
        _ab.convert_into(adapter.producer(s), out, index=i)
    except (ValueError, TypeError, BufferError, MemoryError, RuntimeError, IndexError) as e:
        whole = adapter.whole(s) if no_export(e) else None  # as convert_memory asks it
        if whole is None:
            why = why_no_memory(adapter, s)
            if why is None:
                raise
            raise ValueError("slice %d: %s" % (i, why)) from e
        _ab.convert_into(adapter.producer(whole), out, index=i)


def unstack_slices(array, memory_type, gpu_id=None, validate_slices=True):
    """The 2-D slices (along axis 0) of a 3-D array, as a list of
    memory_type arrays on gpu_id: the array is converted once (zero-copy when
    it already is there) and the slices are the target framework's own
    indexing of it (views in NumPy, torch and CuPy; JAX's indexing copies,
    and TensorFlow and pyclesperanto promise neither). ValueError when
    array is not 3-D; with validate_slices, also when a slice is not 2-D."""
    mt = _memory_type(memory_type, "memory_type")
    src = detect_memory_type(array)
    shape = tuple(getattr(array, "shape", ()))
    if len(shape) != 3:
        raise ValueError("Array must be 3D, got shape %s" % (getattr(array, "shape", "unknown"),))
    whole = convert_memory(array, src, mt, gpu_id)
    slices = [whole[i] for i in range(shape[0])]
    if validate_slices:
        for i, s in enumerate(slices):
            # (pyclesperanto's indexing gives a plain number for a slice of
            # one element: no shape at all)
            if len(tuple(getattr(s, "shape", ()))) != 2:
                raise ValueError("Extracted slice at index %d is not 2D (%s's indexing gave a %s). This indicates a "
                                 "malformed 3D array." % (i, mt.display_name, type(s).__name__))
    return slices
