"""A large image, tile by tile, on a Dask cluster: each tile converted from
HWC uint8 to CHW float32 normalised per channel on a worker (on its OpenCL
device when it has one), the tiles' per-channel sums reduced across
workers, and the result checked against NumPy doing the same on the whole
image.

    python examples/dask_tiles.py                    # a LocalCluster of 2 workers
    python examples/dask_tiles.py tcp://host:8786    # an existing scheduler

The tiles travel as arraybridge Tensors: host memory as one frame each,
OpenCL tensors as their bytes, put back on the receiving worker's device
of the same id (docs/scaling.md).
"""
import sys
import time

import numpy as np

import arraybridge as ab

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def synthetic_image(height, width, seed=0):
    """An HWC uint8 RGB image: smooth gradients and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), (x + y) % 256], axis=-1)
    return np.clip(img + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)


def tiles_of(image, tile):
    """(row, col, view) of each tile (edge tiles smaller)."""
    h, w = image.shape[:2]
    return [(r, c, image[r:r + tile, c:c + tile]) for r in range(0, h, tile) for c in range(0, w, tile)]


def worker_device():
    """The worker's OpenCL device when it has one, else host memory."""
    devs = ab.devices()
    return "opencl:0" if "opencl:0" in devs else "cpu:0"


def normalise(tile):
    """HWC uint8 -> CHW float32, (x / 255 - mean) / std per channel, in one
    move on the worker's device: a Tensor there."""
    scale = [1.0 / (255.0 * s) for s in STD]
    offset = [-m / s for m, s in zip(MEAN, STD)]
    return ab.to_device(tile, worker_device(), dtype="float32", permute=(2, 0, 1), channel_axis=2,
                        channel_scale=scale, channel_offset=offset)


def channel_sums(*tensors):
    """Per-channel float64 sums of CHW Tensors (wherever they are)."""
    total = np.zeros(3)
    for t in tensors:
        total += np.from_dlpack(ab.to_device(t, "cpu")).reshape(3, -1).sum(axis=1, dtype=np.float64)
    return total


def add(*parts):
    return np.sum(parts, axis=0)


def pipeline(client, image, tile=256, fan_in=8):
    """Per-channel means of the normalised image, computed on the cluster:
    one normalise task per tile, then channel_sums over groups of fan_in
    tiles (the Tensors travel to where those run), then a sum."""
    futures = [client.submit(normalise, view, pure=False) for _, _, view in tiles_of(image, tile)]
    groups = [client.submit(channel_sums, *futures[i:i + fan_in], pure=False)
              for i in range(0, len(futures), fan_in)]
    total = client.submit(add, *groups, pure=False).result()
    return total / (image.shape[0] * image.shape[1])


def reference(image):
    """The same per-channel means by NumPy."""
    x = image.astype(np.float32)
    mean = np.array(MEAN, np.float32)
    std = np.array(STD, np.float32)
    y = (x / np.float32(255.0) - mean) / std
    return y.reshape(-1, 3).sum(axis=0, dtype=np.float64) / (image.shape[0] * image.shape[1])


def main(argv):
    from distributed import Client, LocalCluster

    image = synthetic_image(2048, 3072)
    cluster = None
    try:
        if len(argv) > 1:
            client = Client(argv[1])
        else:
            cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1",
                                   dashboard_address=None)
            client = Client(cluster)
        with client:
            start = time.perf_counter()
            got = pipeline(client, image)
            seconds = time.perf_counter() - start
            want = reference(image)
            print("per-channel means:", got)
            print("NumPy:            ", want)
            print("%d tiles in %.2f s on %d workers" % (len(tiles_of(image, 256)), seconds,
                                                       len(client.scheduler_info()["workers"])))
            if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
                print("MISMATCH")
                return 1
            print("ok")
            return 0
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
