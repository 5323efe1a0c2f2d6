"""convert_memory(data, source_type, target_type, gpu_id): the seed API's
call, as one DLPack import, one ab_convert_memory and one export."""
import operator
import types

from ._frameworks import ADAPTERS, dtype_arg, failure, no_export, owner_of, why_no_memory
from ._types import MemoryConversionError, MemoryType, id_of_device, memory_type

_OPTIONS = ("dtype", "permute", "scale", "offset", "channel_axis", "channel_scale", "channel_offset")


def _plain(opts):
    """The keywords as plain ints, floats and tuples. Reading a value may
    run the caller's code (__float__, __index__, __iter__), which could
    free or resize data's memory: it runs here, before any of that memory
    is handed to the C core."""
    out = dict(opts)
    for k in ("scale", "offset"):
        if k in out:
            out[k] = _real(k, out[k])
    if "channel_axis" in out:
        out["channel_axis"] = _axis("channel_axis must be an int", out["channel_axis"])
    if "permute" in out:
        out["permute"] = tuple(_axis("a permute axis must be an int", p) for p in _items("permute", out["permute"]))
    for k in ("channel_scale", "channel_offset"):
        if k in out:
            out[k] = tuple(_real(k, v) for v in _items(k, out[k]))
    return out


def _axis(rule, v):
    """v as a plain int, as the C core takes an axis: True is an int to
    Python (operator.index(True) is 1) but no axis, so a bool is refused
    here, with the C core's words, before it becomes one."""
    if isinstance(v, bool):
        raise TypeError("%s, not bool" % rule)
    return operator.index(v)


def _real(name, v):
    """v as a float, taken as the C core takes a number (PyFloat_AsDouble):
    anything with __float__ or __index__. A str or bytes is a TypeError,
    not parsed (float("2") would be), and so are a memoryview and a
    complex."""
    t = type(v)
    if isinstance(v, float):
        return float.__float__(v)  # its value: a subclass's own __float__ is not asked, as in C
    if not (hasattr(t, "__float__") or hasattr(t, "__index__")):
        raise TypeError("%s must be a real number, not %s" % (name, t.__name__))
    return float(v)


def _items(name, v):
    """v's items, when v is a sequence as the C core takes one
    (PySequence_Check: a list, tuple, array...): a set has no order and a
    generator no length, so both are a TypeError there and here."""
    # dict and mappingproxy: C mappings without sq_item, which
    # PySequence_Check refuses (a Python class's __getitem__ fills both)
    if isinstance(v, (dict, types.MappingProxyType)) or not hasattr(type(v), "__getitem__"):
        raise TypeError("%s must be a sequence" % name)
    try:
        return tuple(v)
    except TypeError:  # a 0-d array: the C core's words, not NumPy's
        raise TypeError("%s must be a sequence" % name) from None


# (source_type, target_type) as given -> (source, target, their adapters),
# one look-up a call (a member as a dict key costs Enum's hash, which is
# Python). Only names and members that are valid are kept: at most 12 x 12.
_PAIRS = {}


def _pair(source_type, target_type):
    try:
        return _PAIRS[source_type, target_type]
    except (KeyError, TypeError):  # TypeError: an unhashable name, refused below
        pass
    source = memory_type(source_type, "source_type")
    target = memory_type(target_type, "target_type")
    pair = (source, target, ADAPTERS[source], ADAPTERS[target])
    if type(source_type) in (str, MemoryType) and type(target_type) in (str, MemoryType):
        _PAIRS[source_type, target_type] = pair
    return pair


def detect_memory_type(data):
    """The name of the framework data belongs to ('numpy', 'torch', ...),
    from the module of its type (no framework is imported); ValueError
    ("Unknown memory type ...") for anything else."""
    mt = owner_of(data)
    if mt is not None:
        return mt.value
    raise ValueError("Unknown memory type for %s (module: %s)" % (type(data), type(data).__module__))


def convert_memory(data, source_type, target_type, gpu_id=None, *, dtype=None, permute=None, scale=None,
                   offset=None, channel_axis=None, channel_scale=None, channel_offset=None):
    """data, an array of source_type, as an array of target_type on gpu_id.

    source_type, target_type: 'numpy', 'cupy', 'torch', 'tensorflow', 'jax',
    'pyclesperanto' or a MemoryType (ValueError for other names).
    gpu_id: the target's GPU (torch cuda:N, CuPy device N, JAX's Nth GPU,
    TensorFlow /GPU:N, pyclesperanto's Nth OpenCL device); None is host
    memory for NumPy, torch, JAX and TensorFlow, and the current device for
    CuPy and pyclesperanto. NumPy ignores it. A device that does not exist
    raises MemoryConversionError ('<framework> device N is unavailable;
    available device IDs are (...)').

    The keywords convert the elements in the same move, as arraybridge's
    to_device does: dtype (a name such as 'float16' or NumPy's 'f2', or any
    framework's dtype object: torch.float16, np.float32, tf.float16), permute (result axis i is data's axis
    permute[i]), scale/offset (y = x * scale + offset), channel_axis with
    channel_scale/channel_offset (per-channel maps).

    Zero-copy (the result shares data's memory) when the data already sits
    where the target needs it and no keyword asks for a change; otherwise a
    compact copy made by the C library (peer copies, pinned staging,
    pooled memory). A NumPy array that shares a JAX or TensorFlow array's
    memory (both immutable) is read-only; a copy is writable. Any failure
    is a MemoryConversionError whose __cause__ is the exception behind it;
    for lack of memory its subclass OutOfMemoryError (also a MemoryError
    and a RuntimeError)."""
    source, target, sa, ta = _pair(source_type, target_type)
    if not sa.owns(data):
        try:
            actual = detect_memory_type(data)
        except ValueError:
            actual = "%s.%s" % (type(data).__module__, type(data).__qualname__)
        raise MemoryConversionError(source, target, "detect_memory_type",
                                    "data is %s, not %s" % (actual, source.value))
    # Each by identity (== would ask a NumPy array, permute=np.array(...),
    # for an elementwise comparison); the plain call skips the dict.
    if (dtype is None and permute is None and scale is None and offset is None and channel_axis is None
            and channel_scale is None and channel_offset is None):
        opts = {}
    else:
        given = (dtype, permute, scale, offset, channel_axis, channel_scale, channel_offset)
        opts = {k: v for k, v in zip(_OPTIONS, given) if v is not None}
    if sa.traced(data):  # inside jax.jit, vmap, grad or tf.function: no data to move
        if source is target and not opts:
            if gpu_id is not None:  # checked as in an eager call: an id no GPU has is refused
                ta.target_device(gpu_id, ta.module(source, target), source, target)
            return data
        raise MemoryConversionError(source, target, "convert_memory",
                                    "data is a traced %s value (inside jax.jit, vmap, grad or tf.function), which "
                                    "has no data to convert; convert before tracing" % source.display_name)
    tmod = ta.module(source, target)
    device = ta.target_device(gpu_id, tmod, source, target)
    asked = gpu_id
    if gpu_id is not None:
        gpu_id = id_of_device(device) if device != "cpu:0" else gpu_id
    try:
        if dtype is not None:
            opts["dtype"] = dtype_arg(dtype)  # a ValueError for a dtype of the other byte order
        if len(opts) > ("dtype" in opts):
            opts = _plain(opts)
        if source is target:
            if not opts and sa.device_of(data) == device:
                return data  # already there, as asked
            kept = sa.within(data, device, lambda x: ta.convert(sa.producer(x), device, gpu_id, tmod, opts), opts)
            if kept is not None:
                return kept
        if gpu_id is None and not ta.has_host:
            gpu_id = id_of_device(device)
        if sa.immutable and target is MemoryType.NUMPY:
            return ta.convert_immutable(sa.producer(data), tmod, opts)
        return ta.convert(sa.producer(data), device, gpu_id, tmod, opts)
    except MemoryConversionError:
        raise
    except Exception as e:  # ours (ValueError, BufferError, MemoryError, ...) or the framework's
        # Asked only now, so that a conversion that works pays nothing for
        # them: an array whose memory is in pieces (JAX's, over several
        # devices) converts as its whole value, in one piece; an array with
        # no memory to move (sparse, ragged, nested, meta) gets a reason
        # that says what to convert instead of the framework's words.
        try:
            whole = sa.whole(data) if no_export(e) else None
        except Exception as e2:  # gathering the pieces failed (out of memory, say): that is the reason
            raise failure(source, target, "arraybridge -> %s" % target.value, "%s: %s" % (type(e2).__name__, e2), e2,
                          (sa, ta)) from e2
        if whole is not None:
            return convert_memory(whole, source, target, asked, dtype=dtype, permute=permute, scale=scale,
                                  offset=offset, channel_axis=channel_axis, channel_scale=channel_scale,
                                  channel_offset=channel_offset)
        raise failure(source, target, "arraybridge -> %s" % target.value,
                      why_no_memory(sa, data) or "%s: %s" % (type(e).__name__, e), e, (sa, ta)) from e


def tensor_as(t, target_type, gpu_id=None):
    """An arraybridge Tensor (what to_device returns) as an array of
    target_type on gpu_id, as convert_memory would make one from a
    framework's array there: what a decorator does with a Tensor it is
    given, which is no framework's array (detect_memory_type refuses it)."""
    target = memory_type(target_type, "target_type")
    ta = ADAPTERS[target]
    tmod = ta.module("arraybridge", target)
    device = ta.target_device(gpu_id, tmod, "arraybridge", target)
    if gpu_id is not None or not ta.has_host:
        gpu_id = id_of_device(device) if device != "cpu:0" else gpu_id
    try:
        return ta.convert(t, device, gpu_id, tmod, {})
    except MemoryConversionError:
        raise
    except Exception as e:
        raise failure("arraybridge", target, "arraybridge -> %s" % target.value, "%s: %s" % (type(e).__name__, e), e,
                      (ta,)) from e


__all__ = ["convert_memory", "detect_memory_type"]
