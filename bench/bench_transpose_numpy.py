"""2-D transposes from Python against NumPy's own, in one session (issue 18's
">= 3x NumPy's ascontiguousarray(a.T)"): `arraybridge.to_device(a.T, "cpu",
copy=True)` (a compact row-major copy of the transposed view, on the
library's default threads) beside `np.ascontiguousarray(a.T)` and a plain
`np.copyto` of the same bytes (memcpy's figure through NumPy). Median of N.

    python bench/bench_transpose_numpy.py [reps]
"""
import sys
import time

import numpy as np

import arraybridge as ab

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7


def median_s(fn):
    times = []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        del out
        if r:  # the first round warms up (pool, page faults)
            times.append(t1 - t0)
    return sorted(times)[len(times) // 2]


print("numpy %s, arraybridge %s; GB/s of output, median of %d" % (np.__version__, ab.__version__, reps))
print("%-16s %9s %9s %9s %12s %12s" % ("case", "copyto", "numpy .T", "ab .T", "ab/numpy", "ab/copyto"))
for n, dtype in ((4000, np.float32), (4096, np.float32), (4104, np.float32), (4096, np.uint8),
                 (4096, np.uint16), (4096, np.float64)):
    a = (np.arange(n * n, dtype=np.uint64) * 2654435761 % 251).astype(dtype).reshape(n, n)
    dst = np.empty_like(a)
    ref = np.ascontiguousarray(a.T)
    got = np.asarray(ab.to_device(a.T, "cpu", copy=True))
    assert np.array_equal(got, ref), "arraybridge's transpose differs from NumPy's"
    t_copy = median_s(lambda: np.copyto(dst, a))
    t_np = median_s(lambda: np.ascontiguousarray(a.T))
    t_ab = median_s(lambda: ab.to_device(a.T, "cpu", copy=True))
    gb = a.nbytes / 1e9
    print("%-16s %9.2f %9.2f %9.2f %11.2fx %11.2fx" % ("%dx%d %s" % (n, n, np.dtype(dtype).name), gb / t_copy,
                                                        gb / t_np, gb / t_ab, t_np / t_ab, t_copy / t_ab))
