"""Tensors through Dask distributed: the serializers (a header and the
tensor's own memory as the frame), registration in either import order,
a LocalCluster of two worker processes moving Tensors between them, the
example pipeline against NumPy, and a worker killed mid-run. Every cluster
listens on loopback only, lives a bounded time and is closed in a finally.
"""
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import arraybridge as ab
from ab_support import addr, opencl

EXPECT = os.environ.get("AB_TEST_EXPECT_FRAMEWORKS") == "1"
# The example is imported by name, here and on the workers (Dask pickles
# functions by reference where it can; a worker process starts with this
# process's sys.path).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))


def need_distributed():
    try:
        import distributed  # noqa: F401
        import distributed.protocol
        return distributed.protocol
    except ImportError as e:
        if EXPECT:
            pytest.fail("distributed is not installed, but AB_TEST_EXPECT_FRAMEWORKS=1 (%s)" % e)
        pytest.skip("distributed is not installed (%s)" % e)


def run_py(code, **env):
    full = dict(os.environ)
    full.update(env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# ---- the serializers ----------------------------------------------------------------------


def test_importing_arraybridge_does_not_import_distributed_and_either_order_registers():
    need_distributed()
    out = run_py("""
        import sys, arraybridge
        print("distributed" in sys.modules, arraybridge._dask.registered())
        import distributed.protocol as dp
        print(arraybridge._dask.registered(), dp.serialize(arraybridge.empty((2,), "uint8"))[0]["serializer"])
        """)
    assert out.split() == ["False", "False", "True", "dask"]
    out = run_py("""
        import distributed.protocol as dp, arraybridge
        print(arraybridge._dask.registered(), dp.serialize(arraybridge.empty((2,), "uint8"))[0]["serializer"])
        """)
    assert out.split() == ["True", "dask"]


def test_arraybridge_imported_during_another_threads_import_of_distributed_registers():
    """distributed.protocol is in sys.modules from the start of its import,
    without dask_serialize; arraybridge imported meanwhile (in another
    thread) cannot wrap a loader already found. It registers once that
    import has finished, at the next import, and takes its hook out. An
    audit hook holds the importing thread inside distributed.protocol."""
    need_distributed()
    out = run_py("""
        import sys, threading, time
        held, go = [], threading.Event()

        def hook(event, args):
            if (event == "import" and not held and threading.current_thread().name == "dist"
                    and str(args[0]).startswith("distributed.protocol.")):
                held.append(str(args[0]))
                go.wait(30)

        sys.addaudithook(hook)
        t = threading.Thread(target=lambda: __import__("distributed.protocol"), name="dist")
        t.start()
        while not held and t.is_alive():
            time.sleep(0.005)
        assert held and not hasattr(sys.modules["distributed.protocol"], "dask_serialize"), held
        import arraybridge
        print(arraybridge._dask.registered())
        go.set()
        t.join(60)
        import distributed.protocol as dp
        print(arraybridge._dask.registered(), arraybridge._dask._hook in sys.meta_path,
              dp.serialize(arraybridge.empty((2,), "uint8"))[0]["serializer"])
        """)
    assert out.split() == ["False", "True", "False", "dask"], out


def test_the_late_registration_leaves_every_finder_to_the_import_that_triggers_it():
    """The late registration runs inside the hook's find_spec, for whatever
    import comes next: taking the hook out of sys.meta_path there must not
    make importlib skip the finder after it for that import (removed in
    place, it did: with setuptools' distutils finder absent, the built-in
    importer came next and a built-in module failed to import). A fake,
    half-imported distributed.protocol, finished before the import."""
    out = run_py("""
        import sys, types
        fake = types.ModuleType("distributed.protocol")
        fake.__spec__ = types.SimpleNamespace(_initializing=True)
        sys.modules["distributed.protocol"] = fake
        import arraybridge
        from arraybridge import _dask
        assert _dask._late and _dask._hook in sys.meta_path
        class Funcs:
            def register(self, cls):
                return lambda f: f
        fake.dask_serialize = fake.dask_deserialize = Funcs()
        fake.__spec__._initializing = False
        sys.meta_path.remove(_dask._hook)
        sys.meta_path.insert(sys.meta_path.index(__import__("importlib").machinery.BuiltinImporter), _dask._hook)
        # a built-in module not imported yet: BuiltinImporter, right after the hook, must be asked
        name = next(n for n in sorted(sys.builtin_module_names) if n not in sys.modules and n != "__main__")
        mod = __import__(name)
        print(_dask.registered(), _dask._hook in sys.meta_path, mod.__name__ == name)
        """)
    assert out.split() == ["True", "False", "True"], out


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128"]


def test_a_host_tensors_frame_is_its_own_memory_and_every_dtype_round_trips():
    dp = need_distributed()
    rng = np.random.default_rng(3)
    for dtype in DTYPES:
        a = (rng.standard_normal((5, 7)) * 50).astype(dtype)
        t = ab.to_device(a, "cpu")
        header, frames = dp.serialize(t)
        assert header["serializer"] == "dask" and len(frames) == 1
        assert addr(np.frombuffer(frames[0], np.uint8)) == t.data_ptr  # no copy on the way out
        u = dp.deserialize(header, frames)
        assert isinstance(u, ab.Tensor) and u.dtype == dtype and u.shape == (5, 7) and u.device == "cpu:0"
        np.testing.assert_array_equal(np.from_dlpack(u), a)


def test_float8_and_multi_lane_tensors_travel_and_old_headers_still_load():
    dp = need_distributed()
    payload = bytes(range(48))
    for dl, shape, name in (((10, 8, 1), (6, 8), "float8_e4m3fn(bits 8)"), ((2, 32, 4), (3,), "float32x4")):
        t = ab._arraybridge._rebuild_tensor(payload, dl, shape, False, "cpu:0")
        assert t.dldtype == dl
        header, frames = dp.serialize(t)
        u = dp.deserialize(header, frames)
        assert u.dtype == name and u.shape == shape and bytes(ab.byte_view(u)) == payload
    # a header from a sender before dldtype: the name alone
    from arraybridge import _dask
    h, f = _dask.serialize(ab.to_device(np.arange(6, dtype=np.float32), "cpu"))
    del h["dldtype"]
    np.testing.assert_array_equal(np.from_dlpack(_dask.deserialize(h, f)), np.arange(6, dtype=np.float32))


def test_0d_empty_strided_and_read_only_tensors_travel():
    dp = need_distributed()
    base = np.arange(48, dtype=np.int32).reshape(6, 8)
    ro = base.copy()
    ro.flags.writeable = False
    for a in (np.array(2.5), np.zeros((0, 4), np.uint16), base[::2, 1::3], base[::-1], base.T, ro):
        t = ab.from_dlpack(a)
        u = dp.deserialize(*dp.serialize(t))
        assert u.shape == a.shape and u.dtype == t.dtype
        np.testing.assert_array_equal(np.from_dlpack(u), a)
        assert u.readonly == (a is ro)
    # a read-only tensor's frame that is a bytes object is copied, not
    # adopted: b"\x07" is one object interpreter-wide
    from arraybridge import _dask
    header, _ = _dask.serialize(ab.to_device(np.frombuffer(b"\x07", np.uint8), "cpu"))
    assert header["readonly"]
    v = _dask.deserialize(header, [b"\x07"])
    assert v.readonly and np.from_dlpack(v)[0] == 7 and v.data_ptr != addr(np.frombuffer(b"\x07", np.uint8))


def test_opencl_tensors_come_back_on_their_device_or_on_the_host_where_there_is_none():
    dp = need_distributed()
    opencl(2)
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    g = ab.to_device(a, "opencl:1")
    u = dp.deserialize(*dp.serialize(g))
    assert u.device == "opencl:1"
    np.testing.assert_array_equal(np.from_dlpack(ab.to_device(u, "cpu")), a)
    # A process without OpenCL: the same frames land in host memory.
    header, frames = dp.serialize(g)
    blob = dp.dumps({"x": dp.to_serialize(g)})
    code = """
        import sys, numpy as np, arraybridge as ab, distributed.protocol as dp
        frames = [bytes.fromhex(h) for h in sys.stdin.read().split()]
        u = dp.loads(frames)["x"]
        print(u.device, np.from_dlpack(u).sum())
        """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], input=" ".join(bytes(f).hex() for f in blob),
                       env={**os.environ, "OCL_ICD_VENDORS": "/nonexistent", "OCL_ICD_FILENAMES": ""},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu:0", str(a.sum())]


# ---- a local cluster ---------------------------------------------------------------------------


@contextlib.contextmanager
def local_client(n_workers=2):
    """A Client of a LocalCluster of n_workers processes, one thread each,
    listening on loopback only; both closed however the block ends."""
    from distributed import Client, LocalCluster
    cl = c = None
    try:
        cl = LocalCluster(n_workers=n_workers, processes=True, threads_per_worker=1, host="127.0.0.1",
                          dashboard_address=None, silence_logs=40, death_timeout=60)
        c = Client(cl, timeout=60)
        c.wait_for_workers(n_workers, timeout=60)
        yield c
    finally:
        if c is not None:
            c.close()
        if cl is not None:
            cl.close()


@pytest.fixture(scope="module")
def client():
    need_distributed()
    with local_client() as c:
        yield c


def in_use_everywhere():
    """Bytes in use in every pool of this process (run on the workers:
    imports what it needs, refers to nothing of this module)."""
    import arraybridge
    return {d: arraybridge.memory_stats(d)["in_use_bytes"]["current"] for d in arraybridge.devices()
            if not d.startswith("cuda")}


def all_released(client, seconds=30):
    """Waits until no worker has pool memory in use; the last reading."""
    deadline = time.monotonic() + seconds
    while True:
        used = client.run(in_use_everywhere)
        if all(v == 0 for stats in used.values() for v in stats.values()) or time.monotonic() > deadline:
            return used
        time.sleep(0.2)


def test_tensors_are_scattered_made_on_one_worker_used_on_another_and_gathered(client):
    a, b = sorted(client.scheduler_info()["workers"])
    data = np.random.default_rng(7).standard_normal((64, 48)).astype(np.float32)
    [t] = client.scatter([ab.to_device(data, "cpu")], workers=[a])

    def made_on_a(t):
        return ab.to_device(t, "opencl:0" if "opencl:0" in ab.devices() else "cpu", dtype="float64", scale=2.0)

    def used_on_b(t):
        return t.device, ab.to_device(t, "cpu", permute=(1, 0))

    x = client.submit(made_on_a, t, workers=[a], pure=False)
    y = client.submit(used_on_b, x, workers=[b], pure=False)
    device, back = y.result(timeout=120)
    assert device == ("opencl:0" if "opencl:0" in ab.devices() else "cpu:0")  # back on the same device there
    np.testing.assert_array_equal(np.from_dlpack(back), (data.astype(np.float64) * 2.0).T)
    assert client.gather(t).shape == (64, 48)


def test_dask_counts_a_tensors_bytes(client):
    """Dask sizes worker memory (spilling, pausing) with dask.sizeof, which
    took sys.getsizeof's 40 bytes of a Tensor of 80 MB."""
    need_distributed()
    from dask.sizeof import sizeof
    for device in ["cpu"] + (["opencl:0"] if "opencl:0" in ab.devices() else []):
        t = ab.to_device(np.zeros((1000, 250)), device)
        assert sizeof(t) == t.nbytes == 2_000_000, device
    # a broadcast (strides of 0) holds one row, not its elements
    b = ab.to_device(np.broadcast_to(np.zeros(250), (1000, 250)), "cpu")
    assert b.strides == (0, 1) and b.nbytes == 2_000_000 and sizeof(b) == 2000
    # ... and one reversed (a negative stride spans as many bytes)
    r = ab.to_device(np.broadcast_to(np.arange(5.0)[::-1], (3, 5)), "cpu")
    assert r.strides == (0, -1) and sizeof(r) == 40
    # ... and a worker's count of a task's result
    x = client.submit(lambda: ab.to_device(np.zeros(500_000), "cpu"), pure=False)
    x.result(timeout=120)
    assert client.nbytes(summary=False)[x.key] == 4_000_000


def test_the_seed_api_and_decorators_run_inside_tasks(client):
    def task(n):
        import numpy
        import arraybridge

        @arraybridge.numpy(output_type="torch")
        def double(x):
            return x * 2

        t = arraybridge.convert_memory(numpy.arange(n, dtype=numpy.float32), "numpy", "torch")
        return double(t).numpy().sum(), arraybridge.convert_memory(t, "torch", "jax").shape

    total, shape = client.submit(task, 10, pure=False).result(timeout=120)
    assert total == 90 and shape == (10,)


def test_the_example_pipeline_equals_numpy_and_leaves_no_pool_memory_in_use(client):
    import dask_tiles as tiles
    image = tiles.synthetic_image(384, 512, seed=5)
    got = tiles.pipeline(client, image, tile=128, fan_in=3)
    np.testing.assert_allclose(got, tiles.reference(image), rtol=1e-6, atol=1e-6)
    # Every Tensor the tasks made is released: nothing in use on any worker.
    used = all_released(client)
    assert all(v == 0 for stats in used.values() for v in stats.values()), used


def test_a_worker_killed_mid_run_is_replaced_and_the_result_is_still_right():
    need_distributed()
    with local_client() as c:
        pids = c.run(os.getpid)
        victim = sorted(pids)[0]

        def slow_tile(i):
            import time
            import numpy
            import arraybridge
            time.sleep(0.05)
            return arraybridge.to_device(numpy.full((32, 32), i, numpy.float32), "cpu", dtype="float64")

        def total(*ts):
            import numpy
            return sum(float(numpy.from_dlpack(t).sum()) for t in ts)

        parts = [c.submit(slow_tile, i, pure=False) for i in range(60)]
        result = c.submit(total, *parts, pure=False)
        time.sleep(0.5)  # some done, some running
        os.kill(pids[victim], signal.SIGKILL)
        assert result.result(timeout=180) == sum(i * 32 * 32 for i in range(60))
        del parts, result
        used = all_released(c)  # the survivor and the replacement: nothing leaked
        assert all(v == 0 for stats in used.values() for v in stats.values()), used
        assert pids[victim] not in c.run(os.getpid).values()  # a new process took its place


def test_the_import_hook_wraps_only_distributed_protocol_and_never_breaks_its_import(tmp_path):
    # A stand-in distributed in a zip (one loader object serves every
    # module of the archive) whose protocol imports a sibling while it
    # loads; and one whose protocol lacks the serializer registries.
    import zipfile
    good = {
        "distributed/__init__.py": "",
        "distributed/helper.py": "X = 1\n",
        "distributed/protocol/__init__.py": textwrap.dedent("""
            from distributed import helper
            class Dispatch:
                def __init__(self):
                    self.funcs = {}
                def register(self, cls):
                    return lambda f: self.funcs.setdefault(cls, f)
            dask_serialize, dask_deserialize = Dispatch(), Dispatch()
            """),
        # and dask's sizeof, which the registration asks next: the real
        # dask need not be there (distributed needs it; this stand-in not)
        "dask/__init__.py": "",
        "dask/sizeof.py": "from distributed.protocol import Dispatch\nsizeof = Dispatch()\n",
    }
    bad = {"distributed/__init__.py": "", "distributed/protocol/__init__.py": "Y = 2\n"}
    for name, files, want in (("good.zip", good, "True 1"), ("bad.zip", bad, "False 2")):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as z:
            for f, text in files.items():
                z.writestr(f, text)
        code = """
            import sys, warnings
            sys.path.insert(0, %r)
            import arraybridge
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                import distributed.protocol as p
            print(arraybridge._dask.registered(), getattr(p, "Y", None) or len(p.dask_serialize.funcs))
            print(len(caught))
            """ % str(path)
        out = run_py(code).split()
        assert out[:2] == want.split(), out
        assert out[2] == ("0" if name == "good.zip" else "1")  # the bad one warns, and imports all the same
