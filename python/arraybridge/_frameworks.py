"""One small adapter per framework, registered in one table (ADAPTERS).

An adapter knows, for its framework: whether an object is one of its arrays
(by the top-level module of its type, without importing anything), the
framework's GPU ids, which arraybridge device a gpu_id names, how to hand
an array to the C core (DLPack) and how to make an array of its own from a
Tensor the core returns, its cache cleanup and its out-of-memory errors.

Frameworks are imported only when one of their arrays is converted or they
are named as a target: `import arraybridge` imports none of them.
"""
import importlib
import operator
import os
import sys
import threading
import weakref

from . import _arraybridge as _ab
from ._types import MemoryConversionError, MemoryType, OutOfMemoryError, id_of_device


# The dtype names the C core converts between (all one-lane DLPack types
# but complex, which frameworks name alike).
_DTYPES = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                     "bfloat16", "float32", "float64"))
_COMPLEX = frozenset(("complex64", "complex128"))
# the casts a torch tensor in autograd's graph keeps its place there through (Torch.within)
_GRAD_DTYPES = frozenset(("float16", "bfloat16", "float32", "float64", "complex64", "complex128"))


def _dtype_str(d):
    """The name of a dtype object of any framework: NumPy's dtypes and
    scalar types (np.float32), JAX's and TensorFlow's (which have .name or
    .dtype), torch.float32 (printed with its module)."""
    name = getattr(d, "name", None)
    if not isinstance(name, str):
        inner = getattr(d, "dtype", None)  # a scalar type: jnp.float32
        name = getattr(inner, "name", None)
    if not isinstance(name, str) and isinstance(d, type):
        try:
            import numpy  # a NumPy scalar type: np.float32.dtype is no dtype
            name = numpy.dtype(d).name
        except (ImportError, TypeError):
            name = None
    name = name if isinstance(name, str) else str(d)
    return name.rsplit(".", 1)[-1]  # torch.float32 -> float32


def element_name(obj):
    """obj's element type as the C core names it, complex included, or None."""
    name = dtype_name(obj)
    if name is None and getattr(obj, "dtype", None) is not None:
        name = _dtype_str(obj.dtype)
        name = name if name in ("complex64", "complex128") else None
    return name


def float8_name(obj):
    """obj's float8 element type as the C core names it ("float8_e4m3fn":
    ml_dtypes' NumPy types, torch's, JAX's), or None. Apart from
    element_name: the C core moves float8 data but casts none to or from
    it, so a decorator's preserve_dtype must not ask for one."""
    d = getattr(obj, "dtype", None)
    name = None if d is None else _ml_dtypes_name(_dtype_str(d))
    return name if name is not None and name.startswith("float8_") else None


def is_array(obj):
    """Whether obj is an array of a framework the seed API names: an object
    of its modules with a shape and a dtype (not torch.Size, a dtype, an
    nn.Module, a random Generator), and not a NumPy scalar, such as a
    reduction gives, nor a class (torch.Tensor itself) or a description of
    an array (jax.eval_shape's ShapeDtypeStruct, jax.typeof's ShapedArray,
    tf.TensorSpec, a symbolic keras.KerasTensor)."""
    if owner_of(obj) is None or not (_has(obj, "shape") and _has(obj, "dtype")):  # owner_of: None for a class
        return False
    numpy = imported("numpy")
    return not _describes(type(obj)) and (numpy is None or not isinstance(obj, numpy.generic))


def _has(obj, name):
    """hasattr, where an attribute whose read fails with anything but
    AttributeError is there, unreadable (a torch nested tensor's shape,
    strided layout: RuntimeError), rather than the error raised."""
    try:
        getattr(obj, name)
    except AttributeError:
        return False
    except Exception:
        return True
    return True


_DESCRIBES = weakref.WeakKeyDictionary()  # type -> whether it describes arrays without being one (as _OWNER)


def _describes(cls):
    """Whether cls is a framework's type of array descriptions: a shape and
    a dtype, no data. Cached per type; its framework is imported, since
    one of its objects exists."""
    try:
        return _DESCRIBES[cls]
    except KeyError:
        pass
    jax = imported("jax")
    kinds = tuple(k for k in (getattr(jax, "ShapeDtypeStruct", None),
                              getattr(getattr(jax, "core", None), "AbstractValue", None),  # jax.typeof's ShapedArray
                              getattr(imported("tensorflow"), "TypeSpec", None),
                              getattr(imported("keras"), "KerasTensor", None)) if isinstance(k, type))
    found = _DESCRIBES[cls] = issubclass(cls, kinds)
    return found


def why_no_memory(adapter, obj):
    """Why obj has no memory to convert: an array description's reason
    (keras.Input's KerasTensor, jax.ShapeDtypeStruct: its framework's
    export fails with words about something else), else the adapter's
    why_not. None where neither knows. Never raises."""
    try:
        if _describes(type(obj)):
            return ("a %s describes an array (a shape and a dtype) and holds no data: convert a value, not its "
                    "description" % type(obj).__name__)
    except Exception:  # an odd type: the adapter's words, or the framework's
        pass
    return adapter.why_not(obj)


def dtype_name(obj):
    """obj's element type as the C core names it, or None."""
    d = getattr(obj, "dtype", None)
    if d is None:
        return None
    name = _dtype_str(d)
    return name if name in _DTYPES else None


def dtype_arg(d):
    """A dtype keyword as the C core takes it: a name ('float32') as it is,
    a framework's dtype object (torch.float16, np.float32, np.dtype('u1'),
    tf.float32, jnp.bfloat16) by its name. A NumPy dtype of the other byte
    order (np.dtype('>f4')) is a ValueError: results are in the machine's
    order, and DLPack has no way to say otherwise."""
    if d is None or isinstance(d, str):
        return d
    if getattr(d, "byteorder", "=") not in ("=", "|") and not isinstance(d, type):
        raise ValueError("dtype %s is of the other byte order; arraybridge makes tensors in the machine's own (%s)"
                         % (d, d.newbyteorder("=")))
    return _dtype_str(d)


def core_dtype_name(name):
    """A dtype keyword's name as the C core knows it: its own names as they
    are, one of NumPy's spellings ('f4', 'single', 'u1') as NumPy reads it
    (numpy_dtype_name), else None."""
    return name if name in _DTYPES or name in _COMPLEX else numpy_dtype_name(name)


def numpy_dtype_name(name):
    """The core's name for one of NumPy's spellings of a dtype ('f4',
    '<i2', 'u1', 'half', 'double', '?'), or None: NumPy absent,
    or the string no dtype of NumPy's. The C core asks only for a name it
    does not know itself; a spelling of the other byte order ('>f4') is
    dtype_arg's ValueError."""
    numpy = imported("numpy")
    if numpy is None:
        try:
            import numpy
        except ImportError:
            return None
    try:
        d = numpy.dtype(name)
    except Exception:  # not a dtype (TypeError), a malformed one, a deprecated one under -W error
        return None
    return dtype_arg(d)


def gpu_id_arg(gpu_id, source, target):
    """gpu_id as an int (anything with __index__: NumPy's integers too),
    or None; MemoryConversionError otherwise."""
    if gpu_id is None:
        return None
    if not isinstance(gpu_id, bool):
        try:
            return operator.index(gpu_id)
        except TypeError:
            pass
    raise MemoryConversionError(source, target, "gpu_id", "gpu_id must be an int or None, not %r" % (gpu_id,))


# type -> the MemoryType of its framework (None: no framework's); weak, so
# that classes made per call (records, namedtuples) are not kept alive.
_OWNER = weakref.WeakKeyDictionary()


def _keras_owner():
    """The framework under Keras: Keras 3 runs on TensorFlow, JAX or torch
    (its backend, fixed when it is imported); Keras 2 on TensorFlow."""
    keras = sys.modules.get("keras")
    backend = getattr(getattr(keras, "config", None), "backend", None)
    name = backend() if callable(backend) else "tensorflow"
    return {"tensorflow": MemoryType.TENSORFLOW, "jax": MemoryType.JAX, "torch": MemoryType.TORCH}.get(name)


def _keras_value(obj):
    """A Keras 3 variable's array (its .value) where obj has no DLPack of its
    own, else obj."""
    if type(obj).__module__.startswith("keras.") and not hasattr(obj, "__dlpack__"):
        return getattr(obj, "value", obj)
    return obj


def owner_of(obj):
    """The MemoryType whose framework obj's type belongs to, by the top-level
    module of the type, or else of the first of its bases that is a
    framework's array, scalar or variable type (one with __dlpack__ or a
    dtype: a user's subclass of np.ndarray, torch.Tensor or tf.Variable,
    or ml_dtypes' scalars, are that framework's; a subclass of a NumPy
    mixin or of torch.nn.Module is not); nothing is imported. None for no
    framework's, and for a class. Cached per type."""
    cls = type(obj)
    try:
        return _OWNER[cls]
    except KeyError:
        pass
    found = None
    for c in () if issubclass(cls, type) else cls.__mro__:  # a class (torch.Tensor itself) is no array
        if c is not cls and not (hasattr(c, "__dlpack__") or hasattr(c, "dtype")):
            continue
        module = getattr(c, "__module__", None)
        top = module.split(".", 1)[0] if isinstance(module, str) else ""
        if top == "keras":
            found = _keras_owner()
        else:
            found = next((a.memory_type for a in ADAPTERS.values() if top in a.modules), None)
        if found is not None:
            break
    _OWNER[cls] = found
    return found


# (process id, arraybridge's device names): listed once per process, as
# the C library's devices do not change while it runs (a forked child
# lists its own: a driver does not survive fork). Asked on every
# conversion to a GPU framework: after a conversion of a few MiB, with the
# caches cold, the listing took about 5 us (pyclesperanto's, below, too).
_OUR_DEVICES = (None, frozenset())


def our_devices():
    """arraybridge's device names ('cpu:0', 'opencl:1', ...), a frozenset."""
    global _OUR_DEVICES
    pid, names = _OUR_DEVICES
    if pid != os.getpid():
        names = frozenset(_ab.devices())
        _OUR_DEVICES = (os.getpid(), names)
    return names


def no_export(exc):
    """Whether exc is a producer's refusal to export its array through
    DLPack at all: BufferError, as the array API says, or older JAX's
    ValueError for an array over several devices. Not a bad keyword's
    ValueError (convert_memory then asks for the whole value: a gather of a
    large array onto one device that would only delay the error)."""
    return isinstance(exc, BufferError) or (isinstance(exc, ValueError) and "unsharded" in str(exc))


def is_oom(exc, adapters):
    """Whether exc itself is a lack of memory: a MemoryError, or one of the
    adapters' frameworks' own out-of-memory errors."""
    return isinstance(exc, MemoryError) or any(a.is_oom(exc, a.loaded()) for a in adapters)


def failure(source, target, method, reason, cause, adapters):
    """The MemoryConversionError to raise from cause: an OutOfMemoryError
    where cause is a lack of memory (is_oom)."""
    return (OutOfMemoryError if is_oom(cause, adapters) else MemoryConversionError)(source, target, method, reason)


def imported(name, _get=sys.modules.get):
    """The module if its import has finished, else None (not imported, or
    another thread still importing it: in sys.modules from the start,
    without the names it has yet to define; importlib marks its spec
    _initializing, for this very purpose, until the module's code has
    run). On every conversion's way (Adapter.module): one function."""
    mod = _get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False) is True:
        return None
    return mod


class Adapter:
    """The default behaviour; subclasses override what differs."""

    memory_type = None
    import_name = None
    modules = ()            # top-level module names of its array types
    has_host = True         # its arrays can live in host memory (gpu_id=None)
    accel = "cuda"          # the arraybridge device family of its GPUs
    layout = "any"          # which strides its from_dlpack takes: any, nonnegative, compact
    immutable = False       # its arrays are never written (JAX, TensorFlow), though DLPack does not say so

    # ---- the framework itself -------------------------------------------------
    def module(self, source=None, target=None):
        """The framework, imported; MemoryConversionError when it is missing.
        While another thread is still importing it, this waits for that
        import to finish (import_module takes the module's import lock).
        Where that thread in turn waits for this one's import (a cycle of
        imports across threads), the half-made module, as an import
        statement gives."""
        mod = imported(self.import_name)
        if mod is not None:
            return mod
        try:
            return importlib.import_module(self.import_name)
        except Exception as e:  # a broken install raises OSError (a missing libcudart), AttributeError, ...
            half = sys.modules.get(self.import_name)
            if type(e).__name__ == "_DeadlockError" and half is not None:
                return half
            mt = self.memory_type
            missing = isinstance(e, ModuleNotFoundError) and e.name == self.import_name
            raise MemoryConversionError(source or mt, target or mt, "import %s" % self.import_name,
                                        "%s %s (%s: %s)" % (mt.display_name,
                                                            "is not installed" if missing else "could not be imported",
                                                            type(e).__name__, e)) from e

    def loaded(self):
        """The framework if the process has imported it, else None. A module
        that another thread is still importing is None: it is in sys.modules
        from the start of its import, without the names it has yet to define
        (torch's import takes seconds; a pool of threads converting at once
        met an AttributeError there)."""
        return imported(self.import_name)

    def owns(self, obj):
        return owner_of(obj) is self.memory_type

    def traced(self, obj):
        """Whether obj is a value being traced (inside jax.jit, vmap, grad,
        or tf.function): it has no data to move, only a type."""
        return False

    def traced_cast(self, obj, dtype):
        """A traced value cast to dtype (a name) by the framework itself."""
        return obj.astype(dtype)

    # ---- devices --------------------------------------------------------------
    def gpu_ids(self, mod):
        """The framework's GPU ids (a tuple)."""
        return ()

    def device_ids(self, mod):
        """The ids a gpu_id may name: the framework's GPUs that arraybridge
        sees too (a transfer needs both)."""
        ours = our_devices()
        return tuple(i for i in self.gpu_ids(mod) if "%s:%d" % (self.accel, i) in ours)

    def target_device(self, gpu_id, mod, source, target):
        """The arraybridge device string for gpu_id; MemoryConversionError
        ('<framework> device N is unavailable; ...') when it does not exist."""
        if gpu_id is None and self.has_host:
            return "cpu:0"
        gpu_id = self.default_gpu(mod) if gpu_id is None else gpu_id_arg(gpu_id, source, target)
        ids = self.device_ids(mod)
        if gpu_id not in ids:
            raise MemoryConversionError(
                source, target, "%s.require_device" % self.memory_type.value,
                "%s device %d is unavailable; available device IDs are %s%s"
                % (self.memory_type.display_name, gpu_id, ids, self._why_not_ours(gpu_id, mod)))
        return "%s:%d" % (self.accel, gpu_id)

    def _why_not_ours(self, gpu_id, mod):
        """Where the framework has GPU gpu_id and arraybridge does not see
        it (no OpenCL ICD loader, another driver), arraybridge's reason, to
        follow the message above; else ''."""
        name = "%s:%d" % (self.accel, gpu_id)
        try:
            if gpu_id not in self.gpu_ids(mod) or name in _ab.devices():
                return ""
            _ab.device_info(name)
        except Exception as e:  # what arraybridge says of the device
            return " (the framework has it, arraybridge does not: %s)" % e
        return ""

    def default_gpu(self, mod):
        return 0

    def ids_to_clean(self, mod, device_id):
        """The framework's GPUs an empty_cache of device_id (None: all)
        visits: never one it does not have (entering one raises)."""
        return [i for i in self.gpu_ids(mod) if device_id is None or i == device_id]

    def device_of(self, obj):
        """The arraybridge device string where obj's data is (a Keras 3
        variable's: its array's)."""
        t, i = _keras_value(obj).__dlpack_device__()
        if int(t) == 1:
            return "cpu:0"  # host memory, whatever id the producer gives it (the C core's rule)
        return "%s:%d" % (_DEVICE_NAMES.get(int(t), "?"), int(i))

    # ---- DLPack ---------------------------------------------------------------
    def producer(self, obj):
        """What to hand the C core: an object with __dlpack__."""
        return obj

    def from_tensor(self, t, mod, gpu_id):
        """An array of the framework with t's data (zero-copy where it can)."""
        raise NotImplementedError

    # Asked only after a conversion of obj failed (convert_memory,
    # stack_slices): never on the way of one that works.
    def whole(self, obj):
        """obj's value as an array of the framework whose memory is one
        piece, where obj's is in several (a JAX array over several devices);
        else None. Raises only the framework's own error in making it."""
        return None

    def within(self, obj, device, convert, opts):
        """convert(obj) (the C core's conversion to device, as opts say) kept where the
        framework's own bookkeeping needs it (torch's autograd graph), where
        a DLPack exchange alone would lose that; else None. Asked only for
        a conversion within one framework that is not the no-op."""
        return None

    def why_not(self, obj):
        """Why obj has no memory to convert, and what to convert instead,
        where the framework's own words do not say (a sparse tensor, say);
        else None. Never raises."""
        return None

    def convert(self, producer, device, gpu_id, mod, opts):
        """producer's data as an array of the framework on device (gpu_id),
        converted as opts (to_device's keywords) say."""
        return self.from_tensor(_ab.to_device(producer, device, layout=self.layout, **opts), mod, gpu_id)

    # ---- memory ---------------------------------------------------------------
    def empty_cache(self, mod, device_id=None):
        """Returns the framework's cached, unused device memory."""

    def is_oom(self, exc, mod):
        return isinstance(exc, MemoryError)

    def raised(self, exc):
        """Whether exc is of an exception type the framework defines (its
        modules'): for its out-of-memory errors met where it is not the
        decorator's, whose words in a message any error could carry."""
        return type(exc).__module__.partition(".")[0] in self.modules


_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 13: "cuda_managed"}


def _ml_dtypes_name(name):
    """A dtype name, a Tensor's ("bfloat16", "float8_e4m3fn(bits 8)") or
    ml_dtypes' ("float8_e4m3fn"), as ml_dtypes names its NumPy type, for
    the whole-byte formats NumPy itself lacks; None for any other (and for
    more than one lane: "float8_e4m3fn(bits 8)x2")."""
    if name == "bfloat16":
        return name
    base, _, rest = name.partition("(")
    return base if base.startswith("float8_") and rest in ("", "bits 8)") else None


def _ml_dtypes_type(name):
    """ml_dtypes' NumPy scalar type `name` (JAX and TensorFlow install
    ml_dtypes); TypeError when it is missing or has no such type."""
    try:
        import ml_dtypes
    except ImportError as e:
        raise TypeError("NumPy has no %s arrays of its own, and ml_dtypes, which adds them, is not installed (%s)"
                        % (name, e)) from e
    found = getattr(ml_dtypes, name, None)
    if found is None:
        raise TypeError("NumPy has no %s arrays, and ml_dtypes %s has no such type either"
                        % (name, getattr(ml_dtypes, "__version__", "?")))
    return found


class NumPy(Adapter):
    memory_type = MemoryType.NUMPY
    import_name = "numpy"
    modules = ("numpy",)

    def target_device(self, gpu_id, mod, source, target):
        return "cpu:0"  # NumPy ignores gpu_id

    # A NumPy scalar (what a reduction gives) has no DLPack export: it
    # moves as the 0-d array of its value.
    def device_of(self, obj):
        numpy = sys.modules.get("numpy")
        return "cpu:0" if numpy is not None and isinstance(obj, numpy.generic) else super().device_of(obj)

    def producer(self, obj):
        numpy = sys.modules.get("numpy")
        if numpy is None:
            return obj
        if isinstance(obj, numpy.generic):
            obj = numpy.asarray(obj)
        dt = getattr(obj, "dtype", None)
        if (isinstance(obj, numpy.ndarray) and dt.num >= 256  # a dtype not NumPy's own (NPY_USERDEF and up)
                and str(getattr(dt.type, "__module__", "")).startswith("ml_dtypes")
                and _ml_dtypes_name(dt.name) is not None):
            # ml_dtypes' bfloat16 and float8 arrays, which NumPy's DLPack
            # export refuses: their memory taken as a Tensor of that dtype
            # (shared; a C-ordered copy of a strided one). A subclass (a
            # masked array, whose mask would not follow the byte view) as
            # its plain data.
            if not dt.isnative:  # its bytes in the other order, which the byte view would not say
                raise BufferError("DLPack only supports native byte order")
            a = obj if type(obj) is numpy.ndarray else obj.view(numpy.ndarray)
            a = a if a.flags.c_contiguous else numpy.ascontiguousarray(a).reshape(a.shape)
            return _ab._rebuild_tensor(a.reshape(-1).view(numpy.uint8), dt.name, a.shape, not a.flags.writeable,
                                       "cpu")
        return obj

    def convert_immutable(self, producer, mod, opts):
        """convert() of an immutable array's producer (JAX's, TensorFlow's):
        read-only where the result shares its memory, as np.asarray makes
        it (a view, written, would change an immutable array); writable
        where it is a copy. Whether it is one is the result's own flag, not
        the keywords: dtype=float32 of a float32 array changes nothing and
        copies nothing. (Set here, not through DLPack's read-only flag,
        which a NumPy before 2.1 cannot take.)"""
        t = _ab.to_device(producer, "cpu:0", layout=self.layout, **opts)
        out = self.from_tensor(t, mod, None)
        if not t.copied:
            out.flags.writeable = False
        return out

    def from_tensor(self, t, mod, gpu_id):
        try:
            return mod.from_dlpack(t)
        except Exception:  # NumPy's refusal of a dtype it lacks (asked only then: this is the hot path)
            name = _ml_dtypes_name(t.dtype)
            if name is None:
                raise
        # bfloat16 and float8, which NumPy's DLPack import refuses: as
        # ml_dtypes' NumPy types (what np.asarray of a JAX array gives),
        # over the same memory where it is compact.
        kind = _ml_dtypes_type(name)
        t = _ab.to_device(t, "cpu:0", layout="compact")
        return mod.frombuffer(_ab.byte_view(t), dtype=kind).reshape(t.shape)


class Torch(Adapter):
    memory_type = MemoryType.TORCH
    import_name = "torch"
    modules = ("torch",)
    layout = "nonnegative"

    def device_of(self, obj):
        # By its torch.device, which torch.compile can trace (it cannot
        # trace __dlpack_device__'s enum): the torch -> torch no-op of a
        # decorated function then compiles. ROCm's "cuda" is not ours.
        dev = getattr(obj, "device", None)
        kind = getattr(dev, "type", None)
        if kind == "cpu":
            return "cpu:0"
        if kind == "cuda" and getattr(getattr(sys.modules.get("torch"), "version", None), "hip", None) is None:
            return "cuda:%d" % (dev.index or 0)
        return super().device_of(obj)

    def gpu_ids(self, mod):
        return tuple(range(mod.cuda.device_count())) if mod.cuda.is_available() else ()

    def why_not(self, obj):
        try:
            obj = _keras_value(obj)
            layout = str(obj.layout).replace("torch.", "")
            if obj.is_nested:
                return ("a torch nested tensor (layout %s) holds tensors of different shapes, not one array; convert "
                        "tensor.to_padded_tensor(0), or its parts (tensor.unbind())" % layout)
            if layout != "strided":
                return "a torch %s tensor has no dense memory; convert tensor.to_dense()" % layout
            if obj.is_meta:
                return "a torch tensor on the meta device has a shape and a dtype but no data"
        except Exception:  # not a tensor as this torch makes them: its own words stand
            pass
        return None

    _graph = (None, None)  # (torch, its autograd Function for within)

    def within(self, obj, device, convert, opts):
        # A tensor in autograd's graph: converted by the C core as any other
        # (its rounding, pools, limits and out-of-memory handling), inside
        # an autograd Function whose backward casts the gradient back to
        # the source's dtype and device, so the result stays in the graph
        # (a DLPack exchange alone detaches it, and a decorated layer whose
        # result preserve_dtype casts back broke backward()). Only a move
        # and a cast within floating or within complex types, whose
        # gradient is the gradient cast back; other keywords, and casts
        # into integers (which have no gradient), give a tensor outside
        # the graph. A forward-mode dual tensor keeps its tangent where it
        # also requires grad (jvp), else not.
        #
        # A tensor inside a torch.func transform (vmap, grad, jacrev) has
        # no memory of its own to export: it is converted through the same
        # Function, which the transforms unwrap (its vmap rule passes the
        # batch dimension through), for a move and any cast; other
        # keywords fail there, and why_not says why.
        obj = _keras_value(obj)  # a Keras 3 variable on the torch backend: its tensor
        mod = self.module()
        wrapped = _functorch_wrapped(mod, obj)
        if len(opts) > ("dtype" in opts):
            if wrapped:
                raise MemoryConversionError(
                    self.memory_type, self.memory_type, "arraybridge -> torch",
                    "a tensor inside a torch.func transform (vmap, grad, jacrev) has no memory of its own: there "
                    "only dtype= and a move to another device convert it; convert before the transform")
            return None
        if not wrapped and not getattr(obj, "requires_grad", False):
            return None
        if "dtype" in opts:
            name = core_dtype_name(opts["dtype"])
            if not wrapped and (name not in _GRAD_DTYPES or name.startswith("complex") != obj.dtype.is_complex):
                return None
            # (a dtype torch lacks goes to the C core, which says why not)
            if name is not None and getattr(mod, name, None) == obj.dtype and self.device_of(obj) == device:
                # Nothing to convert: the C core would hand back an alias
                # autograd does not know (an in-place op on it would change
                # obj behind the graph). A view it tracks instead.
                return obj.view_as(obj)
        known, fn = Torch._graph
        if known is not mod:
            fn = _converted_in_graph(mod)
            Torch._graph = (mod, fn)
        return fn.apply(obj, convert)

    def producer(self, obj):
        obj = _keras_value(obj)  # a Keras 3 variable on the torch backend: its tensor
        if obj.requires_grad:
            obj = obj.detach()
        # A lazily conjugated or negated view: DLPack has no such bits, so
        # the values are made real first (a copy; to_dlpack would hand out
        # the stored, unconjugated numbers).
        if obj.is_conj():
            obj = obj.resolve_conj()
        if obj.is_neg():
            obj = obj.resolve_neg()
        # A CPU tensor as a capsule of torch's public to_dlpack: its
        # __dlpack__ and __dlpack_device__ are Python and cost 6 us a call.
        return self.module().utils.dlpack.to_dlpack(obj) if obj.is_cpu else obj

    def from_tensor(self, t, mod, gpu_id):
        # The capsule itself: torch.from_dlpack(t) would first ask t for its
        # device and stream in Python (2.5 us more). A Tensor's data is
        # complete, so no stream handshake is needed.
        # torch tensors have no read-only flag: read-only data is copied,
        # so that writing the result cannot change the source.
        copy = True if t.readonly else None
        try:
            return mod.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=copy))
        except (TypeError, RuntimeError):  # a torch that takes no versioned capsule
            return mod.from_dlpack(t.__dlpack__(copy=copy))

    def empty_cache(self, mod, device_id=None):
        # Only devices torch has: torch.cuda.device(N) past the last one
        # raises (invalid device ordinal), and such an id holds nothing.
        for i in self.ids_to_clean(mod, device_id):
            with mod.cuda.device(i):
                mod.cuda.empty_cache()

    def is_oom(self, exc, mod):
        oom = getattr(mod.cuda, "OutOfMemoryError", None) if mod is not None else None
        return (oom is not None and isinstance(exc, oom)) or isinstance(exc, MemoryError) or (
            isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _functorch_wrapped(torch, obj):
    """Whether obj is a tensor wrapped by a torch.func transform (vmap's
    batched tensors, grad's tracking ones): no storage of its own."""
    test = getattr(getattr(getattr(torch, "_C", None), "_functorch", None), "is_functorch_wrapped_tensor", None)
    try:
        return test is not None and bool(test(obj))
    except Exception:  # not a tensor this torch makes
        return False


def _converted_in_graph(torch):
    """An autograd Function for Torch.within: forward is the C core's
    conversion, backward the gradient cast back to the source's dtype on
    the source's device. In torch.func's form (forward without ctx, a
    setup_context, a vmap rule), so that its transforms can run it."""

    class ConvertedInGraph(torch.autograd.Function):
        @staticmethod
        def forward(x, convert):
            return convert(x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x = inputs[0]
            ctx.source, ctx.target = (x.dtype, x.device), (output.dtype, output.device)

        @staticmethod
        def vmap(info, in_dims, x, convert):
            # A move or a cast, element by element: the batch dimension of
            # x is the result's, where it was.
            return ConvertedInGraph.apply(x, convert), in_dims[0]

        @staticmethod
        def backward(ctx, grad):
            dtype, device = ctx.source
            return grad.to(device=device, dtype=dtype), None

        @staticmethod
        def jvp(ctx, tangent, _):  # forward mode: a dual tensor that also requires grad
            dtype, device = ctx.target
            return tangent.to(device=device, dtype=dtype)

    return ConvertedInGraph


class CuPy(Adapter):
    memory_type = MemoryType.CUPY
    import_name = "cupy"
    modules = ("cupy", "cupyx")
    has_host = False

    def gpu_ids(self, mod):
        try:
            return tuple(range(mod.cuda.runtime.getDeviceCount()))
        except Exception:  # no driver or no GPU: CuPy raises its CUDARuntimeError
            return ()

    def default_gpu(self, mod):
        try:
            return mod.cuda.runtime.getDevice()
        except Exception:
            return 0

    def from_tensor(self, t, mod, gpu_id):
        with mod.cuda.Device(id_of_device(t.device)):
            return mod.from_dlpack(t)

    def empty_cache(self, mod, device_id=None):
        # The device pool frees the current device's blocks alone: each
        # device asked for in turn, never one CuPy does not have.
        for i in self.ids_to_clean(mod, device_id):
            with mod.cuda.Device(i):
                mod.get_default_memory_pool().free_all_blocks()
        mod.get_default_pinned_memory_pool().free_all_blocks()

    def is_oom(self, exc, mod):
        oom = getattr(getattr(mod, "cuda", None), "memory", None) if mod is not None else None
        oom = getattr(oom, "OutOfMemoryError", None)
        return (oom is not None and isinstance(exc, oom)) or isinstance(exc, MemoryError)


# What JAX makes of 64-bit floats with its 64-bit types off.
_JAX_NARROW = {"float64": "float32", "complex128": "complex64"}
# The 64-bit integers JAX narrows itself with its 64-bit types off.
_JAX_NARROW_INT = frozenset(("int64", "uint64"))


class Jax(Adapter):
    memory_type = MemoryType.JAX
    import_name = "jax"
    modules = ("jax", "jaxlib")
    layout = "compact"
    immutable = True

    def producer(self, obj):
        return _keras_value(obj)  # a Keras 3 variable on the JAX backend: its array

    @staticmethod
    def _devices(obj, one=False):
        """The devices obj's array is on, where there are several (or, with
        one, at least one); else None (one device, or not an array as this
        JAX makes them)."""
        try:
            devices = _keras_value(obj).sharding.device_set
            return devices if len(devices) > (0 if one else 1) else None
        except Exception:
            return None

    def device_of(self, obj):
        try:
            return super().device_of(obj)
        except (BufferError, ValueError, AttributeError) as e:
            # Over several devices: no __dlpack_device__ (older JAX:
            # ValueError). Typed PRNG keys have none at all
            # (AttributeError), on one device or several: a jax -> jax
            # call leaves host keys as they are.
            devices = self._devices(obj, one=isinstance(e, AttributeError))
            if devices is None:
                raise
            # All of them host memory, cpu:0 to the C core (JAX's CPU device
            # N exports id N): a jax -> jax call for the host leaves it as it
            # is, shards and all.
            return "cpu:0" if all(d.platform == "cpu" for d in devices) else None

    def whole(self, obj):
        # An array over several devices has no DLPack export (JAX: "only
        # supported for unsharded arrays"). A replicated one has its whole
        # value on each device: the copy of the first in JAX's order of its
        # shards, shared. Any other is gathered by JAX onto the device of
        # lowest id (a copy; GPU shards stay on GPUs; JAX's error, out of
        # memory say, is raised). One spread over several processes has no
        # whole value here: why_not says so.
        devices = self._devices(obj)
        if devices is None:
            return None
        obj = _keras_value(obj)
        try:
            if not obj.is_fully_addressable:
                return None
            if obj.sharding.is_fully_replicated:
                return obj.addressable_data(0)
            jax = sys.modules["jax"]
            first = jax.sharding.SingleDeviceSharding(min(devices, key=lambda d: (d.platform, d.id)))
        except Exception:  # not an array as this JAX makes them: the first error stands
            return None
        return jax.device_put(obj, first)

    def why_not(self, obj):
        try:
            obj = _keras_value(obj)
            if obj.is_deleted():
                return "the JAX array has been deleted (array.delete(), or donated to a jitted function)"
            if not obj.is_fully_addressable:
                return ("a JAX array sharded over several processes has no whole value in this one; gather it first "
                        "(jax.experimental.multihost_utils.process_allgather), or convert its local shards "
                        "(array.addressable_shards)")
            dtype = getattr(obj, "dtype", None)
            if type(dtype).__name__ == "PRNGKeyType" or "key<" in str(dtype):
                return ("a JAX array of typed PRNG keys has no DLPack form; convert its key data "
                        "(jax.random.key_data(keys))")
        except Exception:  # not an array as this JAX makes them: its own words stand
            pass
        return None

    def traced(self, obj):
        # A Keras 3 variable is traced where its value is (model.fit's
        # step, a StatelessScope under jax.jit).
        jax = sys.modules.get("jax")
        tracer = getattr(getattr(jax, "core", None), "Tracer", None)
        return tracer is not None and isinstance(_keras_value(obj), tracer)

    def traced_cast(self, obj, dtype):
        # By the C core's rules, as an eager call casts: into integers, floats
        # rounded half to even, NaN 0, and everything saturated (astype
        # truncates and wraps, so jit(f) and f gave other integers).
        jnp = importlib.import_module("jax.numpy")
        obj = _keras_value(obj)  # a Keras 3 variable whose value is traced: that value
        dt = jnp.dtype(dtype)
        if not jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(obj.dtype, jnp.bool_):
            return obj.astype(dt)
        # The bounds as arrays of their types: a Python int above int32's
        # top (uint32's) is an OverflowError for JAX's weak types.
        info, x = jnp.iinfo(dt), obj
        lo, hi = jnp.asarray(info.min, dt), jnp.asarray(info.max, dt)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            # Compared as floats: a bound may round outwards there (int32's
            # top is 2^31 as a float32), so what reaches it is the bound;
            # what lies past one is cast to anything, then replaced.
            x = jnp.where(jnp.isnan(x), jnp.zeros_like(x), jnp.round(x))
            import numpy
            with numpy.errstate(over="ignore"):  # uint32's top is inf as a float16: still the bound
                lo_x, hi_x = numpy.asarray(info.min, dt).astype(x.dtype), numpy.asarray(info.max, dt).astype(x.dtype)
            y = jnp.where(x <= lo_x, lo, x.astype(dt))
            return jnp.where(x >= hi_x, hi, y)
        src = jnp.iinfo(x.dtype)  # clipped by the bounds the source's type can hold
        if info.max < src.max:
            x = jnp.minimum(x, hi.astype(x.dtype))
        if info.min > src.min:
            x = jnp.maximum(x, lo.astype(x.dtype))
        return x.astype(dt)

    def _gpus(self, mod):
        try:
            return mod.devices("gpu")
        except RuntimeError:  # no GPU backend
            return []

    def gpu_ids(self, mod):
        return tuple(range(len(self._gpus(mod))))

    def from_tensor(self, t, mod, gpu_id):
        import jax.dlpack
        dev = mod.devices("cpu")[0] if gpu_id is None else self._gpus(mod)[gpu_id]
        narrow = _JAX_NARROW.get(t.dtype)
        if narrow is not None and not mod.config.jax_enable_x64:
            # 64-bit floats with JAX's 64-bit types off: JAX's own import
            # narrows them flushing float32 subnormals to zero (1e-40 -> 0,
            # where jnp.asarray keeps it); the C core rounds them as NumPy's
            # astype does. (Integers are left to JAX, which wraps them as
            # jnp.asarray does.)
            t = _ab.to_device(t, t.device, dtype=narrow)
        elif t.readonly or (gpu_id is None and t.data_ptr % 64 != 0):
            # JAX takes legacy capsules, which cannot say read-only. And it
            # uses host memory in place only where it is 64-byte aligned
            # (malloc aligns NumPy's arrays to 16 bytes): others it copies,
            # on one thread and after from_dlpack returns, so the caller's
            # writes to the source just after this call reached that copy.
            # The C core's copy into the pool (aligned), which JAX then
            # shares, is done when this returns, and faster: 64 MiB float32
            # from NumPy, 2 cores, 34 ms by JAX's copy, 3-6 ms by ours
            # (bench/results/2026-12-05-numpy-to-jax-unaligned.md). Also
            # before JAX narrows int64 (below), which it does faster from
            # aligned memory: 64 MiB unaligned, 11-15 ms with our copy
            # first, 35-41 ms without.
            t = _ab.to_device(t, t.device, copy=True)
        out = jax.dlpack.from_dlpack(t, device=dev)
        if t.dtype in _JAX_NARROW_INT and not mod.config.jax_enable_x64:
            # JAX narrows them in a copy of its own, made after
            # from_dlpack returns: waited for here, so that the caller's
            # writes to the source after this call cannot reach the result
            # (they did, in most of a 64 MiB array). block_until_ready lets
            # go of the GIL, which the source's deleter, run on a thread of
            # JAX's, takes.
            out.block_until_ready()
        return out

    def empty_cache(self, mod, device_id=None):
        # Compiled functions and what their executables hold: only where JAX
        # has GPUs, whose memory that may be (on the CPU alone, every OOM
        # retry made each jitted function compile again, for nothing). And
        # only once JAX's backends have started: asking for its devices
        # starts them (an XLA client, a dozen threads, on a GPU build its
        # memory preallocated), in a process that only imported JAX.
        clear = getattr(mod, "clear_caches", None)
        if clear is not None and self._started() and self._gpus(mod):
            clear()

    @staticmethod
    def _started():
        """Whether JAX's backends have started (none has, no array of JAX's
        exists); True where this JAX does not say (as before)."""
        try:
            from jax._src import xla_bridge
            return bool(xla_bridge.backends_are_initialized())
        except Exception:  # a private module: another layout says nothing
            return True

    def is_oom(self, exc, mod):
        return isinstance(exc, MemoryError) or "RESOURCE_EXHAUSTED" in str(exc) or "out of memory" in str(exc).lower()


class TensorFlow(Adapter):
    memory_type = MemoryType.TENSORFLOW
    import_name = "tensorflow"
    modules = ("tensorflow", "tf_keras")  # keras: by its backend (_keras_owner)
    layout = "compact"
    immutable = True

    def gpu_ids(self, mod):
        return tuple(range(len(mod.config.list_physical_devices("GPU"))))

    def producer(self, obj):
        # Variables and other tensor-likes: their value as a tf.Tensor.
        return obj if hasattr(obj, "__dlpack__") else self.module().convert_to_tensor(obj)

    def why_not(self, obj):
        kind = type(obj).__name__
        if kind == "RaggedTensor":
            return ("a tf.RaggedTensor has rows of different lengths, not one array; convert ragged.to_tensor() "
                    "(padded) or ragged.flat_values")
        if kind == "SparseTensor":
            return "a tf.SparseTensor has no dense memory; convert tf.sparse.to_dense(sparse)"
        return None

    def device_of(self, obj):
        return super().device_of(self.producer(obj))

    def traced(self, obj):
        # A graph tensor, inside tf.function (Keras's fit, say); a variable
        # there is one as its value.
        tf = sys.modules.get("tensorflow")
        symbolic = getattr(tf, "is_symbolic_tensor", None)
        if symbolic is None:
            return False
        if symbolic(obj):
            return True
        if hasattr(obj, "__dlpack__") or tf.executing_eagerly():
            return False
        try:
            return bool(symbolic(self.producer(obj)))
        except Exception:  # no tensor (a SparseTensor): refused later, as outside tf.function
            return False

    def traced_cast(self, obj, dtype):
        # By the C core's rules, as for JAX above (tf.cast truncates and wraps).
        tf = self.module()
        dt = tf.as_dtype(dtype)
        if not dt.is_integer or obj.dtype == tf.bool:
            return tf.cast(obj, dt)
        if not obj.dtype.is_floating:
            # Between integers by hand: saturate_cast gives 0 for int64 ->
            # uint64 and has no CPU kernel for uint32 and uint64. Clipped
            # in the source's type, by the bounds it can hold.
            x, src = obj, obj.dtype
            if dt.max < src.max:
                top = tf.constant(dt.max, src)
                x = tf.where(x > top, tf.fill(tf.shape(x), top), x)
            if dt.min > src.min:
                bottom = tf.constant(dt.min, src)
                x = tf.where(x < bottom, tf.fill(tf.shape(x), bottom), x)
            return tf.cast(x, dt)
        x = tf.where(tf.math.is_nan(obj), tf.zeros_like(obj), tf.round(obj))
        # saturate_cast clamps at the bounds as floats, where int32's top
        # rounds up to 2^31, which then wraps: what reaches a bound is it.
        hi, lo = tf.constant(dt.max, dt), tf.constant(dt.min, dt)
        y = tf.saturate_cast(x, dt)
        y = tf.where(x >= tf.cast(hi, x.dtype), tf.fill(tf.shape(y), hi), y)
        return tf.where(x <= tf.cast(lo, x.dtype), tf.fill(tf.shape(y), lo), y)

    def from_tensor(self, t, mod, gpu_id):
        # TensorFlow takes legacy capsules only, and a legacy capsule cannot
        # say read-only: such data is copied (TensorFlow never writes it).
        # Its kernels also assume 64-byte aligned buffers (Eigen's
        # EIGEN_MAX_ALIGN_BYTES) and abort the process on one that is not,
        # so an unaligned source (a NumPy slice, a small allocation) is
        # copied into pool memory, which is aligned.
        copy = t.readonly or t.data_ptr % 64 != 0
        cap = t.__dlpack__(max_version=None, copy=True if copy else None)
        return mod.experimental.dlpack.from_dlpack(cap)

    def is_oom(self, exc, mod):
        oom = getattr(getattr(mod, "errors", None), "ResourceExhaustedError", None) if mod is not None else None
        return (oom is not None and isinstance(exc, oom)) or isinstance(exc, MemoryError)


# OpenCL's codes for an allocation that did not fit, as pyclesperanto's
# errors spell them.
_CL_NO_MEMORY = ("MEM_OBJECT_ALLOCATION_FAILURE", "OUT_OF_RESOURCES", "OUT_OF_HOST_MEMORY", "INVALID_BUFFER_SIZE")


# What pyclesperanto makes arrays of (bool as uint8, 64-bit types as
# 32-bit: its own storage rules); float16, bfloat16 and float8 it has not.
_CLE_DTYPES = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
                         "float64"))


class Pyclesperanto(Adapter):
    memory_type = MemoryType.PYCLESPERANTO
    import_name = "pyclesperanto"
    modules = ("pyclesperanto", "pyclesperanto_opencl", "pyclesperanto_prototype")
    has_host = False
    accel = "opencl"
    layout = "compact"
    _select_lock = threading.Lock()

    def module(self, source=None, target=None):
        # The OpenCL drivers must be loaded by arraybridge first (RTLD_DEEPBIND,
        # see backends/opencl/icd_preload.c): pyclesperanto's own ICD loader
        # then reuses them, and a process holding TensorFlow does not crash.
        # Once pyclesperanto is imported that is settled, either way: not
        # asked again on every call (after a conversion, with the caches
        # cold, the device list took about 5 us).
        if self.loaded() is None:
            _ab.devices()
        return super().module(source, target)

    # pyclesperanto 0.25 that found no backend (none of its backend
    # packages imports, or none finds a device) warns and leaves its device
    # functions out of the module: it then has no devices, and a conversion
    # to it says why (_why_not_ours).
    _ids = (None, None, ())  # (process id, module, ids): its devices do not change either

    def gpu_ids(self, mod):
        pid, known, ids = self._ids
        if pid == os.getpid() and known is mod:
            return ids
        listing = getattr(mod, "list_available_devices", None)
        ids = tuple(range(len(listing()))) if listing is not None else ()
        if ids:  # none is not kept: the importing thread itself may ask before the module lists any
            Pyclesperanto._ids = (os.getpid(), mod, ids)
        return ids

    def default_gpu(self, mod):
        current = getattr(mod, "get_device", None)
        return current().index if current is not None else 0  # pyclesperanto's current device

    def _why_not_ours(self, gpu_id, mod):
        if getattr(mod, "list_available_devices", None) is None:
            version = getattr(mod, "__version__", "?")
            listing = getattr(mod, "list_available_backends", None)
            backends = [str(b).lower() for b in listing()] if listing is not None else ["opencl"]
            if not backends:  # no backend package imports
                return (" (pyclesperanto %s has no backend: none of its backend packages could be imported; "
                        "pip install pyclesperanto[opencl])" % version)
            if "opencl" not in backends:
                return (" (pyclesperanto %s has no backend: its %s backend found no device, and its OpenCL one is "
                        "not installed: pip install pyclesperanto[opencl])" % (version, ", ".join(backends)))
            return (" (pyclesperanto %s has no backend: its OpenCL backend could load no OpenCL driver; is an ICD "
                    "registered in %s?)" % (version, os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"))
        return super()._why_not_ours(gpu_id, mod)

    @staticmethod
    def _device_by_index(mod):
        """pyclesperanto's backend's getDeviceFromIndex (0.25 and later), which
        hands out the Device that select_device would without making it the
        process's current device; None where the backend has none."""
        try:
            return mod._core._get_backend_manager().get_backend().getDeviceFromIndex
        except Exception:  # another layout: a private API, so no promise
            return None

    def create(self, mod, shape, dtype, gpu_id):
        """A new pyclesperanto array on its device gpu_id. The current device
        is process-wide in pyclesperanto, so selecting gpu_id, even for a
        moment, would send another thread's arrays there: the Device is taken
        from the backend by index where it can be, and only elsewhere
        selected and the caller's current device selected again after.
        An allocation that does not fit is a MemoryError."""
        try:
            return self._create(mod, shape, dtype, gpu_id)
        except RuntimeError as e:
            # pyclesperanto raises RuntimeError with OpenCL's code; out of
            # memory, or more than the device allocates at once, is a
            # MemoryError, as the C core's own allocations give.
            if not any(code in str(e) for code in _CL_NO_MEMORY):
                raise
            raise MemoryError("pyclesperanto could not allocate an array of shape %s on its device %s: %s%s"
                              % (tuple(shape), gpu_id, e, self._past_largest(e, gpu_id))) from e

    @staticmethod
    def _past_largest(e, gpu_id):
        """For OpenCL's CL_INVALID_BUFFER_SIZE, what the device allocates at
        once at most (no release of memory makes room past it: a decorator's
        oom_recovery does not try again, _cleanup.hopeless); else ''."""
        if "INVALID_BUFFER_SIZE" not in str(e):
            return ""
        try:
            most = _ab.device_info("opencl:%d" % gpu_id)["max_alloc_size"]
        except Exception:  # a device arraybridge does not see: the words alone
            return "; more than the device allocates at once"
        return "; more than the device allocates at once (%d bytes)" % most

    def _create(self, mod, shape, dtype, gpu_id):
        import numpy  # pyclesperanto's own dependency; it names dtypes so
        by_index = self._device_by_index(mod)
        if by_index is not None:
            dev = by_index(gpu_id, "all")
            if dev is not None:
                return mod.create(tuple(shape), dtype=numpy.dtype(dtype), device=dev)
        with self._select_lock:  # our select-and-restore, one thread at a time
            current = mod.get_device().index
            dev = mod.select_device(gpu_id)
            try:
                return mod.create(tuple(shape), dtype=numpy.dtype(dtype), device=dev)
            finally:
                mod.select_device(current)

    @staticmethod
    def check(shape, dtype):
        """Refuses what pyclesperanto has no array for (its create would make
        another shape or dtype, or fail in words about something else):
        ValueError for the shape, TypeError for the dtype."""
        if not 1 <= len(shape) <= 3 or 0 in shape:
            raise ValueError("pyclesperanto arrays have 1 to 3 dimensions of at least one element each; data has "
                             "shape %s" % (tuple(shape),))
        name = str(dtype).split("(", 1)[0]
        if name.startswith("complex"):
            raise TypeError("pyclesperanto has no complex arrays, so %s data cannot go there as it is; convert its "
                            "real part, or abs(), instead" % (name,))
        if name not in _CLE_DTYPES:
            raise TypeError("pyclesperanto has no %s arrays (bool, integers, float32 and float64 only); convert the "
                            "data to one (convert_memory's dtype='float32', say) first" % (name,))

    def from_tensor(self, t, mod, gpu_id):
        return self.convert(t, None, gpu_id, mod, {})

    def convert(self, producer, device, gpu_id, mod, opts):
        # The result must live in pyclesperanto's own OpenCL context (its
        # kernels cannot use a buffer of ours): made there, then written by
        # the C core, device-side where the contexts allow, else once
        # through host memory.
        src = _ab.from_dlpack(producer)  # zero-copy: its shape and dtype
        shape = src.shape
        if opts:
            # Every keyword checked, and refused in the words and order of
            # every other target, before the result's shape is worked out
            # from permute: the C core plans the same move to the host.
            _ab.explain_route(src, "cpu:0", **opts)
        perm = opts.get("permute")
        if perm is not None:
            shape = tuple(shape[p + len(shape) if p < 0 else p] for p in perm)
        dtype = opts.get("dtype")
        if dtype is None:
            dtype = src.dtype
        else:  # one of NumPy's spellings ('f4', 'single', 'u1') too, as the C core takes it
            dtype = core_dtype_name(dtype) or dtype
        self.check(shape, dtype)
        out = self.create(mod, shape, dtype, gpu_id)
        _ab.convert_into(src, out, **{k: v for k, v in opts.items() if k != "dtype"})
        return out

    def is_oom(self, exc, mod):
        text = str(exc)
        return isinstance(exc, MemoryError) or any(code in text for code in _CL_NO_MEMORY)


ADAPTERS = {a.memory_type: a for a in (NumPy(), CuPy(), Torch(), TensorFlow(), Jax(), Pyclesperanto())}


def _forget_devices():
    """In a forked child: the device lists are its own to make (the process
    id check alone would trust a list whose maker's id the child reuses)."""
    global _OUR_DEVICES
    _OUR_DEVICES = (None, frozenset())
    Pyclesperanto._ids = (None, None, ())


def _note_drivers():
    """Before a fork: pyclesperanto starts the OpenCL driver at its import,
    which the C core does not see. A child forked after that would wait
    for ever in its first OpenCL call (the driver's threads stay in the
    parent), arraybridge started or not: noted, the child has no OpenCL
    devices and says why. Half imported counts (another thread importing
    it at the fork): the driver starts partway through the import."""
    if sys.modules.get("pyclesperanto") is not None:  # None: an import blocked on purpose
        try:
            _ab._note_driver_started("opencl:0")
        except ValueError:  # a build without the OpenCL backend: nothing of ours to leave behind
            pass


def _as_imported_now(name):
    """A fork hook that calls this module's function `name` as the module is
    imported now: a module imported again (its entries taken out of
    sys.modules) keeps the device lists in use, and os.register_at_fork
    cannot take a hook back, so the hooks are registered once a process
    (_claim_fork_hooks: a static of the C module, which no re-import
    resets). Where the module is out of sys.modules, or half imported
    again, at the fork, this copy's own function runs: the parent's note
    that pyclesperanto started OpenCL must not be skipped (its child then
    hangs in the driver)."""
    def hook():
        fn = getattr(sys.modules.get(__name__), name, None)
        (fn if callable(fn) else globals()[name])()
    return hook


if hasattr(os, "register_at_fork") and _ab._claim_fork_hooks():  # POSIX
    os.register_at_fork(before=_as_imported_now("_note_drivers"), after_in_child=_as_imported_now("_forget_devices"))
