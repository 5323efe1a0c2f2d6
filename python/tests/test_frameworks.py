"""arraybridge against the frameworks users exchange tensors with, each
through its own DLPack implementation rather than ours.

- JAX on the CPU runs in CI (jax[cpu] from PyPI, python/requirements-test.txt).
- PyTorch and CuPy run where they are installed: PyTorch's PyPI wheel
  brings the CUDA libraries (gigabytes), so CI does not install it; the GPU
  machine has all three.
- The CUDA cases need a GPU as well and skip, saying why, without one.

Zero-copy is proven by comparing the frameworks' own data pointers, and by
writes through one side seen in the other."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import arraybridge as ab
from ab_support import addr, n_devices, opencl


def bits(a):
    """The array's bytes, so that NaN payloads and -0.0 compare exactly."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view("u%d" % a.dtype.itemsize)


# ---- JAX (CPU) --------------------------------------------------------------

def need_jax():
    # On a GPU machine JAX would reserve most of the GPU's memory at import.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'jax[cpu]')")
    import jax.numpy as jnp

    return jax, jnp


@pytest.fixture
def jax_cpu():
    """JAX's arrays on its CPU device, also where JAX has a GPU."""
    jax, jnp = need_jax()
    with jax.default_device(jax.devices("cpu")[0]):
        yield jax, jnp


JAX_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "float16", "bfloat16", "float32",
              "complex64"]


def jax_sample(name, shape=(5, 7)):
    _, jnp = need_jax()
    rng = np.random.default_rng(len(name))
    if name == "bool":
        return jnp.asarray(rng.integers(0, 2, shape).astype(bool))
    if name.startswith("complex"):
        return jnp.asarray((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(name))
    if name in ("float16", "bfloat16", "float32"):
        return jnp.asarray(rng.standard_normal(shape) * 100).astype(name)
    info = np.iinfo(name)
    return jnp.asarray(rng.integers(info.min, info.max, shape, endpoint=True).astype(name))


def test_jax_to_arraybridge_shares_memory(jax_cpu):
    jax, jnp = jax_cpu
    x = jnp.arange(24, dtype=jnp.float32).reshape(4, 6) * 2
    t = ab.from_dlpack(x)
    assert (t.shape, t.dtype, t.device) == ((4, 6), "float32", "cpu:0")
    v = np.from_dlpack(t)
    assert addr(v) == x.unsafe_buffer_pointer()
    assert np.array_equal(v, np.arange(24, dtype=np.float32).reshape(4, 6) * 2)


def test_arraybridge_to_jax_shares_memory_and_writes_show_through(jax_cpu):
    jax, jnp = jax_cpu
    # Memory arraybridge allocated is 64-byte aligned, which XLA needs to
    # use a buffer in place instead of copying it.
    a = np.arange(1000, dtype=np.int32)
    t = ab.to_device(a, "cpu", copy=True)
    mine = np.from_dlpack(t)
    j = jnp.from_dlpack(t)
    assert j.unsafe_buffer_pointer() == addr(mine)
    mine[3] = -7  # JAX arrays are immutable by contract; this shows the sharing
    assert int(j[3]) == -7


def test_64_bit_floats_reach_jax_without_x64_rounded_as_numpy_rounds(jax_cpu):
    """With JAX's 64-bit types off, its own DLPack import narrows float64
    flushing float32 subnormals to zero; jnp.asarray (NumPy's astype) keeps
    them. convert_memory gives jnp.asarray's values, bit for bit."""
    jax, jnp = jax_cpu
    if jax.config.jax_enable_x64:
        pytest.skip("JAX's 64-bit types are on here")
    x = np.array([1e-40, -3e-42, 1.401298464324817e-45, 0.1, 1e300, -0.0, np.nan], np.float64)
    c = (x + 1j * x[::-1]).astype(np.complex128)
    for a, want in ((x, x.astype(np.float32)), (c, c.astype(np.complex64))):
        got = ab.convert_memory(a, "numpy", "jax")
        assert got.dtype == want.dtype
        assert np.array_equal(bits(np.asarray(got)), bits(want))
    assert int(ab.convert_memory(np.array([2**40 + 5], np.int64), "numpy", "jax")[0]) == 5  # wraps, as jnp.asarray


@pytest.mark.parametrize("name", JAX_DTYPES)
def test_every_jax_dtype_round_trips_bit_exact(name, jax_cpu):
    jax, jnp = jax_cpu
    x = jax_sample(name)
    t = ab.from_dlpack(x)
    assert t.dtype == name
    assert t.shape == x.shape
    back = jnp.from_dlpack(t)
    assert back.dtype == x.dtype
    assert np.array_equal(bits(np.asarray(back)), bits(np.asarray(x)))


def test_a_jax_array_stays_alive_while_arraybridge_uses_it(jax_cpu):
    jax, jnp = jax_cpu
    x = jnp.arange(4096, dtype=jnp.float32) + 1
    t = ab.from_dlpack(x)
    del x
    gc.collect()
    jnp.zeros(1 << 16).block_until_ready()  # new allocations reuse freed memory
    assert np.array_equal(np.from_dlpack(t), np.arange(4096, dtype=np.float32) + 1)


def test_a_deleted_jax_array_is_said_to_be_deleted(jax_cpu):
    # JAX's __dlpack_device__ of one failed with "object of type 'NoneType'
    # has no len()", which is all the user saw
    jax, jnp = jax_cpu
    x = jnp.arange(4.0)
    x.delete()
    for call in (lambda: ab.to_device(x, "cpu"), lambda: ab.from_dlpack(x)):
        with pytest.raises(ValueError, match="has been deleted") as info:
            call()
        assert info.value.__cause__ is not None
    with pytest.raises(ab.MemoryConversionError, match="JAX array has been deleted"):
        ab.convert_memory(x, "jax", "numpy")


@pytest.mark.parametrize("name", ["uint8", "bfloat16", "float16", "int16"])
def test_jax_arrays_through_opencl_bit_exact(name, jax_cpu):
    jax, jnp = jax_cpu
    opencl()
    x = jax_sample(name, (3, 17, 5))
    on_cl = ab.to_device(x, "opencl:0")
    back = jnp.from_dlpack(ab.to_device(on_cl, "cpu"))
    assert np.array_equal(bits(np.asarray(back)), bits(np.asarray(x)))


def test_a_jax_image_converted_and_reordered_on_opencl_like_numpy(jax_cpu):
    jax, jnp = jax_cpu
    opencl()
    hwc = jax_sample("uint8", (48, 64, 3))
    chw = ab.to_device(hwc, "opencl:0", dtype="float32", permute=(2, 0, 1))
    got = jnp.from_dlpack(ab.to_device(chw, "cpu"))
    want = np.transpose(np.asarray(hwc), (2, 0, 1)).astype(np.float32)
    assert got.shape == (3, 48, 64)
    assert np.array_equal(np.asarray(got), want)


def test_jax_on_a_gpu_exchanges_with_arraybridge():
    jax, jnp = need_jax()
    gpus = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
    if not gpus or n_devices("cuda") < 1:
        pytest.skip("needs JAX with a CUDA GPU and arraybridge's CUDA backend (JAX: %s, arraybridge CUDA devices: %d)"
                    % (jax.default_backend(), n_devices("cuda")))
    x = jax.device_put(jnp.arange(1 << 16, dtype=jnp.float32) * 3, gpus[0])
    t = ab.from_dlpack(x)
    assert t.device == "cuda:%d" % gpus[0].id
    assert np.array_equal(np.from_dlpack(ab.to_device(t, "cpu")), np.asarray(x))
    back = jnp.from_dlpack(ab.to_device(np.arange(100, dtype=np.float32), "cuda:0"))
    assert np.array_equal(np.asarray(back), np.arange(100, dtype=np.float32))


# ---- PyTorch ----------------------------------------------------------------


def need_torch():
    return pytest.importorskip(
        "torch", reason="PyTorch is not installed (CI leaves it out: its PyPI wheel brings the CUDA libraries)")


def need_torch_cuda():
    torch = need_torch()
    if not torch.cuda.is_available() or n_devices("cuda") < 1:
        pytest.skip("needs a CUDA GPU seen by both PyTorch (%s) and arraybridge (%d CUDA devices)"
                    % (torch.cuda.is_available(), n_devices("cuda")))
    return torch


TORCH_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
                "complex64", "complex128"]


def torch_sample(torch, name, shape=(6, 9)):
    g = torch.Generator().manual_seed(len(name))
    dt = getattr(torch, name)
    if name == "bool":
        return torch.randint(0, 2, shape, generator=g).bool()
    if dt.is_complex:
        return torch.randn(shape, generator=g, dtype=torch.complex128).to(dt)
    if dt.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dt)
    info = torch.iinfo(dt)
    return torch.randint(max(info.min, -(1 << 62)), min(info.max, 1 << 62), shape, generator=g, dtype=dt)


def same_torch(torch, a, b):
    """Equal bit for bit (NaNs, -0.0), whatever the dtype."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous(), b.contiguous()
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(view), b.view(view))


def test_torch_to_arraybridge_and_back_shares_memory():
    torch = need_torch()
    x = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    t = ab.from_dlpack(x)
    assert (t.shape, t.strides, t.dtype, t.device) == ((4, 5), (5, 1), "float32", "cpu:0")
    v = np.from_dlpack(t)
    assert addr(v) == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr()
    y[1, 2] = -1.5
    assert float(x[1, 2]) == -1.5 and v[1, 2] == -1.5


def test_arraybridge_to_torch_shares_memory():
    torch = need_torch()
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    y = torch.from_dlpack(ab.from_dlpack(a))
    assert y.data_ptr() == addr(a)
    a[2, 3] = 99
    assert int(y[2, 3]) == 99


@pytest.mark.parametrize("view", ["transposed", "every_other_column", "broadcast", "sliced_rows"])
def test_strided_torch_views_import_zero_copy(view):
    torch = need_torch()
    base = torch.arange(60, dtype=torch.int16).reshape(6, 10)
    v = {"transposed": base.t(), "every_other_column": base[:, ::2], "broadcast": base[2:3, :].expand(4, 10),
         "sliced_rows": base[1:5]}[view]
    t = ab.from_dlpack(v)
    assert t.shape == tuple(v.shape)
    got = np.from_dlpack(t)
    assert np.array_equal(got, v.numpy())
    assert addr(got) == v.data_ptr()
    copy = ab.to_device(v, "cpu", copy=True)  # compact, row-major
    assert copy.strides == tuple(torch.empty(v.shape).stride())
    assert torch.equal(torch.from_dlpack(copy), v)


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_every_torch_dtype_round_trips_bit_exact(name):
    torch = need_torch()
    x = torch_sample(torch, name)
    t = ab.from_dlpack(x)
    assert t.dtype == name
    assert same_torch(torch, torch.from_dlpack(t), x)
    c = ab.to_device(x, "cpu", copy=True)
    assert same_torch(torch, torch.from_dlpack(c), x)


def test_torch_refusing_an_opencl_tensor_leaves_the_process_alive():
    """torch.from_dlpack of an OpenCL tensor fails after taking it, deletes
    it and leaves the capsule's name: that used to free it twice and abort
    the process. (A child, so that an abort is a failure here.)"""
    opencl(1)
    need_torch()
    code = ("import numpy as np, arraybridge as ab, torch\n"
            "t = ab.to_device(np.arange(4, dtype=np.float32), 'opencl:0')\n"
            "try:\n    torch.from_dlpack(t)\nexcept Exception:\n    pass\n"
            "assert np.asarray(ab.to_device(t, 'cpu')).tolist() == [0, 1, 2, 3]\n"
            "print('alive')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.strip() == "alive", (r.returncode, r.stdout, r.stderr[-2000:])


def test_torch_tensors_through_opencl_with_a_cast():
    torch = need_torch()
    opencl()
    x = torch_sample(torch, "float32", (5, 33))
    on_cl = ab.to_device(x, "opencl:0", dtype="float16")
    back = torch.from_dlpack(ab.to_device(on_cl, "cpu"))
    assert same_torch(torch, back, x.half())


def test_torch_negated_and_conjugated_views_keep_their_values_through_the_device_api():
    # torch exports a lazily negated view's stored numbers (the wrong sign),
    # and refuses a conjugated one: to_device, from_dlpack and convert_into
    # resolve both first, as convert_memory does, and copy=False refuses.
    torch = need_torch()
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)
    neg, conj = z.conj().imag, z.conj()
    assert neg.is_neg() and conj.is_conj()
    want_neg, want_conj = np.array([-2.0, 4.0]), np.conj(z.numpy())
    for v, want in ((neg, want_neg), (conj, want_conj)):
        t = ab.to_device(v, "cpu")
        assert t.copied
        np.testing.assert_array_equal(np.from_dlpack(t), want)
        np.testing.assert_array_equal(np.from_dlpack(ab.from_dlpack(v)), want)
        out = np.zeros_like(want)
        ab.convert_into(v, out)
        np.testing.assert_array_equal(out, want)
        with pytest.raises(BufferError, match="negated view"):
            ab.to_device(v, "cpu", copy=False)
        if n_devices("opencl") > 0:
            np.testing.assert_array_equal(np.from_dlpack(ab.to_device(ab.to_device(v, "opencl:0"), "cpu")), want)
    # the source is as it was
    assert neg.is_neg() and conj.is_conj()
    np.testing.assert_array_equal(neg.resolve_neg().numpy(), want_neg)


def test_torch_cuda_tensors_exchange_zero_copy_both_ways():
    torch = need_torch_cuda()
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    t = ab.from_dlpack(x)
    assert t.device == "cuda:0"
    y = torch.from_dlpack(t)
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    y.add_(1)
    torch.cuda.synchronize()
    assert float(x[5]) == 6.0


def test_to_device_moves_torch_tensors_to_the_gpu_and_back():
    torch = need_torch_cuda()
    for name in TORCH_DTYPES:
        x = torch_sample(torch, name, (64, 65))
        g = ab.to_device(x, "cuda:0")
        assert g.device == "cuda:0"
        on_gpu = torch.from_dlpack(g)
        assert on_gpu.is_cuda
        assert same_torch(torch, on_gpu.cpu(), x), name
        back = torch.from_dlpack(ab.to_device(on_gpu, "cpu"))
        assert same_torch(torch, back, x), name


def test_torch_work_on_a_side_stream_is_complete_before_arraybridge_reads_it():
    # The producer's data is written on a non-default stream; from_dlpack
    # asks for it on the legacy stream (stream=1), so PyTorch must order it,
    # and arraybridge waits before returning.
    torch = need_torch_cuda()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.ones(1 << 24, device="cuda:0")
        for _ in range(20):
            a = a * 1.0001
        torch.cuda._sleep(100_000_000)  # the stream stays busy well past the call below
        t = ab.from_dlpack(a)
        # from_dlpack waited for the data (docs/python.md), so for the
        # work queued before the export: without that wait s is still busy.
        assert s.query(), "from_dlpack returned before the producer's stream finished"
        host = np.from_dlpack(ab.to_device(t, "cpu"))
    s.synchronize()
    assert np.array_equal(host, a.cpu().numpy())
    # And the other way: PyTorch, on its side stream, consumes a Tensor.
    g = ab.to_device(np.full(1 << 20, 3, dtype=np.float32), "cuda:0")
    with torch.cuda.stream(s):
        y = torch.from_dlpack(g) * 2
    s.synchronize()
    assert float(y.sum()) == 6.0 * (1 << 20)


# ---- CuPy -------------------------------------------------------------------


def need_cupy():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (it needs CUDA)")
    try:
        ok = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception as e:  # no driver
        pytest.skip("CuPy sees no GPU: %s" % e)
    if not ok or n_devices("cuda") < 1:
        pytest.skip("needs a CUDA GPU seen by both CuPy and arraybridge")
    return cupy


def test_cupy_arrays_exchange_zero_copy_both_ways():
    cupy = need_cupy()
    x = cupy.arange(1 << 16, dtype=cupy.float64)
    t = ab.from_dlpack(x)
    assert t.device == "cuda:0"
    y = cupy.from_dlpack(t)
    assert y.data.ptr == x.data.ptr
    y[7] = -2
    assert float(x[7]) == -2


def test_to_device_moves_cupy_arrays_to_the_host_and_back():
    cupy = need_cupy()
    x = cupy.asarray(np.random.default_rng(3).standard_normal((128, 96)).astype(np.float32))
    host = np.from_dlpack(ab.to_device(x, "cpu"))
    assert np.array_equal(host, cupy.asnumpy(x))
    view = x[:, ::3]  # strided on the GPU
    assert np.array_equal(np.from_dlpack(ab.to_device(view, "cpu")), cupy.asnumpy(view))
    g = cupy.from_dlpack(ab.to_device(host, "cuda:0", dtype="float16"))
    assert np.array_equal(cupy.asnumpy(g), host.astype(np.float16))
