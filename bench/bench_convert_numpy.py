"""NumPy's figure for bench_convert: the same frame, the expression users
write, timed in the same session (median of N); and, when the arraybridge
module is installed, the same result from Python in one to_device
call, with its ratio to NumPy."""
import sys
import time

import numpy as np

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
h, w = 2160, 3840
img = (np.arange(h * w * 3, dtype=np.uint64) * 2654435761 >> 24).astype(np.uint8).reshape(h, w, 3)
mean = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
std = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
times = []
for r in range(reps + 1):
    t0 = time.perf_counter()
    out = (img.transpose(2, 0, 1).astype(np.float32) / 255 - mean) / std
    t1 = time.perf_counter()
    if r:
        times.append(t1 - t0)
numpy_ms = sorted(times)[len(times) // 2] * 1e3
print("numpy %s: (img.transpose(2,0,1).astype(float32) / 255 - mean) / std: %.2f ms (median of %d)"
      % (np.__version__, numpy_ms, reps))

try:
    import arraybridge as ab
except ImportError:
    sys.exit(0)
scale = (1 / (255 * std)).reshape(3)
offset = (-mean / std).reshape(3)
times = []
for r in range(reps + 1):
    t0 = time.perf_counter()
    t = ab.to_device(img, "cpu", dtype="float32", permute=(2, 0, 1), channel_axis=2, channel_scale=scale,
                          channel_offset=offset)
    t1 = time.perf_counter()
    del t
    if r:
        times.append(t1 - t0)
ours_ms = sorted(times)[len(times) // 2] * 1e3
print("arraybridge.to_device(img, 'cpu', dtype='float32', permute=(2, 0, 1), channel_axis=2, ...): "
      "%.2f ms (median of %d, %.1fx numpy)" % (ours_ms, reps, numpy_ms / ours_ms))
