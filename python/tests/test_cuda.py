"""The module's CUDA paths: device strings, streams in __dlpack__, imports
from CUDA producers, pinned and managed memory, pools.

They run wherever arraybridge sees a CUDA device: on a GPU for real, and in
`make test-python` against simcuda, the simulated CUDA runtime of the C
tests (the module is built a second time with AB_PY_SIMCUDA=1 and run with
AB_SIMCUDA_DEVICES=2). Elsewhere they skip, saying why."""
import gc
import os
import sys

import numpy as np
import pytest

import arraybridge as ab
from ab_support import n_devices, opencl

KDLCPU, KDLCUDA, KDLCUDAHOST, KDLCUDAMANAGED = 1, 2, 3, 13

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32", "float64", "complex64",
          "complex128"]


def n_cuda():
    return n_devices("cuda")


@pytest.fixture(autouse=True)
def need_cuda():
    expect = os.environ.get("AB_TEST_EXPECT_CUDA")
    if expect:
        # make test-python's simcuda run: skipping would hide a wrong build.
        assert n_cuda() == int(expect), "expected %s CUDA devices (the simcuda build), have %s" % (expect, ab.devices())
    if n_cuda() < 1:
        pytest.skip("needs a CUDA device (a GPU, or simcuda: make test-python runs this file against it)")


def sample(name, shape=(7, 11)):
    rng = np.random.default_rng(len(name) * 7 + 1)
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if name.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(name)
    if name.startswith("float"):
        return (rng.standard_normal(shape) * 1000).astype(name)
    info = np.iinfo(name)
    return rng.integers(info.min, info.max, shape, dtype=name, endpoint=True)


def host(t):
    return np.from_dlpack(ab.to_device(t, "cpu"))


def host_bytes(t):
    """A tensor's bytes on the host, whatever its dtype (NumPy takes none of
    bfloat16, float8 or multi-lane)."""
    return bytes(ab.byte_view(ab.to_device(t, "cpu", layout="compact")))


class Recorder:
    """A producer that passes a Tensor's capsule on and remembers how it was asked."""

    def __init__(self, t):
        self.t, self.kwargs = t, None

    def __dlpack__(self, **kwargs):
        self.kwargs = kwargs
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_cuda_devices_are_listed_and_described():
    devs = ab.devices()
    assert "cuda:0" in devs and "cuda_host:0" in devs and "cuda_managed:0" in devs
    info = ab.device_info("cuda:0")
    assert info["backend"] == "cuda" and info["total_memory"] > 0 and not info["host_accessible"]
    assert ab.device_info("cuda_host:0")["host_accessible"]
    with pytest.raises(ValueError, match="cuda:%d" % n_cuda()):
        ab.device_info("cuda:%d" % n_cuda())


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips_through_each_gpu(name):
    a = sample(name)
    t = ab.to_device(a, "cuda:0")
    assert (t.device, t.dtype, t.shape) == ("cuda:0", name, a.shape)
    last = t
    for i in range(1, n_cuda()):
        last = ab.to_device(last, "cuda:%d" % i)
        assert last.device == "cuda:%d" % i
    assert np.array_equal(host(last).view(np.uint8), np.ascontiguousarray(a).view(np.uint8))


def test_strided_and_reversed_arrays_arrive_compact():
    a = sample("int16", (30, 40))
    for view in (a.T, a[::-1, ::3], a[5:25, 10:30], np.broadcast_to(a[3], (6, 40))):
        t = ab.to_device(view, "cuda:0")
        assert t.strides == tuple(np.empty(view.shape, view.dtype).strides[i] // view.itemsize
                                  for i in range(view.ndim))
        assert np.array_equal(host(t), view)


def test_gpu_id_and_auto_choose_the_gpu():
    a = np.arange(10, dtype=np.int32)
    assert ab.to_device(a, "cuda", gpu_id=n_cuda() - 1).device == "cuda:%d" % (n_cuda() - 1)
    assert ab.to_device(a, "cuda:auto").device.startswith("cuda:")
    with pytest.raises(ValueError):
        ab.to_device(a, "cuda", gpu_id=n_cuda())


def test_conversions_on_the_way_to_the_gpu_match_numpy():
    # As test_numpy's image test: float32 arithmetic, a multiply then an add
    # per channel (the axis of the source), then HWC -> CHW.
    hwc = sample("uint8", (24, 32, 3))
    scale, offset = np.array([1 / 255, 1 / 127, 1 / 63]), np.array([-0.5, 0.25, 2.0])
    t = ab.to_device(hwc, "cuda:0", dtype="float32", permute=(2, 0, 1), channel_axis=-1, channel_scale=scale,
                          channel_offset=offset)
    assert (t.device, t.shape, t.dtype) == ("cuda:0", (3, 24, 32), "float32")
    want = (hwc.astype(np.float32) * scale.astype(np.float32) + offset.astype(np.float32)).transpose(2, 0, 1)
    assert np.array_equal(host(t).view(np.uint32), want.view(np.uint32))


def test_stream_argument_of_a_cuda_tensor():
    t = ab.to_device(np.arange(8, dtype=np.float32), "cuda:0")
    for s in (1, 2, 0x7F0000001000, None):
        cap = t.__dlpack__(stream=s)
        assert "dltensor" in repr(cap)
    with pytest.raises(ValueError, match="ambiguous"):
        t.__dlpack__(stream=0)
    with pytest.raises(TypeError):
        t.__dlpack__(stream="1")
    # managed memory is CUDA's too: 0 is as ambiguous there
    m = ab.to_device(np.arange(8, dtype=np.float32), "cuda_managed")
    assert "dltensor" in repr(m.__dlpack__(stream=1))
    with pytest.raises(ValueError, match="ambiguous"):
        m.__dlpack__(stream=0)
    # dl_device=cpu: a host copy, so a CPU consumer can take it; then a
    # stream makes no sense.
    with pytest.raises(ValueError, match="host memory"):
        t.__dlpack__(stream=1, dl_device=(KDLCPU, 0))


def test_a_cuda_capsule_reaches_numpy_only_through_a_host_copy():
    a = np.arange(12, dtype=np.int64)
    t = ab.to_device(a, "cuda:0")
    with pytest.raises((RuntimeError, BufferError)):
        np.from_dlpack(t)

    class ToHost(Recorder):
        def __dlpack__(self, **kwargs):
            kwargs["dl_device"] = (KDLCPU, 0)
            return self.t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (KDLCPU, 0)

    assert np.array_equal(np.from_dlpack(ToHost(t)), a)


def test_convert_into_reads_a_cuda_capsule_in_place_and_takes_it_once_done():
    a = np.arange(12, dtype=np.float32)
    t = ab.to_device(a, "cuda:%d" % (n_cuda() - 1))  # cuda:1 where there are two
    cap = t.__dlpack__(max_version=(1, 0))
    out = np.zeros(12, np.float32)
    with pytest.raises(ValueError, match="shape"):
        ab.convert_into(cap, out[:6])
    ab.convert_into(cap, out, scale=3.0)
    np.testing.assert_array_equal(out, a * 3)
    with pytest.raises(BufferError, match="not an unconsumed"):
        ab.convert_into(cap, out)
    # a GPU out given as a capsule is written in place
    dst = ab.empty((12,), "float32", device="cuda:0")
    ab.convert_into(a + 1, dst.__dlpack__(max_version=(1, 0)))
    np.testing.assert_array_equal(np.asarray(dst), a + 1)


def test_importing_from_a_cuda_producer_asks_for_the_legacy_stream():
    a = sample("float32", (64, 3))
    r = Recorder(ab.to_device(a, "cuda:0"))
    t = ab.from_dlpack(r)
    assert r.kwargs.get("stream") == 1, r.kwargs
    assert r.kwargs.get("max_version") is not None
    assert t.device == "cuda:0"
    assert np.array_equal(host(t), a)
    # cross-device import: to cuda:last, or to the host
    moved = ab.from_dlpack(Recorder(t), device="cuda:%d" % (n_cuda() - 1))
    assert np.array_equal(host(moved), a)
    assert np.array_equal(np.from_dlpack(ab.from_dlpack(Recorder(t), device="cpu")), a)
    with pytest.raises(BufferError):
        ab.from_dlpack(Recorder(t), device="cpu", copy=False)


def test_pinned_and_managed_tensors_are_numpy_readable_zero_copy():
    a = sample("float64", (16, 9))
    for where in ("cuda_host:0", "cuda_managed:0"):
        t = ab.to_device(a, where)
        assert t.device == where
        v = np.from_dlpack(t)
        assert np.array_equal(v, a)
        again = np.from_dlpack(t)
        assert again.__array_interface__["data"][0] == v.__array_interface__["data"][0]
        g = ab.to_device(t, "cuda:0")
        assert np.array_equal(host(g), a)


def test_pool_statistics_limits_and_empty_cache_on_a_gpu():
    dev = "cuda:0"
    ab.empty_cache(dev)
    before = ab.memory_stats(dev)
    t = ab.to_device(np.zeros(1 << 20, dtype=np.uint8), dev)
    during = ab.memory_stats(dev)
    assert during["in_use_bytes"]["current"] >= before["in_use_bytes"]["current"] + (1 << 20)
    del t
    gc.collect()
    assert ab.memory_stats(dev)["in_use_bytes"]["current"] == before["in_use_bytes"]["current"]
    ab.set_memory_limit(dev, 1 << 20)
    try:
        with pytest.raises(MemoryError, match="cuda:0"):
            ab.to_device(np.zeros(4 << 20, dtype=np.uint8), dev)
    finally:
        ab.set_memory_limit(dev, 0)
    ab.empty_cache(dev)
    assert ab.memory_stats(dev)["reserved_bytes"]["current"] == 0


def test_reference_counts_and_gpu_memory_return_after_many_round_trips():
    a = sample("int32", (33, 17))
    ab.empty_cache("cuda:0")
    base = ab.memory_stats("cuda:0")["in_use_bytes"]["current"]
    refs = sys.getrefcount(a)
    for _ in range(300):
        t = ab.to_device(a, "cuda:0")
        back = np.from_dlpack(ab.to_device(t, "cpu"))
        assert back[5, 5] == a[5, 5]
        r = ab.from_dlpack(Recorder(t))
        del t, back, r
    gc.collect()
    assert sys.getrefcount(a) == refs
    assert ab.memory_stats("cuda:0")["in_use_bytes"]["current"] == base


def test_cuda_and_opencl_through_the_host():
    opencl()
    a = sample("float16", (20, 21))
    c = ab.to_device(ab.to_device(a, "cuda:0"), "opencl:0")
    assert c.device == "opencl:0"
    back = ab.to_device(c, "cuda:%d" % (n_cuda() - 1))
    assert np.array_equal(host(back).view(np.uint16), a.view(np.uint16))


# ---- the CUDA array interface and Dask's "cuda" family ---------------------------------------


def test_cuda_tensors_describe_themselves_with_the_cuda_array_interface():
    a = sample("float32", (6, 5))
    t = ab.to_device(a, "cuda:%d" % (n_cuda() - 1))
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3 and cai["typestr"] == "<f4" and cai["shape"] == (6, 5)
    assert cai["data"] == (t.data_ptr, False) and cai["strides"] is None and cai["stream"] is None
    assert not hasattr(ab.to_device(a, "cpu"), "__cuda_array_interface__")
    assert not hasattr(ab.to_device(a.astype(np.float32), "cuda:0", dtype="bfloat16"), "__cuda_array_interface__")
    # read back in: zero-copy, the same bytes, any shape the bytes make
    u = ab._arraybridge._from_cuda_array_interface(t, n_cuda() - 1)
    assert u.data_ptr == t.data_ptr and u.device == t.device and u.dtype == "float32"
    np.testing.assert_array_equal(host(u), a)
    w = ab._arraybridge._from_cuda_array_interface(t, n_cuda() - 1, dtype="uint8", shape=(a.nbytes,))
    np.testing.assert_array_equal(host(w), a.view(np.uint8).reshape(-1))
    with pytest.raises(ValueError, match="bytes"):
        ab._arraybridge._from_cuda_array_interface(t, 0, dtype="uint8", shape=(a.nbytes + 1,))
    # a producer's stream: 0 is disallowed by version 3 of the interface

    class Producer:
        def __init__(self, stream):
            self.__cuda_array_interface__ = dict(t.__cuda_array_interface__, stream=stream)

    with pytest.raises(ValueError, match="stream 0 is disallowed"):
        ab._arraybridge._from_cuda_array_interface(Producer(0), n_cuda() - 1)
    v = ab._arraybridge._from_cuda_array_interface(Producer(1), n_cuda() - 1)
    np.testing.assert_array_equal(host(v), a)
    # a stream is an integer or None, as __dlpack__'s: True is not stream 1
    for junk in (True, "1", 1.0):
        with pytest.raises(TypeError, match="stream must be None or an integer"):
            ab._arraybridge._from_cuda_array_interface(Producer(junk), n_cuda() - 1)


def test_strided_cuda_tensors_give_their_strides_in_bytes():
    """The interface's strides are in bytes, DLPack's in elements."""
    a = sample("float32", (6, 5))
    dev = n_cuda() - 1
    t = ab.to_device(a, "cuda:%d" % dev)

    class View:
        def __init__(self, shape, strides):
            self.__cuda_array_interface__ = dict(t.__cuda_array_interface__, shape=shape, strides=strides)

    for shape, strides, want in (((3, 5), (40, 4), a[::2]), ((5, 6), (4, 20), a.T)):
        u = ab._arraybridge._from_cuda_array_interface(View(shape, strides), dev)
        assert u.strides == tuple(s // 4 for s in strides) and u.data_ptr == t.data_ptr
        assert u.__cuda_array_interface__["strides"] == strides
        np.testing.assert_array_equal(host(u), want)
        # and back in through its own interface: the same elements
        np.testing.assert_array_equal(host(ab._arraybridge._from_cuda_array_interface(u, dev)), want)


def test_reversed_cuda_views_given_from_their_first_element():
    """CuPy and the CUDA Array Interface give a view's element 0 as its
    address: a reversed view's other elements lie below it."""
    a = sample("int32", (6, 5))
    dev = n_cuda() - 1
    t = ab.to_device(a, "cuda:%d" % dev)

    class View:
        def __init__(self, at, shape, strides):
            cai = t.__cuda_array_interface__
            self.__cuda_array_interface__ = dict(cai, data=(cai["data"][0] + at * 4, False), shape=shape,
                                                 strides=strides)

    for at, shape, strides, want in ((29, (6, 5), (-20, -4), a[::-1, ::-1]), (27, (6,), (-20,), a[::-1, 2]),
                                     (29, (5, 6), (-4, -20), a[::-1, ::-1].T)):
        u = ab._arraybridge._from_cuda_array_interface(View(at, shape, strides), dev)
        assert u.data_ptr == t.data_ptr + at * 4
        np.testing.assert_array_equal(host(u), want)
        for to in ["cuda:%d" % i for i in range(n_cuda())] + ["cpu"]:
            np.testing.assert_array_equal(host(ab.to_device(u, to, copy=True)), want)
    # one element more reaches below the allocation: refused, not read
    with pytest.raises(ValueError, match="strides address from 4 bytes below it, outside its allocation"):
        ab._arraybridge._from_cuda_array_interface(View(0, (2,), (-4,)), dev)


def test_dask_cuda_family_sends_the_device_memory_itself():
    try:
        import distributed.protocol as dp
    except ImportError:
        pytest.skip("distributed is not installed")
    a = sample("int16", (9, 4))
    t = ab.to_device(a, "cuda:%d" % (n_cuda() - 1))
    header, frames = dp.serialize(t, serializers=("cuda",))
    assert header["serializer"] == "cuda" and len(frames) == 1
    assert frames[0].__cuda_array_interface__["data"][0] == t.data_ptr  # the tensor's memory, no copy
    u = dp.deserialize(header, frames, deserializers=("cuda",))
    assert u.device == t.device and u.shape == (9, 4) and u.dtype == "int16"
    np.testing.assert_array_equal(host(u), a)
    # A host tensor is not the cuda family's: the next family takes it.
    h = ab.to_device(a, "cpu")
    header, frames = dp.serialize(h, serializers=("cuda", "dask"))
    assert header["serializer"] == "dask"
    np.testing.assert_array_equal(np.from_dlpack(dp.deserialize(header, frames)), a)


def test_dask_cuda_frames_carry_dtypes_the_cuda_array_interface_cannot_name():
    # bfloat16, float8 and multi-lane dtypes have no typestr: their frame
    # is the tensor's memory as bytes, and the header says what they are.
    try:
        import distributed.protocol as dp
    except ImportError:
        pytest.skip("distributed is not installed")
    gpu = "cuda:%d" % (n_cuda() - 1)
    payload = bytes(range(48))
    cases = [(ab.to_device(sample("float32", (4, 3)), gpu, dtype="bfloat16"), "bfloat16")]
    for dl, shape, name in (((10, 8, 1), (6, 8), "float8_e4m3fn(bits 8)"), ((2, 32, 4), (3,), "float32x4")):
        cases.append((ab.to_device(ab._arraybridge._rebuild_tensor(payload, dl, shape, False, "cpu:0"), gpu), name))
    for t, name in cases:
        assert not hasattr(t, "__cuda_array_interface__")
        header, frames = dp.serialize(t, serializers=("cuda",))
        assert header["serializer"] == "cuda" and len(frames) == 1
        cai = frames[0].__cuda_array_interface__
        assert cai["data"][0] == t.data_ptr and cai["typestr"] == "|u1" and cai["shape"] == (t.nbytes,)
        u = dp.deserialize(header, frames, deserializers=("cuda",))
        assert u.device == t.device and u.dtype == name and u.shape == t.shape and u.data_ptr == t.data_ptr
        assert host_bytes(u) == host_bytes(t)
    # a header from a sender before dldtype: the name alone
    from arraybridge import _dask
    a = sample("float32", (2, 5))
    h, f = _dask.cuda_serialize(ab.to_device(a, gpu))
    del h["dldtype"]
    np.testing.assert_array_equal(host(_dask.cuda_deserialize(h, f)), a)


def test_cuda_frames_are_placed_on_the_gpu_their_memory_is_on_and_keep_read_only():
    if n_cuda() < 2:
        pytest.skip("needs two CUDA devices")
    try:
        import distributed.protocol as dp
    except ImportError:
        pytest.skip("distributed is not installed")
    from arraybridge import _dask
    a = sample("float32", (4, 4))
    t = ab.to_device(a, "cuda:1")
    header, frames = _dask.cuda_serialize(t)
    header = dict(header, device="cuda:0", readonly=True)  # a sender whose id differs from the memory's
    u = _dask.cuda_deserialize(header, frames)
    assert u.device == "cuda:1" and u.readonly and u.data_ptr == t.data_ptr
    np.testing.assert_array_equal(host(u), a)
    # dtype alone: the buffer's bytes as that many new elements
    b = ab.to_device(np.arange(16, dtype=np.uint8), "cuda:0")
    f = ab._arraybridge._from_cuda_array_interface(b, 0, dtype="float32")
    assert f.shape == (4,) and f.dtype == "float32"
    assert dp is not None
