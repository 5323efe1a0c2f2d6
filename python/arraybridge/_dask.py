"""Tensors as first-class passengers of Dask distributed.

Dask serializes an object with the first family that takes it: "dask"
(per-type dask_serialize functions: a msgpack header and a list of byte
frames), then "pickle". This module registers Tensor with the "dask"
family: the header carries dtype, shape, the read-only flag and the device
the tensor came from, and the one frame is the tensor's own host memory (a
memoryview of it, no copy) or, for a strided view or a device tensor, its
bytes made compact in host memory once through the library's staging path.
On the receiving side the frame becomes the tensor's memory (no copy where
Dask hands over a writable, aligned buffer), and a device tensor goes back
onto a device of the same kind and id when the worker has one, else stays
in host memory: its .device says which (AB_UNPICKLE_MISSING_DEVICE=fail
makes that an error instead), exactly as pickling does.

`import arraybridge` does not import distributed: registration happens when
both are imported, in either order (an import hook waits for
distributed.protocol when it is not there yet).

Dask's "cuda" family, which a cluster on UCX tries first so that GPU
frames go device to device, takes Tensors in CUDA memory: the frame is the
tensor itself (its __cuda_array_interface__), and the receiving worker's
frame (device memory UCX received into) becomes the new tensor's memory.
Written against distributed.protocol.cuda's interface and tested against
simcuda, the simulated runtime, only: it has never run on a GPU or over
UCX.
"""
import importlib.abc
import math
import sys
import pickle
import threading
import warnings

from . import _arraybridge as _ab
from ._frameworks import imported
from ._types import id_of_device

_PROTOCOL = "distributed.protocol"
_lock = threading.Lock()
_registered = False


def _header(t):
    """Both families' header of a Tensor. dldtype: (code, bits, lanes), for
    dtypes whose names older versions do not read back (float8, multi-lane);
    dtype: the name, for receivers before dldtype."""
    return {"dtype": t.dtype, "dldtype": list(t.dldtype), "shape": list(t.shape), "readonly": bool(t.readonly),
            "device": t.device}


def _header_dtype(header):
    """The dtype a header carries, as _rebuild_tensor and
    _from_cuda_array_interface take it (a sender before dldtype: the name)."""
    return tuple(header["dldtype"]) if "dldtype" in header else header["dtype"]


def serialize(t):
    """(header, frames) of a Tensor for Dask: its host bytes, compact, as
    one frame (the tensor's own memory when it already is such bytes)."""
    host = _ab.to_device(t, "cpu", layout="compact")
    # its bytes, one-dimensional (byte_view: bfloat16 and float8 have no
    # typed buffer; the others' memoryview has its dtype and shape)
    return _header(t), [pickle.PickleBuffer(_ab.byte_view(host)).raw()]


def deserialize(header, frames):
    """The Tensor of serialize's header and frames."""
    frame = frames[0] if len(frames) == 1 else b"".join(frames)
    return _ab._rebuild_tensor(frame, _header_dtype(header), tuple(header["shape"]), header["readonly"],
                               header["device"])


_CUDA = ("cuda:", "cuda_managed:")


class _CudaBytes:
    """A compact CUDA tensor's memory as a frame of bytes: the CUDA array
    interface has no type string for bfloat16, float8 or multi-lane dtypes,
    so such a tensor describes itself as uint8 (one dimension), and the
    header says what the bytes are. Holds the tensor."""

    def __init__(self, t):
        self.tensor = t
        self.nbytes = t.nbytes
        self.__cuda_array_interface__ = {"version": 3, "shape": (t.nbytes,), "typestr": "|u1",
                                         "data": (t.data_ptr, bool(t.readonly)), "strides": None, "stream": None}


def cuda_serialize(t):
    """(header, frames) of a Tensor in CUDA memory for Dask's "cuda" family
    (UCX moves such frames GPU to GPU): the tensor itself, compact, as the
    frame (its __cuda_array_interface__; its bytes where the interface has
    no type string for its dtype). Any other tensor is Dask's
    NotImplementedError, so that the next family takes it."""
    if not t.device.startswith(_CUDA):
        raise NotImplementedError("arraybridge: only a Tensor in CUDA memory is a cuda frame")
    frame = _ab.to_device(t, t.device, layout="compact")  # itself when already compact
    if not hasattr(frame, "__cuda_array_interface__"):
        frame = _CudaBytes(frame)
    return _header(t), [frame]


def cuda_deserialize(header, frames):
    """The Tensor of cuda_serialize's header and frame: the frame's device
    memory (any object with __cuda_array_interface__: what UCX received
    into), zero-copy. The interface does not say which GPU the memory is
    on: the sender's id is tried first, then this worker's other GPUs, and
    the one the library finds the memory on (it checks every CUDA pointer
    against the device it is labelled with) is the tensor's device."""
    (frame,) = frames
    n = sum(1 for d in _ab.devices() if d.startswith("cuda:"))
    first = id_of_device(header["device"])
    dtype = _header_dtype(header)
    error = None
    for gpu in [first] + [i for i in range(n) if i != first]:
        try:
            return _ab._from_cuda_array_interface(frame, gpu, dtype=dtype, shape=tuple(header["shape"]),
                                                 readonly=header["readonly"])
        except ValueError as e:  # not this GPU's memory (or no such GPU)
            error = e
    raise ValueError("the frame's memory is on none of this worker's %d CUDA devices: %s" % (n, error))


def _nbytes(t):
    """The bytes a Tensor holds: its elements', or fewer where strides of 0
    (a broadcast) make them share memory, as Dask counts NumPy's."""
    n = int(t.nbytes)
    if n == 0 or 0 not in t.strides:
        return n
    item = n // math.prod(t.shape)
    span = 1 + sum((d - 1) * abs(s) for d, s in zip(t.shape, t.strides))
    return min(n, item * span)


def _register(protocol):
    global _registered
    with _lock:
        if _registered:
            return
        protocol.dask_serialize.register(_ab.Tensor)(serialize)
        protocol.dask_deserialize.register(_ab.Tensor)(deserialize)
        cuda = getattr(protocol, "cuda_serialize", None)
        if cuda is not None:
            cuda.register(_ab.Tensor)(cuda_serialize)
            protocol.cuda_deserialize.register(_ab.Tensor)(cuda_deserialize)
        _registered = True
        # Its size as Dask counts worker memory (for spilling and pausing):
        # the bytes, on whatever device, as Dask counts CuPy's; without
        # this, sys.getsizeof's 40 bytes of the object. Last, and on its
        # own: the serializers stand whatever happens here.
        try:
            from dask.sizeof import sizeof
            sizeof.register(_ab.Tensor)(_nbytes)
        except Exception as e:  # a dask whose API moved
            warnings.warn("arraybridge: Tensor's dask.sizeof not registered (Dask counts it as 40 bytes): %r" % (e,),
                          RuntimeWarning)


class _RegisteringLoader(importlib.abc.Loader):
    """distributed.protocol's own loader, which registers the serializers
    once the module has run. A wrapper of this one spec's loader: the
    loader object itself, which may serve other modules (zipimport), is
    left alone."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _uninstall()
        try:
            _register(module)
        except Exception as e:  # a distributed whose API moved: its import must still work
            warnings.warn("arraybridge: Tensor's Dask serializers not registered: %r" % (e,), RuntimeWarning)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Finds distributed.protocol as the other finders would, with a loader
    that registers the serializers once it has run; then takes itself out
    of sys.meta_path."""

    def find_spec(self, name, path, target=None):
        if name != _PROTOCOL:
            if _late and not _registered:
                _register_late()
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


_hook = _WhenImported()


def _uninstall():
    # A new list, not the list changed in place: this runs inside the
    # hook's own find_spec (_register_late) or an import's exec_module,
    # while importlib (in this thread or another) may be walking the list,
    # and removing an entry there skips the finder after it for that walk
    # (a built-in module then failed to import).
    if _hook in sys.meta_path:
        sys.meta_path = [f for f in sys.meta_path if f is not _hook]


# Whether install() found distributed.protocol half-imported by another
# thread: its loader was found before the hook went in, so the hook never
# sees it; it registers at the first import anywhere after it has run
# (distributed's own __init__ imports more after it).
_late = False


def _register_late():
    protocol = imported(_PROTOCOL)
    if protocol is None:
        return
    _uninstall()
    try:
        _register(protocol)
    except Exception as e:  # a distributed whose API moved: the import under way is not its own
        try:  # and must work even where warnings are errors (-W error)
            warnings.warn("arraybridge: Tensor's Dask serializers not registered: %r" % (e,), RuntimeWarning)
        except Exception:
            pass


def install():
    """Registers now if distributed.protocol is imported, else when it is."""
    global _late
    protocol = imported(_PROTOCOL)
    if protocol is not None and hasattr(protocol, "dask_serialize"):
        _register(protocol)
    elif _hook not in sys.meta_path:
        _late = protocol is None and _PROTOCOL in sys.modules  # half-imported (not: imported without the API)
        # The hook of an earlier import of this module (its entries taken
        # out of sys.modules and imported again) is replaced, not kept
        # beside it: each import added one, which kept its module alive.
        # Only then a new list (as _uninstall makes one): rebuilding it
        # every time could drop a finder another thread inserts meanwhile.
        stale = [f for f in sys.meta_path
                 if type(f).__qualname__ == "_WhenImported" and type(f).__module__ == __name__]
        if stale:
            sys.meta_path = [_hook] + [f for f in sys.meta_path if not any(f is s for s in stale)]
        else:
            sys.meta_path.insert(0, _hook)


def registered():
    """Whether the serializers are registered with distributed."""
    return _registered
