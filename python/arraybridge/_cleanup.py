"""Freeing cached GPU memory (ours and the frameworks'), and running a call
again after an out-of-memory error."""
import contextlib
import contextvars
import gc
import operator
import sys

from . import _arraybridge as _ab
from ._frameworks import ADAPTERS, is_oom
from ._types import id_of_device


def cleanup_all_gpu_frameworks(device_id=None):
    """Returns cached, unused memory to the drivers: arraybridge's pools (all
    of them, or those of GPU device_id: cuda:N, its pinned pool and
    opencl:N) and the caches of every framework the process has imported
    (torch.cuda.empty_cache, CuPy's pools, JAX's caches). Frameworks not
    imported are left alone (never imported here). Runs gc.collect() first,
    so arrays no longer referenced give their memory back too. device_id:
    None or an int >= 0 (TypeError for a bool, a float, a string; an id no
    device has frees nothing of ours)."""
    device_id = _checked_id(device_id)
    gc.collect()
    if device_id is None:
        _ab.empty_cache()
    else:
        for dev in _ab.devices():
            if not dev.startswith("cpu") and id_of_device(dev) == device_id:
                _ab.empty_cache(dev)
    for adapter in ADAPTERS.values():
        mod = adapter.loaded()
        if mod is not None:
            adapter.empty_cache(mod, device_id)


def _checked_id(device_id):
    """device_id as cleanup_all_gpu_frameworks takes it: None, or a plain
    int >= 0 (from a NumPy integer too); TypeError for a bool, a float, a
    string, ValueError for a negative id."""
    if device_id is None:
        return None
    if isinstance(device_id, bool) or not hasattr(type(device_id), "__index__"):
        raise TypeError("device_id must be an int or None, not %s" % type(device_id).__name__)
    device_id = operator.index(device_id)
    if device_id < 0:
        raise ValueError("device_id must be >= 0, got %d" % device_id)
    return device_id


def memory_report():
    """arraybridge's pool table of every device, as one text."""
    parts = []
    for dev in _ab.devices():
        try:
            parts.append(_ab.pool_summary(dev))
        except (ValueError, RuntimeError) as e:  # a device gone since devices()
            parts.append("%s: no pool summary (%s)" % (dev, e))
    return "\n".join(parts)


# The recoveries that enclose this point of the thread's (or task's) call
# stack, outermost first: a token each. A recovery that gives up on an
# error marks it with that path, and a recovery takes an error as given up
# on only where its own token is on the mark's path: one it encloses gave
# up (in this thread, or in a task or thread that copied this context:
# asyncio.to_thread, copy_context().run; not a plain Thread, an executor's
# submit or run_in_executor, which start in a context of their own). One
# exception object can reach several threads at once (a Future's result):
# a mark that said only "given up" made a sibling's recovery give up at its
# first try, and the sibling's outermost level took the mark off while the
# first thread's enclosing recovery was still to see it.
_path = contextvars.ContextVar("arraybridge_oom_recovery_path", default=())
_NOTE = "arraybridge: still out of memory after "


def _behind(exc, handling=None):
    """The exception exc was raised from or while handling, as a traceback
    shows the chain: __cause__, else __context__ unless suppressed. The
    context stops at `handling`, the exception being handled where the
    recovery began: a decorated fallback called in an except block (try
    the big model; on MemoryError, the chunked one) raises its own errors
    in that context, and they are its own to retry."""
    if exc.__cause__ is not None:
        return exc.__cause__
    if exc.__suppress_context__ or exc.__context__ is handling:
        return None
    return exc.__context__


def _unmark(exc, root):
    """The marks made within the outermost recovery `root`, taken off exc
    and what it was raised from."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        marks = getattr(exc, "__dict__", {}).get("_arraybridge_retried")
        if isinstance(marks, set):
            marks.difference_update([p for p in list(marks) if p[0] is root])
        exc = _behind(exc)


def _retried(exc, handling=None):
    """Whether exc, or an exception it was raised from or while handling
    (`raise MemoryError("again")` in an except block) within this recovery
    (not before it began: `handling`), is one a recovery gave up on
    (run_with_oom_recovery)."""
    path = _path.get()
    me = path[-1] if path else None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        marks = getattr(exc, "__dict__", {}).get("_arraybridge_retried")
        if isinstance(marks, set) and any(me in p for p in list(marks)):
            return True
        exc = _behind(exc, handling)
    return False


def _in_chain(exc, test):
    """Whether test holds for exc or an exception it was raised from
    (its __cause__, theirs, and so on; a cycle is walked once)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if test(exc):
            return True
        exc = exc.__cause__
    return False


OWN, OTHER = "own", "other"  # _oom_kind's answers


def _oom_kind(exc, adapters):
    """Whether exc, or an exception it was raised from, is a lack of memory:
    OWN where the adapters' frameworks say so (MemoryError, their errors,
    the words their messages use); OTHER where it is an out-of-memory error
    of a type another imported framework defines (a @pyclesperanto stage
    that runs a torch model meets torch's OutOfMemoryError; only such types
    count there, not the words, which any error may carry once that
    framework is imported); else None."""
    if _in_chain(exc, lambda e: is_oom(e, adapters)):
        return OWN
    others = [a for a in ADAPTERS.values() if a not in adapters and a.loaded() is not None]
    if others and _in_chain(exc, lambda e: any(a.raised(e) and a.is_oom(e, a.loaded()) for a in others)):
        return OTHER
    return None


# Out-of-memory errors that no freed cache can cure: a request past what
# the device allocates at once (the C core's words, and OpenCL's code as
# pyclesperanto gives it). Raised at once, not tried again.
_HOPELESS = ("no release or callback can make room", "INVALID_BUFFER_SIZE")


def hopeless(exc):
    """Whether exc, or an exception it was raised from, is a request too
    large for the device whatever is freed (_HOPELESS)."""
    return _in_chain(exc, lambda e: any(words in str(e) for words in _HOPELESS))


def run_with_oom_recovery(call, adapters, device_id=None, max_retries=2):
    """call(); on an out-of-memory error (MemoryError, arraybridge's, one of
    the adapters' frameworks', or one of a type another imported framework
    defines: _oom_kind), frees the caches (of every GPU for another
    framework's: device_id numbers the adapters' GPUs) and calls again, at most
    max_retries times (not for a request past what the device allocates at
    once, which no freed cache cures: hopeless). The last error is raised
    as it came, with arraybridge's memory report attached as a note
    (Python >= 3.11). A
    recovery inside another (one decorated function calling another, on
    the same thread or task) marks the error it gives up on, and the
    enclosing one raises it, or one raised from it, as it is rather than
    retrying what was retried already (3 x 3 calls, two notes); the
    outermost takes the mark off, so the same exception object raised
    again by a later call (a Future's result) is retried afresh."""
    handling = sys.exc_info()[1]  # called in an except block: that error is not this call's
    with _nesting():
        for attempt in range(max_retries + 1):
            try:
                return call()
            except Exception as e:
                clean = _recovered(e, adapters, device_id, attempt, max_retries, handling)
                if clean is _GIVE_UP:
                    raise
            # Out of the except block: the error's traceback, which holds the
            # failed attempt's frames and the arrays they made, is gone, so
            # the caches get those arrays' memory back too.
            cleanup_all_gpu_frameworks(clean)


async def run_with_oom_recovery_async(call, adapters, device_id=None, max_retries=2):
    """run_with_oom_recovery for a coroutine function call."""
    handling = sys.exc_info()[1]
    with _nesting():
        for attempt in range(max_retries + 1):
            try:
                return await call()
            except Exception as e:
                clean = _recovered(e, adapters, device_id, attempt, max_retries, handling)
                if clean is _GIVE_UP:
                    raise
            cleanup_all_gpu_frameworks(clean)  # out of the except block, as above


@contextlib.contextmanager
def _nesting():
    """One recovery's token on the path of those that enclose it (_path);
    the outermost takes the marks made within it off the error it raises.
    The path is set back by value, not by token: a coroutine closed
    outside its task (an abandoned task collected later) leaves in another
    context, where a token would be refused."""
    outer = _path.get()
    path = outer + (object(),)
    _path.set(path)
    try:
        yield
    except Exception as e:
        if not outer:
            _unmark(e, path[0])
        raise
    finally:
        _path.set(outer)


_GIVE_UP = object()


def _recovered(e, adapters, device_id, attempt, max_retries, handling=None):
    """After attempt (0-based) raised e: the GPU whose caches are to be freed
    (by the caller, once out of its except block) for another try: device_id
    for the adapters' frameworks' errors (None, every GPU, where it is no
    GPU id), None for another framework's, which numbers its GPUs its own
    way; _GIVE_UP when e is to
    be raised (not out of memory, given up on already, or the last try:
    then noted and marked)."""
    kind = _oom_kind(e, adapters)
    if kind is None or _retried(e, handling):
        return _GIVE_UP
    too_large = hopeless(e)
    if attempt == max_retries or too_large:
        if hasattr(e, "add_note"):
            # One note of ours: an exception raised again and again (a
            # cached one, a Future's) would gather one per give-up.
            notes = getattr(e, "__notes__", None)
            if isinstance(notes, list):
                notes[:] = [n for n in notes if not (isinstance(n, str) and n.startswith(_NOTE))]
            tries = ("no retry (past what the device allocates at once)" if too_large
                     else "%d retries (caches freed before each)" % max_retries)
            e.add_note(_NOTE + "%s; memory report:\n%s" % (tries, memory_report()))
        try:
            marks = e.__dict__.setdefault("_arraybridge_retried", set())
            marks.add(_path.get())
        except AttributeError:  # an exception type without a __dict__: unmarked
            pass
        return _GIVE_UP
    if kind is OTHER:
        return None
    try:
        return _checked_id(device_id)
    except Exception:
        # a gpu_id no conversion has checked (NumPy ignores it; a call
        # with no array converts nothing): every GPU's caches, and the
        # function's own error stays the one raised
        return None
