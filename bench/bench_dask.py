"""Dask: tiles per second of the example pipeline (examples/dask_tiles.py)
on a LocalCluster of 1 and of 2 worker processes, against the same loop in
this process; and the pickle round trip (protocol 5, out of band) of a
64 MiB host Tensor against that of a NumPy array of the same size, in the
same run. Ratios > 1 mean ours is faster.

    python bench/bench_dask.py [repeats]

Needs distributed. Workers listen on loopback only."""
import pathlib
import pickle
import sys
import time
import timeit

import numpy as np

import arraybridge as ab

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import dask_tiles as tiles  # noqa: E402

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def best(fn, number=1):
    return min(timeit.repeat(fn, number=number, repeat=REPS)) / number


def round_trip(x):
    bufs = []
    stream = pickle.dumps(x, protocol=5, buffer_callback=bufs.append)
    return pickle.loads(stream, buffers=bufs)


def pickles():
    a = np.random.default_rng(1).random(8 << 20)  # 64 MiB of float64
    t = ab.to_device(a, "cpu")
    theirs, ours = best(lambda: round_trip(a), 20), best(lambda: round_trip(t), 20)
    print("pickle round trip, 64 MiB, protocol 5 out of band: NumPy %8.1f us  Tensor %8.1f us  ratio %5.2fx"
          % (theirs * 1e6, ours * 1e6, theirs / ours), flush=True)
    # The same through pickle's stream alone (in band: both copy once on load).
    theirs = best(lambda: pickle.loads(pickle.dumps(a, protocol=5)), 3)
    ours = best(lambda: pickle.loads(pickle.dumps(t, protocol=5)), 3)
    print("pickle round trip, 64 MiB, protocol 5 in band:     NumPy %8.1f ms  Tensor %8.1f ms  ratio %5.2fx"
          % (theirs * 1e3, ours * 1e3, theirs / ours), flush=True)


def local_loop(image, tile):
    """The pipeline's work in this process, tile after tile."""
    total = np.zeros(3)
    for _, _, view in tiles.tiles_of(image, tile):
        total += tiles.channel_sums(tiles.normalise(view))
    return total / (image.shape[0] * image.shape[1])


def pipelines():
    from distributed import Client, LocalCluster

    image, tile = tiles.synthetic_image(2048, 3072), 256
    n = len(tiles.tiles_of(image, tile))
    want = tiles.reference(image)
    local_loop(image, tile)  # kernels built, pools warm
    s = best(lambda: local_loop(image, tile), 1)
    print("%-44s %7.1f tiles/s  (%d tiles of %d x %d, device %s)" % ("one process, no Dask", n / s, n, tile, tile,
                                                                       tiles.worker_device()), flush=True)
    for workers in (1, 2):
        cluster = client = None
        try:
            cluster = LocalCluster(n_workers=workers, processes=True, threads_per_worker=1, host="127.0.0.1",
                                   dashboard_address=None, silence_logs=40)
            client = Client(cluster)
            got = tiles.pipeline(client, image, tile)  # warm: imports, kernels, pools
            assert np.allclose(got, want, rtol=1e-6, atol=1e-6), (got, want)
            times = []
            for _ in range(REPS):
                start = time.perf_counter()
                tiles.pipeline(client, image, tile)
                times.append(time.perf_counter() - start)
            print("%-44s %7.1f tiles/s  ratio to one process %5.2fx" % ("LocalCluster, %d worker process%s"
                  % (workers, "" if workers == 1 else "es"), n / min(times), s / min(times)), flush=True)
        finally:
            if client is not None:
                client.close()
            if cluster is not None:
                cluster.close()


if __name__ == "__main__":
    pickles()
    pipelines()
