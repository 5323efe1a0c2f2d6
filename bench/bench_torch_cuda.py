"""numpy <-> torch on a GPU, piece by piece: torch's own calls against
ab.to_device alone, torch.from_dlpack of its Tensor, and the seed API's
convert_memory, at 256 KiB, 1 MiB and 4 MiB of float32. Every call is
synchronized before and after; the calls alternate within one loop (so
each meets the others' allocator and cache state), and each row prints the
best and the median of the repeats, in microseconds.

    python bench/bench_torch_cuda.py [repeats]      (default 200)

Needs a CUDA build of torch and a GPU that arraybridge sees as cuda:0.
bench_frameworks.py times the same moves back to back instead, each in
its own block of calls; the two can disagree at 1 MiB
(bench/results/2026-11-27-gpu-check-h100.md)."""
import os
import sys
import time

import numpy as np

import arraybridge as ab
from arraybridge import convert_memory

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def main():
    try:
        import torch
    except ImportError as e:
        sys.exit("bench_torch_cuda: needs torch (%s)" % e)
    if not torch.cuda.is_available() or "cuda:0" not in ab.devices():
        sys.exit("bench_torch_cuda: needs a GPU that both torch and arraybridge see (arraybridge sees %s)"
                 % ab.devices())
    sync = torch.cuda.synchronize
    print("AB_STAGING_MIN=%s, best / median of %d, us" % (os.environ.get("AB_STAGING_MIN", "default"), REPS))
    for size in (256 << 10, 1 << 20, 4 << 20):
        a = np.random.default_rng(0).random(size // 4).astype(np.float32)
        g = torch.from_numpy(a).cuda()
        rows = [
            ("numpy->cuda torch .to('cuda:0')", lambda: torch.from_numpy(a).to("cuda:0")),
            ("numpy->cuda ab.to_device", lambda: ab.to_device(a, "cuda:0")),
            ("numpy->cuda to_device+from_dlpack", lambda: torch.from_dlpack(ab.to_device(a, "cuda:0"))),
            ("numpy->cuda convert_memory", lambda: convert_memory(a, "numpy", "torch", gpu_id=0)),
            ("cuda->numpy torch .cpu().numpy()", lambda: g.cpu().numpy()),
            ("cuda->numpy ab.to_device(g, 'cpu')", lambda: ab.to_device(g, "cpu")),
            ("cuda->numpy np.from_dlpack(to_device)", lambda: np.from_dlpack(ab.to_device(g, "cpu"))),
            ("cuda->numpy convert_memory", lambda: convert_memory(g, "torch", "numpy")),
        ]
        ts = [[] for _ in rows]
        for _ in range(REPS):
            for i, (_, fn) in enumerate(rows):
                sync()
                t0 = time.perf_counter()
                r = fn()
                sync()
                ts[i].append(time.perf_counter() - t0)
                del r
        print("%d KiB" % (size >> 10))
        for (name, _), t in zip(rows, ts):
            t.sort()
            print("  %-40s %8.1f / %8.1f" % (name, t[0] * 1e6, t[len(t) // 2] * 1e6), flush=True)


if __name__ == "__main__":
    main()
