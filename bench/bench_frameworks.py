"""The seed API's convert_memory against the frameworks' own calls, in the
same run: per-call overhead at 4 KiB, throughput at 1 MiB and 64 MiB
float32, and stack_slices of 64 512x512 slices against np.stack plus the
framework's import. Ratios > 1 mean ours is faster.

    python bench/bench_frameworks.py [repeats]

Needs NumPy; each of torch, jax, tensorflow, pyclesperanto is timed where
installed (pyclesperanto on its device 0, PoCL here). With a CUDA build of
torch and a GPU, also NumPy to torch and CuPy on GPU 0 and back."""
import sys
import timeit

import numpy as np

import arraybridge as ab

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def best(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=REPS)) / number


def row(name, size, theirs, ours, number):
    t, o = best(theirs, number), best(ours, number)
    print("%-34s %9s  theirs %10.2f us  ours %10.2f us  ratio %6.2fx" % (name, size, t * 1e6, o * 1e6, t / o),
          flush=True)


def have(name):
    try:
        return __import__(name)
    except ImportError:
        print("(%s not installed: skipped)" % name)
        return None


def gpu_rows(torch, cv):
    """NumPy (pageable memory) to a GPU framework and back, against the
    framework's own call; both synchronized, so each row is a whole copy."""
    cupy = have("cupy")
    sync = torch.cuda.synchronize
    for nbytes, label in ((1 << 20, "1 MiB"), (64 << 20, "64 MiB"), (256 << 20, "256 MiB")):
        a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
        number = 50 if nbytes <= 1 << 20 else 3
        g = torch.from_numpy(a).cuda()

        def theirs_up():
            torch.from_numpy(a).cuda()
            sync()

        def ours_up():
            cv(a, "numpy", "torch", gpu_id=0)
            sync()

        row("numpy->torch cuda (.cuda())", label, theirs_up, ours_up, number)
        row("torch cuda->numpy (.cpu().numpy())", label, lambda: g.cpu().numpy(), lambda: cv(g, "torch", "numpy"),
            number)
        if cupy:
            c = cupy.asarray(a)

            def theirs_cupy():
                cupy.asarray(a)
                cupy.cuda.Device().synchronize()

            def ours_cupy():
                cv(a, "numpy", "cupy", gpu_id=0)
                cupy.cuda.Device().synchronize()

            row("numpy->cupy (cupy.asarray)", label, theirs_cupy, ours_cupy, number)
            row("cupy->numpy (cupy.asnumpy)", label, lambda: cupy.asnumpy(c), lambda: cv(c, "cupy", "numpy"), number)


def main():
    torch, jax, tf, cle = have("torch"), have("jax"), have("tensorflow"), have("pyclesperanto")
    if jax:
        import jax.numpy as jnp
    cv = ab.convert_memory
    for nbytes, label in ((4096, "4 KiB"), (1 << 20, "1 MiB"), (64 << 20, "64 MiB")):
        a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
        number = 2000 if nbytes <= 4096 else 200 if nbytes <= 1 << 20 else 5
        if torch:
            t = torch.from_numpy(a.copy())
            row("numpy->torch (torch.from_numpy)", label, lambda: torch.from_numpy(a), lambda: cv(a, "numpy", "torch"),
                number)
            row("torch->numpy (t.numpy())", label, lambda: t.numpy(), lambda: cv(t, "torch", "numpy"), number)
        if jax:
            j = jnp.asarray(a)
            row("numpy->jax (jnp.asarray)", label, lambda: jnp.asarray(a).block_until_ready(),
                lambda: cv(a, "numpy", "jax").block_until_ready(), number)  # both wait alike
            row("jax->numpy (np.asarray)", label, lambda: np.asarray(j), lambda: cv(j, "jax", "numpy"), number)
        if tf:
            row("numpy->tf (tf.convert_to_tensor)", label, lambda: tf.convert_to_tensor(a),
                lambda: cv(a, "numpy", "tensorflow"), number)
        if cle:
            g = cle.push(a)
            n2 = max(1, number // 10)
            row("numpy->cle (cle.push)", label, lambda: cle.push(a), lambda: cv(a, "numpy", "pyclesperanto", 0), n2)
            row("cle->numpy (cle.pull)", label, lambda: cle.pull(g), lambda: cv(g, "pyclesperanto", "numpy"), n2)
    if torch and torch.cuda.is_available():
        gpu_rows(torch, cv)
    slices = [np.random.default_rng(i).random((512, 512), dtype=np.float32) for i in range(64)]
    row("stack 64x512x512 -> numpy (np.stack)", "64 MiB", lambda: np.stack(slices),
        lambda: ab.stack_slices(slices, "numpy"), 3)
    if torch:
        row("stack -> torch (np.stack+from_numpy)", "64 MiB", lambda: torch.from_numpy(np.stack(slices)),
            lambda: ab.stack_slices(slices, "torch"), 3)
    if cle:
        row("stack -> cle (np.stack+cle.push)", "64 MiB", lambda: cle.push(np.stack(slices)),
            lambda: ab.stack_slices(slices, "pyclesperanto", 0), 3)


if __name__ == "__main__":
    main()
