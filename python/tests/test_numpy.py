"""arraybridge against NumPy 2.x: zero-copy exchange both ways, ownership of
DLPack capsules, every dtype and layout NumPy can export, and round trips
through OpenCL (PoCL in CI: POCL_DEVICES="pthread pthread" gives two
devices)."""
import gc
import subprocess
import sys
import weakref

import numpy as np
import pytest

import arraybridge as ab
from ab_support import addr, n_devices, opencl

KDLCPU, KDLOPENCL = 1, 4


class LegacyProducer:
    """A producer that knows only the pre-1.0 protocol (no max_version)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class LegacyCapsule:
    """Hands NumPy the legacy capsule a legacy consumer would get from t."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class SameCapsule:
    """Offers one capsule every time it is asked."""

    def __init__(self, cap, device):
        self.cap, self.device = cap, device

    def __dlpack__(self, **kwargs):
        return self.cap

    def __dlpack_device__(self):
        return self.device


def capsule_name(cap):
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype, get.argtypes = ctypes.c_char_p, [ctypes.py_object]
    return get(cap).decode()


# ---- zero-copy -----------------------------------------------------------------


def test_numpy_to_arraybridge_shares_memory_and_writes_show_through():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ab.from_dlpack(a)
    assert t.data_ptr == addr(a)
    assert (t.shape, t.strides, t.dtype, t.device, t.nbytes) == ((3, 4), (4, 1), "float32", "cpu:0", 48)
    b = np.from_dlpack(t)
    assert addr(b) == addr(a)
    b[1, 2] = -7
    assert a[1, 2] == -7
    a[0, 0] = 99
    assert b[0, 0] == 99


def test_arraybridge_to_numpy_shares_the_copy_it_made():
    opencl()
    a = np.arange(10, dtype=np.int64)
    back = ab.to_device(ab.to_device(a, "opencl:0"), "cpu")
    n1, n2 = np.from_dlpack(back), np.from_dlpack(back)
    assert addr(n1) == addr(n2) == back.data_ptr
    n1[3] = 1234
    assert n2[3] == 1234
    assert a[3] == 3


def test_read_only_arrays_stay_read_only():
    a = np.arange(6, dtype=np.uint16)
    a.flags.writeable = False
    t = ab.from_dlpack(a)
    assert t.readonly
    b = np.from_dlpack(t)
    assert not b.flags.writeable
    assert addr(b) == addr(a)
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()  # a legacy consumer cannot be told
    c = ab.from_dlpack(a, copy=True)
    assert not c.readonly and c.data_ptr != addr(a)


# ---- dtypes and layouts -----------------------------------------------------------


CASES = {
    "0-d": lambda: np.array(3.5, dtype=np.float64),
    "zero-size": lambda: np.zeros((3, 0, 2), dtype=np.int32),
    "bool": lambda: np.array([True, False, True, True]),
    "complex64": lambda: (np.arange(6) + 1j * np.arange(6)).astype(np.complex64),
    "complex128": lambda: np.arange(5) * (1 - 2j),
    "float16": lambda: np.linspace(-2, 2, 9).astype(np.float16),
    "int8": lambda: np.arange(-5, 5, dtype=np.int8),
    "uint64": lambda: np.array([0, 2**64 - 1, 12345], dtype=np.uint64),
    "non-contiguous": lambda: np.arange(60, dtype=np.float32).reshape(6, 10)[::2, 1:8:3],
    "negative-stride": lambda: np.arange(20, dtype=np.int16)[::-1],
    "transposed": lambda: np.arange(24, dtype=np.float64).reshape(2, 3, 4).transpose(2, 0, 1),
    "broadcast": lambda: np.broadcast_to(np.arange(4, dtype=np.uint8), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_layout_imports_zero_copy_and_exports_back(name):
    a = CASES[name]()
    t = ab.from_dlpack(a)
    assert t.shape == a.shape
    assert t.dtype == ("bool" if a.dtype == np.bool_ else str(a.dtype))
    b = np.from_dlpack(t)
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(b, a)
    if a.size:
        assert addr(b) == addr(a)
        # element strides, as DLPack counts them
        assert tuple(s // a.itemsize for s in b.strides) == tuple(s // a.itemsize for s in a.strides)


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_through_opencl_is_bit_exact(name):
    opencl()
    a = CASES[name]()
    g = ab.to_device(a, "opencl:0")
    assert g.device == "opencl:0" and g.shape == a.shape
    back = np.from_dlpack(ab.to_device(g, "cpu"))
    assert back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == np.ascontiguousarray(a).tobytes()


def test_nan_payloads_and_signed_zeros_survive_bit_exact():
    opencl(2)
    bits = np.array([0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800000, 0x00000001], dtype=np.uint32)
    a = bits.view(np.float32)
    g = ab.to_device(ab.to_device(a, "opencl:0"), "opencl:1")
    back = np.from_dlpack(ab.to_device(g, "cpu"))
    assert back.view(np.uint32).tolist() == bits.tolist()


def test_gpu_id_and_device_tuples_choose_the_device():
    opencl(2)
    a = np.arange(8.0)
    assert ab.to_device(a, "opencl", gpu_id=1).device == "opencl:1"
    assert ab.to_device(a, "opencl", 0).device == "opencl:0"
    assert ab.from_dlpack(a, device=(KDLOPENCL, 1)).device == "opencl:1"
    t = ab.to_device(a, "opencl:auto")
    assert t.device in ("opencl:0", "opencl:1")


# ---- copies ---------------------------------------------------------------------


def test_copy_modes():
    a = np.arange(16, dtype=np.int32)
    assert ab.from_dlpack(a, copy=False).data_ptr == addr(a)
    c = ab.from_dlpack(a, copy=True)
    assert c.data_ptr != addr(a)
    np.testing.assert_array_equal(np.from_dlpack(c), a)
    opencl()
    with pytest.raises(BufferError, match="copy is needed"):
        ab.from_dlpack(a, device="opencl:0", copy=False)
    t = ab.from_dlpack(a)
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(KDLOPENCL, 0), copy=False)
    # a dl_device it cannot export to: BufferError, as the array API asks
    # (a device id past the last, a type with no devices or none built in,
    # a type DLPack does not define; CUDA: none here, or a GPU past the last)
    for dev in ((KDLOPENCL, 7), (KDLCPU, 1), (2, n_devices("cuda")), (7, 0), (99, 0)):
        with pytest.raises(BufferError, match="cannot export to dl_device"):
            t.__dlpack__(max_version=(1, 0), dl_device=dev)
    # dl_device elsewhere makes a copy there, owned by the capsule
    cap = t.__dlpack__(max_version=(1, 0), dl_device=(KDLOPENCL, 0))
    assert capsule_name(cap) == "dltensor_versioned"
    g = ab.from_dlpack(SameCapsule(cap, (KDLOPENCL, 0)))
    assert g.device == "opencl:0"
    np.testing.assert_array_equal(np.from_dlpack(ab.to_device(g, "cpu")), a)
    # copy=True on the same device
    n = np.from_dlpack(SameCapsule(t.__dlpack__(max_version=(1, 0), copy=True), (KDLCPU, 0)))
    assert addr(n) != addr(a)
    np.testing.assert_array_equal(n, a)


def test_dtype_changes_convert_and_impossible_ones_are_refused():
    a = np.array([0, 1, 2, 255], dtype=np.uint8)
    f = np.from_dlpack(ab.to_device(a, "cpu", dtype="float32"))
    assert f.dtype == np.float32 and f.tolist() == [0, 1, 2, 255]
    h = np.from_dlpack(ab.to_device(np.array([1.5, 2.5, -0.5, 300.0]), "cpu", dtype="uint8"))
    assert h.tolist() == [2, 2, 0, 255]  # half to even, saturated
    with pytest.raises(BufferError, match="float64 to complex64"):
        ab.to_device(np.arange(3.0), "cpu", dtype="complex64")
    assert ab.to_device(np.arange(3, dtype=np.uint8), "cpu", dtype=np.dtype("uint8")).dtype == "uint8"
    with pytest.raises(ValueError, match="unknown dtype"):
        ab.to_device(np.arange(3), "cpu", dtype="float24")


def test_casts_into_floats_round_once_like_numpy():
    # NumPy's astype rounds once from the source value; so must we, on every
    # route (the C suite holds the devices to the host's bits).
    big = [2**60 + 2**36 + 1, 2**54 + 2**46 + 1, 2**53 + 1, 2**63 - 1, 16777217, 65520, 0, 1]
    sources = [
        np.array(big + [-v for v in big[:4]] + [-(2**63)], dtype=np.int64),
        np.array(big + [2**64 - 1, 2**63 + 2**39 + 1], dtype=np.uint64),
        np.array([2**31 - 1, -(2**31), 16777217, -16777219, 65519, 65520, 2049], dtype=np.int32),
        np.array([1 + 2**-24, 1 + 2**-11, 65519.99, 65520.0, 2**-25, 2**-24 * 1.5, 1e-310, 3.5e38, -0.0,
                  np.inf, 1 + 2**-24 + 2**-52, 5.960464477539063e-08], dtype=np.float64),
    ]
    for src in sources:
        for dt in ("float32", "float16", "float64"):
            got = np.from_dlpack(ab.to_device(src, "cpu", dtype=dt))
            with np.errstate(over="ignore"):  # past float16's or float32's range: infinity, as ours
                want = src.astype(dt)
            assert got.dtype == want.dtype
            bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.itemsize]
            np.testing.assert_array_equal(got.view(bits), want.view(bits), err_msg=f"{src.dtype} -> {dt}")


def test_an_image_is_normalised_and_reordered_in_the_move_like_numpy():
    rng = np.random.default_rng(11)
    img = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)  # HWC
    mean = np.array([0.485, 0.456, 0.406]) * 255
    std = np.array([0.229, 0.224, 0.225]) * 255
    # NumPy in float32: a multiply, then an add, per channel, then HWC -> CHW
    want = (img.astype(np.float32) * (1 / std).astype(np.float32) + (-mean / std).astype(np.float32)).transpose(2, 0, 1)
    devices = ["cpu"] + [d for d in ab.devices() if d.startswith("opencl")][:1]
    for dev in devices:
        t = ab.to_device(img, dev, dtype="float32", permute=(2, 0, 1), channel_axis=-1, channel_scale=1 / std,
                              channel_offset=list(-mean / std))
        assert t.shape == (3, 5, 7) and t.dtype == "float32" and t.device.startswith(dev)
        got = np.from_dlpack(ab.to_device(t, "cpu"))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=dev)
    # and back: per tensor, into uint8 (float64 arithmetic, half to even, saturated)
    back = np.from_dlpack(ab.to_device(want, "cpu", dtype="uint8", permute=(1, 2, 0), scale=58.0, offset=114.5))
    ref = np.clip(np.rint(want.transpose(1, 2, 0).astype(np.float64) * 58.0 + 114.5), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(back, ref)
    assert "convert" in ab.explain_route(img, "cpu", dtype="float32", permute=(2, 0, 1), scale=2.0)


def test_dtype_keywords_take_every_frameworks_dtype_objects_alike():
    """to_device, empty and convert_memory read a dtype the same way: a name
    or any framework's dtype object (to_device used str(), which made
    np.float32 "<class 'numpy.float32'>"). NumPy dtypes of the other byte
    order are refused: results are in the machine's order, and
    convert_memory used to take np.dtype('>f2') as float16."""
    a = np.arange(6, dtype=np.int32)
    kinds = ["float16", np.float16, np.dtype("float16"), np.dtype("f2")]
    try:
        import torch
        kinds.append(torch.float16)
    except ImportError:
        pass
    for d in kinds:
        assert ab.to_device(a, "cpu", dtype=d).dtype == "float16", d
        assert ab.empty((2,), d, "cpu").dtype == "float16", d
        assert ab.convert_memory(a, "numpy", "numpy", dtype=d).dtype == np.float16, d
    other = np.dtype("float16").newbyteorder()
    with pytest.raises(ValueError, match="other byte order"):
        ab.to_device(a, "cpu", dtype=other)
    with pytest.raises(ValueError, match="other byte order"):
        ab.empty((2,), other, "cpu")
    with pytest.raises(ab.MemoryConversionError, match="other byte order") as e:
        ab.convert_memory(a, "numpy", "numpy", dtype=other)
    assert isinstance(e.value.__cause__, ValueError)
    with pytest.raises(ValueError, match="unknown dtype"):
        ab.to_device(a, "cpu", dtype=3)
    # a tuple is one argument, not an argument list (it was unpacked into
    # dtype_arg: (2, 32, 1) a TypeError, ("float64",) taken as float64)
    for d in ((2, 32, 1), ("float64",)):
        with pytest.raises(ValueError, match="unknown dtype"):
            ab.to_device(a, "cpu", dtype=d)
        with pytest.raises(ValueError, match="unknown dtype"):
            ab.empty((2,), d, "cpu")


def test_dtype_strings_take_numpys_spellings_too():
    """np.dtype('f4') works, so dtype='f4' must: a string the core does not
    know is read as NumPy reads it. What NumPy reads as a dtype the core
    has not ('g', 'S3', a record) keeps the core's refusal and its list."""
    a = np.arange(6, dtype=np.int32)
    for spelling, want in (("f4", "float32"), ("<i2", "int16"), ("=u1", "uint8"), ("|u1", "uint8"), ("half", "float16"),
                           ("double", "float64"), ("?", "bool"), ("e", "float16"), ("B", "uint8"), ("int64", "int64")):
        t = ab.to_device(a, "cpu", dtype=spelling)
        assert t.dtype == want, spelling
        np.testing.assert_array_equal(np.from_dlpack(t), a.astype(want))
        assert ab.empty((2,), spelling, "cpu").dtype == want, spelling
        assert ab.convert_memory(a, "numpy", "numpy", dtype=spelling).dtype == np.dtype(want), spelling
    other = ">f4" if np.little_endian else "<f4"
    with pytest.raises(ValueError, match="other byte order"):
        ab.to_device(a, "cpu", dtype=other)
    for name in ("g", "S3", "i4,i4", "float24", "f3"):
        with pytest.raises(ValueError, match="unknown dtype .*bfloat16") as e:
            ab.empty((2,), name, "cpu")
        assert '"%s"' % name in str(e.value), str(e.value)  # the name given, not NumPy's for it


def test_float8_formats_are_named_as_the_frameworks_name_them():
    """DLPack's float8/6/4 formats by their names (torch.float8_e4m3fn,
    ml_dtypes' float8_e5m2, "float8_e4m3fn", or the Tensor's own dtype
    string): an empty tensor of one, a move that keeps it; a cast to or
    from one is refused as unsupported (there is no such cast)."""
    e = ab.empty((2, 3), "float8_e4m3fn")
    assert e.dldtype == (10, 8, 1) and e.dtype == "float8_e4m3fn(bits 8)"
    assert ab.to_device(e, "cpu", dtype=e.dtype).dldtype == (10, 8, 1)  # the Tensor's name reads back
    assert ab.empty((4,), "float8_e5m2").dldtype == (12, 8, 1)
    kinds = ["float8_e4m3fn"]
    for mod, attr in (("torch", "float8_e4m3fn"), ("ml_dtypes", "float8_e4m3fn")):
        try:
            kinds.append(getattr(__import__(mod), attr))
        except (ImportError, AttributeError):
            pass
    for d in kinds:
        assert ab.to_device(e, "cpu", dtype=d).dldtype == (10, 8, 1), d
        with pytest.raises(BufferError, match="cannot convert float32 to float8_e4m3fn"):
            ab.to_device(np.zeros(3, np.float32), "cpu", dtype=d)
    with pytest.raises(ValueError, match="unknown dtype"):
        ab.empty((2,), "float8_e4m3fn(bits 16)")
    # Other bits of the sized codes too, as the Tensor writes them: a
    # complex32 (torch's chalf) tensor's own dtype reads back; moved as it
    # is, never cast
    c = ab.empty((2,), "complex32")
    assert c.dldtype == (5, 32, 1) and c.dtype == "complex32"
    assert ab.to_device(c, "cpu", dtype=c.dtype).dldtype == (5, 32, 1)
    with pytest.raises(BufferError, match="complex32"):
        ab.to_device(np.zeros(3, np.complex64), "cpu", dtype="complex32")
    for bare in ("float8", "float4"):  # a format meant: its name is asked for
        with pytest.raises(ValueError, match="float8_e4m3fn"):
            ab.empty((2,), bare)


def test_bad_conversion_options_are_clear_errors():
    a = np.zeros((2, 3, 4), dtype=np.uint8)
    with pytest.raises(ValueError, match="permute has 2 axes; the tensor has 3"):
        ab.to_device(a, "cpu", permute=(1, 0))
    with pytest.raises(ValueError, match="permute axis 3 is out of range"):
        ab.to_device(a, "cpu", permute=(0, 1, 3))
    with pytest.raises(ValueError, match="permute"):
        ab.to_device(a, "cpu", permute=(0, 0, 1))  # repeated: the library's check
    with pytest.raises(ValueError, match="channel_scale has 2 values; the channel axis has 4"):
        ab.to_device(a, "cpu", channel_axis=2, channel_scale=[1.0, 2.0])
    with pytest.raises(ValueError, match="need channel_axis"):
        ab.to_device(a, "cpu", channel_offset=[0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="not both"):
        ab.to_device(a, "cpu", scale=2.0, channel_axis=0, channel_scale=[1.0, 1.0])
    with pytest.raises(TypeError):
        ab.to_device(a, "cpu", scale="two")
    with pytest.raises(TypeError):
        ab.to_device(a, "cpu", channel_axis=0, channel_scale=[1.0, "x"])
    with pytest.raises(ValueError, match="out of range"):
        ab.to_device(a, "cpu", permute=(0, 1, 10**30))
    with pytest.raises(TypeError, match="permute must be a sequence"):
        ab.to_device(a, "cpu", permute=3)

    class Shrinks:  # converting an item empties the list the caller gave
        def __float__(self):
            values.clear()
            return 1.0

    values = [Shrinks(), 1.0, 2.0, 3.0]
    t = ab.to_device(a, "cpu", dtype="float32", channel_axis=2, channel_scale=values)
    assert t.shape == (2, 3, 4) and values == []
    # a permutation alone is a conversion: a compact copy in the new order
    t = ab.to_device(a, "cpu", permute=(2, 0, 1))
    assert t.shape == (4, 2, 3) and t.strides == (6, 3, 1)


# ---- the protocol -----------------------------------------------------------------


def test_legacy_producers_and_consumers():
    a = np.arange(9, dtype=np.float64).reshape(3, 3)
    t = ab.from_dlpack(LegacyProducer(a))
    assert t.data_ptr == addr(a)
    # copy=False: asked with max_version and copy, then without copy, then
    # the legacy way, each after the producer's TypeError
    assert ab.from_dlpack(LegacyProducer(a), copy=False).data_ptr == addr(a)
    asked = []

    class Refuses:  # a TypeError of its own, whatever it is asked
        device = (KDLCPU, 0)

        def __dlpack_device__(self):
            return self.device

        def __dlpack__(self, **kwargs):
            asked.append(sorted(kwargs))
            raise TypeError("refused %d" % len(asked))

    with pytest.raises(TypeError, match="refused 3"):
        ab.from_dlpack(Refuses(), copy=False)
    assert asked == [["copy", "max_version"], ["max_version"], []]
    asked.clear()
    with pytest.raises(TypeError, match="refused 2"):
        ab.from_dlpack(Refuses())
    assert asked == [["max_version"], []]
    # a CUDA producer is asked for the legacy default stream every time
    # (refused before anything needs a GPU)
    asked.clear()
    cuda = Refuses()
    cuda.device = (2, 0)
    with pytest.raises(TypeError, match="refused 3"):
        ab.from_dlpack(cuda, copy=False)
    assert asked == [["copy", "max_version", "stream"], ["max_version", "stream"], ["stream"]]
    cap = t.__dlpack__()
    assert capsule_name(cap) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    b = np.from_dlpack(LegacyCapsule(t))
    assert addr(b) == addr(a)
    np.testing.assert_array_equal(b, a)
    assert t.__dlpack_device__() == (KDLCPU, 0)


def test_arguments_are_read_by_position_and_by_name_as_python_reads_them():
    a = np.arange(6, dtype=np.float32)
    # to_device and explain_route: x, target, gpu_id by position or name, the rest by name
    for f in (ab.to_device, ab.explain_route):
        name = f.__name__
        with pytest.raises(TypeError, match=r"%s\(\) missing required argument 'target' \(pos 2\)" % name):
            f(a)
        with pytest.raises(TypeError, match=r"%s\(\) missing required argument 'x' \(pos 1\)" % name):
            f(target="cpu")
        with pytest.raises(TypeError, match=r"%s\(\) takes at most 3 positional arguments \(4 given\)" % name):
            f(a, "cpu", None, True)
        with pytest.raises(TypeError, match=r"argument for %s\(\) given by name \('target'\) and position \(2\)"
                           % name):
            f(a, "cpu", target="cpu")
        with pytest.raises(TypeError, match="'layouts' is an invalid keyword argument for %s" % name):
            f(a, "cpu", layouts="any")
    # every name, also from a ** dict (strings made at run time, not the interned ones)
    keys = {"".join(k): v for k, v in ((("x",), a), (("tar", "get"), "cpu"), (("gpu", "_id"), 0),
                                         (("dt", "ype"), "float64"), (("co", "py"), True), (("perm", "ute"), (0,)),
                                         (("sca", "le"), 2.0), (("off", "set"), 1.0), (("lay", "out"), "compact"))}
    t = ab.to_device(**keys)
    assert t.dtype == "float64" and t.data_ptr != addr(a)
    np.testing.assert_array_equal(np.from_dlpack(t), a * 2.0 + 1.0)
    assert "->" in ab.explain_route(**keys)
    t = ab.to_device(a, "cpu", channel_axis=0, channel_scale=[2.0] * 6, channel_offset=[1.0] * 6, dtype="float64")
    np.testing.assert_array_equal(np.from_dlpack(t), a * 2.0 + 1.0)
    # Tensor.__dlpack__: keywords only
    t = ab.to_device(a, "cpu")
    with pytest.raises(TypeError, match=r"__dlpack__\(\) takes no positional arguments"):
        t.__dlpack__(None)
    with pytest.raises(TypeError, match="'streams' is an invalid keyword argument for __dlpack__"):
        t.__dlpack__(streams=None)
    kw = {"max" + "_version": (1, 0), "co" + "py": None, "str" + "eam": None, "dl" + "_device": (KDLCPU, 0)}
    assert capsule_name(t.__dlpack__(**kw)) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(**{"max" + "_version": (0, 8)})) == "dltensor"
    with pytest.raises(TypeError, match="max_version must be None or a"):
        t.__dlpack__(**{"max" + "_version": "1.0"})
    with pytest.raises(ValueError, match="stream must be None for data in host memory"):
        t.__dlpack__(**{"str" + "eam": 5})
    with pytest.raises(BufferError, match="a copy is needed: the target is another device"):
        ab.to_device(a[::2], "cpu", layout="compact").__dlpack__(**{"co" + "py": False, "dl" + "_device": (4, 0)})


def test_arguments_outlive_python_code_run_by_the_call():
    """functools.partial hands its stored arguments to a METH_FASTCALL
    function without references of its own: a producer's __dlpack_device__
    that resets the partial must not free x under the call (it spun or
    crashed), nor an __index__ that drops __dlpack__'s max_version. In a
    process of its own, so that a regression fails here, not the suite."""
    code = """
import functools, gc
import numpy as np
import arraybridge as ab
src = ab.to_device(np.arange(3, dtype=np.float32), "cpu")
freed = []
class Resets:
    def __del__(self):
        freed.append(True)
    def __dlpack_device__(self):
        convert.__setstate__((ab.to_device, ("other",), None, None))
        gc.collect()
        assert not freed  # still held by the call
        return (1, 0)
    def __dlpack__(self, **kwargs):
        return src.__dlpack__(**kwargs)
convert = functools.partial(ab.to_device, Resets())
assert np.from_dlpack(convert("cpu")).tolist() == [0, 1, 2]
gc.collect()
assert freed == [True]
t = ab.to_device(np.arange(3, dtype=np.float32), "cpu")
class Major:
    def __index__(self):
        export.__setstate__((t.__dlpack__, (), {}, None))
        gc.collect()
        return 1
export = functools.partial(t.__dlpack__, max_version=(Major(), 0))
assert np.from_dlpack(t).tolist() == [0, 1, 2] and export() is not None
print("ok")
"""
    import subprocess
    import sys

    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a call whose argument was freed under it did not return")
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stdout, p.stderr[-2000:])


def capsule_data(cap):
    """The data pointer of an unconsumed versioned capsule's tensor."""
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    p = get(cap, b"dltensor_versioned")
    P = ctypes.sizeof(ctypes.c_void_p)
    return ctypes.c_void_p.from_address(p + 8 + 2 * P + 8).value  # version, ctx, deleter, flags


class Recorder:
    """A producer that notes what __dlpack__ was asked and answers with
    make(**kwargs); without `knows_copy`, it refuses the 2023.12 keywords
    as DLPack 1.0 producers did."""

    def __init__(self, make, knows_copy=True):
        self.make, self.knows_copy, self.asked = make, knows_copy, []

    def __dlpack_device__(self):
        return (KDLCPU, 0)

    def __dlpack__(self, **kwargs):
        self.asked.append(dict(kwargs))
        if not self.knows_copy and ("copy" in kwargs or "dl_device" in kwargs):
            raise TypeError("__dlpack__() got an unexpected keyword argument 'copy'")
        return self.make(**kwargs)


def test_copy_false_is_asked_of_the_producer_and_a_copy_it_exports_is_refused():
    a = np.arange(6, dtype=np.float32)
    p = Recorder(lambda **kw: a.__dlpack__(**kw))
    t = ab.from_dlpack(p, copy=False)
    assert p.asked[-1].get("copy") is False and t.data_ptr == addr(a)
    # ... also with the producer's own device named as the target
    assert ab.from_dlpack(p, device="cpu", copy=False).data_ptr == addr(a)
    assert p.asked[-1].get("copy") is False
    assert ab.to_device(p, "cpu", copy=False).data_ptr == addr(a)
    assert p.asked[-1].get("copy") is False
    ab.from_dlpack(p)
    assert "copy" not in p.asked[-1]  # None: the producer decides, as before
    # a producer that does not know the keyword is asked again without it
    old = Recorder(lambda **kw: a.__dlpack__(**kw), knows_copy=False)
    assert ab.from_dlpack(old, copy=False).data_ptr == addr(a)
    assert "copy" not in old.asked[-1] and "max_version" in old.asked[-1]
    # a producer that cannot export without copying refuses, and that stands
    def refuse(**kw):
        raise BufferError("cannot export without a copy")
    with pytest.raises(BufferError, match="without a copy"):
        ab.from_dlpack(Recorder(refuse), copy=False)
    # one that copies anyway (IS_COPIED) is refused: copy=False never copies
    src = ab.to_device(a, "cpu", copy=True)
    copier = Recorder(lambda **kw: src.__dlpack__(max_version=(1, 0), copy=True))
    with pytest.raises(BufferError, match="exported a copy"):
        ab.from_dlpack(copier, copy=False)
    # ... and with a dtype or map that leaves the import as the result
    for kw in (dict(dtype="float32"), dict(dtype=np.float32), dict(permute=(0,))):
        assert ab.to_device(p, "cpu", copy=False, **kw).data_ptr == addr(a), kw
        assert p.asked[-1].get("copy") is False, kw
    # a capsule another thread's call is reading in place is named so
    import ctypes
    setname = ctypes.pythonapi.PyCapsule_SetName
    setname.argtypes = [ctypes.py_object, ctypes.c_char_p]
    busy = b"dltensor_versioned (being read by arraybridge)"
    cap = a.__dlpack__(max_version=(1, 0))
    setname(cap, busy)
    with pytest.raises(BufferError, match="being read by an arraybridge call in progress"):
        ab.from_dlpack(cap)
    setname(cap, b"dltensor_versioned")
    assert ab.from_dlpack(cap).data_ptr == addr(a)
    # copy=True is not passed on (a legacy capsule could not say it copied)
    ab.from_dlpack(p, copy=True)
    assert "copy" not in p.asked[-1]


def test_copy_true_takes_a_copy_the_producer_made_without_copying_again():
    a = np.arange(6, dtype=np.float32)
    src = ab.to_device(a, "cpu", copy=True)
    cap = src.__dlpack__(max_version=(1, 0), copy=True)  # IS_COPIED: the consumer's own
    data = capsule_data(cap)
    assert data != src.data_ptr
    t = ab.from_dlpack(cap, copy=True)
    assert t.data_ptr == data and not t.readonly
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    # a view's capsule is no such copy: copy=True copies it
    cap = src.__dlpack__(max_version=(1, 0))
    assert ab.from_dlpack(cap, copy=True).data_ptr != src.data_ptr


def test_a_capsule_the_core_refuses_is_left_for_the_caller():
    """A capsule handed to to_device/from_dlpack is planned before it is
    taken: a refusal leaves it unconsumed, as the caller's to use again
    (it was renamed and its tensor deleted before)."""
    a = np.arange(6, dtype=np.float32)
    for cap in (a.__dlpack__(max_version=(1, 0)), a.__dlpack__()):
        name = capsule_name(cap)
        with pytest.raises(BufferError, match="copy is needed"):
            ab.to_device(cap, "cpu", dtype="float64", copy=False)
        with pytest.raises(ValueError, match="permute has 2 axes"):
            ab.to_device(cap, "cpu", permute=(1, 0))
        with pytest.raises(ValueError):
            ab.to_device(cap, "cpu", dtype="float64", channel_axis=0, channel_scale=[1.0])
        assert capsule_name(cap) == name
        t = ab.to_device(cap, "cpu", dtype="float64")
        assert capsule_name(cap) == "used_" + name
        np.testing.assert_array_equal(np.from_dlpack(t), a)
    # explaining a move is no move: the capsule stays the caller's
    for cap in (a.__dlpack__(max_version=(1, 0)), a.__dlpack__()):
        name = capsule_name(cap)
        assert "view" in ab.explain_route(cap, "cpu")
        assert "host" in ab.explain_route(cap, "cpu", dtype="float64")
        with pytest.raises(ValueError, match="permute has 2 axes"):
            ab.explain_route(cap, "cpu", permute=(1, 0))
        assert capsule_name(cap) == name
        assert ab.from_dlpack(cap).data_ptr == addr(a)
    # the same for one of the module's own capsules
    src = ab.to_device(a, "cpu")
    cap = src.__dlpack__(max_version=(1, 0))
    with pytest.raises(BufferError, match="copy is needed"):
        ab.to_device(cap, "cpu", dtype="int32", copy=False)
    assert capsule_name(cap) == "dltensor_versioned"
    assert ab.from_dlpack(cap).data_ptr == src.data_ptr


def test_convert_into_takes_a_capsule_only_once_it_has_converted():
    """convert_into reads a capsule (x or out) in place: a refusal leaves
    it unconsumed, a conversion takes it (it took both before, refused or
    not)."""
    a = np.arange(6, dtype=np.float32)
    out = np.zeros((2, 3), np.float32)
    for cap in (a.__dlpack__(max_version=(1, 0)), a.__dlpack__()):
        name = capsule_name(cap)
        with pytest.raises(ValueError, match="shape"):
            ab.convert_into(cap, out)
        with pytest.raises(ValueError, match="permute has 2 axes"):
            ab.convert_into(cap, out.reshape(6), permute=(1, 0))
        assert capsule_name(cap) == name
        ab.convert_into(cap, out.reshape(6), scale=2.0)
        assert capsule_name(cap) == "used_" + name
        np.testing.assert_array_equal(out.reshape(6), a * 2)
    # out as a capsule: written through, taken only when written
    o = np.zeros(6, np.float32)
    cap = o.__dlpack__(max_version=(1, 0))
    with pytest.raises(ValueError, match="shape"):
        ab.convert_into(np.zeros(5, np.float32), cap)
    with pytest.raises(IndexError):
        ab.convert_into(a[:1].reshape(()), cap, index=6)
    assert capsule_name(cap) == "dltensor_versioned"
    ab.convert_into(a + 1, cap)
    assert capsule_name(cap) == "used_dltensor_versioned"
    np.testing.assert_array_equal(o, a + 1)
    # a read-only out, or one capsule as both, is refused and left as it was
    ro = np.zeros(6, np.float32)
    ro.flags.writeable = False
    cap = ro.__dlpack__(max_version=(1, 0))
    with pytest.raises(ValueError, match="read-only"):
        ab.convert_into(a, cap)
    with pytest.raises(BufferError, match="same DLPack capsule"):
        ab.convert_into(cap, cap)
    assert capsule_name(cap) == "dltensor_versioned"
    assert ab.from_dlpack(cap).readonly
    # a capsule already taken is still refused as such
    with pytest.raises(BufferError, match="not an unconsumed"):
        ab.convert_into(cap, o)
    # the tensor is deleted once, when taken: NumPy's holds a reference to
    # its array until then
    src = np.arange(6, dtype=np.float32)
    base = sys.getrefcount(src)
    cap = src.__dlpack__(max_version=(1, 0))
    assert sys.getrefcount(src) == base + 1
    with pytest.raises(ValueError):
        ab.convert_into(cap, np.zeros(5, np.float32))
    assert sys.getrefcount(src) == base + 1
    ab.convert_into(cap, np.zeros(6, np.float32))
    assert sys.getrefcount(src) == base
    del cap
    assert sys.getrefcount(src) == base


def test_convert_into_reads_a_capsule_only_after_the_imports_that_run_python():
    """out's import runs Python (its __dlpack__), which may take x's
    capsule and delete its tensor: x is read in place only after it, and
    then found taken (this read freed memory, and crashed)."""
    src = np.ones(1 << 16, np.float32)
    cap = src.__dlpack__(max_version=(1, 0))
    del src
    out = np.zeros(1 << 16, np.float32)

    class TakesX:
        def __dlpack_device__(self):
            return out.__dlpack_device__()

        def __dlpack__(self, **kw):
            taken = ab.from_dlpack(cap)  # takes x's capsule
            del taken  # ... and deletes its tensor
            return out.__dlpack__(**kw)

    with pytest.raises(BufferError, match="not an unconsumed"):
        ab.convert_into(cap, TakesX())
    assert not out.any()


def test_a_consumed_capsule_cannot_be_consumed_twice():
    a = np.arange(5)
    cap = a.__dlpack__(max_version=(1, 0))
    holder = SameCapsule(cap, (KDLCPU, 0))
    t = ab.from_dlpack(holder)
    assert capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(BufferError, match="already consumed"):
        ab.from_dlpack(holder)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    legacy = a.__dlpack__()
    ab.from_dlpack(SameCapsule(legacy, (KDLCPU, 0)))
    assert capsule_name(legacy) == "used_dltensor"
    with pytest.raises(BufferError):
        ab.from_dlpack(SameCapsule(legacy, (KDLCPU, 0)))


def repeated(step, t, times):
    """t after `times` rounds of t = step(t), and the bytes tracemalloc saw
    the rounds keep."""
    import tracemalloc
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(times):
            t = step(t)
        return t, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_views_of_views_hold_the_tensor_with_the_memory_not_a_chain():
    """`t = ab.to_device(t, "cpu")` (or from_dlpack) in a loop made each
    Tensor a view holding the one before: memory grew with every call and a
    million of them overflowed the C stack when the last was freed. Views
    now hold the Tensor whose memory it is."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    root = ab.from_dlpack(a.T)  # strided: the views copy shape and strides
    t = ab.from_dlpack(root)
    first = weakref.ref(t)
    t, grown = repeated(lambda t: ab.to_device(ab.from_dlpack(t), "cpu"), t, 20000)
    assert grown < 20000, grown  # 40000 levels of a chain would be 5 MB
    gc.collect()
    assert first() is None  # nothing holds the earlier views
    # a consumer's view outlives the Tensor it was made of, shape and strides too
    b = np.from_dlpack(ab.from_dlpack(t))
    del t
    gc.collect()
    assert b.shape == (4, 3) and b.strides == a.T.strides and np.array_equal(b, a.T)
    legacy = np.from_dlpack(SameCapsule(ab.from_dlpack(root).__dlpack__(), (KDLCPU, 0)))
    gc.collect()
    assert legacy.strides == a.T.strides and np.array_equal(legacy, a.T)


def test_our_own_capsules_reimported_do_not_chain():
    """`t = ab.from_dlpack(t.__dlpack__(...))` in a loop: a Tensor imported
    from one of the module's own capsules is the view of the Tensor with
    the memory, as one imported from the Tensor itself (150000 levels of a
    chain crashed the C stack when the last was freed)."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    root = ab.from_dlpack(a.T)  # strided: shape and strides are copied
    for export in (lambda t: t.__dlpack__(max_version=(1, 0)), lambda t: t.__dlpack__()):
        for imp in (ab.from_dlpack, lambda c: ab.to_device(c, "cpu")):
            t = ab.from_dlpack(root)
            first = weakref.ref(t)
            t, grown = repeated(lambda t: imp(export(t)), t, 20000)
            assert grown < 20000, grown  # a chain: 300 bytes a level, 6 MB
            gc.collect()
            assert first() is None
            assert t.strides == root.strides and np.array_equal(np.from_dlpack(t), a.T)
            b = np.from_dlpack(t)  # and the memory lives as long as its last view
            del t
            gc.collect()
            assert np.array_equal(b, a.T)
    # a copy exported for a consumer is still a copy when taken back
    c = ab.from_dlpack(ab.from_dlpack(root).__dlpack__(max_version=(1, 0), copy=True))
    assert c.data_ptr != root.data_ptr and np.array_equal(np.from_dlpack(c), a.T)


def test_a_capsule_of_ours_a_consumer_deleted_without_renaming_is_refused():
    """torch.from_dlpack of an OpenCL tensor's capsule fails, deletes the
    tensor and leaves the capsule's name: taking it again must not read the
    freed wrapper (it read garbage: 'tensor device type 751355348')."""
    opencl()
    torch = pytest.importorskip("torch")
    t = ab.to_device(np.arange(6, dtype=np.float32), "opencl:0")
    before = sys.getrefcount(t)
    for cap in (t.__dlpack__(), t.__dlpack__(max_version=(1, 0))):
        with pytest.raises(Exception):
            torch.from_dlpack(cap)
        with pytest.raises(BufferError, match="already consumed"):
            ab.from_dlpack(cap)
        del cap
    gc.collect()
    assert sys.getrefcount(t) == before  # every view's reference dropped once


def test_each_deleter_runs_exactly_once():
    a = np.arange(7, dtype=np.float32)
    t = ab.from_dlpack(a)
    alive = weakref.ref(t)
    # an exported view keeps the Tensor alive until its consumer lets go
    b = np.from_dlpack(t)
    del t
    gc.collect()
    assert alive() is not None
    del b
    gc.collect()
    assert alive() is None
    # an unconsumed capsule's destructor runs the deleter
    t = ab.from_dlpack(a)
    alive = weakref.ref(t)
    caps = [t.__dlpack__(max_version=(1, 0)), t.__dlpack__()]
    del t
    gc.collect()
    assert alive() is not None
    del caps
    gc.collect()
    assert alive() is None
    # NumPy's own producer reference is dropped once ours is gone
    base = np.arange(3)
    before = sys.getrefcount(base)
    t = ab.from_dlpack(base)
    assert sys.getrefcount(base) > before
    del t
    gc.collect()
    assert sys.getrefcount(base) == before


def test_reference_counts_return_to_their_start_after_many_round_trips():
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    base = sys.getrefcount(a)
    for _ in range(2000):
        t = ab.from_dlpack(a)
        b = np.from_dlpack(t)
        c = ab.from_dlpack(b.T, copy=True)
        np.from_dlpack(c)
        del t, b, c
    gc.collect()
    assert sys.getrefcount(a) == base
    assert ab.memory_stats("cpu")["in_use_bytes"]["current"] == 0


def test_stream_must_be_none_for_host_memory():
    t = ab.from_dlpack(np.arange(3))
    with pytest.raises(ValueError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=3)


def test_stream_of_a_device_tensor_takes_no_number_below_minus_one():
    opencl(1)
    t = ab.to_device(np.arange(3), "opencl:0")
    for bad in (-2, -(1 << 40)):
        with pytest.raises(ValueError, match="stream must be -1"):
            t.__dlpack__(stream=bad)
    assert t.__dlpack__(stream=-1) is not None and t.__dlpack__(stream=None) is not None


def test_non_producers_are_type_errors():
    with pytest.raises(TypeError, match="DLPack"):
        ab.from_dlpack([1, 2, 3])

    class Bad:
        def __dlpack__(self, **kw):
            return "not a capsule"

    with pytest.raises(TypeError, match="not a capsule"):
        ab.from_dlpack(Bad())


# ---- devices and pools ----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "gpu", "cuda:", "cuda:-1", "opencl:x", "cpu:0:0", " cpu"])
def test_malformed_device_strings_raise_value_error(bad):
    with pytest.raises(ValueError, match="device string"):
        ab.to_device(np.arange(3), bad)


def test_gpu_id_must_be_an_int_in_range():
    for bad in (True, False):
        with pytest.raises(TypeError, match="not bool"):
            ab.to_device(np.arange(3), "cpu", gpu_id=bad)
        # the other integer arguments refuse a bool alike (True was index 1)
        out = ab.empty((2, 3), "float32", "cpu")
        with pytest.raises(TypeError, match="index must be an int or None, not bool"):
            ab.convert_into(np.ones(3, np.float32), out, index=bad)
        with pytest.raises(TypeError, match="bytes must be an int, not bool"):
            ab.set_memory_limit("cpu", bad)
    for bad in (-2, 1 << 31, 1 << 80, -(1 << 80)):
        with pytest.raises(ValueError, match="out of range"):
            ab.to_device(np.arange(3), "cpu", gpu_id=bad)
    with pytest.raises(TypeError):
        ab.to_device(np.arange(3), "cpu", gpu_id="0")
    assert ab.to_device(np.arange(3), "cpu", gpu_id=np.int64(0)).device == "cpu:0"


def test_an_unknown_dtype_name_cut_inside_a_character_is_still_a_value_error():
    # The library's message cut the name at 40 bytes, inside the 'é':
    # Python's strict decoding raised UnicodeDecodeError instead.
    for name in ("x" * 39 + "\u00e9", "\u00e9" * 30, "int8\n\x1b[31m"):
        with pytest.raises(ValueError, match="unknown dtype"):
            ab.empty((2,), name, "cpu")
        with pytest.raises(ValueError, match="unknown dtype"):
            ab.to_device(np.arange(3), "cpu", dtype=name)
    with pytest.raises(ValueError, match=r"gpu_id 2147483648 is out of range \(0 to 2147483647, or -1"):
        ab.to_device(np.arange(3), "cpu", gpu_id=2**31)


def test_text_with_a_nul_character_is_refused_not_cut_short():
    # The C parsers would stop at the NUL: "cpu\0:7" read as "cpu".
    for bad in ("cpu\0:7", "opencl:1\0garbage", "opencl\0:1"):
        with pytest.raises(ValueError, match="NUL"):
            ab.to_device(np.arange(3), bad)
        with pytest.raises(ValueError, match="NUL"):
            ab.from_dlpack(np.arange(3), device=bad)
    with pytest.raises(ValueError, match="NUL"):
        ab.to_device(np.arange(3), "cpu", dtype="float32\0x")
    with pytest.raises(ValueError, match="NUL"):
        ab.to_device(np.arange(3), "cpu", layout="any\0")


def test_missing_devices_raise_value_error_naming_them():
    with pytest.raises(ValueError, match="opencl:99"):
        ab.to_device(np.arange(3), "opencl:99")
    with pytest.raises(ValueError, match="cpu:3"):
        ab.device_info("cpu:3")
    if not any(d.startswith("cuda:") for d in ab.devices()):
        with pytest.raises(ValueError, match="no cuda devices"):
            ab.to_device(np.arange(3), "cuda", gpu_id=0)
    with pytest.raises(TypeError):
        ab.device_info(3.5)


def test_devices_device_info_and_best_device():
    devs = ab.devices()
    assert devs[0] == "cpu:0"
    info = ab.device_info("cpu")
    assert info["device"] == "cpu:0" and info["host_accessible"] and info["total_memory"] > 0
    for d in devs:
        assert ab.device_info(d)["device"] == d
    assert ab.best_device() in devs


def test_memory_stats_limits_and_empty_cache():
    opencl()
    ab.empty_cache()
    ab.set_memory_limit("opencl:0", 1 << 20)
    try:
        with pytest.raises(MemoryError, match="opencl:0"):
            ab.to_device(np.zeros(1 << 19), "opencl:0")  # 4 MiB
        small = ab.to_device(np.zeros(1000), "opencl:0")
        s = ab.memory_stats("opencl:0")
        assert s["limit_bytes"] == 1 << 20
        assert s["in_use_bytes"]["current"] >= 8000
        assert s["oom_failures"] >= 1
        del small
        assert ab.memory_stats("opencl:0")["in_use_bytes"]["current"] == 0
        ab.empty_cache(device="opencl:0")  # by keyword, as documented
        assert ab.memory_stats("opencl:0")["reserved_bytes"]["current"] == 0
    finally:
        ab.set_memory_limit("opencl:0", 0)


def test_explain_route_describes_the_plan():
    opencl()
    text = ab.explain_route(np.arange(12.0).reshape(3, 4).T, "opencl:0")
    assert text.startswith("cpu:0 -> opencl:0: 96 bytes, strided source")
    assert "upload" in text


def test_explain_route_says_where_a_dtype_change_runs():
    a = np.arange(12, dtype=np.uint8)
    text = ab.explain_route(a, "cpu", dtype="float32")
    assert "convert on the host: uint8 -> float32" in text
    assert "view" not in text
    assert "view" in ab.explain_route(a, "cpu")
    with pytest.raises(ValueError):
        ab.explain_route(a, "cpu", dtype="no-such-dtype")


def test_dl_device_and_stream_are_checked_against_the_target():
    t = ab.from_dlpack(np.arange(4.0))
    with pytest.raises(ValueError, match="concrete device"):
        t.__dlpack__(max_version=(1, 0), dl_device=(KDLCPU, -1), copy=False)
    with pytest.raises(ValueError, match="concrete device"):
        t.__dlpack__(max_version=(1, 0), dl_device="cpu:auto")
    # the stream belongs to the consumer's device: fine for OpenCL, not for the host
    with pytest.raises(ValueError, match="host memory"):
        t.__dlpack__(stream=3, dl_device=(KDLCPU, 0))
    opencl()
    cap = t.__dlpack__(max_version=(1, 0), stream=3, dl_device=(KDLOPENCL, 0))
    g = ab.from_dlpack(SameCapsule(cap, (KDLOPENCL, 0)))
    np.testing.assert_array_equal(np.from_dlpack(ab.to_device(g, "cpu")), np.arange(4.0))


def test_stream_max_version_and_copy_take_only_what_the_standard_allows():
    a = np.arange(4.0)
    t = ab.from_dlpack(a)
    # stream: an integer >= -1 (a bool is no stream)
    for bad, err in ((True, TypeError), (-5, ValueError), (-(2**70), ValueError), (1.0, TypeError)):
        with pytest.raises(err, match="stream"):
            t.__dlpack__(stream=bad, dl_device=(KDLOPENCL, 0))
    # max_version: two integers
    for bad in ((1, "x"), ("1", 0), (1.0, 0), (True, 0)):
        with pytest.raises(TypeError, match="max_version"):
            t.__dlpack__(max_version=bad)
    assert capsule_name(t.__dlpack__(max_version=(np.int64(1), 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(1, 2**64))) == "dltensor_versioned"  # any minor
    assert capsule_name(t.__dlpack__(max_version=(2**64, 0))) == "dltensor_versioned"
    # copy: None or a bool; truth testing read copy="False" as True
    for bad in ("False", 0, [], 1.0):
        with pytest.raises(TypeError, match="copy must be None, True or False"):
            ab.from_dlpack(a, copy=bad)
        with pytest.raises(TypeError, match="copy must be None, True or False"):
            ab.to_device(a, "cpu", copy=bad)
        with pytest.raises(TypeError, match="copy must be None, True or False"):
            t.__dlpack__(copy=bad)
    assert ab.from_dlpack(a, copy=np.False_).data_ptr == addr(a)
    with pytest.raises(TypeError):  # from_dlpack(x, /, ...), as the standard and python.md have it
        ab.from_dlpack(x=a)
    assert ab.from_dlpack(a, copy=np.True_).data_ptr != addr(a)
    opencl()
    ab.from_dlpack(SameCapsule(t.__dlpack__(max_version=(1, 0), stream=-1, dl_device=(KDLOPENCL, 0)),
                               (KDLOPENCL, 0)))


def test_memory_limits_out_of_range_are_overflow_errors():
    with pytest.raises(OverflowError):
        ab.set_memory_limit("cpu", 2**64 + 5)
    with pytest.raises(OverflowError):
        ab.set_memory_limit("cpu", -1)
    with pytest.raises(TypeError):
        ab.set_memory_limit("cpu", 1.5)
    ab.set_memory_limit("cpu", 0)


def test_a_producer_whose_dlpack_device_raises_passes_the_error_on():
    class Broken:
        def __dlpack_device__(self):
            raise KeyError("from the producer")

        def __dlpack__(self, **kw):
            return np.arange(3).__dlpack__(**kw)

    with pytest.raises(KeyError, match="from the producer"):
        ab.from_dlpack(Broken())


def test_asarray_of_a_strided_or_device_tensor_copies_it_to_the_host():
    # What the buffer protocol cannot give goes through __array__ (NumPy
    # made a 0-d object array of such a Tensor before).
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = ab.to_device(base[::-1, ::2], "cpu")
    assert t.strides != (3, 1)  # a strided view
    a = np.asarray(t)
    assert a.dtype == np.float32 and a.shape == (4, 3)
    np.testing.assert_array_equal(a, base[::-1, ::2])
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="copy=False"):
        np.array(t, copy=False)
    c = ab.to_device(base, "cpu")  # compact: still the buffer, zero-copy, even with copy=False
    assert np.array(c, copy=False).__array_interface__["data"][0] == c.data_ptr
    if "opencl:0" in ab.devices():
        g = ab.to_device(base, "opencl:0")
        np.testing.assert_array_equal(np.asarray(g), base)


def test_asarray_and_memoryview_see_the_tensors_dtype_and_shape():
    # The buffer protocol with format and shape (what np.asarray asks for):
    # the tensor as an array, sharing its memory, read-only where it is.
    for dt in ("int8", "uint16", "int32", "uint64", "float16", "float32", "float64", "complex64", "complex128", "bool"):
        a = (np.arange(24) % 7).astype(dt).reshape(2, 3, 4)
        t = ab.to_device(a, "cpu", copy=True)
        b = np.asarray(t)
        assert b.dtype == a.dtype and b.shape == (2, 3, 4), (dt, b.dtype, b.shape)
        np.testing.assert_array_equal(b, a)
        assert b.__array_interface__["data"][0] == t.data_ptr
        m = memoryview(t)
        assert m.shape == (2, 3, 4) and m.itemsize == a.itemsize and m.nbytes == a.nbytes
    ro = np.arange(5.0)
    ro.flags.writeable = False
    assert not np.asarray(ab.from_dlpack(ro)).flags.writeable
    assert np.asarray(ab.to_device(np.array(2.5, np.float32), "cpu", copy=True)).shape == ()
    assert np.asarray(ab.to_device(np.zeros((0, 3), np.int16), "cpu")).shape == (0, 3)
    # pickle and plain readers still get bytes
    t = ab.to_device(np.arange(6, dtype=np.int32), "cpu", copy=True)
    assert bytes(t) == np.arange(6, dtype=np.int32).tobytes()
    # A dtype without a struct code (bfloat16, float8, multi-lane) has no
    # typed buffer: as bytes, NumPy took a (2, 3) bfloat16 tensor for 12
    # uint8 numbers, silently. Refused; __array__ then says what NumPy
    # cannot read. Its bytes are byte_view's (pickle and Dask use it too).
    bf = ab.to_device(np.arange(1, 7, dtype=np.float32).reshape(2, 3), "cpu", dtype="bfloat16")
    with pytest.raises(BufferError, match="bfloat16 has no buffer format"):
        memoryview(bf)
    with pytest.raises(TypeError, match="NumPy has no bfloat16 arrays"):
        np.asarray(bf)  # what NumPy cannot read is an error, not numbers
    raw = ab.byte_view(bf)
    assert raw.dtype == "uint8" and raw.shape == (12,) and raw.data_ptr == bf.data_ptr
    with pytest.raises(ValueError, match="compact host memory"):
        ab.byte_view(ab.from_dlpack(np.zeros((3, 4), np.float32).T))
    assert np.array_equal(np.asarray(raw).view(np.uint16).astype(np.uint32) << 16,
                          np.arange(1, 7, dtype=np.float32).view(np.uint32))
    # a reader that wants Fortran order is refused (the memory is C order)
    ctypes = pytest.importorskip("ctypes")
    buf = (ctypes.c_char * ctypes.sizeof(ctypes.c_void_p * 11))()
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes, get.restype = (ctypes.py_object, ctypes.c_void_p, ctypes.c_int), ctypes.c_int
    PyBUF_F_CONTIGUOUS, PyBUF_FORMAT = 0x0040 | 0x0008 | 0x0010, 0x0004
    rel = ctypes.pythonapi.PyBuffer_Release
    rel.argtypes = (ctypes.c_void_p,)
    with pytest.raises(BufferError, match="Fortran"):
        get(ab.to_device(np.zeros((2, 3), np.float32), "cpu", copy=True), ctypes.addressof(buf),
            PyBUF_F_CONTIGUOUS | PyBUF_FORMAT)
    one = ab.to_device(np.zeros((1, 3), np.float32), "cpu", copy=True)  # one long dim: both orders
    assert get(one, ctypes.addressof(buf), PyBUF_F_CONTIGUOUS | PyBUF_FORMAT) == 0
    rel(ctypes.addressof(buf))


CONSUMERS = """
import ctypes, gc, sys, tracemalloc
import numpy as np, arraybridge as ab
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetDestructor.argtypes = [ctypes.py_object, ctypes.c_void_p]
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
P = ctypes.sizeof(ctypes.c_void_p)
# where the deleter is: after DLPackVersion and manager_ctx (versioned),
# after the DLTensor (data, device, ndim, dtype, shape, strides,
# byte_offset) and manager_ctx (legacy)
DLTENSOR = ctypes.sizeof(type("DLTensor", (ctypes.Structure,), {"_fields_": [
    ("data", ctypes.c_void_p), ("device", ctypes.c_int32 * 2), ("ndim", ctypes.c_int32),
    ("dtype", ctypes.c_uint8 * 4), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
    ("byte_offset", ctypes.c_uint64)]}))
KINDS = (({"max_version": (1, 0)}, b"dltensor_versioned", 8 + P), ({}, b"dltensor", DLTENSOR + P))
# A capsule keeps the pointer to the name it is given, so each name is one
# bytes object that lives as long as the script (a temporary's memory is
# reused, and the capsule's name with it).
USED = {name: b"used_" + name for _, name, _ in KINDS}

def delete(cap, name, offset):
    p = api.PyCapsule_GetPointer(cap, name)
    ctypes.cast(ctypes.c_void_p.from_address(p + offset).value, DELETER)(p)

a = np.arange(1 << 16, dtype=np.float32)
t = ab.to_device(a, "cpu", copy=True)
for copy in (None, True):  # views of t, and copies made for the consumer
    for kwargs, name, offset in KINDS:
        # torch's way on a failure: delete, leave the name as it was
        for _ in range(100):
            cap = t.__dlpack__(copy=copy, **kwargs)
            delete(cap, name, offset)
            del cap
        # JAX's and TensorFlow's way: rename, take the destructor away, delete later
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(2000):
            cap = t.__dlpack__(copy=copy, **kwargs)
            api.PyCapsule_SetName(cap, USED[name])
            api.PyCapsule_SetDestructor(cap, None)
            delete(cap, USED[name], offset)
            del cap
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert grown < 40000, (copy, name, grown)  # 2000 leaked wrappers would be 200 KB
gc.collect()
assert sys.getrefcount(t) == 2, sys.getrefcount(t)  # each export's reference dropped once
assert np.array_equal(np.asarray(t), a)
print("ok")
"""


BARE_THREAD = CONSUMERS.split("a = np.arange")[0] + """
libc = ctypes.PyDLL(None)  # its calls keep the GIL
libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
t = ab.to_device(np.arange(1 << 16, dtype=np.float32), "cpu", copy=True)
for kwargs, name, offset in KINDS:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(500):
        cap = t.__dlpack__(copy=True, **kwargs)
        p = api.PyCapsule_GetPointer(cap, name)
        api.PyCapsule_SetName(cap, USED[name])  # taken: the deleter owns it now
        deleter = ctypes.c_void_p.from_address(p + offset).value
        tid = ctypes.c_ulong()
        # the deleter as a bare thread's start routine, joined with the GIL held
        assert libc.pthread_create(ctypes.byref(tid), None, deleter, p) == 0
        assert libc.pthread_join(tid, None) == 0
        del cap
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 20000, (name, grown)  # 500 wrappers left behind would be 50 KB
print("ok")
"""


VIEW_ON_BARE_THREAD = CONSUMERS.split("a = np.arange")[0] + """
import time
held = ctypes.PyDLL(None)  # its calls keep the GIL
free = ctypes.CDLL(None)   # its calls let it go
for lib in (held, free):
    lib.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
held.usleep.argtypes = [ctypes.c_uint]
sys.setswitchinterval(1000)  # this thread gives the GIL up only where it blocks in free's calls
t = ab.to_device(np.arange(16, dtype=np.float32), "cpu", copy=True)
for kwargs, name, offset in KINDS:
    for _ in range(20):
        cap = t.__dlpack__(**kwargs)  # a view: it holds a reference to t
        p = api.PyCapsule_GetPointer(cap, name)
        api.PyCapsule_SetName(cap, USED[name])
        deleter = ctypes.c_void_p.from_address(p + offset).value
        del cap
        refs = sys.getrefcount(t)
        tid = ctypes.c_ulong()
        assert held.pthread_create(ctypes.byref(tid), None, deleter, p) == 0
        held.usleep(20000)  # the GIL held throughout: the deleter must wait for it
        during = sys.getrefcount(t)
        assert free.pthread_join(tid, None) == 0
        after = sys.getrefcount(t)
        assert (during, after) == (refs, refs - 1), (refs, during, after)
print("ok")
"""


def test_a_views_deleter_on_a_bare_thread_waits_for_the_gil():
    """A view's deleter drops its reference to the Tensor, which only the
    GIL's holder may do. Before Python 3.12 the current thread state is one
    global (the holder's, on whatever thread), and the deleter took it for
    its own: it dropped the reference while another thread held the GIL."""
    r = subprocess.run([sys.executable, "-c", VIEW_ON_BARE_THREAD], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


# Subinterpreters as the scripts below make them (after importing
# _xxsubinterpreters as si).
NEW_INTERP = """
def new_interp():  # the legacy kind, 3.11's: 3.12 makes isolated ones, which refuse ctypes and NumPy
    try:
        return si.create(isolated=False)
    except TypeError:
        return si.create()
"""

IN_A_SUBINTERPRETER = CONSUMERS.split("a = np.arange")[0] + """
import threading, time, warnings
import _xxsubinterpreters as si
""" + NEW_INTERP + """
interp = new_interp()  # from here PyGILState_Check says 1 on every thread
t = ab.to_device(np.arange(16, dtype=np.float32), "cpu", copy=True)

def dropped_to(refs):  # a release deferred to the main thread runs at its next check
    end = time.monotonic() + 10
    while sys.getrefcount(t) != refs and time.monotonic() < end:
        time.sleep(0.001)
    return sys.getrefcount(t) == refs

for _ in range(5):
    cap = t.__dlpack__(max_version=(1, 0))
    p = api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    api.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    deleter = ctypes.c_void_p.from_address(p + 8 + P).value
    del cap
    refs = sys.getrefcount(t)
    # called from code the subinterpreter runs: a thread state of another
    # interpreter holds the GIL, on this thread
    si.run_string(interp, f"import ctypes\\nctypes.PYFUNCTYPE(None, ctypes.c_void_p)({deleter})({p})\\n")
    assert dropped_to(refs - 1), (refs, sys.getrefcount(t))
print("ok")
"""


# The module used only inside a subinterpreter, whose code runs on a thread
# other than the one that created it (run_string then borrows that thread's
# thread state: it hung there at the first view's deleter), or on a thread
# that created it; each view's reference dropped.
ON_ANOTHER_THREAD = """
import threading
import _xxsubinterpreters as si
""" + NEW_INTERP + """
code = '''
import sys, time, warnings
warnings.simplefilter("ignore")
import arraybridge as ab
import numpy as np
t = ab.from_dlpack(np.arange(3.0))
refs = sys.getrefcount(t)
for _ in range(100):
    a = np.from_dlpack(t)
    del a
end = time.monotonic() + 10  # each view's reference is dropped, if a little later
while sys.getrefcount(t) != refs and time.monotonic() < end:
    time.sleep(0.001)
assert sys.getrefcount(t) == refs, (refs, sys.getrefcount(t))
'''
failures = []

def run(interp, code):
    try:
        si.run_string(interp, code)
    except Exception as e:
        failures.append(repr(e))

def create_and_run():  # a thread with a subinterpreter of its own (NumPy loads in one only)
    run(new_interp(), code.replace("import numpy as np\\n", "").replace("np.from_dlpack(t)", "ab.from_dlpack(t)")
                         .replace("ab.from_dlpack(np.arange(3.0))", "ab.empty((3,), 'float64')"))

interp = new_interp()  # on this thread, run on another
for target, args in ((run, (interp, code)), (create_and_run, ())):
    th = threading.Thread(target=target, args=args)
    th.start()
    th.join()
assert not failures, failures
print("ok", flush=True)
# CPython 3.11's own: a subinterpreter that imported threading on a thread
# other than its creator's leaves the process waiting at exit for ever
# (`import threading` alone there does it), so leave without the wait.
import os
os._exit(0)
"""


def test_a_views_deleter_called_where_a_subinterpreter_holds_the_gil_does_not_wait_for_it():
    """Where a subinterpreter's thread state holds the GIL, which thread
    holds it cannot be told before Python 3.12 (run_string borrows the one
    made on the thread that created the interpreter): the deleter neither
    waits for a GIL its own thread may hold nor drops a reference without
    it; the main thread drops it soon after."""
    try:
        import _xxsubinterpreters  # noqa: F401  (CPython 3.9-3.12)
    except ImportError:
        pytest.skip("this Python has no _xxsubinterpreters")
    for script in (IN_A_SUBINTERPRETER, ON_ANOTHER_THREAD):
        try:
            r = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True,
                               timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("hung: the deleter waited for the GIL its own thread held")
        assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_copys_deleter_runs_on_a_bare_thread_while_another_holds_the_gil():
    """A consumer may delete a copy on a thread of its own that Python never
    saw, while the thread holding the GIL waits for it (pthread_join under
    the GIL here). The copy's deleter used to take the GIL for the list of
    wrappers, and that wait never ended; it is freed without Python now."""
    try:
        r = subprocess.run([sys.executable, "-c", BARE_THREAD], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("hung: the copy's deleter waited for the GIL")
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


def test_thousands_of_exports_alive_at_once_are_each_deleted_once_in_any_order():
    """The list of wrappers not yet deleted grows and shrinks (a hash set
    under its own lock): entries taken out of order, some among them long
    lived while tens of thousands come and go around them, must leave every
    other one findable. Each view holds one reference to t, so one left
    behind or deleted twice shows in t's reference count."""
    import ctypes
    import random
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    deleter_at = 8 + ctypes.sizeof(ctypes.c_void_p)  # after DLPackVersion and manager_ctx
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def consume(cap):  # as a consumer does: take, rename, delete
        p = api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
        api.PyCapsule_SetName(cap, b"used_dltensor_versioned")
        deleter(ctypes.c_void_p.from_address(p + deleter_at).value)(p)

    t = ab.to_device(np.arange(8, dtype=np.float32), "cpu", copy=True)
    refs = sys.getrefcount(t)
    rng = random.Random(18)
    first = [t.__dlpack__(max_version=(1, 0)) for _ in range(5000)]
    rng.shuffle(first)
    kept, first = first[:1000], first[1000:]  # long lived, scattered through the set
    for cap in first[:2000]:
        consume(cap)
    del first  # the rest never consumed: their destructors delete them
    assert sys.getrefcount(t) == refs + len(kept)
    for _ in range(12):  # serials run far past the set's size: they collide with the kept ones
        caps = [t.__dlpack__(max_version=(1, 0)) for _ in range(3000)]
        rng.shuffle(caps)
        for cap in caps[:1500]:
            consume(cap)
        rest = caps[1500:]
        del caps
        rng.shuffle(rest)
        while rest:
            rest.pop()
        assert sys.getrefcount(t) == refs + len(kept)
    rng.shuffle(kept)
    for cap in kept[:500]:
        consume(cap)
    del kept
    assert sys.getrefcount(t) == refs


def test_consumers_that_delete_without_renaming_or_take_the_destructor_away_free_once():
    """torch.from_dlpack of an OpenCL tensor takes the capsule's tensor,
    fails, calls its deleter and leaves the capsule's name as it was; the
    capsule's destructor then freed the tensor again and the process
    aborted (double free). JAX and TensorFlow rename the capsule and take
    its destructor away before deleting. Each export is deleted exactly
    once either way, with nothing left behind. In a child, so that an abort
    is a failure here."""
    r = subprocess.run([sys.executable, "-c", CONSUMERS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_refused_capsule_is_released_without_our_error_pending():
    """A producer's capsule destructor written in Python (ctypes) ran while
    the import's BufferError was pending: the call ended in SystemError and
    the tensor was never deleted. A refused capsule (DLPack 99.0 here) is
    now released with the error set aside."""
    import ctypes

    class Dev(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int32), ("id", ctypes.c_int32)]

    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", Dev), ("ndim", ctypes.c_int32),
                    ("dtype", ctypes.c_uint8 * 4), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]

    class Managed(ctypes.Structure):
        pass

    deleter_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(Managed))
    Managed._fields_ = [("version", ctypes.c_uint32 * 2), ("ctx", ctypes.c_void_p), ("deleter", deleter_t),
                        ("flags", ctypes.c_uint64), ("dl_tensor", Tensor)]
    deleted = []
    data, shape = (ctypes.c_float * 4)(), (ctypes.c_int64 * 1)(4)
    m = Managed()
    m.version[0] = 99
    m.dl_tensor = Tensor(ctypes.addressof(data), Dev(KDLCPU, 0), 1, (ctypes.c_uint8 * 4)(2, 32, 1, 0),
                         shape, None, 0)
    m.deleter = deleter_t(lambda p: deleted.append(1))
    new, name = ctypes.pythonapi.PyCapsule_New, ctypes.pythonapi.PyCapsule_GetName
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def destructor(cap):  # Python code: it must not run with an exception pending
        if name(cap) == b"dltensor_versioned":
            m.deleter(ctypes.pointer(m))

    class Producer:
        def __dlpack_device__(self):
            return (KDLCPU, 0)

        def __dlpack__(self, **kwargs):
            return new(ctypes.addressof(m), b"dltensor_versioned", ctypes.cast(destructor, ctypes.c_void_p))

    with pytest.raises(BufferError, match="99"):
        ab.from_dlpack(Producer())
    assert deleted == [1]


def test_permute_and_shape_longer_than_any_tensor_are_refused_by_their_length():
    """range(10**9) as a permute (or a shape) was built whole, a tuple of a
    billion ints, before its length was compared: the kernel killed the
    process. Only the first 65 items are read now, also of a sequence
    with no length that never ends."""

    class Endless:
        def __getitem__(self, i):
            return 0

    a = np.zeros((2, 3), np.float32)
    for seq in (range(10**9), Endless()):
        with pytest.raises(ValueError, match="permute has more than 64 axes; the tensor has 2"):
            ab.to_device(a, "cpu", permute=seq)
        with pytest.raises(ValueError, match="shape has more than 64 dims"):
            ab.empty(seq, "float32", "cpu")
    with pytest.raises(ValueError, match="permute has 3 axes; the tensor has 2"):
        ab.to_device(a, "cpu", permute=range(3))
    assert ab.to_device(a, "cpu", permute=range(1, -1, -1)).shape == (3, 2)  # a short range still is read


def test_array_protocol_honours_copy_with_a_dtype():
    """__array__(dtype, copy=False) used astype, which always copies: the same
    dtype gave a copy, another dtype a cast, where NumPy's protocol says
    copy=False never copies."""
    a = np.arange(6, dtype=np.float32)
    t = ab.from_dlpack(a)
    same = t.__array__(np.float32, copy=False)
    assert addr(same) == addr(a)
    assert addr(t.__array__(np.float32)) == addr(a)  # copy=None: no copy needed either
    with pytest.raises(ValueError, match="needs a copy"):
        t.__array__(np.int8, copy=False)
    cast = t.__array__(np.int8)
    assert cast.dtype == np.int8 and list(cast) == list(range(6))
    dt = np.dtype(np.int8)
    before = sys.getrefcount(dt)
    for _ in range(100):
        t.__array__(dt)
    assert sys.getrefcount(dt) - before < 10  # each call leaked its argument tuple and a dtype reference
    assert addr(t.__array__(np.float32, copy=True)) != addr(a)


def test_explain_route_takes_every_option_of_to_device():
    """python.md promised to_device's options; gpu_id, copy and layout were
    TypeError, so a compact copy's or copy=True's route could not be shown."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert "view" in ab.explain_route(a.T, "cpu")
    assert "host copy" in ab.explain_route(a.T, "cpu", layout="compact")
    assert "host copy" in ab.explain_route(a, "cpu", copy=True)
    assert "host copy" in ab.explain_route(a, "cpu", 0, copy=True)
    with pytest.raises(BufferError, match="copy is needed"):
        ab.explain_route(a.T, "cpu", copy=False, layout="compact")
    with pytest.raises(TypeError, match="not bool"):
        ab.explain_route(a, "cpu", True)


def test_bools_are_no_axes_dimensions_or_device_numbers():
    """gpu_id, index and bytes refused bools; permute=(True, False) was a
    transpose, channel_axis=True axis 1, (4, True) opencl:1, and
    empty((True, 2)) a (1, 2) array."""
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="a permute axis must be an int, not bool"):
        ab.to_device(a, "cpu", permute=(True, False))
    with pytest.raises(TypeError, match="channel_axis must be an int, not bool"):
        ab.to_device(a, "cpu", channel_axis=True, channel_scale=(1.0, 2.0, 3.0))
    with pytest.raises(TypeError, match="device tuple's id must be an int, not bool"):
        ab.to_device(a, (KDLCPU, False))
    with pytest.raises(TypeError, match="device tuple's type must be an int, not bool"):
        ab.to_device(a, (True, 0))
    with pytest.raises(TypeError, match=r'device type number.*one string: "opencl:1"'):
        ab.to_device(a, ("opencl", 1))  # was "'str' object cannot be interpreted as an integer"
    with pytest.raises(TypeError, match="a shape's dimension must be an int, not bool"):
        ab.empty((True, 2), "float32", "cpu")
    assert ab.to_device(a, (KDLCPU, 0), permute=(np.int64(1), 0)).shape == (3, 2)  # integers still are


def test_device_tuples_beyond_a_long_are_out_of_range_like_any_other():
    """(1, 2**70) raised OverflowError ("too large to convert to C long")
    where (1, 2**40) raised ValueError."""
    a = np.zeros(3, np.float32)
    t = ab.to_device(a, "cpu")

    class Device:
        def __init__(self, dev):
            self.dev = dev

        def __dlpack_device__(self):
            return self.dev

        def __dlpack__(self, **kw):
            return a.__dlpack__(**kw)

    for dev in ((KDLCPU, 2**70), (KDLCPU, -(2**70)), (2**70, 0), (KDLCPU, 2**40)):
        with pytest.raises(ValueError, match=r"device \(%d, %d\) is out of range" % dev):
            ab.to_device(a, dev)
        with pytest.raises(ValueError, match="out of range"):
            t.__dlpack__(dl_device=dev)
    with pytest.raises(ValueError, match="out of range"):
        ab.from_dlpack(Device((2**70, 0)))


def test_an_error_raised_while_a_sequence_is_read_keeps_its_words():
    """A TypeError from a sequence's own item access was replaced by
    'permute must be a sequence', which it is."""

    class Bad:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            if i == 1:
                raise TypeError("item 1 is broken")
            return 0

    a = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="item 1 is broken"):
        ab.to_device(a, "cpu", permute=Bad())
    with pytest.raises(TypeError, match="item 1 is broken"):
        ab.to_device(a, "cpu", channel_axis=0, channel_scale=Bad())
    with pytest.raises(TypeError, match="item 1 is broken"):
        ab.empty(Bad(), "float32", "cpu")
    with pytest.raises(TypeError, match="permute must be a sequence"):
        ab.to_device(a, "cpu", permute=np.array(1))  # no items at all: as before
