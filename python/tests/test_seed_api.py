"""The seed API (the Python arraybridge's convert_memory(data, source_type,
target_type, gpu_id), decorators, stacks, cleanup) against NumPy, PyTorch,
JAX, TensorFlow and pyclesperanto (on PoCL), all on the CPU.

make test-python installs all five and sets AB_TEST_EXPECT_FRAMEWORKS=1, so
a missing one fails there instead of skipping. CuPy needs a GPU."""
import gc
import importlib.util
import itertools
import os
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import arraybridge as ab
from ab_support import n_devices, opencl

EXPECT = os.environ.get("AB_TEST_EXPECT_FRAMEWORKS") == "1"
HOST = ("numpy", "torch", "jax", "tensorflow")


def need(name):
    try:
        return __import__(name)
    except ImportError as e:
        if EXPECT:
            pytest.fail("%s is not installed, but AB_TEST_EXPECT_FRAMEWORKS=1 (%s)" % (name, e))
        pytest.skip("%s is not installed (%s)" % (name, e))


def aligned(a):
    """A copy of a whose data is 64-byte aligned (JAX and TensorFlow copy
    less aligned memory on import, which would hide a copy of ours)."""
    buf = np.empty(a.nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def jax_on_cpu():
    """JAX's CPU device as its default, for arrays these tests take as host
    arrays: where JAX has a GPU, jnp.asarray puts them there."""
    jax = need("jax")
    return jax.default_device(jax.devices("cpu")[0])


def make(fw, a):
    """An array of fw with a's values, made by fw's own call (JAX's on its
    CPU)."""
    if fw == "numpy":
        return a
    if fw == "torch":
        return need("torch").from_numpy(a)
    if fw == "jax":
        cpu = jax_on_cpu()
        import jax.numpy as jnp
        with cpu:
            return jnp.asarray(a)
    if fw == "tensorflow":
        return need("tensorflow").constant(a)
    if fw == "pyclesperanto":
        return need("pyclesperanto").push(a)
    raise AssertionError(fw)


def values(fw, x):
    """x's values as NumPy, by fw's own call."""
    if fw == "pyclesperanto":
        return need("pyclesperanto").pull(x)
    if fw in ("torch", "tensorflow"):
        return x.numpy()
    return np.asarray(x)


def ptr(x):
    if isinstance(x, np.ndarray):
        return x.ctypes.data  # NumPy's DLPack export refuses ml_dtypes' bfloat16
    return ab.from_dlpack(x).data_ptr


def dtype_of(x):
    d = x.dtype
    name = getattr(d, "name", None)
    return (name if isinstance(name, str) else str(d)).rsplit(".", 1)[-1]


# ---- names, types, errors --------------------------------------------------------


def test_import_loads_no_framework():
    code = ("import sys, arraybridge; print(sorted(m for m in ('torch', 'jax', 'tensorflow', 'pyclesperanto', "
            "'cupy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_memory_types_and_sets_are_those_of_the_seed_api():
    assert [m.value for m in ab.MemoryType] == ["numpy", "cupy", "torch", "tensorflow", "jax", "pyclesperanto"]
    assert ab.CPU_MEMORY_TYPES == frozenset({ab.MemoryType.NUMPY})
    assert ab.GPU_MEMORY_TYPES == frozenset(ab.MemoryType) - ab.CPU_MEMORY_TYPES
    assert ab.SUPPORTED_MEMORY_TYPES == frozenset(ab.MemoryType)


def test_unknown_names_raise_value_error_listing_the_valid_ones():
    a = np.zeros(3)
    for bad in (("nump", "numpy"), ("numpy", "pytorch")):
        with pytest.raises(ValueError, match="Available types: .*'numpy'.*'pyclesperanto'"):
            ab.convert_memory(a, *bad)


def test_data_of_another_framework_than_source_type_is_refused():
    with pytest.raises(ab.MemoryConversionError) as e:
        ab.convert_memory(np.zeros(3), "torch", "numpy")
    assert (e.value.source_type, e.value.target_type, e.value.method) == ("torch", "numpy", "detect_memory_type")
    assert "data is numpy, not torch" in str(e.value)
    with pytest.raises(ab.MemoryConversionError):
        ab.convert_memory([1, 2], "numpy", "numpy")


def test_memory_conversion_error_names_all_four_and_pickles():
    import pickle
    e = ab.MemoryConversionError("numpy", "torch", "m", "why")
    assert str(e) == "Cannot convert from numpy to torch using m. Reason: why"
    f = pickle.loads(pickle.dumps(e))
    assert (f.source_type, f.target_type, f.method, f.reason) == ("numpy", "torch", "m", "why")
    # re-made from its message alone, as Keras re-raises an error from a
    # layer's call (type(e)(message)): the message, not a TypeError
    for kind in (ab.MemoryConversionError, ab.OutOfMemoryError):
        g = kind("in a layer: " + str(kind("numpy", "torch", "m", "out of memory")))
        assert str(g) == "in a layer: Cannot convert from numpy to torch using m. Reason: out of memory"
        assert g.reason is None and g.method is None
        h = pickle.loads(pickle.dumps(g))
        assert type(h) is kind and str(h) == str(g)
    assert str(ab.OutOfMemoryError("no room")) == "no room (out of memory)"
    # notes (the OOM memory report) and attributes set later travel along
    for err in (ab.MemoryConversionError("numpy", "torch", "m", "why"), ab.OutOfMemoryError("no room")):
        err.add_note("pool report")
        err.step = 3
        back = pickle.loads(pickle.dumps(err))
        assert back.__notes__ == ["pool report"] and back.step == 3 and str(back) == str(err)


def test_detect_memory_type_knows_each_framework_and_refuses_the_rest():
    assert ab.detect_memory_type(np.zeros(1)) == "numpy"
    assert ab.detect_memory_type(make("torch", np.zeros(1))) == "torch"
    assert ab.detect_memory_type(make("jax", np.zeros(1))) == "jax"
    assert ab.detect_memory_type(make("tensorflow", np.zeros(1))) == "tensorflow"
    with pytest.raises(ValueError, match="Unknown memory type"):
        ab.detect_memory_type([1.0])


@pytest.mark.parametrize("fw", ["torch", "jax", "tensorflow"])
def test_a_gpu_that_does_not_exist_is_named_with_the_ids_that_do(fw):
    need(fw)
    display = {"torch": "PyTorch", "jax": "JAX", "tensorflow": "TensorFlow"}[fw]
    n = ab.MemoryType(fw)
    from arraybridge._frameworks import ADAPTERS
    ids = ADAPTERS[n].device_ids(sys.modules[fw])
    with pytest.raises(ab.MemoryConversionError, match=r"%s device 7 is unavailable; available device IDs are %s"
                       % (display, __import__("re").escape(str(ids)))):
        ab.convert_memory(np.zeros(3), "numpy", fw, gpu_id=7)


def test_without_an_opencl_loader_the_host_works_and_pyclesperanto_says_why(tmp_path):
    """No OpenCL ICD loader for arraybridge (AB_OPENCL_LIBRARY naming no
    file, as on a machine without one; pyclesperanto brings its own): the
    module imports, converts on the host, and a pyclesperanto target is
    refused with arraybridge's reason, not only "unavailable"."""
    opencl(1)
    need("pyclesperanto")
    code = """
        import numpy as np
        import arraybridge as ab
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = ab.convert_memory(a.T, "numpy", "numpy")
        assert b.shape == (4, 3) and (b == a.T).all()
        assert not any(d.startswith("opencl") for d in ab.devices()), ab.devices()
        try:
            ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=0)
        except ab.MemoryConversionError as e:
            print(e)
        else:
            raise SystemExit("converted to pyclesperanto without an OpenCL loader")
    """
    env = dict(os.environ, AB_OPENCL_LIBRARY=str(tmp_path / "no-such-dir" / "libOpenCL.so.1"))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pyclesperanto device 0 is unavailable" in r.stdout, r.stdout + r.stderr
    assert "the framework has it, arraybridge does not" in r.stdout, r.stdout + r.stderr
    assert "ICD loader" in r.stdout and "could not be opened" in r.stdout, r.stdout + r.stderr


def test_pyclesperanto_without_a_backend_is_refused_with_the_reason(tmp_path):
    """No OpenCL driver registered at all (OCL_ICD_VENDORS naming an empty
    folder): pyclesperanto imports but, finding no backend, leaves its
    device functions out of the module. A conversion to it, with or without
    a gpu_id, and a decorated call are MemoryConversionError saying so, not
    an AttributeError from inside arraybridge."""
    need("pyclesperanto")
    code = """
        import warnings
        warnings.simplefilter("ignore")
        import numpy as np
        import arraybridge as ab
        import pyclesperanto as cle
        if hasattr(cle, "list_available_devices"):
            raise SystemExit(77)  # pyclesperanto found a backend anyway (a CUDA one, say)
        @ab.pyclesperanto()
        def f(x):
            return x
        calls = [lambda: ab.convert_memory(np.zeros(3), "numpy", "pyclesperanto", gpu_id=0),
                 lambda: ab.convert_memory(np.zeros(3), "numpy", "pyclesperanto"),
                 lambda: f(np.zeros(3))]
        for call in calls:
            try:
                call()
            except ab.MemoryConversionError as e:
                print(e)
            else:
                raise SystemExit("converted to pyclesperanto without a backend")
        ab.cleanup_all_gpu_frameworks()
    """
    (tmp_path / "vendors").mkdir()
    env = dict(os.environ, OCL_ICD_VENDORS=str(tmp_path / "vendors"), OCL_ICD_FILENAMES="")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=240)
    if r.returncode == 77:
        pytest.skip("pyclesperanto found a backend with no OpenCL driver registered (another of its backends)")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3, r.stdout + r.stderr
    for line in lines:
        assert "pyclesperanto device 0 is unavailable; available device IDs are ()" in line, line
        assert "has no backend: its OpenCL backend could load no OpenCL driver" in line, line
        assert str(tmp_path / "vendors") in line, line


def test_bool_and_negative_gpu_ids_are_refused_not_taken_as_devices():
    """True and False are ints to Python: taken, they would send data to
    device 1 or 0 without a word; -1 is the C core's "device with most free
    memory", not a device the seed API names."""
    opencl(2)
    need("pyclesperanto")
    a = np.arange(6, dtype=np.float32)
    for target, display in (("pyclesperanto", "pyclesperanto"), ("torch", "PyTorch")):
        need(target)
        for bad in (True, False):
            with pytest.raises(ab.MemoryConversionError, match="gpu_id must be an int or None, not %s" % bad):
                ab.convert_memory(a, "numpy", target, gpu_id=bad)
        with pytest.raises(ab.MemoryConversionError, match="%s device -1 is unavailable" % display):
            ab.convert_memory(a, "numpy", target, gpu_id=-1)


def test_device_lists_are_read_once_per_process_and_again_in_a_forked_child():
    """convert_memory checks a gpu_id against arraybridge's devices and
    pyclesperanto's, listed once per process (they do not change while it
    runs); a child forked after OpenCL started has no OpenCL devices, and
    must not see its parent's list. An empty list is not kept."""
    opencl(1)
    code = """
import os, numpy as np, arraybridge as ab
from arraybridge import _frameworks as F
ab.to_device(np.ones(2, np.float32), "opencl:0")  # OpenCL started here
first = F.our_devices()
assert first == frozenset(ab.devices()) and "opencl:0" in first, first
assert F.our_devices() is first
pid = os.fork()
if pid == 0:
    names = F.our_devices()
    os._exit(0 if names == frozenset(ab.devices()) and "opencl:0" not in names else 3)
assert os.waitpid(pid, 0)[1] == 0
try:
    import pyclesperanto as cle
except ImportError:
    cle = None
P = F.ADAPTERS[ab.MemoryType.PYCLESPERANTO]
if cle is not None:
    ids = P.gpu_ids(cle)
    assert ids == tuple(range(len(cle.list_available_devices()))) and P.gpu_ids(cle) is ids
# a module without devices yet (its importing thread asking mid-import)
# is asked again next time, not remembered as having none
import types
half = types.ModuleType("half")
assert P.gpu_ids(half) == ()
half.list_available_devices = lambda: ["a", "b"]
assert P.gpu_ids(half) == (0, 1)
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stdout, p.stderr[-2000:])


def test_a_package_imported_again_keeps_one_import_hook_and_the_current_device_lists():
    """Taking the package's modules out of sys.modules and importing them
    again (as some test runners and notebooks do) added a Dask import hook
    and a pair of fork hooks each time, each keeping its old module alive
    (a probe: about 280 objects and 225 KB an import). One hook now, and
    the fork hooks, registered once, reset the device lists of the
    package as imported now."""
    opencl(1)
    code = """
import gc, os, sys, numpy as np
import arraybridge as ab
for k in range(20):
    for name in [m for m in sys.modules if m.startswith("arraybridge") and m != "arraybridge._arraybridge"]:
        del sys.modules[name]
    import arraybridge as ab
    ab.to_device(np.ones(4, np.float32), "opencl:0")
hooks = [f for f in sys.meta_path if type(f).__qualname__ == "_WhenImported"]
assert len(hooks) <= 1, hooks
from arraybridge import _frameworks as F
assert "opencl:0" in F.our_devices()
pid = os.fork()
if pid == 0:  # OpenCL started in the parent: the child's list is its own, without it
    os._exit(0 if "opencl:0" not in F.our_devices() else 3)
assert os.waitpid(pid, 0)[1] == 0
# out of sys.modules at the fork, after pyclesperanto started OpenCL: the
# parent's note is still made, so the child is told, not left hanging in
# the driver (a review: the hook did nothing without the module)
import pyclesperanto as cle
cle.push(np.ones(4, np.float32))
for name in [m for m in sys.modules if m.startswith("arraybridge")]:
    del sys.modules[name]
pid = os.fork()
if pid == 0:
    import arraybridge as again
    try:
        again.to_device(np.ones(4, np.float32), "opencl:0")
        os._exit(4)
    except ValueError as e:
        os._exit(0 if "started in process" in str(e) else 5)
assert os.waitpid(pid, 0)[1] == 0
print("ok")
"""
    need("pyclesperanto")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and p.stdout.strip() == "ok", (p.returncode, p.stdout, p.stderr[-2000:])


@pytest.mark.parametrize("target", ["torch", "pyclesperanto"])
def test_a_conversion_waits_for_another_threads_import_of_its_framework(target):
    """The seed's pattern is a pool of threads converting at once: the first
    to name a framework imports it, and a module is in sys.modules from the
    start of its import. Another thread's conversion must wait for that
    import, not take the half-made module (AttributeError, or pyclesperanto
    "without devices"). An audit hook holds the importing thread inside its
    import until the other thread has started its conversion."""
    need(target)
    if target == "pyclesperanto":
        opencl(1)
    code = """
import sys, threading, time
import numpy as np
import arraybridge as ab
NAME = sys.argv[1]
assert NAME not in sys.modules
a = np.arange(12, dtype=np.float32).reshape(3, 4)
held, asking, results = [], threading.Event(), {}

def hook(event, args):
    # the importing thread, inside NAME's import (a submodule being found):
    # hold it there until the other thread converts, and some more
    if (event == "import" and not held and threading.current_thread().name == "first"
            and str(args[0]).startswith(NAME + ".")):
        held.append(str(args[0]))
        asking.wait(60)
        time.sleep(0.5)

sys.addaudithook(hook)

def convert(who):
    try:
        out = ab.convert_memory(a, "numpy", NAME)
        results[who] = np.asarray(out.cpu() if NAME == "torch" else out.get())
    except BaseException as e:
        results[who] = e

first = threading.Thread(target=convert, args=("first",), name="first")
first.start()
deadline = time.monotonic() + 120
while not held and first.is_alive() and time.monotonic() < deadline:
    time.sleep(0.005)
assert held, "the first thread's import was never held: %r" % (results,)
mod = sys.modules[NAME]
assert mod.__spec__._initializing, "held, but the import is not in progress"
second = threading.Thread(target=convert, args=("second",), name="second")
second.start()
time.sleep(0.05)
asking.set()
second.join(180)
first.join(180)
for who in ("first", "second"):
    r = results.get(who)
    assert isinstance(r, np.ndarray) and np.array_equal(r, a), (who, r)
print("ok", held[0])
"""
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), target], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stdout, r.stderr[-3000:])


def test_unhashable_memory_type_names_are_value_errors_naming_the_valid_ones():
    a = np.zeros(3)
    for bad in ([], {}):
        with pytest.raises(ValueError, match=r"Invalid source_type .*Available types: \['cupy'"):
            ab.convert_memory(a, bad, "numpy")
        with pytest.raises(ValueError, match=r"Invalid target_type .*Available types"):
            ab.convert_memory(a, "numpy", bad)
        with pytest.raises(ValueError, match=r"Invalid memory_type .*Available types"):
            ab.stack_slices([a], bad)


def test_numpy_ignores_gpu_id_and_returns_the_same_array():
    a = np.arange(4.0)
    assert ab.convert_memory(a, "numpy", "numpy", gpu_id=3) is a


# ---- every pair of the CPU frameworks ---------------------------------------------

# dtypes each pair carries as they are (JAX without x64 has no 64-bit types).
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float16", "bfloat16", "float32",
          "float64"]


def supported(fw, dtype):
    if fw == "jax" and dtype in ("int64", "uint64", "float64"):
        return False
    return True


def source_array(dtype, shape=(3, 4)):
    rng = np.random.default_rng(7)
    if dtype == "bool":
        return aligned(rng.integers(0, 2, shape).astype(bool))
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return aligned(rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dtype))
    return aligned(rng.standard_normal(shape).astype(dtype))


def make_bfloat16(fw, a32):
    """fw's bfloat16 array of float32 values a32, by fw's own cast
    (NumPy's: ml_dtypes', which JAX and TensorFlow install)."""
    if fw == "numpy":
        return aligned(a32.astype(need("ml_dtypes").bfloat16))
    if fw == "torch":
        return need("torch").from_numpy(a32).to(need("torch").bfloat16)
    if fw == "jax":
        import jax.numpy as jnp
        with jax_on_cpu():
            return jnp.asarray(a32, dtype=jnp.bfloat16)
    tf = need("tensorflow")
    return tf.cast(tf.constant(a32), tf.bfloat16)


@pytest.mark.parametrize("src,dst", list(itertools.product(HOST, HOST)))
def test_every_pair_of_host_frameworks_is_zero_copy_with_every_dtype(src, dst):
    for name in {src, dst} - {"numpy"}:
        need(name)
    for dtype in DTYPES:
        if not (supported(src, dtype) and supported(dst, dtype)):
            continue
        if dtype == "bfloat16":  # NumPy's: ml_dtypes' (NumPy has none of its own)
            a = source_array("float32")
            x = make_bfloat16(src, a)
            want = ab.convert_memory(x, src, "numpy", dtype="float32")
        else:
            a = source_array(dtype)
            x = make(src, a)
            want = a
        y = ab.convert_memory(x, src, dst)
        assert ab.detect_memory_type(y) == dst
        assert dtype_of(y) == dtype, (src, dst, dtype)
        got = values(dst, y) if dtype != "bfloat16" else ab.convert_memory(y, dst, "numpy", dtype="float32")
        np.testing.assert_array_equal(got, want)
        assert ptr(y) == ptr(x), "%s -> %s (%s) copied" % (src, dst, dtype)


@pytest.mark.parametrize("dst", HOST)
def test_zero_d_empty_strided_and_reversed_numpy_sources(dst):
    need(dst) if dst != "numpy" else None
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for a in (np.array(3.5, np.float32), np.zeros((0, 3), np.float32), base[:, ::2], base[::-1], base.T,
              base[::-2, ::-3]):
        y = ab.convert_memory(a, "numpy", dst)
        got = values(dst, y)
        assert got.shape == a.shape and got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)


def test_a_writable_broadcast_reaches_torch_as_a_view_with_its_zero_stride():
    """Strides of 0 are not negative: PyTorch takes them, so the array is
    shared, not copied (a read-only one PyTorch copies anyway)."""
    torch = need("torch")
    base = np.arange(3, dtype=np.float32)
    b = np.lib.stride_tricks.as_strided(base, (4, 3), (0, 4), writeable=True)
    y = ab.convert_memory(b, "numpy", "torch")
    assert y.stride() == (0, 1) and y.data_ptr() == base.ctypes.data
    np.testing.assert_array_equal(y.numpy(), b)
    assert isinstance(y, torch.Tensor)


def test_conversion_keywords_apply_in_the_same_move():
    need("torch")
    need("jax")
    frame = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    t = ab.convert_memory(frame, "numpy", "torch", dtype="float32", permute=(2, 0, 1), channel_axis=2,
                          channel_scale=[1, 0.5, 2], channel_offset=[0, 1, -1])
    want = np.transpose(frame.astype(np.float32) * np.array([1, 0.5, 2], np.float32) + np.array([0, 1, -1],
                        np.float32), (2, 0, 1))
    np.testing.assert_array_equal(t.numpy(), want)
    j = ab.convert_memory(t, "torch", "jax", scale=2, offset=1)
    np.testing.assert_array_equal(np.asarray(j), want * 2 + 1)


def test_keywords_take_numpy_arrays_and_refuse_numbers_written_as_strings():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    # An array as permute, with no other keyword: each keyword is tested
    # by identity, not by == (an elementwise comparison for an array).
    np.testing.assert_array_equal(ab.convert_memory(a, "numpy", "numpy", permute=np.array([1, 0])), a.T)
    np.testing.assert_array_equal(
        ab.convert_memory(a, "numpy", "numpy", channel_axis=1, channel_scale=np.array([1, 2, 3])), a * [1, 2, 3])
    # Numbers, not text that reads as one (as to_device: TypeError).
    for kw in (dict(scale="2"), dict(offset=b"1"), dict(channel_axis=1, channel_scale=["1", "2", "3"]),
               dict(channel_axis=1, channel_offset="123")):
        with pytest.raises(ab.MemoryConversionError, match="must be a real number") as e:
            ab.convert_memory(a, "numpy", "numpy", **kw)
        assert isinstance(e.value.__cause__, TypeError)
        with pytest.raises(TypeError):
            ab.to_device(a, "cpu", **kw)
    # What the core takes as a number (__float__ or __index__) and nothing
    # else: float() would read a memoryview's text, and complex fails there
    # with another message.
    for kw in (dict(scale=memoryview(b"2")), dict(offset=1j), dict(channel_axis=1, channel_scale=[1, 2, 3j])):
        with pytest.raises(ab.MemoryConversionError, match="must be a real number, not") as e:
            ab.convert_memory(a, "numpy", "numpy", **kw)
        assert isinstance(e.value.__cause__, TypeError)
    np.testing.assert_array_equal(ab.convert_memory(a, "numpy", "numpy", scale=True, offset=np.int8(1)), a + 1)

    class Odd(float):  # a float's value is its value, whatever its __float__ says (as in C)
        def __float__(self):
            return 5.0

    np.testing.assert_array_equal(ab.convert_memory(a, "numpy", "numpy", scale=Odd(2.0)), a * 2)
    np.testing.assert_array_equal(np.from_dlpack(ab.to_device(a, "cpu", scale=Odd(2.0))), a * 2)
    # Sequences where the core wants one: a set has no order, a generator
    # no length, a float no items.
    import types
    for kw in (dict(permute={1, 0}), dict(permute=(i for i in (1, 0))), dict(channel_axis=1, channel_scale=2.0),
               dict(permute=types.MappingProxyType({1: 0, 0: 1})), dict(permute=np.array(1)),
               dict(channel_axis=1, channel_scale=np.array(2.0))):
        with pytest.raises(ab.MemoryConversionError, match="must be a sequence") as e:
            ab.convert_memory(a, "numpy", "numpy", **kw)
        assert isinstance(e.value.__cause__, TypeError)
        with pytest.raises(TypeError, match="must be a sequence"):
            ab.to_device(a, "cpu", **kw)
    # A bool is an int to Python but no axis, here as in to_device (the
    # keywords were made plain ints first, and True became axis 1).
    b = np.arange(24.0).reshape(2, 3, 4)
    for kw, words in ((dict(permute=(2, True, 0)), "a permute axis must be an int, not bool"),
                      (dict(channel_axis=True, channel_scale=[1, 2, 3]), "channel_axis must be an int, not bool")):
        with pytest.raises(ab.MemoryConversionError, match=words) as e:
            ab.convert_memory(b, "numpy", "numpy", **kw)
        assert isinstance(e.value.__cause__, TypeError)
        with pytest.raises(TypeError, match=words):
            ab.to_device(b, "cpu", **kw)


def test_numpy_scalars_convert_as_their_0d_arrays():
    s = np.float32(3)
    assert ab.detect_memory_type(s) == "numpy"
    assert ab.convert_memory(s, "numpy", "numpy") is s  # same framework, no keyword: itself
    d = ab.convert_memory(s, "numpy", "numpy", dtype="float64")
    assert d.shape == () and d.dtype == np.float64 and d == 3
    torch = need("torch")  # the rest only
    t = ab.convert_memory(np.int16(-7), "numpy", "torch")
    assert t.shape == () and t.dtype == torch.int16 and int(t) == -7


def test_torch_tensors_that_require_grad_are_taken_detached():
    torch = need("torch")
    t = torch.ones(3, requires_grad=True)
    a = ab.convert_memory(t, "torch", "numpy")
    np.testing.assert_array_equal(a, np.ones(3, np.float32))


def unaligned(a):
    """A copy of a whose data is 4 bytes past a 64-byte boundary (as a NumPy
    slice such as x[1:] often is)."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    off = (-buf.ctypes.data) % 64 + 4
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("dst", HOST)
def test_unaligned_numpy_data_reaches_every_host_framework(dst):
    # TensorFlow aborts the process (an Eigen alignment check) on a buffer
    # that is not 64-byte aligned: such data must reach it as a copy.
    need(dst) if dst != "numpy" else None
    a = unaligned(np.arange(1, 41, dtype=np.float32).reshape(5, 8))
    assert a.ctypes.data % 64 == 4
    y = ab.convert_memory(a, "numpy", dst)
    if dst == "tensorflow":
        tf = need("tensorflow")
        assert ptr(y) % 64 == 0
        assert float(tf.reduce_sum(y * 2.0)) == float(a.sum() * 2)
    np.testing.assert_array_equal(values(dst, y), a)


def cpu_in_use_settled(expect=None):
    """The host pool's bytes in use once garbage is collected and JAX's
    threads, which may free imported buffers a moment later, are done:
    waits (up to 10 s) for expect where given, else for two equal reads."""
    deadline, last = time.monotonic() + 10, None
    while True:
        gc.collect()
        now = ab.memory_stats("cpu")["in_use_bytes"]["current"]
        if (now == expect if expect is not None else now == last) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.02)


def test_unaligned_numpy_data_reaches_jax_through_a_copy_of_ours():
    # JAX copies host memory that is not 64-byte aligned on its own, on one
    # thread; the C core's copy is faster, and JAX then shares it: the
    # result lies in the pool's memory, which stays in use while it lives.
    need("jax")
    a = unaligned(np.arange(1 << 16, dtype=np.float32))
    before = cpu_in_use_settled()
    y = ab.convert_memory(a, "numpy", "jax")
    y.block_until_ready()
    assert ab.memory_stats("cpu")["in_use_bytes"]["current"] >= before + a.nbytes
    assert ptr(y) % 64 == 0 and ptr(y) != a.ctypes.data
    np.testing.assert_array_equal(np.asarray(y), a)
    del y
    assert cpu_in_use_settled(before) == before


@pytest.mark.parametrize("case", ["unaligned float32", "aligned int64 narrowed", "unaligned int64 narrowed",
                                  "read-only int64 narrowed"])
def test_writes_to_the_source_after_a_copy_to_jax_do_not_reach_it(case):
    # JAX makes its own copies (of unaligned data; of 64-bit integers it
    # narrows, its 64-bit types off) after its import returns: a copy
    # convert_memory returns must be whole by then. 64 MiB, which JAX took
    # 30 ms or more to copy, so the writes below came first.
    jax = need("jax")
    if case == "unaligned float32":
        src = unaligned(np.arange(1 << 24, dtype=np.float32))
    elif jax.config.jax_enable_x64:
        pytest.skip("JAX's 64-bit types are on: it keeps int64 as it is")
    else:
        place = unaligned if case.startswith("unaligned") else aligned
        src = place(np.arange(1 << 23, dtype=np.int64))
    want = np.arange(src.size).astype(np.int32 if src.dtype == np.int64 else src.dtype)
    if case.startswith("read-only"):
        src.flags.writeable = False
    y = ab.convert_memory(src, "numpy", "jax")
    src.flags.writeable = True  # a read-only view's owner may still write
    src[:] = -1
    got = np.asarray(y)
    assert got.dtype == want.dtype
    assert int((got != want).sum()) == 0


def test_read_only_numpy_data_stays_unwritten_through_torch_and_jax():
    torch = need("torch")
    need("jax")
    a = aligned(np.arange(6, dtype=np.float32))
    a.flags.writeable = False
    t = ab.convert_memory(a, "numpy", "torch")
    assert ptr(t) != a.ctypes.data  # torch has no read-only tensors: a copy
    t += 1
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(t.numpy(), a + 1)
    j = ab.convert_memory(a, "numpy", "jax")
    np.testing.assert_array_equal(np.asarray(j), a)
    assert isinstance(torch.zeros(1), torch.Tensor)


def test_jax_arrays_on_other_cpu_devices_and_over_several_convert():
    """JAX with several CPU devices (XLA_FLAGS=--xla_force_host_platform_
    device_count=N, how sharding is tried without accelerators) exports an
    array of CPU device 1 with device_id 1, where DLPack says 0; NumPy,
    torch and TensorFlow take it as host memory, and so must we (the C core
    refused it: "cpu:1 does not exist"). An array over both devices has no
    DLPack export at all: it converts as its whole value (np.asarray gives
    that too). A new process: JAX reads the flag once."""
    need("jax")
    targets = ["numpy", "torch", "tensorflow"] + (["pyclesperanto"] if n_devices("opencl") else [])
    for t in targets[1:]:
        need(t)
    code = """
import sys, numpy as np, jax, jax.numpy as jnp, arraybridge as ab
cpu1 = jax.devices("cpu")[1]
x = jax.device_put(jnp.arange(12, dtype=jnp.float32).reshape(3, 4), cpu1)
want = np.arange(12, dtype=np.float32).reshape(3, 4)
assert x.__dlpack__().__class__.__name__ == "PyCapsule"
t = ab.to_device(x, "cpu")
assert t.device == "cpu:0" and np.asarray(t).ctypes.data == x.unsafe_buffer_pointer(), t  # a view
n = ab.convert_memory(x, "jax", "numpy")
assert n.ctypes.data == x.unsafe_buffer_pointer() and np.array_equal(n, want)
np.testing.assert_array_equal(ab.convert_memory(x, "jax", "numpy", dtype="float64"), want)
np.testing.assert_array_equal(ab.convert_memory(x.T, "jax", "numpy"), want.T)
for target in sys.argv[1:]:
    r = ab.convert_memory(x, "jax", target)
    back = ab.convert_memory(r, target, "numpy")
    np.testing.assert_array_equal(back, want, err_msg=target)
y = ab.convert_memory(x, "jax", "jax")
assert y is x
# imported as a Tensor, it is host memory (cpu:0), which is also its own target
t = ab.from_dlpack(x)
assert t.device == "cpu:0" and t.__dlpack_device__() == (1, 0), t
for c in (ab.from_dlpack(x, copy=True), ab.to_device(t, t.device, copy=True), np.from_dlpack(t, copy=True),
          ab.from_dlpack(x.__dlpack__(), copy=True), ab.to_device(x.__dlpack__(), "cpu", dtype="float64")):
    np.testing.assert_array_equal(np.asarray(c), want)

# Over both devices: JAX exports no DLPack ("only supported for unsharded
# arrays"); the whole value converts, a replicated array's from its copy
# on one device (shared), a split one gathered by JAX first.
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
want4 = np.arange(16, dtype=np.float32).reshape(4, 4)
mesh = Mesh(np.array(jax.devices("cpu")), ("x",))
split = jax.device_put(jnp.asarray(want4), NamedSharding(mesh, P("x")))
copies = jax.device_put(jnp.asarray(want4), NamedSharding(mesh, P()))
for a in (split, copies):
    try:
        a.__dlpack__()
        raise AssertionError("JAX exported an array over two devices")
    except BufferError:
        pass
    for target in ["numpy"] + sys.argv[1:]:
        r = ab.convert_memory(a, "jax", target)
        np.testing.assert_array_equal(ab.convert_memory(r, target, "numpy"), want4, err_msg=target)
    # to JAX's host memory: it is there (both devices are the host's), shards and all
    assert ab.convert_memory(a, "jax", "jax") is a
    r = ab.convert_memory(a, "jax", "jax", dtype="float64")
    assert len(r.devices()) == 1 and np.array_equal(np.asarray(r), want4)
    h = ab.convert_memory(a, "jax", "numpy", dtype="float64", permute=(1, 0))
    assert h.dtype == np.float64 and np.array_equal(h, want4.T)
    st = ab.stack_slices([a, a + 1], "numpy")
    np.testing.assert_array_equal(st, np.stack([want4, want4 + 1]))
# a failure that is not about the pieces gathers nothing first
from arraybridge import _frameworks as F
J = F.ADAPTERS[ab.MemoryType.JAX]
asked = []
J.whole = lambda obj, _w=J.whole: asked.append(obj) or _w(obj)
try:
    ab.convert_memory(split, "jax", "numpy", dtype="nonsense")
    raise AssertionError("a bad dtype converted")
except ab.MemoryConversionError as e:
    assert "nonsense" in str(e) and not asked, (e, len(asked))
del J.whole
n = ab.convert_memory(copies, "jax", "numpy")
assert n.ctypes.data in [s.data.unsafe_buffer_pointer() for s in copies.addressable_shards]  # shared, not gathered
assert not n.flags.writeable
print("ok")
"""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code] + targets[1:], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr[-3000:])


def test_arrays_without_memory_to_move_say_what_to_convert_instead():
    """Sparse, nested, meta, ragged tensors and typed PRNG keys have no
    dense memory (DLPack has no form for them): the reason names what to
    convert instead, and the framework's own error is the cause."""
    torch, tf, jax = need("torch"), need("tensorflow"), need("jax")
    cases = [
        ("torch", torch.eye(3).to_sparse(), "sparse_coo tensor has no dense memory; convert tensor.to_dense()"),
        ("torch", torch.eye(3).to_sparse_csr(), "sparse_csr tensor has no dense memory"),
        ("torch", torch.empty(2, device="meta"), "meta device has a shape and a dtype but no data"),
        ("torch", torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "to_padded_tensor"),
        ("tensorflow", tf.ragged.constant([[1], [2, 3]]), "RaggedTensor has rows of different lengths"),
        ("tensorflow", tf.sparse.from_dense(tf.eye(2)), "tf.sparse.to_dense"),
        ("jax", jax.random.key(0), r"jax.random.key_data\(keys\)"),
    ]
    for source, data, words in cases:
        for target in ("numpy", "torch" if source != "torch" else "jax"):
            with pytest.raises(ab.MemoryConversionError, match=words) as info:
                ab.convert_memory(data, source, target)
            assert info.value.__cause__ is not None, (source, target)
    for source, data, words in cases[:2] + cases[5:6]:  # the 2-D ones, as slices
        with pytest.raises(ab.MemoryConversionError, match=words):
            ab.stack_slices([data, data], "numpy")
    # a tensor that does convert is not asked
    t = torch.eye(2)
    np.testing.assert_array_equal(ab.convert_memory(t, "torch", "numpy"), np.eye(2))


def test_torch_conjugate_and_negative_views_give_their_values():
    torch = need("torch")
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    c = z.conj()
    assert c.is_conj()
    np.testing.assert_array_equal(ab.convert_memory(c, "torch", "numpy"), np.conj(z.numpy()))
    neg = c.imag  # a view with the negative bit set
    assert neg.is_neg()
    np.testing.assert_array_equal(ab.convert_memory(neg, "torch", "numpy"), [-2.0, 4.0])
    np.testing.assert_array_equal(ab.convert_memory(neg, "torch", "numpy", dtype="float64"), [-2.0, 4.0])


def test_keywords_are_read_before_the_data_is_taken():
    # A keyword whose __float__ replaces the source tensor's storage: the
    # conversion must read the storage as it is after that, never the
    # freed one.
    torch = need("torch")

    for call in ("convert_memory", "to_device"):
        src = torch.arange(1 << 16, dtype=torch.float32)

        class Scale:
            def __float__(self):
                src.set_(torch.full((1 << 16,), 3.0))
                return 2.0

        if call == "convert_memory":
            out = ab.convert_memory(src, "torch", "numpy", scale=Scale())
        else:
            out = np.from_dlpack(ab.to_device(src, "cpu", scale=Scale()))
        np.testing.assert_array_equal(out, np.full(1 << 16, 6.0, np.float32))


def test_dtype_keyword_takes_every_frameworks_dtype_objects_and_gpu_id_numpy_ints():
    torch = need("torch")
    tf = need("tensorflow")
    need("jax")
    import jax.numpy as jnp
    a = np.arange(6, dtype=np.int32)
    for d, want in ((torch.float16, np.float16), (np.float32, np.float32), (np.dtype("uint8"), np.uint8),
                    (tf.float64, np.float64), (jnp.bfloat16, None), ("int16", np.int16)):
        y = ab.convert_memory(a, "numpy", "torch", dtype=d)
        assert dtype_of(y) == (np.dtype(want).name if want is not None else "bfloat16")
        np.testing.assert_array_equal(y.float().numpy(), a.astype(np.float32))
    with pytest.raises(ab.MemoryConversionError, match="dtype"):
        ab.convert_memory(a, "numpy", "torch", dtype=object())
    with pytest.raises(ab.MemoryConversionError, match="gpu_id must be an int"):
        ab.convert_memory(a, "numpy", "torch", gpu_id=1.0)
    opencl(2)
    g = ab.convert_memory(a.astype(np.float32), "numpy", "pyclesperanto", gpu_id=np.int64(1))
    np.testing.assert_array_equal(values("pyclesperanto", g), a)


def test_pyclesperanto_refuses_shapes_it_has_no_arrays_for():
    opencl(1)
    need("pyclesperanto")
    for a in (np.array(2.0, np.float32), np.zeros((0, 3), np.float32), np.zeros((2, 2, 2, 2), np.float32)):
        with pytest.raises(ab.MemoryConversionError, match="1 to 3 dimensions"):
            ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=0)
    # stack_slices too (pyclesperanto made a (1, 2) array of empty slices,
    # which convert_into then refused as a shape mismatch)
    with pytest.raises(ab.MemoryConversionError, match="1 to 3 dimensions"):
        ab.stack_slices([np.zeros((0, 2), np.float32)], "pyclesperanto")
    # complex data: pyclesperanto makes complex64 float32 and refuses
    # complex128, each in words about something else
    for d in (np.complex64, np.complex128):
        with pytest.raises(ab.MemoryConversionError, match="no complex arrays"):
            ab.convert_memory(np.ones(3, d), "numpy", "pyclesperanto", gpu_id=0)
        with pytest.raises(ab.MemoryConversionError, match="no complex arrays"):
            ab.stack_slices([np.ones((2, 2), d)], "pyclesperanto")
    # nor float16 or bfloat16, which it refused in words of its own
    with pytest.raises(ab.MemoryConversionError, match="no float16 arrays"):
        ab.convert_memory(np.ones(3, np.float16), "numpy", "pyclesperanto", gpu_id=0)
    np.testing.assert_array_equal(
        need("pyclesperanto").pull(ab.convert_memory(np.ones(3, np.float16), "numpy", "pyclesperanto", gpu_id=0,
                                                     dtype="float32")), np.ones(3, np.float32))


def test_pyclesperanto_targets_check_permute_as_the_other_targets_do():
    opencl(1)
    need("pyclesperanto")
    x = np.zeros((2, 3, 4), np.float32)
    for perm, words in (((0, 1, 2, 0), "permute has 4 axes; the tensor has 3"),
                        ((0, 1, 5), "permute axis 5 is out of range for a 3-dimensional tensor"),
                        ((0, 0, 1), r"permute\[1\] is 0; want each of 0..2 exactly once"),
                        # every axis's range before any repeat, as the core does
                        ((0, 0, 5), "permute axis 5 is out of range"),
                        # repeats told by the axis counted from the end
                        ((0, -3, 1), r"permute\[1\] is 0; want"),
                        ((0, 1, -4), "permute axis -4 is out of range for a 3-dimensional tensor"),
                        ((0, 1, 2**70), "permute axis is out of range for a 3-dimensional tensor"),
                        ((0, 1, -2**63), "permute axis is out of range for a 3-dimensional tensor")):
        said = []
        for target in ("numpy", "pyclesperanto"):
            with pytest.raises(ab.MemoryConversionError, match=words) as e:
                ab.convert_memory(x, "numpy", target, permute=perm)
            assert isinstance(e.value.__cause__, ValueError)
            said.append(str(e.value.__cause__))
        assert said[0] == said[1]  # the same words, whichever target
    # With another keyword wrong too, the same error comes first.
    for kw in (dict(permute=(0, 0, 5), scale=1, channel_axis=0, channel_scale=[1, 2]),
               dict(permute=(0, 0, 5), channel_axis=0),
               dict(permute=(0, 0, 1), channel_axis=0, channel_scale=[1, 2, 3])):
        said = []
        for target in ("numpy", "pyclesperanto"):
            with pytest.raises(ab.MemoryConversionError) as e:
                ab.convert_memory(x, "numpy", target, **kw)
            said.append(str(e.value.__cause__))
        assert said[0] == said[1] and "permute" not in said[0]
    g = ab.convert_memory(x + np.arange(4, dtype=np.float32), "numpy", "pyclesperanto", permute=(2, -3, 1))
    np.testing.assert_array_equal(values("pyclesperanto", g), np.transpose(x + np.arange(4), (2, 0, 1)))
    with pytest.raises(ab.MemoryConversionError, match="permute has 1 axes; the tensor has 0"):
        ab.convert_memory(np.array(1.0, np.float32), "numpy", "pyclesperanto", permute=(0,))


def test_pyclesperanto_arrays_too_large_for_the_device_are_memory_errors():
    """As the C core's own allocations: the cause is a MemoryError (which
    the decorators' OOM recovery and callers catching MemoryError know),
    not pyclesperanto's RuntimeError with an OpenCL code."""
    opencl(1)
    need("pyclesperanto")
    huge = np.broadcast_to(np.zeros(1, np.float32), (1 << 20, 1 << 20))  # 4 TiB, no memory behind it
    with pytest.raises(ab.MemoryConversionError, match="could not allocate") as e:
        ab.convert_memory(huge, "numpy", "pyclesperanto", gpu_id=0)
    assert isinstance(e.value.__cause__, MemoryError)
    assert isinstance(e.value.__cause__.__cause__, RuntimeError)
    assert isinstance(e.value, ab.OutOfMemoryError) and "out of memory" in str(e.value)
    # stack_slices allocates its pyclesperanto result the same way
    with pytest.raises(ab.MemoryConversionError, match="could not allocate") as e:
        ab.stack_slices([huge[:1 << 15, :1 << 15]] * 64, "pyclesperanto", gpu_id=0)  # 256 GiB
    assert isinstance(e.value.__cause__, MemoryError) and isinstance(e.value, ab.OutOfMemoryError)


def test_out_of_memory_is_caught_as_the_pages_idiom_and_memory_error_catch_it():
    """The page's troubleshooting idiom for torch's CUDA out-of-memory
    error (a RuntimeError saying "out of memory") catches a conversion's,
    and so does `except MemoryError`; other failures are neither."""
    need("torch")
    big = np.ones((1024, 1024), np.float32)
    ab.set_memory_limit("cpu", 1 << 20)
    ab.empty_cache()  # what earlier tests left cached would serve these under the limit
    try:
        for what, call in (("convert", lambda: ab.convert_memory(big, "numpy", "torch", dtype="float64")),
                           ("stack", lambda: ab.stack_slices([big, big], "torch")),
                           ("decorator", lambda: ab.torch(lambda x: x.float())(np.ones((1024, 1024))))):  # cast back
            caught = None
            try:
                call()
            except RuntimeError as e:
                if "out of memory" in str(e):
                    caught = e
            assert isinstance(caught, ab.OutOfMemoryError) and isinstance(caught, ab.MemoryConversionError), what
            assert isinstance(caught, MemoryError) and isinstance(caught.__cause__, MemoryError)
            assert pickle.loads(pickle.dumps(caught)).args == caught.args
    finally:
        ab.set_memory_limit("cpu", 0)
    with pytest.raises(ab.MemoryConversionError) as e:
        ab.convert_memory(np.ones(2, np.complex64), "numpy", "torch", dtype="float32")
    assert not isinstance(e.value, (MemoryError, RuntimeError))



def test_a_slices_own_framework_running_out_of_memory_is_an_out_of_memory_error(monkeypatch):
    """stack_slices asks every framework whether an error is its lack of
    memory, not only the target's: a torch slice's CUDA OOM stacking into
    NumPy (made here by a producer that raises torch's error)."""
    torch = need("torch")
    from arraybridge._frameworks import ADAPTERS

    def out_of_memory(obj):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(ADAPTERS[ab.MemoryType.TORCH], "producer", out_of_memory)
    with pytest.raises(ab.OutOfMemoryError) as e:
        ab.stack_slices([torch.ones(2, 2), torch.ones(2, 2)], "numpy")
    assert isinstance(e.value.__cause__, torch.cuda.OutOfMemoryError)


def test_tensorflow_variables_are_taken_as_their_value():
    tf = need("tensorflow")
    v = tf.Variable([1.0, 2.0, 3.0])
    assert ab.convert_memory(v, "tensorflow", "tensorflow") is v
    np.testing.assert_array_equal(ab.convert_memory(v, "tensorflow", "numpy"), [1, 2, 3])
    np.testing.assert_array_equal(values("torch", ab.convert_memory(v, "tensorflow", "torch")), [1, 2, 3])


def test_tensorflow_strings_and_handles_are_refused_not_aborted():
    """TensorFlow's DLPack export aborts the process for tensors of strings,
    resource handles and variants (numpy.from_dlpack of one does): we refuse
    them before asking. Run in a child so that an abort is a failure here,
    not the end of the test run."""
    need("tensorflow")
    code = textwrap.dedent("""
        import arraybridge as ab, tensorflow as tf
        for t in (tf.constant(["a", "b"]), tf.Variable([1.0]).handle):
            try:
                ab.convert_memory(t, "tensorflow", "numpy")
            except ab.MemoryConversionError as e:
                assert "has no DLPack form" in str(e) and isinstance(e.__cause__, TypeError), e
            else:
                raise AssertionError("converted a %s tensor" % t.dtype.name)
            try:
                ab.from_dlpack(t)
            except TypeError as e:
                assert "TensorFlow tensor of %s has no DLPack form" % t.dtype.name in str(e), e
            else:
                raise AssertionError("imported a %s tensor" % t.dtype.name)
        print("refused")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "refused" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


@pytest.mark.parametrize("fw", ("jax", "tensorflow"))
def test_numpy_views_of_immutable_arrays_are_read_only(fw):
    # JAX and TensorFlow arrays are immutable, but their DLPack exports do
    # not say read-only: a writable NumPy view would let a caller change one.
    a = aligned(np.arange(4, dtype=np.float32))
    x = make(fw, a)
    n = ab.convert_memory(x, fw, "numpy")
    assert ptr(n) == ptr(x), "no longer zero-copy"
    assert not n.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        n[0] = 100

    @ab.numpy
    def center(v):
        v -= v.mean()
        return v

    with pytest.raises(ValueError, match="read-only"):  # NumPy's own refusal, in the caller's function
        center(x)
    np.testing.assert_array_equal(values(fw, x), a)  # unchanged
    # A copy is the caller's to write; so is a view of a mutable array.
    c = ab.convert_memory(x, fw, "numpy", dtype="float64")
    assert c.flags.writeable and ptr(c) != ptr(x)
    assert ab.convert_memory(np.zeros(2), "numpy", "numpy").flags.writeable
    # A keyword that changes nothing copies nothing: still a view, so
    # still read-only (it was writable, and writing it changed x).
    for kw in ({"dtype": "float32"}, {"dtype": np.float32}, {"permute": (0,)}):
        v = ab.convert_memory(x, fw, "numpy", **kw)
        assert ptr(v) == ptr(x), kw
        assert not v.flags.writeable, kw
    assert not ab.to_device(x, "cpu:0").copied and ab.to_device(x, "cpu:0", dtype="float64").copied
    # from_dlpack takes the producer's word, unless told: readonly=True
    for v in ab.unstack_slices(make(fw, aligned(np.zeros((2, 2, 2), np.float32))), "numpy"):
        assert not v.flags.writeable
    t = ab.from_dlpack(x, readonly=True)
    assert t.readonly and not ab.from_dlpack(x).readonly
    with pytest.raises(ValueError, match="read-only"):
        ab.convert_into(np.ones(4, np.float32), t)
    assert ab.from_dlpack(np.zeros(2), readonly=True).readonly


# ---- pyclesperanto on PoCL ------------------------------------------------------


@pytest.mark.parametrize("gpu_id", [0, 1])
@pytest.mark.parametrize("src", HOST)
def test_frameworks_to_pyclesperanto_and_back(src, gpu_id):
    opencl(2)
    cle = need("pyclesperanto")
    a = aligned(np.random.default_rng(gpu_id).random((16, 24)).astype(np.float32))
    g = ab.convert_memory(make(src, a), src, "pyclesperanto", gpu_id=gpu_id)
    assert ab.detect_memory_type(g) == "pyclesperanto"
    assert g.__dlpack_device__() == (4, gpu_id)
    np.testing.assert_array_equal(cle.pull(g), a)
    # pyclesperanto's own kernels run on it: the buffer is of its context
    blurred = cle.gaussian_blur(g, sigma_x=2, sigma_y=2)
    back = ab.convert_memory(blurred, "pyclesperanto", src)
    ref = cle.pull(cle.gaussian_blur(cle.push(a), sigma_x=2, sigma_y=2))
    np.testing.assert_allclose(values(src, back), ref, rtol=0, atol=0)


# pyclesperanto's own storage for each dtype (what cle.push makes of it).
CLE_DTYPES = {"uint8": "uint8", "int8": "int8", "uint16": "uint16", "int16": "int16", "uint32": "uint32",
              "int32": "int32", "float32": "float32", "bool": "uint8", "int64": "int32", "float64": "float32"}


def test_pyclesperanto_dtypes_follow_its_own_storage_rules():
    opencl(1)
    cle = need("pyclesperanto")
    for dtype, stored in CLE_DTYPES.items():
        a = source_array(dtype, (3, 5))
        g = ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=0)
        assert str(g.dtype) == stored, dtype
        np.testing.assert_array_equal(cle.pull(g), a.astype(stored))
        back = ab.convert_memory(g, "pyclesperanto", "numpy", dtype=dtype)
        np.testing.assert_array_equal(back, a.astype(stored).astype(dtype))
    with pytest.raises(ab.MemoryConversionError, match="float16"):
        ab.convert_memory(np.zeros(3, np.float16), "numpy", "pyclesperanto", gpu_id=0)


def test_strided_torch_views_reach_every_framework():
    torch = need("torch")
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    for view in (base[:, ::3], base.T, base[1:5, 2:7]):
        want = view.numpy()
        for dst in HOST:  # TensorFlow last: without it the rest have run when this skips
            need(dst)
            got = values(dst, ab.convert_memory(view, "torch", dst))
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_cupy_arrays_convert_where_a_gpu_is():
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # not installed, or no driver/GPU
        pytest.skip("CuPy needs a CUDA GPU (%s: %s)" % (type(e).__name__, e))
    if n == 0 or not any(d.startswith("cuda:") for d in ab.devices()):
        pytest.skip("CuPy needs a CUDA GPU that arraybridge sees too")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = ab.convert_memory(a, "numpy", "cupy", gpu_id=0)
    assert isinstance(g, cupy.ndarray) and g.device.id == 0
    np.testing.assert_array_equal(ab.convert_memory(g, "cupy", "numpy"), a)


def test_pyclesperanto_between_its_devices_and_with_a_cast():
    opencl(2)
    cle = need("pyclesperanto")
    a = np.arange(60, dtype=np.uint8).reshape(6, 10)
    g0 = ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=0)
    g1 = ab.convert_memory(g0, "pyclesperanto", "pyclesperanto", gpu_id=1, dtype="float32", scale=0.5)
    assert g1.__dlpack_device__() == (4, 1) and g1.dtype == np.float32
    np.testing.assert_array_equal(cle.pull(g1), a.astype(np.float32) * 0.5)
    # NumPy's spellings of a dtype, as every other target takes them
    for spelling, want in (("f4", np.float32), ("single", np.float32), ("u1", np.uint8), ("i4", np.int32),
                           (np.dtype("<i2"), np.int16)):
        g = ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=0, dtype=spelling)
        assert g.dtype == want, spelling
        np.testing.assert_array_equal(cle.pull(g), a.astype(want))
    # no options: a move, not the same array back (it is on device 0)
    m = ab.convert_memory(g0, "pyclesperanto", "pyclesperanto", gpu_id=1)
    assert m is not g0 and m.__dlpack_device__() == (4, 1)
    np.testing.assert_array_equal(cle.pull(m), a)
    assert ab.convert_memory(g0, "pyclesperanto", "pyclesperanto", gpu_id=0) is g0
    before = cle.get_device().index
    ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=1 - before)
    assert cle.get_device().index == before, "convert_memory changed pyclesperanto's current device"


def test_pyclesperanto_targets_leave_other_threads_current_device_alone(monkeypatch):
    """pyclesperanto's current device is one for the whole process: a
    conversion that selected its target, even for a moment and under a lock
    of ours, sent arrays that another thread pushed meanwhile to the wrong
    device. Where pyclesperanto's backend hands out devices by index (0.25
    and later), a conversion selects nothing."""
    opencl(2)
    cle = need("pyclesperanto")
    from arraybridge import _frameworks
    if _frameworks.Pyclesperanto._device_by_index(cle) is None:
        pytest.skip("this pyclesperanto has no getDeviceFromIndex; conversions select and restore")
    selected = []
    real = cle.select_device
    monkeypatch.setattr(cle, "select_device", lambda *a, **k: selected.append(a) or real(*a, **k))
    a = np.arange(6, dtype=np.float32)
    for gpu_id in (0, 1):
        g = ab.convert_memory(a, "numpy", "pyclesperanto", gpu_id=gpu_id)
        assert g.device.index == gpu_id
        np.testing.assert_array_equal(cle.pull(g), a)
    assert selected == [], "a conversion selected pyclesperanto devices %s" % selected


# ---- decorators ------------------------------------------------------------------


def test_decorators_bare_and_called_convert_in_and_out():
    torch = need("torch")

    @ab.torch
    def double(x):
        """doubles"""
        assert isinstance(x, torch.Tensor)
        return x * 2

    a = np.arange(6, dtype=np.float32)
    r = double(a)
    assert isinstance(r, torch.Tensor) and double.__name__ == "double" and double.__doc__ == "doubles"
    assert (double.input_memory_type, double.output_memory_type) == ("torch", "torch")
    np.testing.assert_array_equal(r.numpy(), a * 2)

    @ab.jax(input_type="numpy", output_type="numpy")
    def third(x):
        assert ab.detect_memory_type(x) == "jax"
        return x / 3

    u = np.array([0, 3, 7, 255], np.uint8)
    out = third(u)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8  # the input's dtype, kept
    np.testing.assert_array_equal(out, np.array([0, 1, 2, 85], np.uint8))
    with pytest.raises(ab.MemoryConversionError):
        third(make("torch", u))  # input_type says numpy

    # Complex data: cast back between complex types; between complex and
    # real the result is returned as it is (a cast would drop a part).
    c64 = np.array([1 + 2j, 3 - 4j], np.complex64)
    widened = ab.numpy(lambda x: x.astype(np.complex128))(c64)
    assert widened.dtype == np.complex64
    np.testing.assert_array_equal(widened, c64)
    assert ab.numpy(lambda x: np.abs(x))(c64).dtype == np.float32  # NumPy's own abs: float32
    magnitudes = ab.numpy(lambda x: np.abs(x).astype(np.float64))(c64)
    assert magnitudes.dtype == np.float64
    np.testing.assert_allclose(magnitudes, [5 ** 0.5, 5])
    assert ab.numpy(lambda x: x * 1j)(np.ones(2, np.float32)).dtype == np.complex64

    need("tensorflow")  # last: without it the rest has run when this skips

    @ab.memory_types("tensorflow", "torch")
    def ident(x):
        assert ab.detect_memory_type(x) == "tensorflow"
        return x

    assert isinstance(ident(a), torch.Tensor)
    assert (ident.input_memory_type, ident.output_memory_type) == ("tensorflow", "torch")


def test_oom_recovery_frees_caches_retries_and_reports():
    calls = []

    @ab.numpy(oom_recovery=True)
    def flaky(x):
        calls.append(1)
        if len(calls) < 3:
            raise MemoryError("out of memory (test)")
        return x + 1

    np.testing.assert_array_equal(flaky(np.zeros(2)), np.ones(2))
    assert len(calls) == 3

    # A real one: a memory limit on the host pool makes the C core run out.
    calls.clear()

    @ab.numpy(oom_recovery=True, output_type="torch")
    def grow(x):
        calls.append(1)
        return np.zeros(1 << 20, np.float32)[:: 1 << 10].astype(np.float64)  # needs a cast (a copy) on the way out

    need("torch")
    ab.set_memory_limit("cpu", 1024)
    try:
        with pytest.raises(ab.MemoryConversionError) as e:
            grow(np.zeros(4, np.float32))
    finally:
        ab.set_memory_limit("cpu", 0)
    assert len(calls) == 3  # the call and two retries
    assert isinstance(e.value.__cause__, MemoryError)
    if sys.version_info >= (3, 11):
        assert any("memory report" in n and "cpu:0" in n for n in e.value.__notes__)


def test_oom_recovery_retries_any_imported_frameworks_out_of_memory_error():
    """A stage decorated for one framework that runs another's code (a
    @pyclesperanto step calling a torch model) meets that framework's
    out-of-memory errors: retried as the decorator's own are (python.md
    lists every framework's)."""
    torch = need("torch")
    tf = need("tensorflow")
    for error in (torch.cuda.OutOfMemoryError("CUDA out of memory (test)"),
                  tf.errors.ResourceExhaustedError(None, None, "OOM when allocating (test)")):
        calls = []

        @ab.numpy(output_type="numpy")
        def stage(x):
            calls.append(1)
            if len(calls) < 3:
                raise error
            return x

        np.testing.assert_array_equal(stage(np.ones(2)), np.ones(2))
        assert len(calls) == 3, (type(error), calls)
    # Their words in an error of another type are not theirs: once JAX and
    # pyclesperanto are imported, a ValueError saying "out of memory", a
    # gRPC quota's RESOURCE_EXHAUSTED, a KeyError naming an OpenCL code are
    # raised at once, as before.
    need("jax")
    need("pyclesperanto")
    for error in (ValueError("the whole volume would run out of memory; pass chunks="),
                  RuntimeError("status = StatusCode.RESOURCE_EXHAUSTED: Received message larger than max"),
                  KeyError("OUT_OF_RESOURCES")):
        calls = []

        @ab.numpy(output_type="numpy")
        def plain(x):
            calls.append(1)
            raise error

        with pytest.raises(type(error)):
            plain(np.ones(2))
        assert len(calls) == 1, (error, calls)


def test_another_frameworks_out_of_memory_error_frees_every_gpus_caches(monkeypatch):
    """gpu_id numbers the decorator's framework's GPUs: torch's error in a
    @numpy(gpu_id=1) stage may be on torch's cuda:0, so the retry frees
    every GPU's caches; the decorator's own errors free gpu_id's."""
    torch = need("torch")
    from arraybridge import _cleanup
    freed = []
    monkeypatch.setattr(_cleanup, "cleanup_all_gpu_frameworks", freed.append)
    for error, want in ((torch.cuda.OutOfMemoryError("CUDA out of memory (test)"), [None, None]),
                        (MemoryError("out of memory (test)"), [1, 1])):
        freed.clear()
        calls = []

        @ab.numpy(gpu_id=1, output_type="numpy")
        def stage(x):
            calls.append(1)
            if len(calls) < 3:
                raise error
            return x

        stage(np.ones(2))
        assert freed == want, (error, freed)


def test_oom_recovery_does_not_retry_a_request_too_large_for_the_device():
    """A request past what the device allocates at once (the C core's
    words; OpenCL's CL_INVALID_BUFFER_SIZE as pyclesperanto raises it) is
    raised at once: no freed cache makes room for it (found by a probe: a
    @pyclesperanto function ran three times before failing)."""
    for words in ("opencl:0: out of memory allocating 300 MiB: no release or callback can make room for it, so none ran",
                  "clCreateBuffer failed: CL_INVALID_BUFFER_SIZE"):
        calls = []

        @ab.numpy(oom_recovery=True)
        def too_large(x):
            calls.append(1)
            raise MemoryError(words)

        with pytest.raises(MemoryError, match=words[-20:]) as e:
            too_large(np.zeros(2))
        assert len(calls) == 1, words
        if sys.version_info >= (3, 11):
            assert any("no retry" in n and "memory report" in n for n in e.value.__notes__)


def test_a_decorator_converts_an_arraybridge_tensor_it_is_given():
    """to_device's Tensor is no framework's array; a decorated function was
    handed it as it was (pyclesperanto's functions then refused it)."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = ab.to_device(a.T, "cpu")
    seen = []

    @ab.numpy
    def double(x):
        seen.append(type(x))
        return x * 2

    np.testing.assert_array_equal(double(t), a.T * 2)
    assert seen == [np.ndarray]
    torch = need("torch")

    @ab.torch(output_type="numpy")
    def plus_one(x):
        assert isinstance(x, torch.Tensor)
        return x + 1

    np.testing.assert_array_equal(plus_one(t), a.T + 1)
    if n_devices("opencl") >= 2:
        cle = need("pyclesperanto")
        on1 = ab.to_device(a, "opencl:1")

        @ab.pyclesperanto(gpu_id=1, output_type="numpy")
        def blur(x):
            assert type(x).__module__.startswith("pyclesperanto"), type(x)
            return cle.copy(x)

        np.testing.assert_array_equal(blur(on1), a)


def test_a_result_of_a_framework_numbering_other_gpus_goes_where_gpu_id_none_puts_it():
    """gpu_id numbers the decorator's framework's devices: a @pyclesperanto
    (OpenCL device 1) function whose result is asked as torch gave it to
    torch's cuda:1 (here: 'PyTorch device 1 is unavailable', after the work
    had run). It is torch's host tensor now, as gpu_id=None gives."""
    opencl(2)
    cle, torch = need("pyclesperanto"), need("torch")

    @ab.pyclesperanto(gpu_id=1, output_type="torch")
    def blur(x):
        return cle.copy(x)

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = blur(a)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    np.testing.assert_array_equal(out.numpy(), a)
    # NumPy has no GPUs: its gpu_id is the result's, whatever its framework
    from arraybridge._frameworks import ADAPTERS
    from arraybridge._types import MemoryType
    cle_adapter = ADAPTERS[MemoryType.PYCLESPERANTO]
    current = cle.get_device().index
    cle.select_device(0)
    try:
        for deco in (ab.numpy(gpu_id=1, output_type="pyclesperanto"),
                     ab.memory_types("numpy", "pyclesperanto", gpu_id=1)):
            assert cle_adapter.device_of(deco(lambda x: x + 1)(a)) == "opencl:1"
    finally:
        cle.select_device(current)


def test_oom_recovery_frees_what_the_failed_attempt_held(monkeypatch):
    """The caches were freed inside the except block, while the error's
    traceback still held the failed attempt's frames and the arrays they
    made: those stayed in use, and their memory out of every cache."""
    import arraybridge._cleanup as cleanup

    real, in_use = cleanup.cleanup_all_gpu_frameworks, []

    def spy(device_id=None):
        real(device_id)
        in_use.append(ab.memory_stats("cpu")["in_use_bytes"]["current"])

    monkeypatch.setattr(cleanup, "cleanup_all_gpu_frameworks", spy)
    before = ab.memory_stats("cpu")["in_use_bytes"]["current"]
    calls = []

    def attempt(x):
        scratch = ab.empty((64 << 20,), "uint8", "cpu")  # noqa: F841 (held by the frame)
        calls.append(1)
        if len(calls) < 3:
            raise MemoryError("out of memory (test)")
        return x

    np.testing.assert_array_equal(ab.numpy(oom_recovery=True)(attempt)(np.ones(2)), np.ones(2))

    async def attempt_async(x):
        return attempt(x)

    import asyncio

    calls.clear()
    np.testing.assert_array_equal(asyncio.run(ab.numpy(oom_recovery=True)(attempt_async)(np.ones(2))), np.ones(2))
    assert in_use == [before] * 4, in_use


def test_a_framework_that_fails_to_import_is_a_memory_conversion_error(tmp_path):
    """Only ImportError was caught: a torch whose CUDA libraries are
    missing raises OSError, which escaped convert_memory and the
    decorators as it was."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise OSError("libcudart.so.12: cannot open shared object file")\n')
    code = textwrap.dedent('''
        import numpy as np, arraybridge as ab
        for call in (lambda: ab.convert_memory(np.ones(2), "numpy", "torch"), lambda: ab.torch(lambda x: x)(np.ones(2))):
            try:
                call()
            except ab.MemoryConversionError as e:
                assert "PyTorch could not be imported (OSError: libcudart.so.12" in str(e), str(e)
            else:
                raise AssertionError("no error")
        print("ok")
    ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_types_seen_by_the_decorators_are_not_kept_alive():
    """The per-type cache of which framework owns a type held every type
    it saw: classes made per call (records, namedtuples) never went."""
    import gc
    import weakref

    @ab.numpy
    def same(x):
        return x

    refs = []
    for i in range(50):
        cls = type("Record%d" % i, (), {})
        same(cls())
        refs.append(weakref.ref(cls))
    del cls
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


def test_an_oom_retry_on_the_cpu_keeps_jaxs_compiled_functions():
    """Every cleanup ran jax.clear_caches once JAX was imported, even with
    no GPU: an OOM retry of any decorated function, a NumPy one too, made
    every jitted function trace and compile again."""
    jax = need("jax")
    if jax.devices()[0].platform != "cpu":
        pytest.skip("JAX has a GPU here: its caches are cleared, as documented")
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return x * 2

    a = jax.numpy.ones(3)
    f(a)
    f(a)
    calls = []

    @ab.numpy(oom_recovery=True)
    def flaky(x):
        calls.append(1)
        if len(calls) < 2:
            raise MemoryError("out of memory (test)")
        return x

    flaky(np.ones(2))
    f(a)
    assert len(calls) == 2 and len(traces) == 1


def test_a_slice_of_no_framework_is_the_same_error_first_or_later():
    """stack_slices raised a bare ValueError for slice 0 of no known
    framework, and MemoryConversionError for any later one."""

    class Plane:
        shape = (2, 2)

    good = np.zeros((2, 2), np.float32)
    for slices in ([Plane(), good], [good, Plane()]):
        with pytest.raises(ab.MemoryConversionError):
            ab.stack_slices(slices, "numpy")


def test_nested_decorators_retry_once_not_once_per_level():
    # One decorated function calling another: the inner one's recovery
    # gave up after its two retries; the outer one raises that as it is.
    calls = []

    @ab.numpy
    def inner(x):
        calls.append(1)
        raise MemoryError("out of memory (test)")

    @ab.numpy
    def outer(x):
        return inner(x)

    @ab.numpy
    def wrapping(x):
        try:
            return inner(x)
        except MemoryError as e:
            raise RuntimeError("the model failed") from e  # a cause that gave up already

    with pytest.raises(MemoryError) as e:
        outer(np.ones(3))
    assert len(calls) == 3
    if sys.version_info >= (3, 11):
        assert sum("memory report" in n for n in e.value.__notes__) == 1
    calls.clear()
    with pytest.raises(RuntimeError):
        wrapping(np.ones(3))
    assert len(calls) == 3

    @ab.numpy
    def rephrasing(x):
        try:
            return inner(x)
        except MemoryError:
            raise MemoryError("the model ran out")  # no `from`: raised while handling it

    calls.clear()
    with pytest.raises(MemoryError, match="the model ran out"):
        rephrasing(np.ones(3))
    assert len(calls) == 3  # it was retried 3 x 3 when only __cause__ was followed

    # ... but a decorated fallback called in the except block (the big
    # model failed; try the chunked one) retries its own errors
    tries = []

    @ab.numpy
    def chunked(x):
        tries.append(1)
        if len(tries) == 1:
            raise MemoryError("transient")  # in the context of inner's given-up error
        return x

    @ab.numpy
    def model(x):
        try:
            return inner(x)
        except MemoryError:
            return chunked(x)

    calls.clear()
    np.testing.assert_array_equal(model(np.ones(3)), np.ones(3))
    assert len(calls) == 3 and len(tries) == 2
    # An out-of-memory error of the outer function's own is retried as ever.
    tries = []

    @ab.numpy
    def own(x):
        tries.append(1)
        if len(tries) < 3:
            raise MemoryError("out of memory (test)")
        return x

    np.testing.assert_array_equal(own(np.ones(2)), np.ones(2))
    assert len(tries) == 3
    # The same exception object raised again by a later call (a Future's
    # result, say) is retried afresh: the mark lasts one nesting only.
    import concurrent.futures
    fut = concurrent.futures.Future()
    fut.set_exception(MemoryError("out of memory (test)"))
    runs = []

    @ab.numpy
    def from_future(x):
        runs.append(1)
        return fut.result()

    for call in (1, 2):
        with pytest.raises(MemoryError) as e:
            from_future(np.ones(2))
        assert len(runs) == 3 * call
        # one note of ours on it, however often it was given up on
        assert sum("still out of memory" in n for n in e.value.__notes__) == 1


def test_nesting_reaches_threads_through_a_copied_context_only():
    """python.md: a thread an enclosing recovery starts counts as within it
    when it runs in a copy of its context (copy_context().run); an
    executor's plain submit starts in a context of its own, and each level
    retries (3 x 3 calls)."""
    import concurrent.futures
    import contextvars
    calls = {"inner": 0, "outer": 0}

    @ab.numpy
    def inner(x):
        calls["inner"] += 1
        raise MemoryError("out of memory (test)")

    def outer_with(submit):
        @ab.numpy
        def outer(x):
            calls["outer"] += 1
            with concurrent.futures.ThreadPoolExecutor(1) as ex:
                return submit(ex, x).result()
        return outer

    for submit, want in ((lambda ex, x: ex.submit(contextvars.copy_context().run, inner, x), (3, 1)),
                         (lambda ex, x: ex.submit(inner, x), (9, 3))):
        calls.update(inner=0, outer=0)
        with pytest.raises(MemoryError):
            outer_with(submit)(np.ones(2))
        assert (calls["inner"], calls["outer"]) == want, calls


def test_a_shared_out_of_memory_error_is_retried_by_each_thread_on_its_own():
    """One exception object can reach two threads at once (a Future's
    result). Thread B's nested recovery gives up on it and, while B's
    outer function still handles it, the main thread's recovery of the
    same object must retry it in full (it gave up at once), and must not
    take B's mark off (B's outer level then retried what its inner one had
    given up on: 6 and 2 calls, not 3 and 1)."""
    import concurrent.futures
    import threading
    fut = concurrent.futures.Future()
    fut.set_exception(MemoryError("out of memory (test)"))
    counts = {"inner": 0, "outer": 0, "g": 0}
    handling = threading.Event()
    g_done = threading.Event()

    @ab.numpy
    def inner(x):
        counts["inner"] += 1
        return fut.result()

    @ab.numpy
    def outer(x):
        counts["outer"] += 1
        try:
            return inner(x)
        except MemoryError:
            handling.set()
            g_done.wait(30)  # the main thread's recovery runs its course meanwhile
            raise

    @ab.numpy
    def g(x):
        counts["g"] += 1
        return fut.result()

    failures = []

    def b():
        try:
            outer(np.ones(2))
        except MemoryError as e:
            failures.append(e)

    t = threading.Thread(target=b)
    t.start()
    assert handling.wait(30)
    with pytest.raises(MemoryError):
        g(np.ones(2))
    g_done.set()
    t.join(30)
    assert failures and failures[0] is fut.exception()
    assert counts == {"inner": 3, "outer": 1, "g": 3}, counts
    # Threads that copied a recovery's context (asyncio.to_thread) are
    # siblings too: each retries in full, and the enclosing recovery takes
    # their give-up as its own (one retry in all).
    import asyncio
    calls = {1: 0, 2: 0}
    first_gave_up = threading.Event()

    @ab.numpy
    def job(x, k):
        calls[k] += 1
        if k == 2 and calls[2] == 1:
            first_gave_up.wait(30)
        return fut.result()

    def run(k):
        try:
            job(np.ones(2), k)
        finally:
            if k == 1:
                first_gave_up.set()

    outers = []

    @ab.numpy
    async def gathering(x):
        outers.append(1)
        # both to the end (thread 2's first try after thread 1 gave up),
        # then thread 1's error
        done = await asyncio.gather(asyncio.to_thread(run, 1), asyncio.to_thread(run, 2), return_exceptions=True)
        raise done[0]

    with pytest.raises(MemoryError):
        asyncio.run(gathering(np.ones(2)))
    assert calls == {1: 3, 2: 3} and len(outers) == 1, (calls, outers)


def test_an_oom_retry_leaves_a_jax_that_has_not_started_unstarted():
    """cleanup_all_gpu_frameworks asked JAX for its GPUs, which starts its
    backends (an XLA client and its threads; on a GPU build, its memory)
    in a process that had only imported JAX."""
    code = textwrap.dedent("""
        import numpy as np, arraybridge as ab
        import jax
        from jax._src import xla_bridge
        ab.cleanup_all_gpu_frameworks()
        ab.set_memory_limit("cpu", 1 << 20)
        @ab.numpy
        def f(x):
            return np.asarray(ab.to_device(x, "cpu", dtype="float64"))
        try:
            f(np.ones((1024, 1024), np.float32))
        except MemoryError:
            pass
        print(xla_bridge.backends_are_initialized())
    """)
    need("jax")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_callable_instance_is_wrapped_as_its_call_is():
    """An instance whose __call__ is a coroutine or generator function is
    wrapped as one (Python's inspect says no for the instance): its
    result converted once awaited, each yielded array converted."""
    import asyncio
    import inspect

    class Doubler:
        async def __call__(self, x):
            return x * 2

    class Counter:
        def __call__(self, x):
            yield x + 1
            yield x + 2

    class AsyncCounter:
        async def __call__(self, x):
            yield x + 1

    a = np.arange(4, dtype=np.int32)
    w = ab.numpy(Doubler())
    assert inspect.iscoroutinefunction(w)
    r = asyncio.run(w(a))
    assert isinstance(r, np.ndarray) and r.dtype == np.int32 and (r == a * 2).all()
    g = ab.numpy(Counter())
    assert inspect.isgeneratorfunction(g)
    got = list(g(a))
    assert [x.dtype for x in got] == [np.int32] * 2 and (got[1] == a + 2).all()
    ag = ab.numpy(AsyncCounter())
    assert inspect.isasyncgenfunction(ag)

    async def collect():
        return [x async for x in ag(a)]

    got = asyncio.run(collect())
    assert len(got) == 1 and got[0].dtype == np.int32 and (got[0] == a + 1).all()


def test_oom_recovery_keeps_the_error_whatever_gpu_id_names():
    """A gpu_id no conversion checked (NumPy ignores it; a call with no
    array converts nothing) frees every GPU's caches on a retry: the
    function's MemoryError is retried and raised, not replaced by one
    about the id."""
    for gpu_id in (-1, True, 1.5, "x"):
        tries = []

        @ab.numpy(gpu_id=gpu_id)
        def f(x):
            tries.append(1)
            raise MemoryError("out of memory (test)")

        with pytest.raises(MemoryError, match="out of memory") as e:
            f(np.arange(4))
        assert len(tries) == 3, gpu_id
        assert any("arraybridge: still out of memory" in n for n in getattr(e.value, "__notes__", [])), gpu_id


def test_decorated_coroutines_and_generators_convert_what_they_give():
    import asyncio
    import inspect
    torch = need("torch")

    @ab.torch(output_type="numpy")
    async def acoro(x):
        assert isinstance(x, torch.Tensor)
        await asyncio.sleep(0)
        return x * 2

    assert inspect.iscoroutinefunction(acoro)
    r = asyncio.run(acoro(np.ones(2, np.float32)))
    assert isinstance(r, np.ndarray) and r.dtype == np.float32 and (r == 2).all()

    tries = []

    @ab.torch
    async def aoom(x):
        tries.append(1)
        raise MemoryError("out of memory (test)")

    with pytest.raises(MemoryError):
        asyncio.run(aoom(np.ones(2)))
    assert len(tries) == 3  # retried as a plain function is

    closed = []

    @ab.torch(output_type="numpy")
    def gen(x):
        assert isinstance(x, torch.Tensor)
        try:
            got = yield x + 1
            while got is not None:
                got = yield x * got
        except KeyError:
            yield x - 1
        finally:
            closed.append(1)
        return "done"

    assert inspect.isgeneratorfunction(gen)
    g = gen(np.ones(2, np.float32))
    first = next(g)
    assert isinstance(first, np.ndarray) and first.dtype == np.float32 and (first == 2).all()
    assert (g.send(5) == 5).all()  # send reaches the generator
    assert (g.throw(KeyError("k")) == 0).all()  # so does throw
    with pytest.raises(StopIteration) as stop:
        next(g)
    assert stop.value.value == "done" and closed == [1]
    g = gen(np.ones(2, np.float32))
    next(g)
    g.close()  # closing the wrapper closes the generator
    assert closed == [1, 1]

    @ab.numpy(output_type="torch")
    async def agen(x):
        assert isinstance(x, np.ndarray)
        for k in range(3):
            yield x + k

    async def collect():
        return [v async for v in agen(torch.zeros(2))]

    got = asyncio.run(collect())
    assert [type(v) for v in got] == [torch.Tensor] * 3 and [float(v[0]) for v in got] == [0.0, 1.0, 2.0]

    # A yielded array that cannot be converted is the caller's error; the
    # generator is not told (it would catch it at its yield).
    caught = []

    @ab.numpy(output_type="pyclesperanto")
    def four_d(x):
        try:
            yield np.zeros((1, 1, 1, 2), np.float32)  # pyclesperanto has no 4-D arrays
        except Exception as e:
            caught.append(e)
            yield x

    @ab.numpy(output_type="pyclesperanto")
    async def four_d_async(x):
        try:
            yield np.zeros((1, 1, 1, 2), np.float32)
        except Exception as e:
            caught.append(e)
            yield x

    async def first(agen):
        return await agen.__anext__()

    if importlib.util.find_spec("pyclesperanto") is not None and n_devices("opencl") > 0:
        with pytest.raises(ab.MemoryConversionError):
            next(four_d(np.ones(2, np.float32)))
        with pytest.raises(ab.MemoryConversionError):
            asyncio.run(first(four_d_async(np.ones(2, np.float32))))
        assert caught == []
    # and the generator is closed then, its finally run at once
    done = []

    @ab.numpy(output_type="torch")
    def strings(x):
        try:
            yield np.array(["not", "numbers"])  # no DLPack for strings
        finally:
            done.append(1)

    with pytest.raises(ab.MemoryConversionError):
        next(strings(np.ones(2)))
    assert done == [1]

    # A generator-based coroutine (@types.coroutine) stays awaitable.
    import types

    @ab.numpy
    @types.coroutine
    def old_style(x):
        yield from ()
        return x * 2

    async def run_old():
        return await old_style(np.ones(2))

    np.testing.assert_array_equal(asyncio.run(run_old()), [2.0, 2.0])

    # ... and so does one given as a functools.partial
    import functools

    @types.coroutine
    def old_with_k(x, k):
        yield from ()
        return x * k

    partial_old = ab.numpy(functools.partial(old_with_k, k=3))

    async def run_partial():
        return await partial_old(np.ones(2))

    np.testing.assert_array_equal(asyncio.run(run_partial()), [3.0, 3.0])

    # A pending retried coroutine closed outside its task's context (an
    # abandoned task, collected later) closes quietly.
    async def forever(x):
        await asyncio.sleep(3600)

    slow = ab.numpy(forever)

    async def start():
        task = asyncio.ensure_future(slow(np.ones(2)))
        await asyncio.sleep(0.01)
        return task

    loop = asyncio.new_event_loop()
    try:
        task = loop.run_until_complete(start())
        task.get_coro().close()  # here, not in the task's context: no ValueError
    finally:
        loop.close()


def test_cleanup_all_gpu_frameworks_empties_our_pools():
    t = ab.to_device(np.zeros(1 << 16), "cpu", copy=True)
    del t
    assert ab.memory_stats("cpu")["reserved_bytes"]["current"] > 0
    assert ab.cleanup_all_gpu_frameworks() is None
    assert ab.memory_stats("cpu")["reserved_bytes"]["current"] == 0


def test_cleanup_all_gpu_frameworks_checks_its_device_id():
    """'x', True, 1.5 and -5 were taken and freed nothing, silently (True
    was compared as the text "True")."""
    for bad, exc in (("x", TypeError), (True, TypeError), (1.5, TypeError), (-5, ValueError)):
        with pytest.raises(exc, match="device_id"):
            ab.cleanup_all_gpu_frameworks(bad)
    assert ab.cleanup_all_gpu_frameworks(np.int64(0)) is None
    assert ab.cleanup_all_gpu_frameworks(99) is None  # no such device: nothing of ours to free


def test_cleanup_of_a_device_a_framework_lacks_leaves_that_framework_alone():
    """torch.cuda.device(N) past torch's last GPU raises (invalid device
    ordinal): cleanup_all_gpu_frameworks(1) raised so on a one-GPU machine
    (make gpu-check on an H200 found it). CuPy's device pool frees the
    current device's blocks alone, so each device is entered in turn.
    Stand-ins that act as the two do with one GPU, so this runs anywhere."""
    import contextlib
    import types
    from arraybridge._frameworks import ADAPTERS, MemoryType

    entered, freed = [], []

    def device(i):
        if i != 0:
            raise RuntimeError("CUDA error: invalid device ordinal")
        entered.append(i)
        return contextlib.nullcontext()

    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1, device=device,
                                 empty_cache=lambda: freed.append(("torch", entered[-1])))
    fake_torch = types.SimpleNamespace(cuda=cuda)
    pool = types.SimpleNamespace(free_all_blocks=lambda: freed.append(("cupy", entered[-1])))
    pinned = types.SimpleNamespace(free_all_blocks=lambda: freed.append(("cupy pinned", None)))
    fake_cupy = types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1), Device=device),
        get_default_memory_pool=lambda: pool, get_default_pinned_memory_pool=lambda: pinned)
    for kind, mod, name in ((MemoryType.TORCH, fake_torch, "torch"), (MemoryType.CUPY, fake_cupy, "cupy")):
        for device_id, want in ((None, [0]), (0, [0]), (1, []), (99, [])):
            del entered[:], freed[:]
            ADAPTERS[kind].empty_cache(mod, device_id)
            assert entered == want, (name, device_id, entered)
            assert [f for f in freed if f[0] == name] == [(name, 0)] * len(want), (name, device_id, freed)


def test_cleanup_all_gpu_frameworks_of_one_device_trims_that_device_only():
    opencl(2)
    ab.empty_cache()
    for dev in ("opencl:0", "opencl:1"):
        del_me = ab.to_device(np.zeros(1 << 19), dev)  # 4 MiB, back to the pool at once
        del del_me
    held = {d: ab.memory_stats(d)["reserved_bytes"]["current"] for d in ("opencl:0", "opencl:1")}
    assert min(held.values()) > 0
    ab.cleanup_all_gpu_frameworks(0)
    assert ab.memory_stats("opencl:0")["reserved_bytes"]["current"] == 0
    assert ab.memory_stats("opencl:1")["reserved_bytes"]["current"] == held["opencl:1"]
    ab.cleanup_all_gpu_frameworks(1)
    assert ab.memory_stats("opencl:1")["reserved_bytes"]["current"] == 0


def test_decorators_convert_the_first_array_argument_and_pass_the_rest():
    # A method's self (the reference page's MultiGPUModel decorates methods),
    # a classmethod's cls, data given by keyword, a call without arrays.
    need("jax")

    class Model:
        scale = 3.0

        @ab.jax
        def forward(self, x, bias=0.0):
            assert ab.detect_memory_type(x) == "jax"
            return x * self.scale + bias

        @classmethod
        @ab.numpy(output_type="numpy")
        def halve(cls, x):
            assert isinstance(x, np.ndarray)
            return x / 2

    a = np.arange(4, dtype=np.float32)
    r = Model().forward(a, bias=1.0)
    assert ab.detect_memory_type(r) == "jax"
    np.testing.assert_array_equal(np.asarray(r), a * 3 + 1)
    np.testing.assert_array_equal(Model.halve(make("jax", a)), a / 2)

    @ab.numpy
    def masked(x, mask):  # the data is the first parameter, however the call names it
        assert x.dtype == np.float32
        return np.where(mask, x, 0)

    m = np.array([True, False, True, True])
    for r in (masked(a, m), masked(x=a, mask=m), masked(mask=m, x=a), masked(a, mask=m)):
        assert r.dtype == np.float32  # a's dtype kept, not the mask's
        np.testing.assert_array_equal(r, [0, 0, 2, 3])

    @ab.jax
    def no_arrays(n, label="x"):
        return [label] * n

    assert no_arrays(2) == ["x", "x"]  # a data argument that is no array: the call as it is

    @ab.jax(input_type="numpy")
    def strict(x, factor):
        return x * factor

    with pytest.raises(ab.MemoryConversionError, match="not numpy"):
        strict([0.5, 2.5], np.int8(3))  # input_type given: the data must be one

    with pytest.raises(TypeError, match="by keyword"):
        ab.jax(0)  # gpu_id by position: refused where it is written, not at the first call


def test_framework_objects_that_are_not_arrays_pass_as_they_are():
    torch = need("torch")

    @ab.torch
    def apply(x, layer):
        return layer(x)

    lin = torch.nn.Linear(3, 2)
    r = apply(np.ones((1, 3), np.float32), lin)
    assert isinstance(r, torch.Tensor) and r.shape == (1, 2)

    @ab.torch
    def shape_of(x):
        return x.shape

    assert shape_of(np.zeros((2, 5), np.float32)) == torch.Size([2, 5])

    @ab.numpy
    def noise(rng, n):
        return rng.random(n)

    assert noise(np.random.default_rng(1), 3).shape == (3,)  # a Generator is no array: passed as it is


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_variables_belong_to_keras_backend(backend):
    # Keras 3 runs on TensorFlow, JAX or torch; its variables were all taken
    # for TensorFlow's, so @ab.jax on one failed where TensorFlow was absent.
    need("keras")
    need(backend)
    code = textwrap.dedent("""
        import numpy as np, keras, arraybridge as ab
        v = keras.Variable(np.arange(3, dtype=np.float32))
        assert ab.detect_memory_type(v) == %r, ab.detect_memory_type(v)
        n = ab.convert_memory(v, %r, "numpy")
        assert n.tolist() == [0, 1, 2], n

        @ab.jax
        def double(x):
            assert ab.detect_memory_type(x) == "jax"
            return x * 2

        assert np.asarray(double(v)).tolist() == [0, 2, 4]
        if %r == "jax":  # a variable whose value is traced (model.fit's step) is traced
            import jax, jax.numpy as jnp

            def step(x):
                with keras.StatelessScope(state_mapping=[(v, x)]):
                    try:
                        ab.convert_memory(v, "jax", "numpy")
                    except ab.MemoryConversionError as e:
                        assert "traced JAX value" in str(e), e
                    else:
                        raise AssertionError("a traced variable converted to NumPy")
                    same = ab.convert_memory(v, "jax", "jax")
                    assert same is v, same
                    return same.value * 2

            assert jax.jit(step)(jnp.ones(3)).tolist() == [2, 2, 2]

            @ab.jax
            def weight(x):
                return v  # float32 for int32 data: cast back, its value traced

            def step2(x, val):
                with keras.StatelessScope(state_mapping=[(v, val)]):
                    return weight(x)

            assert jax.jit(step2)(jnp.arange(3, dtype=jnp.int32), jnp.full(3, 2.5)).tolist() == [2, 2, 2]
        print("ok")
    """ % (backend, backend, backend))
    env = dict(os.environ, KERAS_BACKEND=backend)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_decorated_functions_return_numpy_scalars_as_they_are():
    @ab.numpy
    def total(x):
        return x.sum()

    @ab.numpy
    def mean_of_ints(x):
        return x.mean()

    t = total(np.arange(4, dtype=np.float32))
    assert isinstance(t, np.float32) and t == 6
    m = mean_of_ints(np.arange(4, dtype=np.int32))
    assert isinstance(m, np.float64) and m == 1.5


def test_a_star_import_leaves_the_callers_frameworks_in_place():
    torch = need("torch")
    space = {}
    exec("import numpy\nimport torch\nfrom arraybridge import *", space)
    assert space["numpy"] is np and space["torch"] is torch
    assert space["convert_memory"] is ab.convert_memory and space["OutOfMemoryError"] is ab.OutOfMemoryError
    assert all(hasattr(ab, name) for name in ab.__all__)
    from arraybridge import torch as torch_decorator  # by name, as the page does
    assert torch_decorator is ab.torch


def test_decorated_functions_return_classes_and_array_descriptions_as_they_are():
    # They have a shape and a dtype (as attributes of the class, or as
    # the description's), but no data: not arrays.
    jax = need("jax")
    tf = need("tensorflow")
    torch = need("torch")

    @ab.jax
    def shape_of(x):
        return jax.eval_shape(lambda y: y * 2, x)

    s = shape_of(jax.numpy.ones(3))
    assert isinstance(s, jax.ShapeDtypeStruct) and s.shape == (3,)
    if hasattr(jax, "typeof"):
        assert ab.jax(lambda x: jax.typeof(x))(jax.numpy.ones(2)).shape == (2,)  # a ShapedArray

    @ab.tensorflow
    def spec_of(x):
        return tf.TensorSpec.from_tensor(x)

    assert isinstance(spec_of(np.ones(2, np.float32)), tf.TensorSpec)

    @ab.torch
    def kind_of(x):
        return type(x)

    assert kind_of(np.ones(2)) is torch.Tensor
    assert ab.torch(lambda x: jax.Array)(np.ones(2)) is jax.Array
    with pytest.raises(ValueError, match="Unknown memory type"):
        ab.detect_memory_type(torch.Tensor)
    # converted, a description says it holds no data (the frameworks' own
    # words named other things: torch's an attribute 'requires_grad')
    described = jax.ShapeDtypeStruct((2, 3), np.float32)
    for target in ("numpy", "torch"):
        with pytest.raises(ab.MemoryConversionError, match="ShapeDtypeStruct describes an array"):
            ab.convert_memory(described, "jax", target)
    with pytest.raises(ab.MemoryConversionError, match="slice 0: a ShapeDtypeStruct describes an array"):
        ab.stack_slices([described], "numpy")


def test_torch_tensors_in_autograds_graph_stay_there_through_casts_and_decorators():
    torch = need("torch")
    x = torch.tensor([1.0, -2.5, 3.25], dtype=torch.float64, requires_grad=True)

    @ab.torch
    def layer(v):
        return v.float() * 2  # float32 result, cast back to float64 by preserve_dtype

    y = layer(x)
    assert y.dtype == torch.float64 and y.requires_grad
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0, dtype=torch.float64))
    # convert_memory within torch, a cast within floating types: the C
    # core's values (torch's .to() rounds float64 -> bfloat16 twice), a new
    # tensor in the graph, the gradient back in the source's dtype
    x.grad = None
    w = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40], dtype=torch.float64)
    for spelling in ("float32", "f4", np.float32, torch.float32, "float16", "bfloat16"):
        r = ab.convert_memory(x, "torch", "torch", dtype=spelling)
        assert r.requires_grad and r.grad_fn is not None and r is not x, spelling
        assert torch.equal(r, ab.convert_memory(x.detach(), "torch", "torch", dtype=spelling)), spelling
        g = ab.convert_memory(w.clone().requires_grad_(), "torch", "torch", dtype=spelling)
        assert torch.equal(g.detach(), ab.convert_memory(w, "torch", "torch", dtype=spelling)), spelling
    assert ab.convert_memory(w.requires_grad_(), "torch", "torch", dtype="bfloat16")[0].item() == 1.0078125
    (ab.convert_memory(x, "torch", "torch", dtype="float16") * 3).sum().backward()
    assert x.grad.dtype == torch.float64 and x.grad.tolist() == [3.0, 3.0, 3.0]
    c = torch.tensor([1 + 2j], dtype=torch.complex64, requires_grad=True)
    assert ab.convert_memory(c, "torch", "torch", dtype="complex128").requires_grad
    assert torch.autograd.gradcheck(lambda v: ab.convert_memory(v, "torch", "torch", dtype="complex128"),
                                    (c.detach().to(torch.complex128).requires_grad_(),))
    # A cast to its own dtype: a view autograd knows of, so that an in-place
    # op on it is refused, as torch refuses one on x.view_as(x), not a
    # silent change of x under a graph that saved it
    x.grad = None
    same = ab.convert_memory(x, "torch", "torch", dtype="float64")
    assert same is not x and same.data_ptr() == x.data_ptr() and same._base is x
    with pytest.raises(RuntimeError, match="leaf"):
        same.mul_(0)
    # forward mode: a dual tensor that also requires grad keeps its tangent
    import torch.autograd.forward_ad as fwad
    with fwad.dual_level():
        d = fwad.make_dual(x.detach().clone().requires_grad_(), torch.ones(3, dtype=torch.float64))
        out = ab.convert_memory(d, "torch", "torch", dtype="float32")
        assert fwad.unpack_dual(out).tangent.tolist() == [1.0, 1.0, 1.0]
    # The C core's pools and limits hold for it, and its refusals
    big = torch.ones((1024, 1024), requires_grad=True)
    ab.set_memory_limit("cpu", 1 << 20)
    ab.empty_cache()
    try:
        with pytest.raises(ab.OutOfMemoryError):
            ab.convert_memory(big, "torch", "torch", dtype="float64")
    finally:
        ab.set_memory_limit("cpu", 0)
    sparse = torch.eye(3).to_sparse().requires_grad_()
    with pytest.raises(ab.MemoryConversionError, match="to_dense"):
        ab.convert_memory(sparse, "torch", "torch", dtype="float64")
    # Elsewhere the C core's rules and a tensor outside the graph: into
    # integers (saturated and rounded half to even, not torch's wrap and
    # truncation), other keywords, across the real/complex line
    i = ab.convert_memory(torch.tensor([300.0, 2.5], requires_grad=True), "torch", "torch", dtype="uint8")
    assert i.tolist() == [255, 2] and not i.requires_grad
    s = ab.convert_memory(x, "torch", "torch", scale=2.0)
    assert not s.requires_grad and s.tolist() == [2.0, -5.0, 6.5]
    with pytest.raises(ab.MemoryConversionError, match="float64 to complex64"):  # not torch's: the C core's refusal
        ab.convert_memory(x, "torch", "torch", dtype="complex64")
    assert ab.convert_memory(x, "torch", "torch") is x


def test_torch_func_transforms_run_decorated_layers_and_casts():
    # torch.func's tensors (vmap's batched ones, grad's tracking ones) have
    # no storage to export: a cast or a move of one runs through the C core
    # inside the Function the transforms unwrap; other keywords say why not.
    # In a process of its own: torch.func.grad loads triton, whose LLVM
    # aborts beside TensorFlow's, which earlier tests have loaded.
    need("torch")
    code = textwrap.dedent("""
        import sys
        import numpy as np, torch, arraybridge as ab
        assert "tensorflow" not in sys.modules

        @ab.torch
        def layer(v):
            return v.float() * 2  # float32 result, cast back to float64 by preserve_dtype

        x = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 0.1
        v = torch.func.vmap(layer)(x)
        assert v.dtype == torch.float64 and torch.equal(v, (x.float() * 2).double())
        g = torch.func.grad(lambda r: layer(r).sum())(x[0])
        assert torch.equal(g, torch.full((3,), 2.0, dtype=torch.float64))
        j = torch.func.jacrev(lambda r: ab.convert_memory(r, "torch", "torch", dtype="float32"))(x[0])
        assert torch.equal(j, torch.eye(3))
        h = torch.func.hessian(lambda r: (ab.convert_memory(r, "torch", "torch", dtype="float32") ** 3).sum())(x[0])
        assert h.dtype == torch.float64  # the gradient in the source's dtype
        torch.testing.assert_close(h, torch.diag(6 * x[0]), rtol=1e-6, atol=0)
        # a batch dimension not first, and a cast into integers: the C core's
        # saturation, where torch would wrap
        y = torch.tensor([[300.0, -1.0], [2.5, 7.0]])
        i = torch.func.vmap(lambda r: ab.convert_memory(r, "torch", "torch", dtype="uint8"), in_dims=1)(y)
        assert i.dtype == torch.uint8 and i.tolist() == [[255, 2], [0, 7]], i
        try:
            torch.func.vmap(lambda r: ab.convert_memory(r, "torch", "torch", scale=2.0))(x)
        except ab.MemoryConversionError as e:
            assert "torch.func transform" in str(e), e
        else:
            raise AssertionError("scale= converted inside vmap")
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


def test_jax_decorated_functions_can_be_jitted_vmapped_and_differentiated():
    jax = need("jax")
    import jax.numpy as jnp

    @ab.jax
    def double(x):
        return x * 2

    x = jnp.arange(3, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(double)(x)), [0, 2, 4])
    np.testing.assert_array_equal(np.asarray(jax.vmap(double)(jnp.ones((2, 3), jnp.float32))), np.full((2, 3), 2))
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda v: double(v).sum())(x)), [2, 2, 2])

    @ab.numpy
    def to_numpy(x):
        return x

    with pytest.raises(ab.MemoryConversionError, match="traced JAX value"):
        jax.jit(to_numpy)(x)  # a traced value has no data to move to NumPy

    @ab.jax
    def positive(v):
        return v > 1  # a bool result, cast back to the input's dtype: by JAX's astype under jit

    for f in (positive, jax.jit(positive)):
        r = f(x)
        assert r.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(r), [0, 0, 1])


def test_traced_results_are_cast_back_by_the_c_cores_rules():
    """A result cast back to the input's integer dtype inside jax.jit or
    tf.function went through astype / tf.cast, which truncate and wrap,
    while the same call run eagerly rounds half to even and saturates
    (the C core): f(x) and jit(f)(x) gave other integers."""
    jax, tf = need("jax"), need("tensorflow")
    import jax.numpy as jnp

    cases = [("int32", [1, 3, 5, -1, -3, 7, 2**30, -2**30], [0.5, 2.0, 2.5, float("nan"), float("inf")]),
             ("uint8", [0, 1, 3, 5, 200, 255], [0.5, 1.5, 2.0, -1.0, float("nan")]),
             ("int8", [1, 3, -3, 100, -100, 127], [0.5, 1.5, 3.0, -2.0]),
             ("uint16", [1, 3, 40000, 65535], [0.5, 2.0, -0.5])]
    for dt, xs, ks in cases:
        for k in ks:
            fj = ab.jax(lambda v, k=k: v * k)
            xj = jnp.array(xs, dtype=dt)
            np.testing.assert_array_equal(np.asarray(jax.jit(fj)(xj)), np.asarray(fj(xj)), err_msg="jax %s %r" % (dt, k))
            ft = ab.tensorflow(lambda v, k=k: tf.cast(v, tf.float32) * k)
            xt = tf.constant(np.array(xs, dtype=dt))
            np.testing.assert_array_equal(tf.function(ft)(xt).numpy(), ft(xt).numpy(), err_msg="tf %s %r" % (dt, k))
    assert list(np.asarray(jax.jit(ab.jax(lambda v: v * 0.5))(jnp.array([1, 3, 5], jnp.int32)))) == [0, 2, 2]
    for src, dst, xs in [("uint8", "int8", [0, 1, 127, 200, 255]), ("int8", "uint16", [-128, -1, 0, 100, 127])]:
        g = ab.jax(lambda v, d=dst: v.astype(d))  # cast back from dst to src
        x = jnp.array(np.array(xs, dtype=src))
        np.testing.assert_array_equal(np.asarray(jax.jit(g)(x)), np.asarray(g(x)), err_msg="jax %s->%s" % (src, dst))
        gt = ab.tensorflow(lambda v, d=dst: tf.cast(v, d))
        x = tf.constant(np.array(xs, dtype=src))
        np.testing.assert_array_equal(tf.function(gt)(x).numpy(), gt(x).numpy(), err_msg="tf %s->%s" % (src, dst))
    # The wide unsigned types: JAX took the bounds as Python ints, too big
    # for its weak int32 (OverflowError); TensorFlow's saturate_cast gave 0
    # for int64 -> uint64 and has no kernel for uint32 and uint64
    xj = jnp.array([0, 5, 9, 4294967295], jnp.uint32)
    for k in (0.5, 2.0, -1.0):
        fj = ab.jax(lambda v, k=k: v * k)
        np.testing.assert_array_equal(np.asarray(jax.jit(fj)(xj)), np.asarray(fj(xj)), err_msg="jax uint32 %r" % k)
    ints = ["int8", "int32", "int64", "uint8", "uint32", "uint64"]
    for src in ints:
        info = np.iinfo(src)
        x = tf.constant(np.array([0, 1, 100, info.max, info.min], dtype=src))
        for dst in ints:
            if dst != src:
                gt = ab.tensorflow(lambda v, d=dst: tf.cast(v, d) * 3)
                np.testing.assert_array_equal(tf.function(gt)(x).numpy(), gt(x).numpy(),
                                              err_msg="tf %s->%s" % (src, dst))


def test_bfloat16_and_float8_reach_numpy_as_ml_dtypes_arrays():
    """NumPy has no bfloat16 or float8 of its own; ml_dtypes (which JAX and
    TensorFlow install) adds them, and np.asarray of a JAX array gives
    them. convert_memory to and from NumPy refused them ("Unsupported
    dtype in DLTensor", NumPy's words)."""
    ml_dtypes = need("ml_dtypes")
    torch = need("torch")
    a32 = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    t = torch.from_numpy(a32).to(torch.bfloat16)
    n = ab.convert_memory(t, "torch", "numpy")
    assert n.dtype == ml_dtypes.bfloat16 and n.ctypes.data == t.data_ptr()  # shared
    np.testing.assert_array_equal(n.astype(np.float32), a32)
    np.testing.assert_array_equal(ab.convert_memory(t.T, "torch", "numpy").astype(np.float32), a32.T)  # strided
    # back: shared, strided, read-only, 0-d and empty arrays of ml_dtypes'
    b = a32.astype(ml_dtypes.bfloat16)
    back = ab.convert_memory(b, "numpy", "torch")
    assert back.dtype == torch.bfloat16 and back.data_ptr() == b.ctypes.data
    np.testing.assert_array_equal(ab.convert_memory(b.T, "numpy", "torch").float().numpy(), a32.T)
    ro = b.copy()
    ro.flags.writeable = False
    got = ab.convert_memory(ro, "numpy", "torch")  # torch has no read-only tensors: a copy
    assert got.data_ptr() != ro.ctypes.data
    got[0, 0] = 100
    assert ro[0, 0] == b[0, 0]
    assert ab.convert_memory(b[1, 2], "numpy", "torch").item() == float(a32[1, 2])
    assert ab.convert_memory(np.zeros((0, 3), ml_dtypes.bfloat16), "numpy", "torch").shape == (0, 3)
    # a masked array, as its data (its mask did not follow the byte view:
    # "cannot reshape array of size 6 into shape (12,)")
    for m in (np.ma.array(b, mask=a32 > 0), np.ma.array(b[:2, :3], mask=[[0, 1, 0], [0, 0, 0]])):
        want = np.asarray(m).astype(np.float32)
        assert ab.convert_memory(m, "numpy", "torch").float().numpy().tolist() == want.tolist()
        np.testing.assert_array_equal(ab.convert_memory(m, "numpy", "numpy", dtype="float32"), want)
        assert ab.stack_slices([m, m], "torch").shape == (2,) + m.shape
    # float8 both ways (ml_dtypes gives float8_e5m2 NumPy's kind 'f', the
    # others 'V'); a cast on the way reads them too
    for name in ("float8_e4m3fn", "float8_e5m2"):
        f8 = torch.from_numpy(a32).to(getattr(torch, name))
        n8 = ab.convert_memory(f8, "torch", "numpy")
        assert n8.dtype == getattr(ml_dtypes, name)
        np.testing.assert_array_equal(n8.view(np.uint8), f8.view(torch.uint8).numpy())
        assert ab.convert_memory(n8, "numpy", "torch").dtype == getattr(torch, name)
    np.testing.assert_array_equal(ab.convert_memory(b, "numpy", "numpy", dtype="float32"), a32)

    @ab.numpy
    def same(x):
        return x

    assert same(t).dtype == ml_dtypes.bfloat16


def test_bfloat16_to_numpy_without_ml_dtypes_says_so(monkeypatch):
    torch = need("torch")
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes: ImportError
    with pytest.raises(ab.MemoryConversionError, match="ml_dtypes, which adds them, is not installed"):
        ab.convert_memory(torch.ones(3, dtype=torch.bfloat16), "torch", "numpy")


def test_odd_framework_arrays_are_refused_or_kept_as_documented():
    """Five kinds the frameworks make (kinds probe): a byte-swapped
    bfloat16 NumPy array converted with its bytes read in the machine's
    order (1.0 became -5.8e-39); a torch nested tensor's shape raises
    RuntimeError, which escaped the decorators; JAX typed PRNG keys,
    which have no DLPack form, were refused by the jax -> jax no-op; a
    MemoryConversionError inside tf.function reached the caller as
    autograph's StagingError; and an impossible gpu_id passed unchecked
    for traced data."""
    ml_dtypes = need("ml_dtypes")
    swapped = np.array([1.0, 2.0, 3.0], ml_dtypes.bfloat16).astype(np.dtype(ml_dtypes.bfloat16).newbyteorder(">"))
    with pytest.raises(ab.MemoryConversionError, match="native byte order") as e:
        ab.convert_memory(swapped, "numpy", "numpy", dtype="float32")
    assert isinstance(e.value.__cause__, BufferError)
    torch = need("torch")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # strided nested tensors are a prototype, torch says
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    assert ab.torch(lambda x: x)(nested) is nested
    assert ab.torch(lambda x: nested)(torch.ones(1)) is nested
    with pytest.raises(ab.MemoryConversionError):
        ab.numpy(lambda x: x)(nested)
    jax = need("jax")
    key = jax.random.key(0)
    assert ab.convert_memory(key, "jax", "jax") is key

    @ab.jax
    def sample(k):
        return jax.random.normal(k, (2,))

    assert sample(key).shape == (2,)
    assert ab.jax(lambda x: key)(np.ones(1)) is key
    with pytest.raises(ab.MemoryConversionError, match="typed PRNG keys"):
        ab.convert_memory(key, "jax", "numpy")
    for gpu_id in (5, "a"):
        with pytest.raises((ab.MemoryConversionError, TypeError)) as eager:
            ab.convert_memory(jax.numpy.ones(2), "jax", "jax", gpu_id=gpu_id)
        with pytest.raises(type(eager.value)):
            jax.jit(lambda y: ab.convert_memory(y, "jax", "jax", gpu_id=gpu_id))(jax.numpy.ones(2))
    tf = need("tensorflow")

    @ab.tensorflow(output_type="numpy")
    def graph_to_numpy(x):
        return x * 2

    with pytest.raises(ab.MemoryConversionError, match="traced"):
        tf.function(graph_to_numpy)(tf.constant([1.0]))


def test_tensorflow_decorated_functions_run_inside_tf_function():
    """Graph tensors inside tf.function (Keras's fit runs there) pass as
    they are, as JAX's traced values do: they have no data to move. They
    failed on __dlpack_device__ before."""
    tf = need("tensorflow")

    @ab.tensorflow
    def double(x):
        return x * 2

    @ab.tensorflow
    def wider(x):
        return tf.cast(x, tf.float64) * 2  # cast back to float32 by TensorFlow under tracing

    x = tf.constant([1.0, 2.0])
    for f in (double, wider):
        r = tf.function(f)(x)
        assert r.dtype == tf.float32, f
        np.testing.assert_array_equal(r.numpy(), [2, 4])
    assert ab.convert_memory(x, "tensorflow", "tensorflow") is x
    v = tf.Variable([1.0, 2.0])

    @tf.function
    def on_variable():  # a variable captured inside tf.function is traced too
        return ab.convert_memory(v, "tensorflow", "tensorflow") * 2

    np.testing.assert_array_equal(on_variable().numpy(), [2, 4])

    class Weights(type(v)):  # a subclass of the variable's type
        pass

    assert ab.detect_memory_type(Weights([1.0])) == "tensorflow"
    sparse = tf.sparse.from_dense(tf.constant([[1.0, 0.0], [0.0, 2.0]]))

    @tf.function
    def on_sparse():  # a MemoryConversionError, as outside tf.function (TensorFlow's TypeError escaped)
        with pytest.raises(ab.MemoryConversionError):
            ab.convert_memory(sparse, "tensorflow", "numpy")
        return tf.constant(0)

    on_sparse()

    @ab.numpy
    def to_numpy(x):
        return x

    with pytest.raises(Exception, match="traced TensorFlow value"):  # within autograph's StagingError
        tf.function(to_numpy)(x)


def test_torch_compile_traces_a_torch_decorated_function():
    """torch.compile could not trace the torch -> torch no-op of @torch
    (__dlpack_device__'s enum). In a process of its own: one that has
    loaded TensorFlow aborts in torch.compile (two LLVMs' options), with
    or without arraybridge."""
    need("torch")
    code = textwrap.dedent("""
        import numpy as np, torch, arraybridge as ab

        @ab.torch
        def f(x):
            return x * 2 + 1

        r = torch.compile(f, backend="eager")(torch.ones(3))
        assert type(r) is torch.Tensor and r.tolist() == [3.0, 3.0, 3.0], r
        r = torch.compile(f, backend="eager")(np.ones(3, np.float32))  # a graph break converts it
        assert type(r) is torch.Tensor and r.tolist() == [3.0, 3.0, 3.0], r
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_subclasses_of_framework_arrays_are_that_frameworks():
    """A user's subclass of np.ndarray or torch.Tensor is that framework's
    array: decorators passed it on unconverted, and convert_memory refused
    it as '__main__.MyArray, not numpy'."""
    class Frame(np.ndarray):
        pass

    a = np.arange(6.0).reshape(2, 3).view(Frame)
    assert ab.detect_memory_type(a) == "numpy"
    torch = need("torch")

    @ab.torch
    def twice(x):
        assert type(x) is torch.Tensor
        return x * 2

    r = twice(a)
    assert type(r) is torch.Tensor
    np.testing.assert_array_equal(r.numpy(), np.asarray(a) * 2)
    assert ab.convert_memory(a, "numpy", "torch").data_ptr() == a.ctypes.data

    # a base of a framework's that is no array type makes no array: a
    # NumPy mixin's duck array, an nn.Module
    class Duck(np.lib.mixins.NDArrayOperatorsMixin):
        shape, dtype = (2,), np.dtype("float32")

        def __array__(self, dtype=None, copy=None):
            return np.ones(2, np.float32)

    duck = Duck()
    assert ab.torch(lambda x: x)(duck) is duck  # no array: runs as it is
    with pytest.raises(ValueError, match="Unknown memory type"):
        ab.detect_memory_type(duck)

    class Net(torch.nn.Module):
        pass

    with pytest.raises(ValueError, match="Unknown memory type"):
        ab.detect_memory_type(Net())

    class Labelled(torch.Tensor):
        pass

    t = torch.arange(3.0).as_subclass(Labelled)
    assert ab.detect_memory_type(t) == "torch"
    np.testing.assert_array_equal(ab.convert_memory(t, "torch", "numpy"), [0, 1, 2])


def test_decorators_stacked_above_classmethod_and_staticmethod():
    """@torch above @classmethod said it was given a gpu_id; both kinds of
    method are wrapped and stay what they were."""
    torch = need("torch")

    class Model:
        @ab.torch(output_type="numpy")
        @classmethod
        def scaled(cls, x, k=2):
            assert cls is Model and type(x) is torch.Tensor
            return x * k

        @ab.torch(output_type="numpy")
        @staticmethod
        def plus(x):
            assert type(x) is torch.Tensor
            return x + 1

        @ab.torch(output_type="numpy")
        @classmethod
        def named_otherwise(klass, x):  # the class's parameter by any name
            assert klass is Model and type(x) is torch.Tensor
            return x - 1

    a = np.arange(3, dtype=np.float32)
    for f in (Model.scaled, Model().scaled):
        np.testing.assert_array_equal(f(a), a * 2)
    np.testing.assert_array_equal(Model.scaled(a, k=3), a * 3)
    for f in (Model.plus, Model().plus):
        np.testing.assert_array_equal(f(a), a + 1)
    np.testing.assert_array_equal(Model.named_otherwise(a), a - 1)
    assert Model.scaled.input_memory_type == "torch" and Model.plus.output_memory_type == "numpy"
    assert Model.__dict__["scaled"].input_memory_type == "torch"  # on the classmethod object too


# ---- stack_slices / unstack_slices ---------------------------------------------


@pytest.mark.parametrize("target", ["numpy", "torch", "jax", "tensorflow", "pyclesperanto"])
def test_stack_slices_of_mixed_frameworks_into_one_array(target):
    need(target) if target != "numpy" else None
    if target == "pyclesperanto":
        opencl(1)
    rng = np.random.default_rng(3)
    planes = [rng.random((5, 7)).astype(np.float32) for _ in range(4)]
    slices = [planes[0], make("torch", planes[1]), make("jax", planes[2]), planes[3][::-1].copy()[::-1]]
    s = ab.stack_slices(slices, target, 0 if target == "pyclesperanto" else None)
    assert ab.detect_memory_type(s) == target
    got = values(target, s)
    assert got.shape == (4, 5, 7) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.stack(planes))
    back = ab.unstack_slices(s, "numpy", None)
    assert len(back) == 4 and all(b.shape == (5, 7) for b in back)
    np.testing.assert_array_equal(back[2], planes[2])


def test_stack_slices_of_float8_slices():
    """float8 slices (ml_dtypes' NumPy arrays, torch's) stack as they are;
    stack_slices refused them as "not one arraybridge converts" although
    convert_memory takes them. A cast into float8 stays refused."""
    ml_dtypes = need("ml_dtypes")
    torch = need("torch")
    a = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5).astype(ml_dtypes.float8_e4m3fn)
    t = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    s = ab.stack_slices([a, t], "numpy")
    assert s.dtype == ml_dtypes.float8_e4m3fn and s.shape == (2, 3, 4)
    np.testing.assert_array_equal(s.view(np.uint8), np.stack([a.view(np.uint8)] * 2))
    s = ab.stack_slices([t, a], "torch")
    assert s.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(s.view(torch.uint8).numpy(), np.stack([a.view(np.uint8)] * 2))
    with pytest.raises(ab.MemoryConversionError, match="float8"):
        ab.stack_slices([a, np.ones((3, 4), np.float32)], "numpy")


def test_stack_slices_casts_to_the_first_slices_dtype_and_checks_shapes():
    s = ab.stack_slices([np.ones((2, 2), np.uint8), np.full((2, 2), 300, np.int32)], "numpy")
    assert s.dtype == np.uint8 and s[1, 0, 0] == 255  # saturated, as the C core casts
    for nothing in ([], (), None):  # None as the seed refused it
        with pytest.raises(ValueError, match="empty"):
            ab.stack_slices(nothing, "numpy")
    with pytest.raises(TypeError, match="not iterable"):
        ab.stack_slices(5, "numpy")
    planes = np.arange(12, dtype=np.float32).reshape(3, 2, 2)  # a 3-D array's planes; any iterable
    np.testing.assert_array_equal(ab.stack_slices(planes, "numpy"), planes)
    np.testing.assert_array_equal(ab.stack_slices((p for p in planes), "numpy"), planes)
    with pytest.raises(ValueError, match="index 1 is not a 2D"):
        ab.stack_slices([np.zeros((2, 2)), np.zeros(2)], "numpy")
    with pytest.raises(ValueError, match="index 1 has shape"):
        ab.stack_slices([np.zeros((2, 2)), np.zeros((2, 3))], "numpy")
    for shape in ((2, 2), (2, 2, 2, 2)):
        for validate in (True, False):  # validate_slices checks the slices, not the array
            with pytest.raises(ValueError, match="must be 3D"):
                ab.unstack_slices(np.zeros(shape), "numpy", validate_slices=validate)
    # pyclesperanto's indexing gives a number for a one-element slice: the
    # documented ValueError, not an AttributeError
    if n_devices("opencl") > 0:
        need("pyclesperanto")
        whole = ab.stack_slices([np.ones((1, 1), np.float32)] * 3, "pyclesperanto")
        with pytest.raises(ValueError, match="index 0 is not 2D .*gave a float"):
            ab.unstack_slices(whole, "pyclesperanto")


def test_stack_slices_of_complex_and_a_dtype_the_target_lacks():
    c = [np.full((2, 3), 1 + 2j, np.complex64), np.full((2, 3), 3 - 1j, np.complex64)]
    s = ab.stack_slices(c, "numpy")
    assert s.dtype == np.complex64
    np.testing.assert_array_equal(s, np.stack(c))
    need("jax")
    import jax.numpy as jnp
    b = [jnp.ones((2, 2), jnp.bfloat16)] * 2
    s = ab.stack_slices(b, "numpy")  # ml_dtypes' bfloat16, as np.asarray of a JAX array gives
    assert s.dtype == jnp.bfloat16 and s.shape == (2, 2, 2)
    np.testing.assert_array_equal(s.astype(np.float32), np.ones((2, 2, 2), np.float32))


def test_convert_into_refuses_bad_outputs():
    out = ab.empty((2, 3), "float32")
    with pytest.raises(ValueError, match="shape"):
        ab.convert_into(np.zeros((3, 2), np.float32), out)
    with pytest.raises(IndexError):
        ab.convert_into(np.zeros(3, np.float32), out, index=2)
    ro = np.zeros((2, 3), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ab.convert_into(np.ones((2, 3), np.float32), ro)
    assert not ro.any()
    ab.convert_into(np.arange(3, dtype=np.int64), out, index=-1)
    np.testing.assert_array_equal(np.from_dlpack(out)[1], [0, 1, 2])
    with pytest.raises(IndexError):
        ab.convert_into(np.zeros(3, np.float32), out, index=1 << 70)
    # A broadcast (stride-0) axis 0: its planes are one memory.
    flat = np.zeros(3, np.float32)
    bcast = np.lib.stride_tricks.as_strided(flat, (4, 3), (0, 4), writeable=True)
    with pytest.raises(ValueError, match="stride 0"):
        ab.convert_into(np.ones(3, np.float32), bcast, index=1)
    assert not flat.any()
    # JAX and TensorFlow arrays are immutable, whatever their DLPack says.
    need("jax")
    import jax.numpy as jnp
    tf = need("tensorflow")
    for imm in (jnp.zeros((2, 3), jnp.float32), tf.zeros((2, 3))):
        with pytest.raises(TypeError, match="immutable"):
            ab.convert_into(np.ones((2, 3), np.float32), imm)
        assert not np.asarray(imm).any()


def test_convert_into_an_index_of_a_reversed_output():
    base = np.zeros((3, 4), np.float32)
    rev = base[::-1]
    for i in range(3):
        ab.convert_into(np.full(4, i + 1, np.float32), rev, index=i)
    np.testing.assert_array_equal(base[:, 0], [3, 2, 1])
    np.testing.assert_array_equal(rev, np.repeat(np.arange(1, 4, dtype=np.float32), 4).reshape(3, 4))


# ---- other libraries in the same process ----------------------------------------

ORDERS = {
    "tensorflow_then_our_opencl": "import tensorflow\nimport arraybridge as ab, numpy as np\n"
                                  "t = ab.to_device(np.arange(6.0), 'opencl:0')\n"
                                  "assert (np.from_dlpack(ab.to_device(t, 'cpu')) == np.arange(6.0)).all()\n",
    "our_opencl_then_tensorflow": "import arraybridge as ab, numpy as np\nab.to_device(np.arange(6.0), 'opencl:1')\n"
                                  "import tensorflow as tf\nassert int(tf.reduce_sum(tf.constant([1, 2]))) == 3\n",
    "tensorflow_then_pyclesperanto_through_us": "import tensorflow\nimport arraybridge as ab, numpy as np\n"
                                                "import pyclesperanto as cle\n"
                                                "g = ab.convert_memory(np.ones((8, 8), np.float32), 'numpy', "
                                                "'pyclesperanto', gpu_id=0)\n"
                                                "assert cle.pull(cle.gaussian_blur(g, sigma_x=1, sigma_y=1)).sum() "
                                                "== 64\n",
    "arraybridge_tensorflow_then_pyclesperanto": "import arraybridge\nimport tensorflow\nimport pyclesperanto as cle\n"
                                                 "print(cle.list_available_devices())\n",
    "pyclesperanto_then_tensorflow": "import arraybridge as ab, numpy as np, pyclesperanto as cle\n"
                                     "g = ab.convert_memory(np.ones((4, 4), np.float32), 'numpy', 'pyclesperanto')\n"
                                     "import tensorflow as tf\n"
                                     "assert ab.convert_memory(g, 'pyclesperanto', 'tensorflow').shape == (4, 4)\n",
}


PRELOADS = {  # environment -> whether `import arraybridge` loads PoCL (with RTLD_DEEPBIND)
    (): True,
    (("AB_OPENCL_DEEPBIND", "0"),): False,
    (("AB_OPENCL_DEEPBIND", "off"),): False,
    (("OCL_ICD_VENDORS", "pocl.icd"),): True,  # a bare name: looked up in the vendors directory
    (("OCL_ICD_VENDORS", "/nonexistent/none.icd"),): False,
    (("OCL_ICD_FILENAMES", "/nonexistent/libnone.so"),): True,  # the vendors directory still counts
    (("OPENCL_VENDOR_PATH", "/nonexistent"),): False,
}


@pytest.mark.parametrize("env", sorted(PRELOADS), ids=lambda e: ",".join("%s=%s" % kv for kv in e) or "default")
def test_import_preloads_the_drivers_the_icd_loader_would_load(env):
    opencl(1)
    if not os.path.exists("/etc/OpenCL/vendors/pocl.icd"):
        pytest.skip("PoCL is not installed through /etc/OpenCL/vendors/pocl.icd")
    code = ("import arraybridge\n"
            "print(any('libpocl' in line for line in open('/proc/self/maps')))\n")
    full = {k: v for k, v in os.environ.items() if k not in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES",
                                                               "OPENCL_VENDOR_PATH", "AB_OPENCL_DEEPBIND")}
    full.update(dict(env))
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(PRELOADS[env]), r.stdout + r.stderr


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_tensorflow_and_opencl_in_one_process_in_either_order(order):
    need("tensorflow")
    need("pyclesperanto")
    opencl(2)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", ORDERS[order]], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, "%s: exit %d\n%s" % (order, r.returncode, r.stderr[-2000:])


# ---- the page's own code (../shared/reference, the GPU Features page) ------------

PAGE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "reference",
                    "arraybridge-python-gpu-features.rst")


def page_blocks():
    import re
    with open(PAGE, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)\.\. code-block:: python\s*$", lines[i])
        i += 1
        if not m:
            continue
        body = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(m.group(1))):
            body.append(lines[i])
            i += 1
        blocks.append(textwrap.dedent("\n".join(body)).strip("\n"))
    return blocks


# Each block of the page (26), in order: None where a CPU runs it, else
# what it needs: (GPUs, modules). A block that needs a GPU runs where torch
# and arraybridge both see that many CUDA devices (make gpu-check runs these
# on a GPU machine) and skips elsewhere, saying why.
PAGE_PLAN = [(2, ()), None, (1, ("cupy",)), None, None, (4, ()), (1, ("cupy",)), (1, ("cupy",)), (1, ("cupy",)),
             (1, ()), (1, ()), (1, ()), (2, ()), None, (1, ("cupy",)), None, None, (1, ()), None, (1, ()), None,
             (1, ("pynvml",)), None, None, (1, ()), None]


def page_gpus():
    """How many GPUs the page's CUDA blocks can use: CUDA devices that both
    torch and arraybridge see. 0 without a CUDA build of torch, and 0 under
    simcuda (AB_SIMCUDA_DEVICES), whose simulated GPUs torch cannot use even
    where a real one is."""
    if os.environ.get("AB_SIMCUDA_DEVICES"):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        return 0
    return min(torch.cuda.device_count(), n_devices("cuda"))


def page_gpus_expected():
    """The GPU count make gpu-check promises on a real GPU machine
    (AB_TEST_EXPECT_CUDA, not under simcuda), else None: there the page
    must be present and every GPU usable, so that no block skips by mistake."""
    expect = os.environ.get("AB_TEST_EXPECT_CUDA")
    return int(expect) if expect and not os.environ.get("AB_SIMCUDA_DEVICES") else None


def need_page():
    if not os.path.exists(PAGE):
        if page_gpus_expected() is not None:
            pytest.fail("the reference page is not beside the repository (%s), and gpu-check needs it" % PAGE)
        pytest.skip("the reference page is not beside the repository (%s)" % PAGE)


def test_the_page_has_the_blocks_this_test_plans_for():
    need_page()
    assert len(page_blocks()) == len(PAGE_PLAN)


def page_namespace():
    """What the page's snippets take as given: imports, and the names that
    its prose or earlier blocks define (data, batches, process, ...)."""
    import torch
    rng = np.random.default_rng(0)
    arr = lambda *shape: rng.random(shape).astype(np.float32)  # noqa: E731
    calls, oom_raised, large = [], [], arr(256, 256)

    def process(t):  # the page's stand-in for a GPU computation
        calls.append(t.device.type)
        return t * 2

    def process_on_gpu(d):  # block 24's: the large batch does not fit, as the block plans for
        if d is large:
            oom_raised.append(True)
            raise RuntimeError("CUDA out of memory (the test's stand-in for a batch too large)")
        return ab.convert_memory(d, "numpy", "torch", gpu_id=0) * 2

    return {"np": np, "torch": torch, "convert_memory": ab.convert_memory, "data": arr(64, 64),
            "gpu_operation1": lambda d: d + 1, "gpu_operation2": lambda d: d * 2,
            "np_data": arr(48, 48), "batches": [arr(32, 32) for _ in range(8)], "process": process,
            "calls": calls, "data_list": [arr(16, 16) for _ in range(4)], "results": [],
            "cpu_data": torch.from_numpy(arr(40, 40)), "data_loader": [arr(8, 8) for _ in range(3)],
            "large_data": large, "smaller_batch": arr(64, 64), "oom_raised": oom_raised,
            "process_on_gpu": process_on_gpu}


def check_page_gpu_block(k, ns):
    """Each CUDA block's results: on the GPU it names, with the values it must have."""
    import torch

    def on(t, i=0):
        assert isinstance(t, torch.Tensor) and t.device == torch.device("cuda", i), t.device
        return t.cpu().numpy()

    torch.cuda.synchronize()
    if k == 0:
        np.testing.assert_array_equal(on(ns["gpu0_data"], 0), ns["np_data"])
        np.testing.assert_array_equal(on(ns["gpu1_data"], 1), ns["np_data"])
    elif k == 2:
        import cupy as cp
        assert ns["num_gpus"] == cp.cuda.runtime.getDeviceCount() >= 1
    elif k == 5:
        assert len(ns["results"]) == len(ns["batches"])
        for b, r in zip(ns["batches"], ns["results"]):
            np.testing.assert_allclose(r, b @ b.T, rtol=1e-3)
    elif k == 6:
        import contextlib
        import io
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ns["print_gpu_memory"]()
        assert "GPU 0 (PyTorch)" in out.getvalue() and "CuPy memory" in out.getvalue(), out.getvalue()
    elif k == 7:
        import cupy as cp
        cp.arange(1 << 20)  # something in CuPy's pool for the helper to free
        ns["clear_gpu_memory"]()
        assert cp.get_default_memory_pool().free_bytes() == 0  # nothing cached is left
    elif k == 8:
        np.testing.assert_array_equal(on(ns["gpu_data"]), ns["data"])
        np.testing.assert_array_equal(on(ns["result"]), ns["data"] * 2)
    elif k == 9:
        np.testing.assert_array_equal(on(ns["gpu_batch"]), np.stack(ns["data_list"]))
        assert len(ns["results"]) == len(ns["data_list"])  # the batch's (the loop's list was rebound)
        for r, d in zip(ns["results"], ns["data_list"]):
            np.testing.assert_array_equal(on(r), d * 2)
        assert ns["calls"] == ["cuda"] * 2 * len(ns["data_list"])  # the loop's items, then the batch's
    elif k == 10:
        np.testing.assert_array_equal(on(ns["gpu_data"]), ns["np_data"])
    elif k == 11:
        np.testing.assert_array_equal(on(ns["result"]), ns["cpu_data"].numpy() * 2)
    elif k == 12:
        np.testing.assert_array_equal(on(ns["gpu0_data"], 0), ns["data"])
        np.testing.assert_array_equal(on(ns["gpu1_data"], 1), ns["data"])  # method 2's
        np.testing.assert_array_equal(ns["cpu_data"], ns["data"])
        # Method 1's direct GPU-to-GPU result, which the block then rebinds.
        direct = ab.convert_memory(ns["gpu0_data"], "torch", "torch", gpu_id=1)
        np.testing.assert_array_equal(on(direct, 1), ns["data"])
    elif k == 14:
        import cupy as cp
        x = np.random.default_rng(1).random((24, 24)).astype(np.float32)
        r = ns["cupy_gpu_ops"](x)
        assert isinstance(r, cp.ndarray) and r.device.id == 0
        np.testing.assert_allclose(cp.asnumpy(r), x @ x.T, rtol=1e-3)
    elif k == 17:
        np.testing.assert_array_equal(on(ns["gpu_data"]), np.array([1, 2, 3], np.float32))
    elif k == 19:
        assert ns["calls"] == ["cuda"] * len(ns["data_loader"])
    elif k == 21:
        assert 0 <= ns["util"].gpu <= 100 and 0 <= ns["util"].memory <= 100
    elif k == 24:  # the large batch ran out of memory (see page_namespace): the retry's result
        assert ns["oom_raised"] == [True]
        np.testing.assert_array_equal(on(ns["result"]), ns["smaller_batch"] * 2)
    else:
        raise AssertionError("no check for page block %d" % k)


@pytest.mark.parametrize("k", range(len(PAGE_PLAN)))
def test_the_pages_code_runs(k):
    need_page()
    need("torch")
    if PAGE_PLAN[k] is not None:
        gpus, mods = PAGE_PLAN[k]
        have, expect = page_gpus(), page_gpus_expected()
        if expect is not None:  # a GPU machine under gpu-check: torch and arraybridge must see every GPU
            assert have == expect, "AB_TEST_EXPECT_CUDA=%d, but torch and arraybridge both see %d" % (expect, have)
        if have < gpus:
            pytest.skip("block %d needs %d CUDA GPU(s) seen by torch and arraybridge, this machine has %d"
                        % (k, gpus, have))
        for m in mods:
            pytest.importorskip(m, reason="block %d needs %s" % (k, m))
    code = page_blocks()[k]
    ns = page_namespace()
    if k == 8:  # its clear_gpu_memory() is block 7's
        exec(compile(page_blocks()[7], "page block 7", "exec"), ns)
    # pyclesperanto_prototype is the page's name for pyclesperanto (the
    # same calls: gaussian_blur, pull).
    cle = "pyclesperanto" in code
    if cle:
        sys.modules.setdefault("pyclesperanto_prototype", need("pyclesperanto"))
    if "jax" in code:
        need("jax")
    try:
        exec(compile(code, "page block %d" % k, "exec"), ns)
    finally:
        sys.modules.pop("pyclesperanto_prototype", None)
    if PAGE_PLAN[k] is not None:
        check_page_gpu_block(k, ns)
        return
    if "cle_gpu_ops" in ns:  # the pyclesperanto example, run on OpenCL device 0
        opencl(1)
        img = np.full((32, 32), 7, np.float32)
        sys.modules["pyclesperanto_prototype"] = need("pyclesperanto")
        try:
            out = ns["cle_gpu_ops"](img)
        finally:
            sys.modules.pop("pyclesperanto_prototype", None)
        np.testing.assert_allclose(out, img, rtol=1e-6)
    if "get_least_used_gpu" in code:  # ran to the end: the least used GPU, or None without CUDA
        if not need("torch").cuda.is_available():  # the block's own test
            assert ns["gpu_id"] is None and ns["gpu_data"].device.type == "cpu"
        else:
            assert ns["gpu_data"].device == need("torch").device("cuda", ns["gpu_id"])
    if "result = ((data + 1) * 2) ** 2" in code:
        np.testing.assert_array_equal(ns["result"], ((ns["data"] + 1) * 2) ** 2)
    # Where GPUs are, the decorated functions of blocks 1 and 13 are called
    # too: @torch(gpu_id=N) runs them on cuda:N. (Block 15's x.device() is
    # JAX's old method, a property in the JAX of today, so it is only defined.)
    torch = need("torch")
    x = np.random.default_rng(2).random((20, 20)).astype(np.float32)
    for name, gpu in (("process_gpu0", 0), ("process_gpu1", 1), ("pytorch_gpu_ops", 0)):
        if name in ns and page_gpus() > gpu:
            r = ns[name](x)
            assert isinstance(r, torch.Tensor) and r.device == torch.device("cuda", gpu), r.device
            np.testing.assert_allclose(r.cpu().numpy(), x @ x.T, rtol=1e-3)


def test_the_pages_model_with_decorated_methods_runs_on_the_host():
    # The page's MultiGPUModel decorates methods (self first) with
    # @torch(gpu_id=N); its GPU ids are taken out, so it runs on any machine.
    need_page()
    torch = need("torch")
    code = next(b for b in page_blocks() if "class MultiGPUModel" in b)
    for gpu in ("gpu_id=0, ", "gpu_id=1, "):
        assert gpu in code
        code = code.replace(gpu, "")
    code = code.replace(", gpu_id=1)", ")")
    ns = page_namespace()
    exec(compile(code, "page block (host)", "exec"), ns)

    class Model(ns["MultiGPUModel"]):
        def _create_layer(self, k):
            return lambda x: x * (k + 2)

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = Model().forward(x)
    assert isinstance(r, torch.Tensor)
    np.testing.assert_array_equal(r.numpy(), x * 2 * 3)


# ---- the device-level pieces the seed API stands on -----------------------------


def test_to_device_layout_copies_only_what_a_framework_cannot_take():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    rev, step = base[::-1], base[:, ::2]
    t = ab.to_device(rev, "cpu", layout="any")
    assert t.data_ptr == rev.__array_interface__["data"][0] and t.strides == (-6, 1)
    t = ab.to_device(rev, "cpu", layout="nonnegative")
    assert t.strides == (6, 1) and t.data_ptr != rev.__array_interface__["data"][0]
    np.testing.assert_array_equal(np.from_dlpack(t), rev)
    assert ab.to_device(step, "cpu", layout="nonnegative").strides == (6, 2)  # a view: no stride is negative
    t = ab.to_device(step, "cpu", layout="compact")
    assert t.strides == (3, 1)
    np.testing.assert_array_equal(np.from_dlpack(t), step)
    assert ab.to_device(base, "cpu", layout="compact").data_ptr == base.__array_interface__["data"][0]
    with pytest.raises(BufferError):
        ab.to_device(step, "cpu", layout="compact", copy=False)
    with pytest.raises(ValueError, match="layout"):
        ab.to_device(base, "cpu", layout="rowmajor")


def test_to_device_takes_a_capsule_once():
    a = np.arange(5.0)
    cap = a.__dlpack__()
    t = ab.to_device(cap, "cpu")
    assert t.data_ptr == a.__array_interface__["data"][0]
    with pytest.raises(BufferError, match="consumed"):
        ab.to_device(cap, "cpu")
    del t


def test_threads_convert_to_both_opencl_devices_at_once():
    """The page's ThreadPoolExecutor pattern, on the OpenCL devices: each
    result lands on the device asked for, and pyclesperanto's current device
    is the caller's again afterwards."""
    from concurrent.futures import ThreadPoolExecutor
    opencl(2)
    cle = need("pyclesperanto")
    before = cle.get_device().index
    batches = [np.full((32, 32), i, np.float32) for i in range(24)]

    def work(i):
        g = ab.convert_memory(batches[i], "numpy", "pyclesperanto", gpu_id=i % 2)
        return g.__dlpack_device__()[1], ab.convert_memory(g, "pyclesperanto", "numpy")

    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(work, range(len(batches))))
    for i, (dev, back) in enumerate(results):
        assert dev == i % 2
        np.testing.assert_array_equal(back, batches[i])
    assert cle.get_device().index == before


def test_convert_into_reads_the_outs_module_name_safely():
    # A type whose __module__ is made afresh on each read (a metaclass
    # property): the name must be read before it is let go.
    class Meta(type):
        @property
        def __module__(cls):
            return "".join(["tensorflow", ".fake"])

    class Fake(metaclass=Meta):
        def __dlpack__(self, **kw):
            raise AssertionError("never imported")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match="TensorFlow array"):
        ab.convert_into(np.ones(3, np.float32), Fake())

    class Broken(type):
        @property
        def __module__(cls):
            raise KeyboardInterrupt

    class Odd(metaclass=Broken):
        pass

    with pytest.raises(KeyboardInterrupt):
        ab.convert_into(np.ones(3, np.float32), Odd())
