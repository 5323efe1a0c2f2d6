"""Tensors through pickle: host bytes out of band with protocol 5, device
tensors as their bytes and back onto their device (or the host where the
receiving process lacks it), flags and layouts as documented."""
import os
import pickle
import warnings
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import arraybridge as ab
from ab_support import addr, n_devices, opencl

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128"]


def sample(dtype, shape=(3, 5)):
    rng = np.random.default_rng(11)
    return (rng.standard_normal(shape) * 100).astype(dtype)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_every_dtype_round_trips_with_its_bytes(protocol):
    for dtype in DTYPES:
        a = sample(dtype)
        u = pickle.loads(pickle.dumps(ab.to_device(a, "cpu"), protocol=protocol))
        assert isinstance(u, ab.Tensor) and u.dtype == dtype and u.shape == a.shape and u.device == "cpu:0"
        np.testing.assert_array_equal(np.from_dlpack(u), a)


def test_protocol_5_hands_out_the_tensors_own_memory():
    a = sample("float32", (64, 64))
    t = ab.to_device(a, "cpu")
    bufs = []
    stream = pickle.dumps(t, protocol=5, buffer_callback=bufs.append)
    assert len(bufs) == 1 and len(stream) < 200  # the 16 KiB are not in the stream
    raw = bufs[0].raw()
    assert raw.nbytes == a.nbytes and addr(np.frombuffer(raw, np.uint8)) == t.data_ptr
    u = pickle.loads(stream, buffers=bufs)
    # The load takes the buffer it is given as its memory, as NumPy's does:
    # here that is t's own, so u is a view of t.
    assert u.data_ptr == t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(u), a)
    # From a stream alone (the buffer in band: pickle makes a bytearray of
    # it) the load adopts that bytearray, no copy of its own.
    v = pickle.loads(pickle.dumps(t, protocol=5))
    assert v.data_ptr != t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(v), a)
    np.from_dlpack(v)[0, 0] = -1.0  # writable, like the tensor pickled
    assert np.from_dlpack(t)[0, 0] == a[0, 0]


def test_a_load_copies_what_it_cannot_adopt():
    rebuild = ab._arraybridge._rebuild_tensor
    data = np.arange(8, dtype=np.float64)
    # read-only bytes for a writable tensor: copied
    raw = data.tobytes()
    t = rebuild(raw, "float64", (8,), False, "cpu:0")
    assert not t.readonly and t.copied and np.from_dlpack(t)[3] == 3.0
    np.from_dlpack(t)[3] = 9.0
    assert np.frombuffer(raw, np.float64)[3] == 3.0
    # the same bytes for a read-only tensor: copied too. bytes are immutable
    # and shared (b"\x05" is one object for the whole interpreter), and
    # torch writes through DLPack's read-only flag; so are bytes under the
    # memoryviews and PickleBuffers that pickle and Dask wrap them in,
    # and arrays made over them (np.frombuffer: the array's base). An array
    # whose base cannot be read, or is a released memoryview (whose owner
    # may be freed: reading it crashed) or PickleBuffer, may be over bytes:
    # copied.
    released_view = memoryview(bytes(range(200)) * 7)
    released_view.release()
    released_pb = pickle.PickleBuffer(bytearray(8))
    released_pb.release()

    def with_base(base):
        class Based(np.ndarray):
            @property
            def base(self):
                if isinstance(base, BaseException):
                    raise base
                return base
        return read_only(np.frombuffer(bytearray(raw), np.uint8).view(Based))

    def read_only(a):
        a.flags.writeable = False
        return a

    for payload in (raw, memoryview(raw), memoryview(memoryview(raw)[8:]), pickle.PickleBuffer(raw),
                    memoryview(pickle.PickleBuffer(raw)), np.frombuffer(raw, np.uint8),
                    memoryview(np.frombuffer(memoryview(raw), np.float64)[1:]),
                    with_base(RuntimeError("no base")), with_base(released_view), with_base(released_pb)):
        r = rebuild(payload, "float64", (len(memoryview(payload).cast("B")) // 8,), True, "cpu:0")
        assert r.readonly and r.copied and r.data_ptr != addr(np.frombuffer(payload, np.uint8))
        np.testing.assert_array_equal(np.from_dlpack(r), np.frombuffer(payload, np.float64))
    # an interrupt while the base is read is no answer: it propagates
    with pytest.raises(KeyboardInterrupt):
        rebuild(with_base(KeyboardInterrupt()), "float64", (8,), True, "cpu:0")
    one = rebuild(b"\x05", "uint8", (1,), True, "cpu:0")
    assert one.data_ptr != addr(np.frombuffer(b"\x05", np.uint8))
    # read-only memory that is not a bytes object's, for a read-only
    # tensor: adopted
    for ro in (memoryview(bytearray(raw)).toreadonly(), read_only(np.frombuffer(bytearray(raw), np.float64))):
        r = rebuild(ro, "float64", (8,), True, "cpu:0")
        assert r.readonly and not r.copied and r.data_ptr == addr(np.frombuffer(ro, np.float64))
    # a misaligned buffer: copied into aligned memory
    buf = bytearray(8 * 8 + 1)
    view = memoryview(buf)[1:]
    view[:] = data.tobytes()
    m = rebuild(view, "float64", (8,), False, "cpu:0")
    assert m.data_ptr % 8 == 0 and m.copied
    np.testing.assert_array_equal(np.from_dlpack(m), data)
    # an adopted buffer lives as long as the tensor does
    ba = bytearray(data.tobytes())
    k = rebuild(ba, "float64", (8,), False, "cpu:0")
    assert k.data_ptr == addr(np.frombuffer(ba, np.float64))
    del ba
    np.testing.assert_array_equal(np.from_dlpack(k), data)


def test_a_misaligned_load_is_copied_outside_a_host_pool_with_no_room():
    """Dask's frames arrive misaligned (TCP); where the host pool's limit
    (a capped worker, docs/scaling.md) leaves no room for their copy, the
    copy is made outside the pool: a MemoryError there stalls Dask's
    transfer for ever."""
    rebuild = ab._arraybridge._rebuild_tensor
    data = np.arange(1 << 16, dtype=np.float32)
    buf = bytearray(data.nbytes + 1)
    view = memoryview(buf)[1:]
    view[:] = data.tobytes()
    before = ab.memory_stats("cpu")["in_use_bytes"]["current"]
    ab.set_memory_limit("cpu", 4096)
    try:
        with pytest.raises(MemoryError):  # the pool itself still refuses
            ab.to_device(data, "cpu", copy=True)
        for readonly in (False, True):
            m = rebuild(view, "float32", (1 << 16,), readonly, "cpu:0")
            assert m.data_ptr % 64 == 0 and m.readonly == readonly and m.copied and m.device == "cpu:0"
            assert ab.memory_stats("cpu")["in_use_bytes"]["current"] == before
            np.testing.assert_array_equal(np.from_dlpack(m), data)
            buf[1:5] = b"\0\0\0\0"  # a copy: the frame's memory can go back to Dask
            assert np.from_dlpack(m)[0] == 0.0 and np.from_dlpack(m)[1] == 1.0
            view[:4] = data[:1].tobytes()
    finally:
        ab.set_memory_limit("cpu", 0)


def test_a_misaligned_load_is_copied_outside_a_pool_a_malformed_limit_fails():
    """A malformed AB_MEMORY_LIMIT fails every pool allocation (pools.md);
    a load, which Dask cannot report failing, copies outside the pool
    instead, and the process's next allocation still says what is wrong."""
    code = textwrap.dedent("""
        import numpy as np, arraybridge as ab
        data = np.arange(1 << 12, dtype=np.float32)
        buf = bytearray(data.nbytes + 1)
        view = memoryview(buf)[1:]
        view[:] = data.tobytes()
        m = ab._arraybridge._rebuild_tensor(view, "float32", (1 << 12,), False, "cpu:0")
        assert m.copied and m.data_ptr % 64 == 0, m
        np.testing.assert_array_equal(np.from_dlpack(m), data)
        try:
            ab.to_device(data, "cpu", copy=True)
        except Exception as e:
            print("refused:", type(e).__name__, e)
    """)
    env = dict(os.environ, AB_MEMORY_LIMIT="cpu=lots")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and 'size "lots" is not a byte count' in r.stdout, r.stdout
    assert 'size "lots" is not a byte count' in r.stderr, r.stderr  # logged
    if n_devices("opencl") >= 1:  # a device tensor too: placed on the device it cannot be, it stays in host memory
        code = textwrap.dedent("""
            import pickle, sys, warnings, numpy as np, arraybridge as ab
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                u = pickle.loads(sys.stdin.buffer.read())
            assert u.device == "cpu:0" and "could not be placed on opencl:0" in str(w[0].message), (u, w)
            np.testing.assert_array_equal(np.from_dlpack(u), np.arange(8, dtype=np.float32))
            print("ok")
        """)
        blob = pickle.dumps(ab.to_device(np.arange(8, dtype=np.float32), "opencl:0"))
        r = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == b"ok", r.stderr.decode()[-2000:]


def test_a_load_checks_the_dtype_whichever_memory_it_takes():
    """A forged pickle's dtype is refused by the library's rules, whether
    the payload is adopted or copied (an adopted one was taken unchecked,
    and after the copy outside the pool took any refusal, so was a
    copied one: review)."""
    rebuild = ab._arraybridge._rebuild_tensor
    # a code DLPack does not have, a 16-bit bool, a 24-bit float, an opaque handle
    for dtype, kind in (((200, 64, 1), ValueError), ((6, 16, 1), ValueError), ((2, 24, 1), ValueError),
                        ((3, 64, 1), BufferError)):
        for make in (bytes, bytearray):  # copied, adopted
            with pytest.raises(kind):
                rebuild(make(2 * dtype[1] // 8), dtype, (2,), False, "cpu:0")


def test_a_misaligned_load_the_host_has_no_room_for_says_so():
    """Outside the pool too there is no room (the address space capped):
    a MemoryError with both refusals, and nothing else printed."""
    code = textwrap.dedent("""
        import os, resource, arraybridge as ab
        n = 64 << 20
        buf = bytearray(n + 1)
        view = memoryview(buf)[1:]
        ab.set_memory_limit("cpu", 4096)
        vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vm + (16 << 20), resource.RLIM_INFINITY))
        try:
            ab._arraybridge._rebuild_tensor(view, "float32", (n // 4,), False, "cpu:0")
        except MemoryError as e:
            print("refused:", e)
    """)
    env = dict(os.environ, OCL_ICD_VENDORS="/nonexistent")  # no driver threads in the capped address space
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused: out of host memory copying a 67108864-byte buffer outside the pool" in r.stdout, r.stdout
    assert "the memory limit would be exceeded" in r.stdout and r.stderr == "", r.stderr


def test_shapes_layouts_and_flags():
    base = sample("int32", (6, 8))
    for view in (base[::2, 1::3], base[::-1], base.T):
        u = pickle.loads(pickle.dumps(ab.from_dlpack(view), protocol=5))
        np.testing.assert_array_equal(np.from_dlpack(u), view)
        expect, st = 1, []
        for n in reversed(view.shape):
            st.insert(0, expect)
            expect *= n
        assert u.strides == tuple(st)  # strided views travel compact
    z = pickle.loads(pickle.dumps(ab.from_dlpack(np.array(2.5)), protocol=5))
    assert z.shape == () and np.from_dlpack(z) == 2.5
    e = pickle.loads(pickle.dumps(ab.from_dlpack(np.zeros((0, 4), np.uint16)), protocol=5))
    assert e.shape == (0, 4) and e.dtype == "uint16"
    ro = base.copy()
    ro.flags.writeable = False
    r = pickle.loads(pickle.dumps(ab.from_dlpack(ro)))
    assert r.readonly and not np.from_dlpack(r).flags.writeable
    assert not pickle.loads(pickle.dumps(ab.to_device(base, "cpu"))).readonly


def test_device_tensors_travel_as_bytes_and_land_on_their_device():
    opencl(2)
    a = sample("float32", (17, 9))
    g = ab.to_device(a, "opencl:1", dtype="float64")
    with pytest.raises(BufferError, match="opencl"):
        memoryview(g)
    u = pickle.loads(pickle.dumps(g, protocol=5))
    assert u.device == "opencl:1" and u.dtype == "float64"
    np.testing.assert_array_equal(np.from_dlpack(ab.to_device(u, "cpu")), a.astype(np.float64))


def test_a_process_without_the_device_gets_host_memory_or_an_error_when_asked():
    opencl(1)
    a = sample("int16", (4, 6))
    blob = pickle.dumps(ab.to_device(a, "opencl:0"), protocol=5)
    code = ("import pickle, sys, numpy as np, arraybridge as ab\n"
            "u = pickle.loads(sys.stdin.buffer.read())\n"
            "print(u.device, np.from_dlpack(u).tobytes().hex())\n")
    env = dict(os.environ, OCL_ICD_VENDORS="/nonexistent", OCL_ICD_FILENAMES="")
    r = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    device, data = r.stdout.decode().split()
    assert device == "cpu:0" and bytes.fromhex(data) == a.tobytes()
    env["AB_UNPICKLE_MISSING_DEVICE"] = "fail"
    r = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, env=env, timeout=120)
    assert r.returncode != 0 and b"AB_UNPICKLE_MISSING_DEVICE=fail" in r.stderr


def test_the_missing_device_rule_warns_about_a_value_it_does_not_know(monkeypatch):
    rebuild = ab._arraybridge._rebuild_tensor
    data = np.arange(4, dtype=np.float32).tobytes()
    for value in ("", "host"):
        monkeypatch.setenv("AB_UNPICKLE_MISSING_DEVICE", value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert rebuild(data, "float32", (4,), False, "opencl:99").device == "cpu:0"
    monkeypatch.setenv("AB_UNPICKLE_MISSING_DEVICE", "FAIL")  # a typo: warned, and the default used
    with pytest.warns(RuntimeWarning, match='AB_UNPICKLE_MISSING_DEVICE="FAIL" ignored: want host or fail'):
        u = rebuild(data, "float32", (4,), False, "opencl:99")
    assert u.device == "cpu:0" and np.from_dlpack(u).tobytes() == data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning made an error leaves nothing behind
        with pytest.raises(RuntimeWarning):
            rebuild(data, "float32", (4,), False, "opencl:99")
    monkeypatch.setenv("AB_UNPICKLE_MISSING_DEVICE", "fail")
    with pytest.raises(ValueError, match="AB_UNPICKLE_MISSING_DEVICE=fail"):
        rebuild(data, "float32", (4,), False, "opencl:99")


def test_a_device_with_no_room_for_an_unpickled_tensor_leaves_it_in_host_memory(monkeypatch):
    """A device tensor arriving where the device is full (its pool's
    limit): a MemoryError while Dask receives a transfer left the task
    waiting for ever (exhaustion probe). It stays in host memory, warned
    about, as for a missing device; AB_UNPICKLE_MISSING_DEVICE=fail raises
    the MemoryError."""
    opencl(1)
    a = np.arange(1 << 16, dtype=np.float32)
    blob = pickle.dumps(ab.to_device(a, "opencl:0"), protocol=5)
    monkeypatch.delenv("AB_UNPICKLE_MISSING_DEVICE", raising=False)
    ab.empty_cache("opencl:0")  # the exported tensor's block, which a load would take whatever the limit
    before = ab.memory_stats("opencl:0")["in_use_bytes"]["current"]
    ab.set_memory_limit("opencl:0", 4096)
    try:
        with pytest.warns(RuntimeWarning, match="stays in host memory: it could not be placed on opencl:0 .*out of memory"):
            u = pickle.loads(blob)
        assert u.device == "cpu:0"
        np.testing.assert_array_equal(np.from_dlpack(u), a)
        monkeypatch.setenv("AB_UNPICKLE_MISSING_DEVICE", "fail")
        with pytest.raises(MemoryError, match="opencl:0"):
            pickle.loads(blob)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the warning made an error: raised, nothing left behind
            monkeypatch.delenv("AB_UNPICKLE_MISSING_DEVICE")
            with pytest.raises(RuntimeWarning):
                pickle.loads(blob)
    finally:
        ab.set_memory_limit("opencl:0", 0)
    assert ab.memory_stats("opencl:0")["in_use_bytes"]["current"] == before
    assert pickle.loads(blob).device == "opencl:0"


@pytest.mark.parametrize("device", ["opencl_host:0", "opencl_host:9"])
def test_a_pickle_naming_the_staging_memory_is_refused_whatever_the_id(device):
    with pytest.raises(ValueError, match="staging memory, which no tensor is ever on"):
        ab._arraybridge._rebuild_tensor(b"\0" * 8, "float32", (2,), False, device)


@pytest.mark.parametrize("protocol", [2, 5])
def test_dtypes_without_a_common_name_round_trip(protocol):
    # float8 (as JAX's ml_dtypes makes them) and multi-lane dtypes have names
    # that older versions do not read back: they travel as (code, bits, lanes).
    rebuild = ab._arraybridge._rebuild_tensor
    payload = bytes(range(48))
    for code_bits_lanes, shape, name in (((10, 8, 1), (6, 8), "float8_e4m3fn(bits 8)"),
                                         ((2, 32, 4), (3,), "float32x4"), ((2, 16, 1), (24,), "float16")):
        t = rebuild(payload, code_bits_lanes, shape, False, "cpu:0")
        assert t.dtype == name
        u = pickle.loads(pickle.dumps(t, protocol=protocol))
        assert u.dtype == name and u.shape == shape
        assert bytes(ab.byte_view(u)) == payload
    # out of band, such a tensor's own memory travels (through byte_view)
    bufs = []
    stream = pickle.dumps(t8 := rebuild(bytearray(payload), (10, 8, 1), (6, 8), False, "cpu:0"), protocol=5,
                          buffer_callback=bufs.append)
    assert addr(np.frombuffer(bufs[0].raw(), np.uint8)) == t8.data_ptr
    assert pickle.loads(stream, buffers=bufs).data_ptr == t8.data_ptr
    # a common dtype still travels by name, which older versions read; a
    # float8 format as its tuple, though newer versions read its name too
    # (versions before that refused the name)
    assert t.__reduce_ex__(2)[1][1] == "float16"
    assert t8.__reduce_ex__(2)[1][1] == (10, 8, 1)


def test_a_pickled_dtype_tuple_is_checked():
    rebuild = ab._arraybridge._rebuild_tensor
    for bad in ((2, 4, 1), (2, 0, 1), (2, 32, 0), (300, 8, 1), (2, 32, 70000), (-1, 8, 1)):
        with pytest.raises(ValueError, match="whole bytes"):
            rebuild(b"\0" * 8, bad, (1,), False, "cpu:0")
    with pytest.raises(TypeError):
        rebuild(b"\0" * 8, (2, 32), (1,), False, "cpu:0")
    # a sub-byte format by name is no more taken than by tuple: its bytes
    # would count as 0, and an empty payload would pass for any shape
    for name in ("float4_e2m1fn", "float6_e2m3fn", "float4_e2m1fn(bits 4)"):
        with pytest.raises(ValueError, match="whole bytes"):
            rebuild(bytearray(), name, (1 << 24,), False, "cpu:0")


def test_a_damaged_pickle_is_refused():
    from arraybridge._arraybridge import _rebuild_tensor
    with pytest.raises(ValueError, match="bytes"):
        _rebuild_tensor(b"\0" * 7, "float32", (2,), False, "cpu:0")
    with pytest.raises(ValueError):
        _rebuild_tensor(b"", "float32", (-1,), False, "cpu:0")
    with pytest.raises(ValueError):
        _rebuild_tensor(b"", "float32", (0,), False, "nodevice:0")


def test_a_forged_pickle_is_refused_before_anything_is_allocated():
    rebuild = ab._arraybridge._rebuild_tensor
    before = ab.memory_stats("cpu:0")
    with pytest.raises(ValueError, match="do not match"):
        rebuild(b"\0" * 4, "float32", (1 << 40,), False, "cpu:0")
    with pytest.raises(ValueError, match="do not match"):
        rebuild(b"\0" * 8, "float64", (1 << 62, 1 << 62), False, "cpu:0")
    with pytest.raises(ValueError, match="do not match"):
        rebuild(b"", "float32", (3,), False, "cpu:0")
    assert ab.memory_stats("cpu:0")["allocations"] == before["allocations"]
    ok = rebuild(b"\0" * 0, "float32", (0, 5), False, "cpu:0")
    assert ok.shape == (0, 5)


def run_ok_or_fail_on_hang(code, hung):
    """Runs code in a new Python process and session (on a hang, a pool's
    children are killed with it); it must print "ok" and exit 0. A run past
    240 s fails the test with `hung`."""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        p.communicate()
        pytest.fail(hung)
    assert p.returncode == 0 and out.strip() == "ok", (p.returncode, out, err[-2000:])


def test_a_child_forked_after_pyclesperanto_started_opencl_refuses_it_instead_of_hanging():
    """pyclesperanto starts the OpenCL driver at its import, with no
    arraybridge call in the parent at all; a forked child's first OpenCL
    transfer waited for ever on the driver's threads, left in the parent.
    Now the child has no OpenCL devices and says why; host moves work."""
    opencl(1)
    pytest.importorskip("pyclesperanto")
    code = """
import multiprocessing as mp, numpy as np, arraybridge as ab
import pyclesperanto
def work(_):
    try:
        ab.to_device(np.ones(2, np.float32), "opencl:0")
        refused = ""
    except ValueError as e:
        refused = str(e)
    return refused, float(np.asarray(ab.to_device(np.arange(4.0), "cpu", dtype="float32")).sum())
if __name__ == "__main__":
    with mp.get_context("fork").Pool(1) as pool:
        refused, total = pool.apply(work, (0,))
    assert "by another library" in refused and "spawn" in refused, refused
    assert total == 6.0
    assert float(np.asarray(ab.to_device(ab.to_device(np.arange(4.0), "opencl:0"), "cpu")).sum()) == 6.0
    print("ok")
"""
    run_ok_or_fail_on_hang(code, "a child forked after pyclesperanto's import hung on OpenCL")


def test_a_child_forked_while_another_thread_imports_pyclesperanto_refuses_opencl():
    """pyclesperanto starts the OpenCL driver partway through its import; a
    fork while another thread was still importing it (its spec marked
    _initializing, which this test sets after a finished import, as that
    thread would leave it) made no note, and the child waited for ever in
    its first OpenCL transfer."""
    opencl(1)
    pytest.importorskip("pyclesperanto")
    code = """
import os, signal, numpy as np, arraybridge as ab
import pyclesperanto
pyclesperanto.__spec__._initializing = True  # as another thread's import leaves it, mid-way
pid = os.fork()
if pid == 0:
    signal.alarm(60)
    try:
        ab.to_device(np.ones(2, np.float32), "opencl:0")
        os._exit(3)
    except ValueError as e:
        os._exit(0 if "by another library" in str(e) else 4)
pyclesperanto.__spec__._initializing = False
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, ("child hung or went on", status)
print("ok")
"""
    run_ok_or_fail_on_hang(code, "a child forked during pyclesperanto's import hung on OpenCL")


def test_a_forked_pool_gets_opencl_tensors_in_host_memory_instead_of_hanging():
    """multiprocessing forks by default on Linux. A child forked after
    OpenCL started has no driver threads, and its first OpenCL call waited
    for ever; now the child has no OpenCL devices (a clear error), so an
    OpenCL tensor sent to it stays in host memory, as for any machine
    without its device."""
    opencl(1)
    code = """
import multiprocessing as mp, numpy as np, arraybridge as ab
def work(t):
    try:
        ab.to_device(np.ones(2, np.float32), "opencl:0")
        refused = ""
    except ValueError as e:
        refused = str(e)
    return t.device, float(np.asarray(ab.to_device(t, "cpu")).sum()), refused
if __name__ == "__main__":
    t = ab.to_device(np.arange(6, dtype=np.float32), "opencl:0")
    with mp.get_context("fork").Pool(2) as pool:
        for device, total, refused in pool.map(work, [t, t]):
            assert (device, total) == ("cpu:0", 15.0), (device, total)
            assert "this process was forked from it" in refused and "spawn" in refused, refused
    assert float(np.asarray(ab.to_device(t, "cpu")).sum()) == 15.0  # the parent's OpenCL still works
    # AB_UNPICKLE_MISSING_DEVICE=fail: the error says why the device is missing
    import os, pickle
    os.environ["AB_UNPICKLE_MISSING_DEVICE"] = "fail"
    with mp.get_context("fork").Pool(1) as pool:
        try:
            pool.apply(pickle.loads, (pickle.dumps(t),))
        except ValueError as e:
            assert "AB_UNPICKLE_MISSING_DEVICE=fail" in str(e) and "forked" in str(e), e
        else:
            raise AssertionError("the fail mode loaded the tensor")
    print("ok")
"""
    run_ok_or_fail_on_hang(code, "a forked child hung on OpenCL")
