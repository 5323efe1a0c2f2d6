"""The seed API's decorators: numpy, cupy, torch, tensorflow, jax,
pyclesperanto and memory_types."""
import functools
import inspect

from ._cleanup import run_with_oom_recovery, run_with_oom_recovery_async
from ._arraybridge import Tensor as _Tensor
from ._convert import convert_memory, detect_memory_type, tensor_as
from ._frameworks import ADAPTERS, element_name as _dtype_name, is_array as _is_array
from ._types import MemoryType, memory_type

_P = inspect.Parameter


def _data_parameter(func, method=False):
    """(position, name) of the parameter that takes the data: func's first,
    or its second when the first is a method's self or cls (by its name,
    or any name where method says func is a classmethod's). name is None
    where the data can only come by position (*args, or a function whose
    signature Python cannot read)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return int(method), None
    i = 1 if params and (method or params[0].name in ("self", "cls")) else 0
    if i >= len(params) or params[i].kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD, _P.POSITIONAL_ONLY):
        return i, None
    return (i if params[i].kind is _P.POSITIONAL_OR_KEYWORD else None), params[i].name


def _wrap(func, accepts, runs_on, output, gpu_id, oom_recovery, preserve_dtype, method=False):
    """func, called with its data argument (_data_parameter) as a runs_on
    array on gpu_id (converted from accepts; None: from whatever it is), its
    result returned as an output array. A coroutine function gets a
    coroutine function (the result converted once awaited), a generator
    function (plain or async) a generator function whose every yielded
    array is converted (its input at the first next(), as a generator's
    body runs; its return value and values sent in as they are); send,
    throw and close reach func's generator. A generator is not retried on
    out-of-memory errors: what it yielded cannot be taken back."""
    if isinstance(func, (classmethod, staticmethod)):
        # Stacked above @classmethod or @staticmethod: the function within
        # is wrapped (a classmethod's first parameter is the class, whatever
        # its name), and made a method of the same kind again.
        inner = _wrap(func.__func__, accepts, runs_on, output, gpu_id, oom_recovery, preserve_dtype,
                      method=isinstance(func, classmethod))
        wrapped = type(func)(inner)
        wrapped.input_memory_type, wrapped.output_memory_type = inner.input_memory_type, inner.output_memory_type
        return wrapped
    adapters = [ADAPTERS[runs_on], ADAPTERS[output]]
    pos, name = _data_parameter(func, method)
    # gpu_id numbers the decorator's framework's GPUs (CUDA's, or
    # pyclesperanto's OpenCL devices): a result of a framework that numbers
    # other ones goes where gpu_id=None puts it (torch's host memory for a
    # @pyclesperanto(gpu_id=1, output_type='torch') function), not onto an
    # unrelated device of the same number. NumPy has no GPUs: there gpu_id
    # can only name the result's.
    same = runs_on is MemoryType.NUMPY or ADAPTERS[output].accel == ADAPTERS[runs_on].accel
    out_gpu = gpu_id if same else None

    def prepare(args, kwargs):
        """(args, kwargs, dtype) to call func with, the data converted; None
        when the call has no array to convert."""
        positional = pos is not None and pos < len(args)
        if positional:
            first = args[pos]
        elif name is not None and name in kwargs:
            first = kwargs[name]
        else:
            return None  # no data argument in this call
        ours = accepts is None and isinstance(first, _Tensor)  # to_device's result: no framework's array
        if accepts is None and not ours and not _is_array(first):
            return None  # not an array (a list, a number): as it is
        dtype = _dtype_name(first) if preserve_dtype else None
        if ours:
            data = tensor_as(first, runs_on, gpu_id)
        else:
            src = accepts if accepts is not None else detect_memory_type(first)
            data = convert_memory(first, src, runs_on, gpu_id)  # input_type given: it must be one
        if positional:
            return args[:pos] + (data,) + args[pos + 1:], kwargs, dtype
        return args, {**kwargs, name: data}, dtype

    def finish(result, dtype):
        if not _is_array(result):
            return result  # not an array (a tuple, a shape, a NumPy scalar): as it is
        res_type = detect_memory_type(result)
        got = _dtype_name(result)
        # Cast back within real or within complex types; between them
        # (abs of complex data, say) the result stays as it is.
        keep = (dtype if dtype is not None and got not in (dtype, None)
                and dtype.startswith("complex") == got.startswith("complex") else None)
        if keep is not None and ADAPTERS[memory_type(res_type)].traced(result):
            result, keep = ADAPTERS[memory_type(res_type)].traced_cast(result, keep), None  # the framework's own
        return convert_memory(result, res_type, output, out_gpu, dtype=keep)

    def start(args, kwargs):
        p = prepare(args, kwargs)
        return (func(*args, **kwargs), None) if p is None else (func(*p[0], **p[1]), p[2])

    # A generator-based coroutine (@types.coroutine) is awaited, not
    # iterated: it is wrapped as any function (its result as it is).
    inner = func
    while isinstance(inner, functools.partial):  # a partial's flags are its function's
        inner = inner.func
    # A callable instance's kind is its __call__'s: an instance whose
    # __call__ is an async def returns a coroutine, which Python's own
    # checks do not see on the instance.
    kind = func if inspect.isroutine(inner) or inspect.isclass(inner) else getattr(inner, "__call__", func)
    old_style = inspect.isgeneratorfunction(kind) and bool(
        getattr(getattr(inner if kind is func else kind, "__code__", None), "co_flags", 0)
        & inspect.CO_ITERABLE_COROUTINE)
    if inspect.isgeneratorfunction(kind) and not old_style:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            gen, dtype = start(args, kwargs)
            try:
                value = next(gen)
                while True:
                    out = finish(value, dtype)  # its failure is the caller's, not thrown into gen
                    try:
                        sent = yield out
                    except GeneratorExit:
                        gen.close()
                        raise
                    except BaseException as e:
                        value = gen.throw(e)
                    else:
                        value = gen.send(sent)
            except StopIteration as stop:
                return stop.value
            except BaseException:
                gen.close()  # a failed conversion: gen's finally runs now, not at collection
                raise
    elif inspect.isasyncgenfunction(kind):
        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            gen, dtype = start(args, kwargs)
            try:
                value = await gen.__anext__()
                while True:
                    out = finish(value, dtype)
                    try:
                        sent = yield out
                    except GeneratorExit:
                        await gen.aclose()
                        raise
                    except BaseException as e:
                        value = await gen.athrow(e)
                    else:
                        value = await gen.asend(sent)
            except StopAsyncIteration:
                return
            except BaseException:
                await gen.aclose()
                raise
    elif inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(kind):  # func: markcoroutinefunction
        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            async def call():
                p = prepare(args, kwargs)
                if p is None:
                    return await func(*args, **kwargs)
                return finish(await func(*p[0], **p[1]), p[2])

            if oom_recovery:
                return await run_with_oom_recovery_async(call, adapters, gpu_id)
            return await call()
    else:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            def call():
                p = prepare(args, kwargs)
                if p is None:
                    return func(*args, **kwargs)
                return finish(func(*p[0], **p[1]), p[2])

            if oom_recovery:
                return run_with_oom_recovery(call, adapters, gpu_id)
            return call()

    wrapper.input_memory_type = (accepts or runs_on).value
    wrapper.output_memory_type = output.value
    return wrapper


def memory_types(input_type, output_type, *, gpu_id=None, oom_recovery=False, preserve_dtype=True):
    """A decorator: the wrapped function receives its data argument (its
    first parameter, or its second when the first is a method's self or
    cls; by position or by keyword) as an input_type array on gpu_id
    (converted from whatever framework it comes in, by detect_memory_type,
    or from an arraybridge Tensor), and its result is returned as an
    output_type array on gpu_id where output_type numbers the same GPUs as
    input_type (CUDA's, or pyclesperanto's OpenCL devices; any, for a NumPy
    input_type), else where gpu_id=None puts it (NumPy ignores gpu_id).
    Other arguments pass as they are; a result that is not
    an array (a NumPy scalar included) is returned as it is, and so is a
    call whose data argument is missing or not an array. Inside jax.jit,
    vmap or grad, a JAX function's traced values pass as they are.

    preserve_dtype: a result whose dtype differs from the data argument's is
    cast back to it in the same move (as the original arraybridge keeps the
    input's dtype). oom_recovery: on an out-of-memory error (MemoryError,
    arraybridge's, or the frameworks'), the caches are freed
    (cleanup_all_gpu_frameworks) and the call is made again, twice at most,
    then the error is raised with arraybridge's memory report attached.
    The wrapper carries input_memory_type and output_memory_type (names) and
    functools.wraps metadata. An async def function's result is converted
    once awaited; a generator function's every yielded array is converted
    (generators are not retried)."""
    inp = memory_type(input_type, "input_type")
    out = memory_type(output_type, "output_type")
    return lambda func: _wrap(func, None, inp, out, gpu_id, oom_recovery, preserve_dtype)


def _framework_decorator(mt):
    def decorator(func=None, *, gpu_id=None, input_type=None, output_type=mt, oom_recovery=True, preserve_dtype=True):
        if func is not None and not callable(func) and not isinstance(func, classmethod):
            # @torch(0): a gpu_id given by position
            raise TypeError("@%s decorates a function; give its options by keyword (@%s(gpu_id=%r)), not %r"
                            % (mt.value, mt.value, func, func))
        accepts = None if input_type is None else memory_type(input_type, "input_type")
        out = memory_type(output_type, "output_type")
        d = lambda f: _wrap(f, accepts, mt, out, gpu_id, oom_recovery, preserve_dtype)  # noqa: E731
        return d if func is None else d(func)

    decorator.__name__ = decorator.__qualname__ = mt.value
    decorator.__doc__ = (
        """Decorator: the function runs on %(name)s arrays. Bare (@%(v)s) or called
        (@%(v)s(gpu_id=0, input_type='numpy', output_type='numpy', oom_recovery=True)):
        the data argument (the first parameter, after a method's self), of
        input_type (default: detected), is converted to
        %(name)s on gpu_id; the result is returned as output_type (default %(v)s)
        with the data argument's dtype; out-of-memory errors free the caches and
        retry. See memory_types.""" % {"name": mt.display_name, "v": mt.value})
    return decorator


numpy = _framework_decorator(MemoryType.NUMPY)
cupy = _framework_decorator(MemoryType.CUPY)
torch = _framework_decorator(MemoryType.TORCH)
tensorflow = _framework_decorator(MemoryType.TENSORFLOW)
jax = _framework_decorator(MemoryType.JAX)
pyclesperanto = _framework_decorator(MemoryType.PYCLESPERANTO)
