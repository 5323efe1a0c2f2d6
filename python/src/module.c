/* arraybridge._arraybridge: the CPython extension over the C library.
 *
 * Ownership in one place:
 *  - A Tensor owns exactly one DLManagedTensorVersioned (`mt`) and calls its
 *    deleter once, when the Tensor is deallocated. When `mt` is a view of
 *    another managed tensor (a zero-copy result of ab_convert_memory), the
 *    Tensor also owns that one (`base`) and deletes it after `mt`.
 *  - Importing (from_dlpack) takes the producer's managed tensor out of its
 *    capsule and renames the capsule "used_...", as DLPack requires; from
 *    then on the Tensor owns it.
 *  - Exporting (__dlpack__) puts a new managed tensor in a capsule: either a
 *    fresh copy (owning its memory) or a view whose manager_ctx holds a
 *    reference to the Tensor, wrapped (struct guarded) so that it is
 *    deleted exactly once: by the consumer's deleter call, or by the
 *    capsule's destructor if no consumer renamed the capsule and none
 *    deleted it. View deleters take the GIL to drop their reference, and
 *    do nothing with Python once the interpreter is finalising; a copy's
 *    deleter needs no GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "arraybridge/arraybridge.h"

#define VERSIONED_NAME "dltensor_versioned"
#define LEGACY_NAME "dltensor"
#define USED_VERSIONED_NAME "used_dltensor_versioned"
/* A capsule's name while this module reads its tensor in place without
 * the GIL (explain_unlocked): no consumer takes it meanwhile. */
#define BUSY_VERSIONED_NAME "dltensor_versioned (being read by arraybridge)"
#define BUSY_LEGACY_NAME "dltensor (being read by arraybridge)"
#define USED_LEGACY_NAME "used_dltensor"

/* ---- errors --------------------------------------------------------------- */

static PyObject *raise_status(ab_status st) {
  PyObject *exc;
  switch (st) {
  case AB_ERR_INVALID_ARGUMENT:
  case AB_ERR_NO_DEVICE: exc = PyExc_ValueError; break;
  case AB_ERR_COPY_REQUIRED:
  case AB_ERR_UNSUPPORTED: exc = PyExc_BufferError; break;
  case AB_ERR_OUT_OF_MEMORY: exc = PyExc_MemoryError; break;
  default: exc = PyExc_RuntimeError; break;
  }
  PyErr_Format(exc, "%s (%s)", ab_last_error(), ab_status_name(st));
  return NULL;
}

static int interpreter_alive(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

/* ---- devices and dtypes as Python values ---------------------------------- */

/* o's UTF-8 text for one of the C parsers, or NULL with ValueError when it
 * holds a NUL character, which they would take for its end ("cpu\0:7"
 * read as "cpu"). */
static const char *text_of(PyObject *o, const char *what) {
  Py_ssize_t n;
  const char *s = PyUnicode_AsUTF8AndSize(o, &n);
  if (s != NULL && strlen(s) != (size_t)n) {
    PyErr_Format(PyExc_ValueError, "%s %R contains a NUL character", what, o);
    return NULL;
  }
  return s;
}

/* -1 with TypeError "<rule>, not bool" when o is a bool: an int to
 * Python, but True is no GPU id, index, byte count, axis, dimension or
 * device number. */
static int refuse_bool(PyObject *o, const char *rule) {
  if (!PyBool_Check(o)) return 0;
  PyErr_Format(PyExc_TypeError, "%s, not bool", rule);
  return -1;
}

/* Where a tensor's memory is, as the module names it: host memory is
 * cpu:0 whatever id a producer gives it (JAX exports its CPU device N's
 * index as the id, where DLPack says 0; the C core takes any such tensor
 * as host memory, but a target cpu:N does not exist). */
static inline DLDevice memory_device(DLDevice d) {
  if (d.device_type == kDLCPU) d.device_id = 0;
  return d;
}

/* A device from a string ("cuda:1") or a (type, id) tuple. */
static int device_from_object(PyObject *o, DLDevice *out) {
  if (PyUnicode_Check(o)) {
    const char *s = text_of(o, "device");
    if (s == NULL) return -1;
    ab_status st = ab_parse_device(s, out);
    if (st != AB_OK) {
      raise_status(st);
      return -1;
    }
    return 0;
  }
  if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2) {
    if (PyUnicode_Check(PyTuple_GET_ITEM(o, 0))) { /* ("opencl", 1): the name belongs in a string */
      PyErr_Format(PyExc_TypeError,
                   "a device tuple's type must be DLPack's device type number, as __dlpack_device__ gives it "
                   "((4, 1) for OpenCL device 1); a device by name is one string: \"%U:%S\"",
                   PyTuple_GET_ITEM(o, 0), PyTuple_GET_ITEM(o, 1));
      return -1;
    }
    if (refuse_bool(PyTuple_GET_ITEM(o, 0), "a device tuple's type must be an int") < 0 ||
        refuse_bool(PyTuple_GET_ITEM(o, 1), "a device tuple's id must be an int") < 0)
      return -1;
    int type_over, id_over; /* beyond a long: out of range, as any value past int32 */
    long type = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(o, 0), &type_over);
    if (type == -1 && PyErr_Occurred()) return -1;
    long id = PyLong_AsLongAndOverflow(PyTuple_GET_ITEM(o, 1), &id_over);
    if (id == -1 && PyErr_Occurred()) return -1;
    if (type_over || id_over || type < 0 || type > INT32_MAX || id < INT32_MIN || id > INT32_MAX) {
      PyErr_Format(PyExc_ValueError, "device (%S, %S) is out of range", PyTuple_GET_ITEM(o, 0),
                   PyTuple_GET_ITEM(o, 1));
      return -1;
    }
    out->device_type = (DLDeviceType)type;
    out->device_id = (int32_t)id;
    return 0;
  }
  PyErr_Format(PyExc_TypeError, "device must be a string like \"cuda:0\" or a (type, id) tuple, not %.100s",
               Py_TYPE(o)->tp_name);
  return -1;
}

static PyObject *device_string(DLDevice d) {
  return PyUnicode_FromFormat("%s:%d", ab_device_type_name(d.device_type), (int)d.device_id);
}

static PyObject *dtype_string(DLDataType t) {
  char name[64];
  return PyUnicode_FromString(ab_dtype_name(t, name, sizeof name));
}

/* A name the core does not know, read as NumPy reads dtype strings ("f4",
 * "<i2", "half": arraybridge._frameworks.numpy_dtype_name) after
 * ab_parse_dtype refused it. AB_OK and *out; else AB_ERR_INVALID_ARGUMENT
 * with ValueError set: the core's message (its list of names) where NumPy
 * has no such dtype or the core none of NumPy's, NumPy's own where it
 * names a dtype of the other byte order. */
static ab_status dtype_from_numpy_name(PyObject *name, DLDataType *out) {
  const char *why = ab_last_error();
  PyObject *refusal = PyUnicode_DecodeUTF8(why, (Py_ssize_t)strlen(why), "replace");
  if (refusal == NULL) return AB_ERR_INVALID_ARGUMENT;
  PyObject *fw = PyImport_ImportModule("arraybridge._frameworks");
  PyObject *alias = fw == NULL ? NULL : PyObject_CallMethod(fw, "numpy_dtype_name", "(O)", name);
  Py_XDECREF(fw);
  const char *text = alias != NULL && PyUnicode_Check(alias) ? PyUnicode_AsUTF8(alias) : NULL;
  ab_status st = AB_ERR_INVALID_ARGUMENT;
  if (alias == NULL) {
    /* its error stands (the other byte order, say) */
  } else if (text != NULL && (st = ab_parse_dtype(text, out)) == AB_OK) {
    /* NumPy's name for it, which the core knows */
  } else {
    PyErr_Clear(); /* None, or a name with no UTF-8 to be had: the core's refusal says it */
    PyErr_SetObject(PyExc_ValueError, refusal);
  }
  Py_XDECREF(alias);
  Py_DECREF(refusal);
  return st;
}

/* A dtype from a name ("float32", as ab_parse_dtype reads them, or one of
 * NumPy's spellings: dtype_from_numpy_name), or from
 * any framework's dtype object (numpy.float32, numpy.dtype("u1"),
 * torch.float16, tf.float32, jnp.bfloat16), named as convert_memory names
 * it (arraybridge._frameworks.dtype_arg, so the two read dtypes alike: the
 * module is used from its package, never alone). */
static int dtype_from_object(PyObject *o, DLDataType *out) {
  PyObject *s;
  if (PyUnicode_Check(o)) {
    Py_INCREF(o);
    s = o;
  } else {
    PyObject *fw = PyImport_ImportModule("arraybridge._frameworks");
    s = fw == NULL ? NULL : PyObject_CallMethod(fw, "dtype_arg", "(O)", o);
    Py_XDECREF(fw);
    if (s != NULL && !PyUnicode_Check(s)) { /* None, say: named by str() in the error below */
      Py_DECREF(s);
      s = PyObject_Str(o);
    }
  }
  if (s == NULL) return -1;
  const char *name = text_of(s, "dtype");
  if (name == NULL) {
    Py_DECREF(s);
    return -1;
  }
  ab_status st = ab_parse_dtype(name, out);
  if (st != AB_OK && PyUnicode_Check(o)) st = dtype_from_numpy_name(o, out);
  else if (st != AB_OK) PyErr_Format(PyExc_ValueError, "%s", ab_last_error()); /* %s: undecodable bytes replaced */
  Py_DECREF(s);
  return st == AB_OK ? 0 : -1;
}

/* ---- the Tensor type -------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  DLManagedTensorVersioned *mt;   /* owned */
  DLManagedTensorVersioned *base; /* owned when mt is a view of it, else NULL */
  PyObject *weakrefs;
} TensorObject;

static PyTypeObject TensorType;

static void release(DLManagedTensorVersioned *m) {
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

/* release(m) with a Python exception pending: a producer's deleter may
 * run Python, which must not see (or clear) it. */
static void release_keeping_error(DLManagedTensorVersioned *m) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  release(m);
  PyErr_Restore(type, value, tb);
}

/* Raises the library's error for `st`, then releases m (whose deleter may
 * run Python or call the library) without losing the exception. */
static PyObject *raise_and_release(ab_status st, DLManagedTensorVersioned *m) {
  raise_status(st);
  release_keeping_error(m);
  return NULL;
}

/* Wraps owned tensors into a new Tensor; on failure deletes them. */
static PyObject *tensor_new_owning(DLManagedTensorVersioned *mt, DLManagedTensorVersioned *base) {
  TensorObject *t = PyObject_New(TensorObject, &TensorType);
  if (t == NULL) {
    release_keeping_error(mt);
    release_keeping_error(base);
    return NULL;
  }
  t->mt = mt;
  t->base = base;
  t->weakrefs = NULL;
  return (PyObject *)t;
}

static void tensor_dealloc(TensorObject *self) {
  if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
  DLManagedTensorVersioned *mt = self->mt, *base = self->base;
  self->mt = self->base = NULL;
  /* A producer's deleter may call back into Python (NumPy's drops a
   * reference): we hold the GIL here, as it expects. */
  release(mt);
  release(base);
  PyObject_Del(self);
}

static const DLTensor *dl(TensorObject *self) { return &self->mt->dl_tensor; }

static PyObject *tensor_shape(TensorObject *self, void *closure) {
  (void)closure;
  const DLTensor *t = dl(self);
  PyObject *tup = PyTuple_New(t->ndim);
  if (tup == NULL) return NULL;
  for (int32_t i = 0; i < t->ndim; i++) {
    PyObject *v = PyLong_FromLongLong(t->shape[i]);
    if (v == NULL) {
      Py_DECREF(tup);
      return NULL;
    }
    PyTuple_SET_ITEM(tup, i, v);
  }
  return tup;
}

/* Strides in elements, as DLPack counts them (compact ones when the tensor
 * has none). */
static PyObject *tensor_strides(TensorObject *self, void *closure) {
  (void)closure;
  const DLTensor *t = dl(self);
  PyObject *tup = PyTuple_New(t->ndim);
  if (tup == NULL) return NULL;
  int64_t acc = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    PyObject *v = PyLong_FromLongLong(t->strides ? t->strides[i] : acc);
    if (v == NULL) {
      Py_DECREF(tup);
      return NULL;
    }
    PyTuple_SET_ITEM(tup, i, v);
    acc *= t->shape[i];
  }
  return tup;
}

static PyObject *tensor_dtype(TensorObject *self, void *closure) {
  (void)closure;
  return dtype_string(dl(self)->dtype);
}

/* DLPack's dtype as Python sees it: (code, bits, lanes). */
static PyObject *dtype_tuple(DLDataType d) {
  return Py_BuildValue("(III)", (unsigned)d.code, (unsigned)d.bits, (unsigned)d.lanes);
}

static PyObject *tensor_dldtype(TensorObject *self, void *closure) {
  (void)closure;
  return dtype_tuple(dl(self)->dtype);
}

static PyObject *tensor_device(TensorObject *self, void *closure) {
  (void)closure;
  return device_string(dl(self)->device);
}

static PyObject *tensor_nbytes(TensorObject *self, void *closure) {
  (void)closure;
  const DLTensor *t = dl(self);
  unsigned long long n = ((unsigned long long)t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (int32_t i = 0; i < t->ndim; i++) n *= (unsigned long long)t->shape[i];
  return PyLong_FromUnsignedLongLong(n);
}

static PyObject *tensor_readonly(TensorObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong((self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
}

static PyObject *tensor_copied(TensorObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong((self->mt->flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0);
}

static PyObject *tensor_data_ptr(TensorObject *self, void *closure) {
  (void)closure;
  const DLTensor *t = dl(self);
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)t->data + t->byte_offset);
}

/* Which strides a result may keep: any (a view keeps the source's), none
 * negative (torch), or compact only (JAX, TensorFlow, pyclesperanto). */
enum layout { LAYOUT_ANY, LAYOUT_NONNEGATIVE, LAYOUT_COMPACT };

static int layout_arg(PyObject *o, enum layout *out) {
  static const char *names[] = {"any", "nonnegative", "compact"};
  *out = LAYOUT_ANY;
  if (o == Py_None) return 0;
  const char *s = PyUnicode_Check(o) ? text_of(o, "layout") : NULL;
  for (int i = 0; s != NULL && i < 3; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (enum layout)i;
      return 0;
    }
  if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "layout must be 'any', 'nonnegative' or 'compact', not %R", o);
  return -1;
}

/* Whether t's strides are what `want` allows (dims of size 1 and empty
 * tensors have no stride that matters). */
static int layout_ok(const DLTensor *t, enum layout want) {
  if (want == LAYOUT_ANY || t->strides == NULL) return 1;
  for (int32_t i = 0; i < t->ndim; i++)
    if (t->shape[i] == 0) return 1; /* no element: any strides will do */
  int64_t expect = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && (want == LAYOUT_COMPACT ? t->strides[i] != expect : t->strides[i] < 0)) return 0;
    expect *= t->shape[i];
  }
  return 1;
}

/* The array-interface type string of a dtype ("<f4", "|u1", "|b1"), or
 * NULL for one it cannot say (bfloat16, more than one lane). */
static const char *typestr_of(DLDataType d) {
  static const struct {
    uint8_t code, bits;
    const char *s;
  } map[] = {
    {kDLBool, 8, "|b1"},   {kDLInt, 8, "|i1"},    {kDLInt, 16, "<i2"},     {kDLInt, 32, "<i4"},
    {kDLInt, 64, "<i8"},   {kDLUInt, 8, "|u1"},   {kDLUInt, 16, "<u2"},    {kDLUInt, 32, "<u4"},
    {kDLUInt, 64, "<u8"},  {kDLFloat, 16, "<f2"}, {kDLFloat, 32, "<f4"},   {kDLFloat, 64, "<f8"},
    {kDLComplex, 64, "<c8"}, {kDLComplex, 128, "<c16"},
  };
  for (size_t i = 0; d.lanes == 1 && i < sizeof map / sizeof map[0]; i++)
    if (map[i].code == d.code && map[i].bits == d.bits) return map[i].s;
  return NULL;
}

/* __cuda_array_interface__ (version 3), for a tensor in CUDA device or
 * managed memory: CuPy, Numba and Dask's "cuda" serializers read it. Its
 * data is complete (conversions synchronise before returning), so stream
 * is None. AttributeError for other tensors, so hasattr() says no. */
static PyObject *tensor_cai(TensorObject *self, void *closure) {
  (void)closure;
  const DLTensor *t = dl(self);
  const char *ts = typestr_of(t->dtype);
  if ((t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged) || ts == NULL) {
    PyErr_Format(PyExc_AttributeError, "__cuda_array_interface__: a %s tensor of %s has none (CUDA memory and "
                 "NumPy's dtypes only)", ab_device_type_name(t->device.device_type), ts == NULL ? "this dtype" : ts);
    return NULL;
  }
  PyObject *shape = tensor_shape(self, NULL), *strides = Py_None;
  if (shape == NULL) return NULL;
  Py_INCREF(Py_None);
  if (!layout_ok(t, LAYOUT_COMPACT)) {
    Py_DECREF(Py_None);
    strides = PyTuple_New(t->ndim);
    if (strides == NULL) {
      Py_DECREF(shape);
      return NULL;
    }
    const int64_t es = (int64_t)(t->dtype.bits / 8u);
    for (int32_t i = 0; i < t->ndim; i++) {
      PyObject *v = PyLong_FromLongLong(t->strides[i] * es);
      if (v == NULL) {
        Py_DECREF(strides);
        Py_DECREF(shape);
        return NULL;
      }
      PyTuple_SET_ITEM(strides, i, v);
    }
  }
  const int readonly = (self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  return Py_BuildValue("{s:N,s:s,s:(KO),s:i,s:N,s:O}", "shape", shape, "typestr", ts, "data",
                       (unsigned long long)((uintptr_t)t->data + t->byte_offset), readonly ? Py_True : Py_False,
                       "version", 3, "strides", strides, "stream", Py_None);
}

static PyObject *tensor_repr(TensorObject *self) {
  PyObject *shape = tensor_shape(self, NULL), *dtype = tensor_dtype(self, NULL), *dev = tensor_device(self, NULL);
  PyObject *r = NULL;
  if (shape && dtype && dev) r = PyUnicode_FromFormat("arraybridge.Tensor(shape=%R, dtype=%U, device=%U)", shape, dtype, dev);
  Py_XDECREF(shape);
  Py_XDECREF(dtype);
  Py_XDECREF(dev);
  return r;
}

/* ---- export ------------------------------------------------------------------- */

/* A view of a Tensor for a consumer: it keeps alive the Tensor whose
 * memory the data is (memory_owner), and has its own copy of the shape
 * and strides (dims: ndim of each), which were the viewed Tensor's. */
struct view_export {
  DLManagedTensorVersioned mt;
  PyObject *owner;
  int64_t dims[];
};

#if PY_VERSION_HEX < 0x030C0000
/* Releases that with_gil cannot place (before 3.12: see there), run by a
 * thread of ours that has no thread state until it takes the GIL
 * (PyGILState_Ensure: a main-interpreter thread state), so it never holds
 * the GIL while it waits for it. Started at the first deferral (again in
 * a forked child). Nodes are malloc'd (not PyMem: under tracemalloc its
 * allocator takes the GIL); a release that cannot be queued, or that is
 * queued once the interpreter is finalising, is leaked rather than run
 * without the GIL. */
struct deferred {
  void (*release)(void *);
  void *arg;
  struct deferred *next;
};
static pthread_mutex_t deferred_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t deferred_cond = PTHREAD_COND_INITIALIZER;
static struct deferred *deferred_head;
static int deferred_thread_up;

static void *run_deferred(void *unused) {
  (void)unused;
  pthread_mutex_lock(&deferred_lock);
  for (;;) {
    while (deferred_head == NULL) pthread_cond_wait(&deferred_cond, &deferred_lock);
    struct deferred *d = deferred_head;
    deferred_head = NULL;
    pthread_mutex_unlock(&deferred_lock);
    const int alive = interpreter_alive();
    PyGILState_STATE g = alive ? PyGILState_Ensure() : PyGILState_UNLOCKED;
    while (d != NULL) {
      struct deferred *next = d->next;
      if (alive) d->release(d->arg);
      free(d);
      d = next;
    }
    if (alive) PyGILState_Release(g);
    pthread_mutex_lock(&deferred_lock);
  }
  return NULL;
}

static void defer_release(void (*release)(void *), void *arg) {
  struct deferred *d = malloc(sizeof *d);
  if (d == NULL) return;
  d->release = release;
  d->arg = arg;
  pthread_mutex_lock(&deferred_lock);
  if (!deferred_thread_up) {
    /* Detached, and with every signal blocked but a fault's: Python's
     * handlers belong to its own threads, and a fault in a deleter run
     * here must still reach faulthandler (the library's own threads do
     * the same: src/lifetime.c, "signals"). */
    pthread_attr_t attr;
    sigset_t all, was;
    pthread_t t;
    sigfillset(&all);
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
      sigdelset(&all, faults[i]);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    if (pthread_attr_init(&attr) == 0) {
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      deferred_thread_up = pthread_create(&t, &attr, run_deferred, NULL) == 0;
      pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &was, NULL);
  }
  if (deferred_thread_up) {
    d->next = deferred_head;
    deferred_head = d;
    pthread_cond_signal(&deferred_cond);
  }
  pthread_mutex_unlock(&deferred_lock);
  if (!deferred_thread_up) free(d); /* no thread to run it: leaked */
}
#endif

/* Runs `release` on `arg` with the GIL (release then owns arg: it may run
 * later): directly when this thread holds it (the usual case: a consumer
 * deleting under the GIL); else taking it, unless the interpreter is
 * finalising, when the Python object is leaked rather than touched (a
 * thread that calls in exactly as finalisation starts can still be
 * stopped inside PyGILState_Ensure: CPython's rule for foreign threads).
 * What every deleter of ours that holds Python objects does. */
static void with_gil(void (*release)(void *), void *arg) {
  /* Whether this thread holds the GIL. (Not PyGILState_Check: once a
   * subinterpreter has been created, CPython stops checking and it says 1
   * on every thread.) From Python 3.12 the current thread state is this
   * thread's own, set exactly while it holds the GIL. Before, it is one
   * global, the holder's on whatever thread, and a bare thread took it
   * for its own; so there it must be this thread's gilstate thread state.
   * Where the current one belongs to another interpreter (a
   * subinterpreter's code runs), which thread holds it cannot be told
   * (_xxsubinterpreters.run_string borrows the thread state made on the
   * thread that created the interpreter, whichever thread runs the code),
   * so the release is deferred to a thread of ours (defer_release) rather
   * than run without the GIL or wait for a GIL this thread may hold. A
   * thread Python has never seen holds no GIL (one that holds it only
   * through a subinterpreter of its own would wait here). Nothing of
   * another thread's thread state is read but its interpreter, and only
   * by a Python thread (the other thread freeing its own at that instant
   * is the one read of freed memory left, a heap block). */
#if PY_VERSION_HEX >= 0x030D0000
  const int holding = PyThreadState_GetUnchecked() != NULL;
#elif PY_VERSION_HEX >= 0x030C0000
  const int holding = _PyThreadState_UncheckedGet() != NULL;
#else
  PyThreadState *cur = _PyThreadState_UncheckedGet(), *mine = PyGILState_GetThisThreadState();
  const int holding = cur != NULL && cur == mine;
  if (!holding && cur != NULL && mine != NULL && cur->interp != mine->interp) {
    if (interpreter_alive()) defer_release(release, arg);
    return;
  }
#endif
  if (holding) {
    release(arg);
    return;
  }
  if (!interpreter_alive()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  release(arg);
  PyGILState_Release(g);
}

static void decref(void *o) { Py_DECREF((PyObject *)o); }

static void drop_owner(PyObject *owner) { with_gil(decref, owner); }

/* The header of a managed tensor this module makes: DLPack's version, ctx
 * and its deleter (the tensor, flags and what ctx holds: the caller's). */
static void managed_init(DLManagedTensorVersioned *mt, void *ctx, void (*deleter)(DLManagedTensorVersioned *)) {
  mt->version.major = DLPACK_MAJOR_VERSION;
  mt->version.minor = DLPACK_MINOR_VERSION;
  mt->manager_ctx = ctx;
  mt->deleter = deleter;
}

static void view_export_deleter(DLManagedTensorVersioned *m) {
  struct view_export *v = (struct view_export *)m;
  drop_owner(v->owner);
  PyMem_RawFree(v);
}

struct legacy_view_export {
  DLManagedTensor mt;
  PyObject *owner;
  int64_t dims[];
};

static void legacy_view_export_deleter(DLManagedTensor *m) {
  struct legacy_view_export *v = (struct legacy_view_export *)m;
  drop_owner(v->owner);
  PyMem_RawFree(v);
}

/* What a capsule of ours holds: the managed tensor handed out, wrapped, so
 * that its deleter runs once however it is reached. A consumer that takes
 * the tensor, calls its deleter on a failure and leaves the capsule's name
 * as it was (torch.from_dlpack of an OpenCL tensor: it raises, deletes,
 * and does not rename) would otherwise have the capsule's destructor free
 * it a second time, and the process abort; and a consumer may also take
 * the capsule's destructor away (JAX and TensorFlow rename it and set
 * none), so the wrapper cannot wait for the destructor either. So the
 * wrappers not yet deleted are listed (struct live_set, serial -> wrapper,
 * under a mutex of its own, so that a deleter on any thread reads it
 * without the GIL): whichever of the deleter and an unconsumed capsule's
 * destructor finds its wrapper there first deletes it; the capsule keeps
 * the serial as its context, so that a new wrapper at a freed one's
 * address is never taken for it. */
struct guarded {
  union {
    DLManagedTensorVersioned v;
    DLManagedTensor l;
  } mt;        /* first: the pointer the capsule holds */
  void *inner; /* the managed tensor wrapped */
  int versioned;
  size_t serial;
};

/* The wrappers not yet deleted: open addressing, linear probing, keyed by
 * serial (0: an empty slot), each serial's home slot a multiplicative
 * hash of it (the serial itself, masked, would put wrappers that live
 * together in one run of slots, which every newer serial wrapping round
 * the table then probed to its end). Between an eighth and a half full
 * once grown past 64 slots. Entries are added under the GIL (capsule_of,
 * the only caller that allocates or resizes: the allocator may take the
 * GIL under tracemalloc) and taken on any thread; nothing else is done
 * under the lock, and nothing with Python. */
static struct live_set {
  pthread_mutex_t lock;
  struct live_entry {
    size_t serial;
    struct guarded *g;
  } *slot;
  size_t mask; /* slots - 1; slot is NULL until the first export */
  size_t count;
  size_t last_serial;
  int wrapped; /* serials have wrapped round (a 32-bit size_t can): a new one may still be listed */
} live = {.lock = PTHREAD_MUTEX_INITIALIZER};
_Static_assert(sizeof(size_t) <= sizeof(void *), "the capsule's context holds a serial");

static size_t live_home(size_t serial, size_t mask) {
  return (size_t)(((uint64_t)serial * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & mask;
}

/* The slot of table t (mask: its slots - 1) holding serial, or the empty
 * one ending its probe. */
static size_t live_probe(const struct live_entry *t, size_t mask, size_t serial) {
  size_t i = live_home(serial, mask);
  while (t[i].serial != 0 && t[i].serial != serial) i = (i + 1) & mask;
  return i;
}

static size_t live_find(size_t serial) { return live_probe(live.slot, live.mask, serial); }

/* The table at `slots` slots (a power of two, more than twice the count).
 * 0 when out of memory, the table as it was. */
static int live_resize(size_t slots) {
  struct live_entry *t = slots <= SIZE_MAX / sizeof *t ? PyMem_RawCalloc(slots, sizeof *t) : NULL;
  if (t == NULL) return 0;
  for (size_t i = 0; live.slot != NULL && i <= live.mask; i++)
    if (live.slot[i].serial != 0) t[live_probe(t, slots - 1, live.slot[i].serial)] = live.slot[i];
  PyMem_RawFree(live.slot);
  live.slot = t;
  live.mask = slots - 1;
  return 1;
}


/* The slot listing g under serial, SIZE_MAX when none does (g deleted
 * already). Under live.lock. */
static size_t live_slot_of(const void *g, size_t serial) {
  if (live.slot == NULL || serial == 0) return SIZE_MAX;
  const size_t i = live_find(serial);
  return live.slot[i].serial == serial && live.slot[i].g == g ? i : SIZE_MAX;
}

/* Whether g is listed under serial (not yet deleted): read only. */
static int live_has(const void *g, size_t serial) {
  pthread_mutex_lock(&live.lock);
  const int has = live_slot_of(g, serial) != SIZE_MAX;
  pthread_mutex_unlock(&live.lock);
  return has;
}

/* Lists g under a new serial (g->serial). 0 when out of memory. */
static int live_add(struct guarded *g) {
  int ok = 1;
  pthread_mutex_lock(&live.lock);
  const size_t slots = live.slot == NULL ? 0 : live.mask + 1;
  if (slots == 0 || (live.count + 1) * 2 > slots)
    ok = live_resize(slots == 0 ? 64 : 2 * slots);
  else if (slots > 64 && (live.count + 1) * 8 < slots)
    live_resize(slots / 2); /* shrinking may fail: the table stays as it is */
  if (ok) {
    /* Serial 0 marks an empty slot; after a wrap, skip serials still
     * listed (a second entry of one serial could never be taken). */
    do {
      if (++live.last_serial == 0) {
        live.wrapped = 1;
        ++live.last_serial;
      }
    } while (live.wrapped && live.slot[live_find(live.last_serial)].serial != 0);
    g->serial = live.last_serial;
    live.slot[live_find(g->serial)] = (struct live_entry){g->serial, g};
    live.count++;
  }
  pthread_mutex_unlock(&live.lock);
  return ok;
}

/* Whether g (freed or not: only its address is compared) is listed with
 * `serial`, taking it off the list if so. Any thread, GIL or not. */
static int take_wrapper(const void *g, size_t serial) {
  pthread_mutex_lock(&live.lock);
  size_t i = live_slot_of(g, serial);
  const int taken = i != SIZE_MAX;
  if (taken) {
    /* Off the list, moving back each later entry of the run that may sit
     * no nearer its home than the hole. */
    const size_t mask = live.mask;
    for (size_t j = (i + 1) & mask; live.slot[j].serial != 0; j = (j + 1) & mask)
      if (((j - live_home(live.slot[j].serial, mask)) & mask) >= ((j - i) & mask)) {
        live.slot[i] = live.slot[j];
        i = j;
      }
    live.slot[i].serial = 0;
    live.count--;
  }
  pthread_mutex_unlock(&live.lock);
  return taken;
}

/* A fork while another thread holds the lock would leave it held in the
 * child: the fork waits for it (registered by PyInit). */
static void live_fork_prepare(void) {
  pthread_mutex_lock(&live.lock);
#if PY_VERSION_HEX < 0x030C0000
  pthread_mutex_lock(&deferred_lock);
#endif
}
static void live_fork_done(void) {
#if PY_VERSION_HEX < 0x030C0000
  pthread_mutex_unlock(&deferred_lock);
#endif
  pthread_mutex_unlock(&live.lock);
}
static void live_fork_child(void) {
#if PY_VERSION_HEX < 0x030C0000
  deferred_thread_up = 0; /* not in the child: the next deferral starts one (and runs what is queued) */
#endif
  live_fork_done();
}

/* Runs the deleter of m, a DLManagedTensorVersioned when versioned, else
 * a DLManagedTensor. */
static void release_either(void *m, int versioned) {
  if (versioned) release(m);
  else if (((DLManagedTensor *)m)->deleter != NULL) ((DLManagedTensor *)m)->deleter(m);
}

/* Deletes the wrapped tensor and frees g; g is off the list. */
static void delete_wrapped(struct guarded *g) {
  release_either(g->inner, g->versioned);
  PyMem_RawFree(g);
}

/* The consumer's call, on any thread. Only a view's own deleter takes the
 * GIL (to drop its reference to the Tensor: drop_owner); a copy's is the
 * C library's, and runs without it, at finalisation too. */
static void guarded_release(struct guarded *g) {
  if (take_wrapper(g, g->serial)) delete_wrapped(g);
}
static void guarded_deleter_versioned(DLManagedTensorVersioned *m) { guarded_release(m->manager_ctx); }
static void guarded_deleter_legacy(DLManagedTensor *m) { guarded_release(m->manager_ctx); }

static void capsule_destructor(PyObject *cap) {
  /* A capsule a consumer took is renamed "used_..."; only an unconsumed
   * one may still own its tensor (unless the consumer deleted it without
   * renaming: then its wrapper is off the list). Keep any exception in
   * flight. */
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  const char *name = PyCapsule_IsValid(cap, VERSIONED_NAME) ? VERSIONED_NAME
                     : PyCapsule_IsValid(cap, LEGACY_NAME)  ? LEGACY_NAME
                                                            : NULL;
  if (name != NULL) {
    void *g = PyCapsule_GetPointer(cap, name);
    size_t serial = (size_t)(uintptr_t)PyCapsule_GetContext(cap);
    if (g != NULL && take_wrapper(g, serial)) delete_wrapped(g);
  }
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

/* A capsule holding m (a DLManagedTensorVersioned when versioned, else a
 * DLManagedTensor), which it owns from here on: on failure m is released
 * and NULL returned with an exception. */
static PyObject *capsule_of(void *m, int versioned) {
  struct guarded *g = PyMem_RawMalloc(sizeof *g);
  PyObject *cap = NULL;
  int listed = 0;
  if (g == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  if (versioned) {
    g->mt.v = *(DLManagedTensorVersioned *)m;
    g->mt.v.manager_ctx = g;
    g->mt.v.deleter = guarded_deleter_versioned;
  } else {
    g->mt.l = *(DLManagedTensor *)m;
    g->mt.l.manager_ctx = g;
    g->mt.l.deleter = guarded_deleter_legacy;
  }
  g->inner = m;
  g->versioned = versioned;
  if (!live_add(g)) {
    PyErr_NoMemory();
    goto fail;
  }
  listed = 1;
  cap = PyCapsule_New(&g->mt, versioned ? VERSIONED_NAME : LEGACY_NAME, NULL);
  if (cap == NULL || PyCapsule_SetContext(cap, (void *)(uintptr_t)g->serial) != 0 ||
      PyCapsule_SetDestructor(cap, capsule_destructor) != 0) {
    Py_CLEAR(cap); /* it has no destructor yet: nothing was deleted */
    goto fail;
  }
  return cap;
fail: {
  PyObject *type, *value, *tb; /* the error stands: m's deleter may run Python */
  PyErr_Fetch(&type, &value, &tb);
  if (listed) take_wrapper(g, g->serial); /* off the list */
  PyMem_RawFree(g);
  release_either(m, versioned);
  PyErr_Restore(type, value, tb);
  return NULL;
}
}

static PyObject *capsule_versioned(DLManagedTensorVersioned *m) { return capsule_of(m, 1); }

static PyObject *capsule_legacy(DLManagedTensor *m) { return capsule_of(m, 0); }

/* Exports a fresh, owned tensor (a copy made for this consumer). */
static PyObject *export_owned(DLManagedTensorVersioned *m, int versioned) {
  if (versioned) return capsule_versioned(m);
  DLManagedTensor *legacy;
  ab_status st = ab_to_legacy(m, &legacy);
  if (st != AB_OK) return raise_and_release(st, m);
  return capsule_legacy(legacy);
}

/* The Tensor whose memory self's data is: the one self is a view of,
 * when self is one (its managed tensor, or the one its zero-copy result
 * was made of, is a view export of ours), else self. A view holds that
 * Tensor, not self, so views of views of a Tensor are never a chain:
 * `t = ab.to_device(t, "cpu")` in a loop held every earlier Tensor alive
 * (128 bytes each, and a million of them overflowed the stack when the
 * last was freed). */
static PyObject *memory_owner(TensorObject *self) {
  const DLManagedTensorVersioned *m = self->base != NULL ? self->base : self->mt;
  return m->deleter == view_export_deleter ? ((const struct view_export *)m)->owner : (PyObject *)self;
}

/* A view's description of src's data, with the shape and strides copied
 * into dims (2 * ndim int64_t), as src's may be freed first. */
static DLTensor describe_into(const DLTensor *src, int64_t *dims) {
  DLTensor t = *src;
  const size_t n = t.ndim > 0 ? (size_t)t.ndim : 0;
  if (n > 0) memcpy(dims, t.shape, n * sizeof *dims);
  t.shape = dims;
  if (t.strides != NULL) {
    if (n > 0) memcpy(dims + n, t.strides, n * sizeof *dims);
    t.strides = dims + n;
  }
  return t;
}

static size_t dims_bytes(TensorObject *self) {
  return 2 * (size_t)(dl(self)->ndim > 0 ? dl(self)->ndim : 0) * sizeof(int64_t);
}

/* A view export with room for ndim dims' shape and strides: its version,
 * context and deleter set, the rest (tensor, flags, owner) the caller's.
 * NULL when out of memory (no exception set). */
static struct view_export *view_export_new(int32_t ndim) {
  const size_t n = ndim > 0 ? (size_t)ndim : 0;
  struct view_export *v = PyMem_RawCalloc(1, sizeof *v + 2 * n * sizeof(int64_t));
  if (v == NULL) return NULL;
  managed_init(&v->mt, v, view_export_deleter);
  return v;
}

/* A view of a Tensor as a managed tensor that keeps its memory alive;
 * NULL with MemoryError. What a versioned export puts in its capsule, and
 * what the module's own imports of a Tensor take without one. */
static DLManagedTensorVersioned *view_of(TensorObject *self) {
  struct view_export *v = view_export_new(dl(self)->ndim);
  if (v == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  v->mt.dl_tensor = describe_into(dl(self), v->dims);
  v->mt.flags = self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY;
  v->owner = memory_owner(self);
  Py_INCREF(v->owner);
  return &v->mt;
}

static PyObject *export_view(TensorObject *self, int versioned) {
  if (versioned) {
    DLManagedTensorVersioned *v = view_of(self);
    return v == NULL ? NULL : capsule_versioned(v);
  }
  if (self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
    PyErr_SetString(PyExc_BufferError,
                    "this tensor is read-only and the consumer asked for a legacy (unversioned) DLPack capsule, "
                    "which cannot say so; ask with max_version=(1, 0) or make a copy");
    return NULL;
  }
  struct legacy_view_export *v = PyMem_RawCalloc(1, sizeof *v + dims_bytes(self));
  if (v == NULL) return PyErr_NoMemory();
  v->mt.dl_tensor = describe_into(dl(self), v->dims);
  v->mt.manager_ctx = v;
  v->mt.deleter = legacy_view_export_deleter;
  v->owner = memory_owner(self);
  Py_INCREF(v->owner);
  return capsule_legacy(&v->mt);
}

/* copy=None/True/False as -1/1/0; -2 with TypeError for anything else
 * (a NumPy bool counts as a bool): truth testing would read copy="False"
 * or a non-empty list as True. */
static int copy_arg(PyObject *copy) {
  if (copy == Py_None) return -1;
  if (PyBool_Check(copy)) return copy == Py_True;
  const char *tn = Py_TYPE(copy)->tp_name;
  if (strcmp(tn, "numpy.bool") == 0 || strcmp(tn, "numpy.bool_") == 0) {
    int v = PyObject_IsTrue(copy);
    return v < 0 ? -2 : v;
  }
  PyErr_Format(PyExc_TypeError, "copy must be None, True or False, not %.100s", tn);
  return -2;
}

static int is_cpu_like(DLDeviceType t) { return t == kDLCPU || t == kDLCUDAHost; }



/* ---- pickling --------------------------------------------------------------------- */

struct map_args;
static PyObject *import_and_convert(PyObject *x, const DLDevice *target, int copy, const DLDataType *dtype,
                                    const struct map_args *map, enum layout layout);
static PyObject *rebuild_fn; /* the module's _rebuild_tensor, for __reduce_ex__ */

static size_t byte_size(const DLTensor *t) {
  size_t n = (size_t)(t->dtype.bits / 8u) * t->dtype.lanes;
  for (int32_t i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i]; /* validated: no overflow */
  return n;
}

static int host_compact(const DLTensor *t) {
  return is_cpu_like(t->device.device_type) && layout_ok(t, LAYOUT_COMPACT);
}

/* The struct-module format of a dtype that has one, else NULL. */
static const char *struct_format(DLDataType d) {
  if (d.lanes != 1) return NULL;
  switch (d.code) {
  case kDLInt: return d.bits == 8 ? "b" : d.bits == 16 ? "h" : d.bits == 32 ? "i" : d.bits == 64 ? "q" : NULL;
  case kDLUInt: return d.bits == 8 ? "B" : d.bits == 16 ? "H" : d.bits == 32 ? "I" : d.bits == 64 ? "Q" : NULL;
  case kDLFloat: return d.bits == 16 ? "e" : d.bits == 32 ? "f" : d.bits == 64 ? "d" : NULL;
  case kDLComplex: return d.bits == 64 ? "Zf" : d.bits == 128 ? "Zd" : NULL;
  case kDLBool: return d.bits == 8 ? "?" : NULL;
  default: return NULL; /* bfloat16, float8: no struct code */
  }
}

/* The buffer protocol, for compact host tensors, read-only when the tensor
 * is: what pickle protocol 5 hands out of band, and what np.asarray and
 * memoryview read. A consumer that asks for the format and shape
 * (PyBUF_FORMAT | PyBUF_ND, as NumPy does) gets the tensor's dtype, shape
 * and strides, so np.asarray(t) is t as an array; one that asks for plain
 * bytes (PyBUF_SIMPLE) gets them. A dtype the struct module cannot name
 * (bfloat16, float8, multi-lane) is refused to a reader that asks for a
 * format (memoryview, NumPy, PickleBuffer all do), which would take its
 * bytes for uint8 elements; byte_view is its bytes as uint8. */
static int tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags) {
  static char empty;
  const DLTensor *t = dl(self);
  if (!host_compact(t)) {
    PyErr_Format(PyExc_BufferError, "a %s tensor%s has no buffer: copy it to compact host memory first "
                 "(to_device(x, 'cpu', layout='compact'))", ab_device_type_name(t->device.device_type),
                 is_cpu_like(t->device.device_type) ? " with strides" : "");
    view->obj = NULL;
    return -1;
  }
  const char *fmt = struct_format(t->dtype);
  if (fmt == NULL && (flags & PyBUF_FORMAT) == PyBUF_FORMAT) {
    /* Bytes with format "B" would be taken for uint8 elements: NumPy made
     * a bfloat16 tensor's (2, 3) values twelve uint8 numbers, silently.
     * Refused, so that np.asarray falls back to __array__ (which says
     * what it cannot read); pickle and Dask take the bytes through
     * byte_view. */
    char name[64];
    ab_dtype_name(t->dtype, name, sizeof name);
    PyErr_Format(PyExc_BufferError, "%s has no buffer format (the struct module and NumPy's buffer reader cannot "
                 "name it); its bytes are arraybridge.byte_view(t), or convert: to_device(t, 'cpu', "
                 "dtype='float32')", name);
    view->obj = NULL;
    return -1;
  }
  const size_t n = byte_size(t);
  char *data = n == 0 ? &empty : (char *)t->data + t->byte_offset;
  if (PyBuffer_FillInfo(view, (PyObject *)self, data, (Py_ssize_t)n,
                        (self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0, flags) < 0)
    return -1;
  if (fmt == NULL || (flags & PyBUF_FORMAT) != PyBUF_FORMAT || (flags & PyBUF_ND) != PyBUF_ND) return 0;
  /* Row-major memory: a reader that insists on Fortran order gets it only
   * where the two agree (at most one dim longer than 1). */
  if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS) {
    int long_dims = 0;
    for (int32_t i = 0; i < t->ndim; i++) long_dims += t->shape[i] > 1;
    if (long_dims > 1) {
      PyBuffer_Release(view);
      PyErr_SetString(PyExc_BufferError, "the tensor is row-major (C order), not Fortran-contiguous");
      return -1;
    }
  }
  /* shape, then strides: freed by tensor_releasebuffer */
  Py_ssize_t *dims = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(t->ndim > 0 ? t->ndim : 1));
  if (dims == NULL) {
    PyBuffer_Release(view);
    PyErr_NoMemory();
    return -1;
  }
  const Py_ssize_t es = (Py_ssize_t)(t->dtype.bits / 8u);
  Py_ssize_t stride = es;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    dims[i] = (Py_ssize_t)t->shape[i];
    dims[t->ndim + i] = stride;
    stride *= dims[i];
  }
  view->internal = dims;
  view->format = (char *)fmt;
  view->itemsize = es;
  view->ndim = t->ndim;
  view->shape = t->ndim > 0 ? dims : NULL;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES && t->ndim > 0 ? dims + t->ndim : NULL;
  return 0;
}

static void tensor_releasebuffer(TensorObject *self, Py_buffer *view) {
  (void)self;
  PyMem_Free(view->internal);
}

static PyBufferProcs tensor_as_buffer = {(getbufferproc)tensor_getbuffer, (releasebufferproc)tensor_releasebuffer};

/* A dtype as a pickle carries it: its name where the name reads back as
 * the same dtype and is one every version reads (the common one-lane
 * types, DLPack's int, uint, float, bfloat, complex and bool codes:
 * pickles stay readable by older versions), else (code, bits, lanes):
 * float8 formats (whose names only newer versions read), multi-lane. */
static PyObject *dtype_for_pickle(DLDataType t) {
  char name[64];
  DLDataType back;
  ab_dtype_name(t, name, sizeof name);
  const int same = t.code <= kDLBool && ab_parse_dtype(name, &back) == AB_OK && back.code == t.code &&
                   back.bits == t.bits && back.lanes == t.lanes;
  return same ? PyUnicode_FromString(name) : dtype_tuple(t);
}

/* The dtype of a pickle: a (code, bits, lanes) tuple, or a name; either
 * way of whole bytes (a sub-byte name, "float4_e2m1fn", would make the
 * payload's size check ask for 0 bytes). */
static int dtype_from_pickle(PyObject *o, DLDataType *out) {
  int code, bits, lanes;
  if (!PyTuple_Check(o)) {
    if (dtype_from_object(o, out) < 0) return -1;
    code = out->code, bits = out->bits, lanes = out->lanes;
  } else if (!PyArg_ParseTuple(o, "iii", &code, &bits, &lanes)) {
    return -1;
  }
  if (code < 0 || code > 255 || bits <= 0 || bits > 255 || bits % 8 != 0 || lanes < 1 || lanes > 65535) {
    PyErr_Format(PyExc_ValueError, "pickled dtype (code %d, bits %d, lanes %d) is not one of whole bytes", code, bits,
                 lanes);
    return -1;
  }
  *out = (DLDataType){(uint8_t)code, (uint8_t)bits, (uint16_t)lanes};
  return 0;
}

/* A 1-D uint8 Tensor of self's bytes (self: compact host memory), sharing
 * them and holding the Tensor they belong to: how pickle and Dask hand
 * over the memory of a dtype the buffer protocol cannot describe
 * (bfloat16, float8, multi-lane) as the bytes it is. */
static PyObject *byte_view(TensorObject *self) {
  struct view_export *v = view_export_new(1);
  if (v == NULL) return PyErr_NoMemory();
  const DLTensor *t = dl(self);
  v->mt.dl_tensor = *t;
  v->mt.dl_tensor.dtype = (DLDataType){kDLUInt, 8, 1};
  v->mt.dl_tensor.ndim = 1;
  v->dims[0] = (int64_t)byte_size(t);
  v->mt.dl_tensor.shape = v->dims;
  v->mt.dl_tensor.strides = NULL;
  v->mt.flags = self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY;
  v->owner = memory_owner(self);
  Py_INCREF(v->owner);
  return tensor_new_owning(&v->mt, NULL);
}

static PyObject *py_byte_view(PyObject *mod, PyObject *x) {
  (void)mod;
  if (!PyObject_TypeCheck(x, &TensorType) || !host_compact(dl((TensorObject *)x)))
    return PyErr_Format(PyExc_ValueError, "byte_view takes a Tensor in compact host memory (to_device(t, 'cpu', "
                        "layout='compact') makes one)");
  return byte_view((TensorObject *)x);
}

/* pickle: (the module's _rebuild_tensor, (bytes, dtype, shape, read-only,
 * device)). The bytes are the tensor's own memory when it is compact host
 * memory (out of band with protocol 5: a PickleBuffer, no copy into the
 * stream), else a compact host copy read through the library's routes. */
static PyObject *tensor_reduce_ex(TensorObject *self, PyObject *proto_o) {
  long proto = PyLong_AsLong(proto_o);
  if (proto == -1 && PyErr_Occurred()) return NULL;
  PyObject *src;
  if (host_compact(dl(self))) {
    src = (PyObject *)self;
    Py_INCREF(src);
  } else {
    const DLDevice cpu = {kDLCPU, 0};
    src = import_and_convert((PyObject *)self, &cpu, 1, NULL, NULL, LAYOUT_COMPACT);
    if (src == NULL) return NULL;
  }
  if (struct_format(dl(self)->dtype) == NULL) { /* no typed buffer: its bytes */
    PyObject *bytes = byte_view((TensorObject *)src);
    Py_DECREF(src);
    if (bytes == NULL) return NULL;
    src = bytes;
  }
  PyObject *payload = proto >= 5 ? PyPickleBuffer_FromObject(src) : PyBytes_FromObject(src);
  Py_DECREF(src);
  if (payload == NULL) return NULL;
  PyObject *readonly = (self->mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY) ? Py_True : Py_False;
  return Py_BuildValue("O(NNNON)", rebuild_fn, payload, dtype_for_pickle(dl(self)->dtype), tensor_shape(self, NULL),
                       readonly, tensor_device(self, NULL));
}

/* to_device's and explain_route's arguments, in this order (move_names
 * holds them interned): x and target by position or name, gpu_id too,
 * the rest by name only. */
enum { MOVE_X, MOVE_TARGET, MOVE_GPU_ID, MOVE_DTYPE, MOVE_COPY, MOVE_PERMUTE, MOVE_SCALE, MOVE_OFFSET,
       MOVE_CHANNEL_AXIS, MOVE_CHANNEL_SCALE, MOVE_CHANNEL_OFFSET, MOVE_LAYOUT, MOVE_ARGS };
static const char *const move_arg_names[MOVE_ARGS] = {"x",      "target",       "gpu_id",        "dtype",
                                                        "copy",   "permute",      "scale",         "offset",
                                                        "channel_axis", "channel_scale", "channel_offset", "layout"};
static PyObject *move_names[MOVE_ARGS];

/* Names and values the DLPack calls use on every import and export, made
 * once (intern_names, at the module's first import) and kept for the
 * process's life. call_dlpack and producer_device made them per call: a
 * dict, a tuple and three strings made and hashed each time
 * (to_device(a, "cpu:0") of a 4 KiB NumPy array: 0.70 -> 0.40-0.43 us on
 * the development VM). */
static PyObject *str_dlpack, *str_dlpack_device, *str_max_version, *str_stream, *str_copy, *str_dl_device,
    *our_max_version, *int_one;

static int intern_names(void) {
  if (our_max_version != NULL) return 0;
  str_dlpack = PyUnicode_InternFromString("__dlpack__");
  str_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
  str_max_version = PyUnicode_InternFromString("max_version");
  str_stream = PyUnicode_InternFromString("stream");
  str_copy = PyUnicode_InternFromString("copy");
  str_dl_device = PyUnicode_InternFromString("dl_device");
  for (int i = 0; i < MOVE_ARGS; i++)
    if ((move_names[i] = PyUnicode_InternFromString(move_arg_names[i])) == NULL) return -1;
  int_one = PyLong_FromLong(1);
  PyObject *v = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
  if (!str_dlpack || !str_dlpack_device || !str_max_version || !str_stream || !str_copy || !str_dl_device ||
      !int_one || !v) {
    Py_XDECREF(v);
    return -1;
  }
  our_max_version = v; /* last: the others are complete once it is set */
  return 0;
}

/* Whether keyword k is `name`: an equal string (one from a ** dict, not
 * the interned name itself). */
static int keyword_is(PyObject *k, PyObject *name) { return PyUnicode_Check(k) && PyUnicode_Compare(k, name) == 0; }

/* Drops fast_args' references (and leaves v's slots NULL). */
static void args_release(PyObject **v, int n) {
  for (int i = 0; i < n; i++) Py_CLEAR(v[i]);
}

/* A METH_FASTCALL | METH_KEYWORDS function's arguments into out[0..n),
 * each a new reference (those not given left NULL; args_release drops
 * them). Held for the whole call: the vectorcall's array is the caller's,
 * and functools.partial's holds no references of its own, so Python code
 * run during the call (a producer's __dlpack__, an __index__) could free
 * an argument it borrowed. Argument i is named
 * names[i] (interned), the first npos may come by position, the first
 * nreq must be given. -1 with TypeError, in CPython 3.10-3.12's words
 * (3.13 adds "Did you mean ...?"), for what PyArg_ParseTupleAndKeywords
 * would refuse (which named a missing argument before an unknown
 * keyword, where this names the keyword, as a Python function does).
 * That parser made and hashed a str for each name it looked up, one by
 * one, until every keyword given was found: to_device(a, "cpu:0", layout="nonnegative") of a 4 KiB NumPy
 * array took 1.21 us through it, 0.39 through this, on the development
 * VM. */
static int fast_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                     PyObject *const *names, int n, int npos, int nreq, PyObject **out) {
  for (int i = 0; i < n; i++) out[i] = NULL;
  if (nargs > npos) {
    if (npos == 0) PyErr_Format(PyExc_TypeError, "%s() takes no positional arguments", fname);
    else PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)", fname, npos, nargs);
    return -1;
  }
  for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
  const Py_ssize_t nk = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t j = 0; j < nk; j++) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, j);
    int i = 0;
    while (i < n && k != names[i]) i++; /* the same object: a keyword written in the call */
    if (i == n)
      for (i = 0; i < n && !keyword_is(k, names[i]); i++) {
      }
    if (i == n) {
      PyErr_Format(PyExc_TypeError, "'%S' is an invalid keyword argument for %s()", k, fname);
      return -1;
    }
    if (i < nargs) {
      PyErr_Format(PyExc_TypeError, "argument for %s() given by name ('%S') and position (%d)", fname, k, i + 1);
      return -1;
    }
    out[i] = args[nargs + j];
  }
  for (int i = 0; i < nreq; i++)
    if (out[i] == NULL) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%S' (pos %d)", fname, names[i], i + 1);
      return -1;
    }
  for (int i = 0; i < n; i++) Py_XINCREF(out[i]);
  return 0;
}

static PyObject *dlpack_export(TensorObject *self, PyObject *stream, PyObject *max_version, PyObject *dl_device,
                               PyObject *copy);

/* Every consumer calls it, with up to four keywords, so its arguments are
 * read by fast_args (with max_version and copy: 0.41 us a call through
 * PyArg_ParseTupleAndKeywords, 0.16 this way, on the development VM). */
static PyObject *tensor_dlpack(TensorObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *const names[] = {str_stream, str_max_version, str_dl_device, str_copy};
  PyObject *v[4];
  if (fast_args("__dlpack__", args, nargs, kwnames, names, 4, 0, 0, v) < 0) return NULL;
  PyObject *r = dlpack_export(self, v[0] ? v[0] : Py_None, v[1] ? v[1] : Py_None, v[2] ? v[2] : Py_None,
                              v[3] ? v[3] : Py_None);
  args_release(v, 4);
  return r;
}

/* __dlpack__ with its keywords read (None where not given). */
static PyObject *dlpack_export(TensorObject *self, PyObject *stream, PyObject *max_version, PyObject *dl_device,
                               PyObject *copy) {
  const DLTensor *t = dl(self);
  DLDevice target = t->device;
  if (dl_device != Py_None) {
    if (device_from_object(dl_device, &target) < 0) return NULL;
    if (target.device_id < 0) {
      PyErr_SetString(PyExc_ValueError, "dl_device must name a concrete device (an id >= 0)");
      return NULL;
    }
  }
  /* The stream is the consumer's, on the device it will use the data on. */
  if (stream != Py_None) {
    if (!PyLong_Check(stream) || PyBool_Check(stream)) {
      PyErr_SetString(PyExc_TypeError, "stream must be None or an integer");
      return NULL;
    }
    int over; /* a handle beyond long long: over is 1, and it is not 0 */
    const long long sv = PyLong_AsLongLongAndOverflow(stream, &over);
    if (over < 0 || (over == 0 && sv < -1)) { /* the standard: an integer >= -1 */
      PyErr_SetString(PyExc_ValueError, "stream must be -1 (no synchronisation), a stream number or a handle");
      return NULL;
    }
    if (is_cpu_like(target.device_type)) {
      PyErr_SetString(PyExc_ValueError, "stream must be None for data in host memory");
      return NULL;
    }
    if ((target.device_type == kDLCUDA || target.device_type == kDLCUDAManaged) && over == 0 && sv == 0) {
      PyErr_SetString(PyExc_ValueError, "stream 0 is ambiguous for CUDA (DLPack): use 1 (legacy default) or 2 "
                                        "(per-thread default)");
      return NULL;
    }
    /* A Tensor's data is complete when the Tensor exists (conversions
     * synchronise before returning, imports wait for the producer's
     * default stream), so the consumer's stream has nothing to wait for. */
  }
  int versioned = 0;
  if (max_version != Py_None) {
    if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2) {
      PyErr_SetString(PyExc_TypeError, "max_version must be None or a (major, minor) tuple");
      return NULL;
    }
    for (int i = 0; i < 2; i++) {
      PyObject *part = PyTuple_GET_ITEM(max_version, i);
      if (!PyIndex_Check(part) || PyBool_Check(part)) {
        PyErr_Format(PyExc_TypeError, "max_version must be a (major, minor) tuple of integers, not one with %.100s",
                     Py_TYPE(part)->tp_name);
        return NULL;
      }
      if (i == 1) break; /* the minor: any integer, however large */
      PyObject *major = PyNumber_Index(part);
      if (major == NULL) return NULL;
      int over; /* a major beyond a long long allows 1.x too */
      const long long v = PyLong_AsLongLongAndOverflow(major, &over);
      Py_DECREF(major);
      if (v == -1 && PyErr_Occurred()) return NULL;
      versioned = over > 0 || (over == 0 && v >= 1);
    }
  }
  int want_copy = copy_arg(copy);
  if (want_copy == -2) return NULL;
  const int moves = target.device_type != t->device.device_type || target.device_id != t->device.device_id;
  if (!moves && want_copy != 1) return export_view(self, versioned);

  struct ab_device_info info;
  if (moves && (ab_device_info(target, &info) != AB_OK || target.device_type == AB_DEVICE_OPENCL_HOST)) {
    /* A dl_device this producer cannot export to: BufferError, as the
     * array API standard asks of __dlpack__; a failure of the move itself
     * below keeps its own error. */
    PyErr_Format(PyExc_BufferError, "cannot export to dl_device %s:%d: %s", ab_device_type_name(target.device_type),
                 (int)target.device_id,
                 target.device_type == AB_DEVICE_OPENCL_HOST ? "the library's own staging memory" : ab_last_error());
    return NULL;
  }
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = want_copy == 0 ? AB_COPY_NEVER : AB_COPY_ALWAYS;
  DLManagedTensorVersioned *m;
  ab_status st;
  Py_BEGIN_ALLOW_THREADS
  st = ab_convert_memory(t, target, &o, &m);
  Py_END_ALLOW_THREADS
  if (st != AB_OK) return raise_status(st);
  if (!(m->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
    /* Only a copy may be exported as owned: a view borrows self's memory
     * and must hold self (cannot happen with the checks above). */
    release(m);
    return export_view(self, versioned);
  }
  return export_owned(m, versioned);
}

static PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused) {
  (void)unused;
  const DLTensor *t = dl(self);
  return Py_BuildValue("(ii)", (int)t->device.device_type, (int)t->device.device_id);
}

/* NumPy's __array__, which np.asarray calls when the buffer protocol gives
 * nothing (a strided tensor, or one on a device; a compact host tensor
 * goes through the buffer, zero-copy): the data copied to compact host
 * memory through the library's routes, as a NumPy array. copy=False is
 * then ValueError, NumPy's protocol for "a copy is needed"; without this
 * method NumPy made a 0-d object array of the Tensor, silently. */
static PyObject *tensor_array(TensorObject *self, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"dtype", "copy", NULL};
  PyObject *dtype = Py_None, *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist, &dtype, &copy)) return NULL;
  const int c = copy_arg(copy);
  if (c == -2) return NULL;
  if (struct_format(dl(self)->dtype) == NULL) { /* NumPy's DLPack import refuses these too */
    char name[64];
    ab_dtype_name(dl(self)->dtype, name, sizeof name);
    return PyErr_Format(PyExc_TypeError, "NumPy has no %s arrays: convert first, e.g. "
                        "np.asarray(arraybridge.to_device(t, 'cpu', dtype='float32'))", name);
  }
  if (c == 0 && !host_compact(dl(self))) {
    PyErr_SetString(PyExc_ValueError, "a NumPy array of this tensor needs a copy (it is strided or on a device), "
                                      "and copy=False was given");
    return NULL;
  }
  const DLDevice cpu = {kDLCPU, 0};
  PyObject *host = import_and_convert((PyObject *)self, &cpu, c == 1 ? 1 : -1, NULL, NULL, LAYOUT_COMPACT);
  if (host == NULL) return NULL;
  PyObject *np = PyImport_ImportModule("numpy");
  PyObject *arr = np == NULL ? NULL : PyObject_CallMethod(np, "from_dlpack", "O", host);
  Py_XDECREF(np);
  Py_DECREF(host);
  if (arr != NULL && dtype != Py_None) {
    /* the array itself when it has that dtype already (the import above
     * copied where copy=True asked); copy=False refuses a cast */
    PyObject *a = Py_BuildValue("(O)", dtype), *kw = Py_BuildValue("{sO}", "copy", Py_False);
    PyObject *astype = PyObject_GetAttrString(arr, "astype");
    PyObject *cast = a != NULL && kw != NULL && astype != NULL ? PyObject_Call(astype, a, kw) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(kw);
    Py_XDECREF(astype);
    if (cast != NULL && cast != arr && c == 0) {
      Py_CLEAR(cast);
      PyErr_SetString(PyExc_ValueError, "a NumPy array of this tensor in that dtype needs a copy (a cast), and "
                                        "copy=False was given");
    }
    Py_DECREF(arr);
    arr = cast;
  }
  return arr;
}

static PyMethodDef tensor_methods[] = {
  {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_FASTCALL | METH_KEYWORDS,
   "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
   "Exports the tensor as a DLPack capsule: versioned (\"dltensor_versioned\") when max_version allows 1.x,\n"
   "legacy (\"dltensor\") otherwise. A view unless dl_device names another device or copy=True."},
  {"__array__", (PyCFunction)(void (*)(void))tensor_array, METH_VARARGS | METH_KEYWORDS,
   "__array__(dtype=None, copy=None)\n--\n\n"
   "NumPy's protocol: the tensor as a NumPy array; a strided or device tensor is copied to compact host memory\n"
   "(a compact host tensor reaches NumPy through the buffer protocol, without a copy)."},
  {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
   "__dlpack_device__()\n--\n\nThe (device_type, device_id) pair of DLPack."},
  {"__reduce_ex__", (PyCFunction)tensor_reduce_ex, METH_O,
   "__reduce_ex__(protocol)\n--\n\nPickling: the tensor's bytes (out of band with protocol 5 when it is compact\n"
   "host memory), dtype, shape, read-only flag and device; see docs/python.md."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
  {"shape", (getter)tensor_shape, NULL, "tuple of ints", NULL},
  {"strides", (getter)tensor_strides, NULL, "strides in elements (DLPack's unit), tuple of ints", NULL},
  {"dtype", (getter)tensor_dtype, NULL, "element type as a string, e.g. 'float32'", NULL},
  {"dldtype", (getter)tensor_dldtype, NULL, "DLPack's dtype as (code, bits, lanes), e.g. (2, 32, 1)", NULL},
  {"device", (getter)tensor_device, NULL, "device string, e.g. 'cuda:0'", NULL},
  {"nbytes", (getter)tensor_nbytes, NULL, "bytes of the elements", NULL},
  {"readonly", (getter)tensor_readonly, NULL, "whether the producer marked the data read-only", NULL},
  {"copied", (getter)tensor_copied, NULL,
   "whether the data was copied for this tensor (DLPack's IS_COPIED flag: by arraybridge, or by the producer it "
   "was imported from); False for a view of its source's memory",
   NULL},
  {"data_ptr", (getter)tensor_data_ptr, NULL, "address of the first element (data + byte_offset)", NULL},
  {"__cuda_array_interface__", (getter)tensor_cai, NULL,
   "the CUDA array interface (version 3) of a tensor in CUDA memory; AttributeError otherwise", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TensorType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "arraybridge.Tensor",
  .tp_doc = "A DLPack tensor owned by arraybridge. Made by from_dlpack and to_device; exchange it with\n"
            "NumPy, PyTorch, CuPy or JAX through __dlpack__.",
  .tp_basicsize = sizeof(TensorObject),
  /* No GC: a Tensor holds no Python references (its exports hold it). */
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_dealloc = (destructor)tensor_dealloc,
  .tp_repr = (reprfunc)tensor_repr,
  .tp_methods = tensor_methods,
  .tp_getset = tensor_getset,
  .tp_weaklistoffset = offsetof(TensorObject, weakrefs),
  .tp_as_buffer = &tensor_as_buffer,
};

/* ---- import ------------------------------------------------------------------- */

/* A capsule of this module's own, being consumed by it: the tensor its
 * wrapper holds, the wrapper freed, and a legacy view remade as a
 * versioned one (same memory, same owner reference; a legacy copy is
 * left wrapped). So a Tensor imported
 * from it is, to memory_owner, the view of its owner it is, and
 * `t = ab.from_dlpack(t.__dlpack__())` in a loop does not chain every
 * earlier Tensor (150000 of them crashed the C stack when the last was
 * freed). NULL when m is not a listed wrapper of ours, or (legacy) the
 * remade view cannot be allocated: then m is consumed as any producer's. */
static DLManagedTensorVersioned *unwrap_own(void *m, int versioned) {
  void (*const want)(void) =
      versioned ? (void (*)(void))guarded_deleter_versioned : (void (*)(void))guarded_deleter_legacy;
  void (*const has)(void) = versioned ? (void (*)(void))((DLManagedTensorVersioned *)m)->deleter
                                      : (void (*)(void))((DLManagedTensor *)m)->deleter;
  if (has != want) return NULL;
  struct guarded *g = versioned ? ((DLManagedTensorVersioned *)m)->manager_ctx : ((DLManagedTensor *)m)->manager_ctx;
  if ((void *)&g->mt != m) return NULL;
  DLManagedTensor *lm = g->inner;
  struct view_export *v = NULL;
  if (!versioned) {
    /* a legacy copy (export_owned) holds its own memory: no chain to cut */
    if (lm->deleter != legacy_view_export_deleter) return NULL;
    v = view_export_new(lm->dl_tensor.ndim);
    if (v == NULL) return NULL;
  }
  if (!take_wrapper(g, g->serial)) { /* not listed: deleted already, not ours to take */
    PyMem_RawFree(v);
    return NULL;
  }
  DLManagedTensorVersioned *inner = g->inner;
  PyMem_RawFree(g);
  if (versioned) return inner;
  struct legacy_view_export *lv = (struct legacy_view_export *)lm;
  v->mt.dl_tensor = describe_into(&lm->dl_tensor, v->dims);
  v->owner = lv->owner; /* the reference moves over */
  PyMem_RawFree(lv);
  return &v->mt;
}

/* 1 when cap is one of this module's capsules, named as unconsumed, whose
 * tensor a consumer deleted without renaming it (torch.from_dlpack of an
 * OpenCL tensor): its wrapper is then off the list and freed, and must not
 * be read. */
static int own_capsule_dead(PyObject *cap) {
  if (!PyCapsule_CheckExact(cap) || PyCapsule_GetDestructor(cap) != capsule_destructor ||
      !(PyCapsule_IsValid(cap, VERSIONED_NAME) || PyCapsule_IsValid(cap, LEGACY_NAME)))
    return 0;
  void *g = PyCapsule_GetPointer(cap, PyCapsule_GetName(cap));
  if (g != NULL && live_has(g, (size_t)(uintptr_t)PyCapsule_GetContext(cap))) return 0;
  PyErr_Clear();
  return 1;
}

/* The tensor of an unconsumed DLPack capsule, read in place: the capsule
 * still owns it. NULL (no exception) when cap is not one that
 * take_capsule would take; take_capsule then says why. */
static const DLTensor *capsule_peek(PyObject *cap) {
  if (!PyCapsule_CheckExact(cap) || own_capsule_dead(cap)) return NULL;
  if (PyCapsule_IsValid(cap, VERSIONED_NAME)) {
    const DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, VERSIONED_NAME);
    return m != NULL && m->version.major == 1 ? &m->dl_tensor : NULL;
  }
  if (PyCapsule_IsValid(cap, LEGACY_NAME)) {
    const DLManagedTensor *m = PyCapsule_GetPointer(cap, LEGACY_NAME);
    return m != NULL ? &m->dl_tensor : NULL;
  }
  return NULL;
}

/* ab_explain_convert of t without the GIL (a device may build its kernels
 * to answer). cap, when t is an unconsumed capsule's tensor read in place
 * (capsule_peek), has a busy name meanwhile (BUSY_*_NAME), so that no
 * other thread takes and deletes the tensor being read, and then the name
 * it had. -1 with an exception when cap cannot be renamed, else 0 and
 * *st. */
static int explain_unlocked(PyObject *cap, const DLTensor *t, DLDevice to, const ab_convert_opts *o, char *buf,
                            size_t len, ab_status *st) {
  const char *name = cap != NULL ? PyCapsule_GetName(cap) : NULL;
  if (cap != NULL &&
      PyCapsule_SetName(cap, PyCapsule_IsValid(cap, VERSIONED_NAME) ? BUSY_VERSIONED_NAME : BUSY_LEGACY_NAME) < 0)
    return -1;
  Py_BEGIN_ALLOW_THREADS
  *st = ab_explain_convert(t, to, o, buf, len);
  Py_END_ALLOW_THREADS
  if (cap != NULL && PyCapsule_SetName(cap, name) < 0) return -1;
  return 0;
}

/* Takes the managed tensor out of a producer's capsule (renaming it, so
 * that the capsule no longer owns it). */
static int take_capsule(PyObject *cap, DLManagedTensorVersioned **out) {
  if (own_capsule_dead(cap)) {
    PyErr_SetString(PyExc_BufferError, "this DLPack capsule was already consumed (its tensor was deleted by a "
                                       "consumer that left the capsule's name as it was)");
    return -1;
  }
  if (PyCapsule_IsValid(cap, VERSIONED_NAME)) {
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, VERSIONED_NAME);
    if (m == NULL) return -1;
    if (m->version.major != 1) {
      /* Not ours to read: leave it to the capsule, which deletes it. */
      PyErr_Format(PyExc_BufferError, "the producer's DLPack version %u.%u is not 1.x", m->version.major,
                   m->version.minor);
      return -1;
    }
    if (PyCapsule_SetName(cap, USED_VERSIONED_NAME) < 0) return -1;
    DLManagedTensorVersioned *own = unwrap_own(m, 1);
    *out = own != NULL ? own : m;
    return 0;
  }
  if (PyCapsule_IsValid(cap, LEGACY_NAME)) {
    DLManagedTensor *m = PyCapsule_GetPointer(cap, LEGACY_NAME);
    if (m == NULL) return -1;
    /* Consumed first: from here on m is ours, whatever happens. */
    if (PyCapsule_SetName(cap, USED_LEGACY_NAME) < 0) return -1;
    DLManagedTensorVersioned *v = unwrap_own(m, 0);
    if (v != NULL) {
      *out = v;
      return 0;
    }
    ab_status st = ab_from_legacy(m, &v);
    if (st != AB_OK) { /* still ours, not wrapped: delete it */
      if (m->deleter != NULL) m->deleter(m);
      raise_status(st);
      return -1;
    }
    *out = v;
    return 0;
  }
  if (PyCapsule_CheckExact(cap)) {
    const char *name = PyCapsule_GetName(cap);
    if (name != NULL && (strcmp(name, BUSY_VERSIONED_NAME) == 0 || strcmp(name, BUSY_LEGACY_NAME) == 0))
      PyErr_SetString(PyExc_BufferError, "this DLPack capsule is being read by an arraybridge call in progress "
                                         "(explain_route, to_device planning, or convert_into: in another "
                                         "thread, or one whose Python code is running now); it is not "
                                         "consumed, try again once that call returns");
    else
      PyErr_Format(PyExc_BufferError, "capsule \"%s\" is not an unconsumed DLPack capsule (already consumed?)",
                   name ? name : "(null)");
  } else {
    PyErr_Format(PyExc_TypeError, "__dlpack__ returned %.100s, not a capsule", Py_TYPE(cap)->tp_name);
  }
  return -1;
}

/* Calls x.__dlpack__: first asking for a versioned capsule, then, for
 * producers that do not know max_version (TypeError), the legacy way.
 * no_copy: also pass copy=False, so that a producer that cannot export
 * without copying refuses (BufferError) as the array API standard asks;
 * a producer that does not know the keyword (TypeError) is asked again
 * without it, and the consumer checks its IS_COPIED flag instead.
 * (copy=True is not passed on: a producer that copies and answers with a
 * legacy capsule, as JAX does, could not say so, and the data would be
 * copied twice.) On CUDA, stream=1 asks the producer to make its data
 * ready for the legacy default stream, the one the library uses by
 * default (DLPack). */
static PyObject *call_dlpack(PyObject *x, DLDevice producer_dev, int no_copy) {
  PyObject *meth = PyObject_GetAttr(x, str_dlpack);
  if (meth == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL; /* KeyboardInterrupt & co go on */
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%.100s does not support DLPack (no __dlpack__)", Py_TYPE(x)->tp_name);
    return NULL;
  }
  const int stream = producer_dev.device_type == kDLCUDA || producer_dev.device_type == kDLCUDAManaged;
  /* The keywords' values and names, max_version first so that each retry
   * below drops a name from one end: copy (last), then max_version (first). */
  PyObject *vals[3], *names[3];
  int first = 0, n = 0;
  vals[n] = our_max_version, names[n++] = str_max_version;
  if (stream) vals[n] = int_one, names[n++] = str_stream;
  if (no_copy) vals[n] = Py_False, names[n++] = str_copy;
  PyObject *cap = NULL;
  for (int attempt = 0; attempt < 3; attempt++) {
    PyObject *kwnames = NULL; /* none: a plain call */
    if (n > first && (kwnames = PyTuple_New(n - first)) == NULL) break;
    for (int i = first; i < n; i++) {
      Py_INCREF(names[i]);
      PyTuple_SET_ITEM(kwnames, i - first, names[i]);
    }
    cap = PyObject_Vectorcall(meth, vals + first, 0, kwnames);
    Py_XDECREF(kwnames);
    if (cap != NULL || !PyErr_ExceptionMatches(PyExc_TypeError)) break;
    if (no_copy && names[n - 1] == str_copy) {
      PyErr_Clear(); /* DLPack 1.0 without the 2023.12 keywords */
      n--;
    } else if (first == 0) {
      PyErr_Clear(); /* a producer from before DLPack 1.0 */
      first = 1;
    } else {
      break;
    }
  }
  Py_DECREF(meth);
  return cap;
}

static int producer_device(PyObject *x, DLDevice *out) {
  out->device_type = kDLCPU;
  out->device_id = 0;
  PyObject *meth = PyObject_GetAttr(x, str_dlpack_device);
  if (meth == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear(); /* optional: the capsule says where the data is */
    return 0;
  }
  PyObject *r = PyObject_CallNoArgs(meth);
  Py_DECREF(meth);
  if (r == NULL) {
    /* A deleted JAX array: its __dlpack_device__ fails on its missing
     * buffers with words of its own ("object of type 'NoneType' has no
     * len()"); its is_deleted() says what happened. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *gone = PyObject_CallMethod(x, "is_deleted", NULL);
    const int deleted = gone != NULL && PyObject_IsTrue(gone) == 1;
    Py_XDECREF(gone);
    if (!deleted) {
      PyErr_Clear();
      PyErr_Restore(type, value, tb);
      return -1;
    }
    PyErr_Clear();
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_Format(PyExc_ValueError, "the %.100s has been deleted (array.delete(), or donated to a jitted function): "
                 "it holds no data", Py_TYPE(x)->tp_name);
    PyObject *t2, *v2, *tb2; /* the framework's own error as the cause */
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2 != NULL && value != NULL) PyException_SetCause(v2, value); /* steals value */
    else Py_XDECREF(value);
    PyErr_Restore(t2, v2, tb2);
    return -1;
  }
  int rc = device_from_object(r, out);
  Py_DECREF(r);
  *out = memory_device(*out);
  return rc;
}

/* The element options of to_device and explain_route, as given
 * (borrowed; Py_None when absent). */
struct map_args {
  PyObject *permute, *scale, *offset, *channel_axis, *channel_scale, *channel_offset;
};

/* The element options, read into C before any tensor is imported:
 * reading them may run the caller's code (__index__, __float__, a
 * sequence's __iter__), which could otherwise free or resize a tensor
 * whose data pointer is already held. map_apply then checks them against
 * the imported tensor without running Python. PyMem; map_free releases. */
struct map_buf {
  int given, per_tensor, per_channel;
  Py_ssize_t nperm;             /* -1: no permute */
  long perm_raw[AB_MAX_NDIM];   /* LONG_MIN: beyond a long */
  int32_t perm[AB_MAX_NDIM];    /* normalised by map_apply */
  long channel_axis_raw;
  double scale, offset;
  double *cs, *co;              /* NULL: not given */
  Py_ssize_t ncs, nco;
};

static void map_free(struct map_buf *b) {
  PyMem_Free(b->cs);
  PyMem_Free(b->co);
  b->cs = b->co = NULL;
}

/* An axis as given (LONG_MIN when it does not fit a long: out of range
 * for any tensor); -1 with an exception when it is not an integer. */
static int axis_raw(PyObject *o, const char *rule, long *out) {
  if (refuse_bool(o, rule) < 0) return -1;
  long a = PyLong_AsLong(o);
  if (a == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    a = LONG_MIN;
  }
  *out = a;
  return 0;
}

/* An axis of an ndim-dimensional tensor, negative ones counted from the
 * end as NumPy does; -1 with ValueError when out of range. */
static int axis_of(long a, int32_t ndim, const char *what, int32_t *out) {
  if (a == LONG_MIN) {
    PyErr_Format(PyExc_ValueError, "%s is out of range for a %d-dimensional tensor", what, (int)ndim);
    return -1;
  }
  if (a < -(long)ndim || a >= (long)ndim) {
    PyErr_Format(PyExc_ValueError, "%s %ld is out of range for a %d-dimensional tensor", what, a, (int)ndim);
    return -1;
  }
  *out = (int32_t)(a < 0 ? a + ndim : a);
  return 0;
}

/* A private tuple of o's items: converting an item may run the caller's
 * code (__float__, __index__), which must not be able to change what is
 * being read (a list given as it is could shrink under the loop). With
 * most >= 0, of its first most + 1 items only. */
static PyObject *items_of(PyObject *o, const char *what, Py_ssize_t most) {
  PyObject *it = PySequence_Check(o) ? PyObject_GetIter(o) : NULL; /* a 0-d array has no iterator */
  if (it == NULL) {
    if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s must be a sequence", what);
    }
    return NULL;
  }
  /* With a bound, most + 1 items at most: more is refused by that length,
   * and a sequence may be as long as range(10**9), or endless. An error
   * while iterating is the sequence's own, passed on as it is. */
  PyObject *seq = PyList_New(0), *item;
  while (seq != NULL && (most < 0 || PyList_GET_SIZE(seq) <= most) && (item = PyIter_Next(it)) != NULL) {
    const int rc = PyList_Append(seq, item);
    Py_DECREF(item);
    if (rc < 0) break;
  }
  Py_DECREF(it);
  if (seq == NULL || PyErr_Occurred()) {
    Py_XDECREF(seq);
    return NULL;
  }
  Py_SETREF(seq, PyList_AsTuple(seq));
  return seq;
}

/* The floats of a sequence of numbers into PyMem (*n of them). */
static int floats_of(PyObject *o, const char *what, double **out, Py_ssize_t *n) {
  PyObject *seq = items_of(o, what, -1);
  if (seq == NULL) return -1;
  const Py_ssize_t len = PyTuple_GET_SIZE(seq);
  double *v = PyMem_Malloc(len > 0 ? (size_t)len * sizeof *v : 1);
  if (v == NULL) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    v[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(seq, i));
    if (v[i] == -1.0 && PyErr_Occurred()) {
      PyMem_Free(v);
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  *out = v;
  *n = len;
  return 0;
}

/* Reads m (m NULL: no options) into b, running whatever Python the values
 * need: permute a sequence of axes; scale/offset a per-tensor map (1 and
 * 0 when one is missing); channel_axis with channel_scale and/or
 * channel_offset a per-channel map. -1 with an exception set (b then holds
 * nothing to free). */
static int map_parse(const struct map_args *m, struct map_buf *b) {
  memset(b, 0, sizeof *b);
  b->nperm = -1;
  if (m == NULL || !(m->permute != Py_None || m->scale != Py_None || m->offset != Py_None ||
                     m->channel_axis != Py_None || m->channel_scale != Py_None || m->channel_offset != Py_None))
    return 0;
  b->given = 1;
  if (m->permute != Py_None) {
    PyObject *seq = items_of(m->permute, "permute", AB_MAX_NDIM); /* more: map_apply refuses the length */
    if (seq == NULL) return -1;
    b->nperm = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < b->nperm && i < AB_MAX_NDIM; i++)
      if (axis_raw(PyTuple_GET_ITEM(seq, i), "a permute axis must be an int", &b->perm_raw[i]) < 0) {
        Py_DECREF(seq);
        return -1;
      }
    Py_DECREF(seq);
  }
  b->per_tensor = m->scale != Py_None || m->offset != Py_None;
  b->per_channel = m->channel_scale != Py_None || m->channel_offset != Py_None;
  if (b->per_tensor && b->per_channel) {
    PyErr_SetString(PyExc_ValueError, "give scale/offset (one map) or channel_scale/channel_offset (per channel), "
                                      "not both");
    return -1;
  }
  if (b->per_channel != (m->channel_axis != Py_None)) {
    PyErr_SetString(PyExc_ValueError, b->per_channel ? "channel_scale/channel_offset need channel_axis"
                                                     : "channel_axis needs channel_scale and/or channel_offset");
    return -1;
  }
  if (b->per_tensor) {
    b->scale = m->scale == Py_None ? 1.0 : PyFloat_AsDouble(m->scale);
    if (b->scale == -1.0 && PyErr_Occurred()) return -1;
    b->offset = m->offset == Py_None ? 0.0 : PyFloat_AsDouble(m->offset);
    if (b->offset == -1.0 && PyErr_Occurred()) return -1;
  }
  if (b->per_channel) {
    if (axis_raw(m->channel_axis, "channel_axis must be an int", &b->channel_axis_raw) < 0) return -1;
    if ((m->channel_scale != Py_None && floats_of(m->channel_scale, "channel_scale", &b->cs, &b->ncs) < 0) ||
        (m->channel_offset != Py_None && floats_of(m->channel_offset, "channel_offset", &b->co, &b->nco) < 0)) {
      map_free(b);
      return -1;
    }
  }
  return 0;
}

/* The number of values per channel must match the channel axis. */
static int channel_count_ok(const double *v, Py_ssize_t len, int64_t n, const char *what) {
  if (v == NULL || (int64_t)len == n) return 0;
  PyErr_Format(PyExc_ValueError, "%s has %zd values; the channel axis has %lld", what, len, (long long)n);
  return -1;
}

/* Sets o's axis order and affine map from b, checked against the tensor t
 * (no Python runs). -1 with an exception set; b holds what o points to
 * until map_free. */
static int map_apply(struct map_buf *b, const DLTensor *t, ab_convert_opts *o) {
  if (!b->given) return 0;
  if (b->nperm >= 0) {
    if (b->nperm != t->ndim) {
      if (b->nperm > AB_MAX_NDIM) /* items_of read no more */
        PyErr_Format(PyExc_ValueError, "permute has more than %d axes; the tensor has %d", AB_MAX_NDIM,
                     (int)t->ndim);
      else
        PyErr_Format(PyExc_ValueError, "permute has %zd axes; the tensor has %d", b->nperm, (int)t->ndim);
      return -1;
    }
    for (Py_ssize_t i = 0; i < b->nperm; i++)
      if (axis_of(b->perm_raw[i], t->ndim, "permute axis", &b->perm[i]) < 0) return -1;
    o->permute = b->perm; /* repeated axes: the library's ValueError */
  }
  if (b->per_tensor) {
    o->flags |= AB_CONVERT_AFFINE;
    o->scale = b->scale;
    o->offset = b->offset;
  }
  if (b->per_channel) {
    if (axis_of(b->channel_axis_raw, t->ndim, "channel_axis", &o->channel_axis) < 0) return -1;
    const int64_t n = t->shape[o->channel_axis];
    if (channel_count_ok(b->cs, b->ncs, n, "channel_scale") < 0 ||
        channel_count_ok(b->co, b->nco, n, "channel_offset") < 0)
      return -1;
    o->flags |= AB_CONVERT_PER_CHANNEL;
    o->channel_scale = b->cs;
    o->channel_offset = b->co;
  }
  return 0;
}

/* TensorFlow's DLPack export aborts the whole process (a failed CHECK)
 * when asked for a tensor of strings, resource handles or variants, so
 * such a tensor is refused before it is asked. Found by the type's name
 * (no import of TensorFlow; a free test for every other producer).
 * 0, or -1 with TypeError set. */
static int refuse_tf_without_dlpack(PyObject *x) {
  static const char *const kinds[] = {"string", "resource", "variant"};
  if (strncmp(Py_TYPE(x)->tp_name, "tensorflow.", 11) != 0) return 0;
  PyObject *dt = PyObject_GetAttrString(x, "dtype");
  PyObject *name = dt == NULL ? NULL : PyObject_GetAttrString(dt, "name");
  Py_XDECREF(dt);
  const char *s = name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) { /* MemoryError, KeyboardInterrupt: they stand */
      Py_XDECREF(name);
      return -1;
    }
    PyErr_Clear(); /* no dtype or no name: TensorFlow's export decides */
  }
  int bad = 0;
  for (size_t k = 0; s != NULL && k < sizeof kinds / sizeof *kinds; k++) bad |= strcmp(s, kinds[k]) == 0;
  if (bad)
    PyErr_Format(PyExc_TypeError, "a TensorFlow tensor of %s has no DLPack form (TensorFlow's export would abort the "
                                  "process); only tensors of numbers and bool convert", s);
  Py_XDECREF(name);
  return bad ? -1 : 0;
}

/* Whether x is a torch tensor: its type derives from torch's C tensor
 * base ("torch._C.TensorBase"; "torch._C._TensorBase" before torch 2.3).
 * Asks no Python. */
static int is_torch_tensor(PyObject *x) {
  PyObject *mro = Py_TYPE(x)->tp_mro;
  if (mro == NULL || !PyTuple_Check(mro)) return 0;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(mro); k++) {
    const char *n = ((PyTypeObject *)PyTuple_GET_ITEM(mro, k))->tp_name;
    if (strcmp(n, "torch._C.TensorBase") == 0 || strcmp(n, "torch._C._TensorBase") == 0) return 1;
  }
  return 0;
}

/* Calls x.name() for a bool; -1 with an exception. */
static int call_bool(PyObject *x, const char *name) {
  PyObject *r = PyObject_CallMethod(x, name, NULL);
  if (r == NULL) return -1;
  int b = PyObject_IsTrue(r);
  Py_DECREF(r);
  return b;
}

/* x, or where x is a torch tensor with its conjugate or negative bit set
 * (z.conj(), z.conj().imag: lazy views), a copy with the bits resolved:
 * DLPack has no such bits, and torch exports a negated view's stored
 * numbers, of the wrong sign. A new reference; *copied says which. NULL
 * with an exception. */
static PyObject *torch_resolved(PyObject *x, int *copied) {
  *copied = 0;
  if (!is_torch_tensor(x)) return Py_NewRef(x);
  int conj = call_bool(x, "is_conj"), neg = conj < 0 ? -1 : call_bool(x, "is_neg");
  if (conj < 0 || neg < 0) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
    PyErr_Clear(); /* a torch without the bits */
    return Py_NewRef(x);
  }
  PyObject *y = Py_NewRef(x);
  if (conj) Py_SETREF(y, PyObject_CallMethod(y, "resolve_conj", NULL));
  if (y != NULL && neg) Py_SETREF(y, PyObject_CallMethod(y, "resolve_neg", NULL));
  *copied = y != NULL && (conj || neg);
  return y;
}

/* x's data as a managed tensor for the caller to release: a view export
 * of a Tensor, else the producer's capsule taken. Validated; a device
 * producer's data is complete when this returns. -1 with an exception. */
static int import_tensor(PyObject *x, int no_copy, const DLDevice *target, DLManagedTensorVersioned **out) {
  DLManagedTensorVersioned *mt;
  if (PyObject_TypeCheck(x, &TensorType)) {
    /* Our own tensor: a view of it (holding a reference to x), taken
     * directly: no capsule, so no consumer to guard against. */
    if ((mt = view_of((TensorObject *)x)) == NULL) return -1;
  } else if (PyCapsule_CheckExact(x)) {
    /* A producer's capsule itself (torch.utils.dlpack.to_dlpack's, say):
     * it carries no stream promise, so device data must be complete. */
    if (take_capsule(x, &mt) < 0) return -1;
  } else {
    DLDevice pdev;
    int resolved;
    if (refuse_tf_without_dlpack(x) < 0 || producer_device(x, &pdev) < 0) return -1;
    /* copy=False is the producer's to honour where its export is to be the
     * result: no target, or the producer's own device. */
    no_copy = no_copy && (target == NULL || (target->device_type == pdev.device_type &&
                                             target->device_id == pdev.device_id));
    PyObject *y = torch_resolved(x, &resolved);
    if (y == NULL) return -1;
    if (resolved && no_copy) {
      Py_DECREF(y);
      PyErr_SetString(PyExc_BufferError, "copy=False, but the torch tensor is a lazily conjugated or negated view: "
                                         "its values need a copy (resolve_conj(), resolve_neg())");
      return -1;
    }
    PyObject *cap = call_dlpack(y, pdev, no_copy);
    Py_DECREF(y);
    if (cap == NULL) return -1;
    int rc = take_capsule(cap, &mt);
    if (rc < 0) { /* an unconsumed capsule's destructor deletes the tensor: */
      PyObject *type, *value, *tb; /* one written in Python must not see (or clear) our error */
      PyErr_Fetch(&type, &value, &tb);
      Py_DECREF(cap);
      PyErr_Restore(type, value, tb);
      return -1;
    }
    Py_DECREF(cap);
    if (resolved) mt->flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
    if (no_copy && (mt->flags & DLPACK_FLAG_BITMASK_IS_COPIED)) {
      /* asked for copy=False (or did not know the keyword) and copied */
      release(mt);
      PyErr_Format(PyExc_BufferError, "copy=False, but the %.100s producer exported a copy", Py_TYPE(x)->tp_name);
      return -1;
    }
  }
  ab_status st = ab_tensor_validate(&mt->dl_tensor);
  if (st != AB_OK) {
    raise_and_release(st, mt);
    return -1;
  }
  /* Host memory is cpu:0 from here on, or a Tensor would say cpu:1 and
   * ask for cpu:1 (no device) where it is its own target. The tensor is
   * ours now; deleters read no device. */
  mt->dl_tensor.device = memory_device(mt->dl_tensor.device);
  /* A device producer's data must be complete before anything reads it
   * from another stream or the host: the producer ordered it before the
   * default stream (stream=1, see call_dlpack); wait for that stream. */
  if (mt->dl_tensor.device.device_type != kDLCPU && mt->dl_tensor.device.device_type != kDLOpenCL) {
    Py_BEGIN_ALLOW_THREADS
    st = ab_synchronize(mt->dl_tensor.device, NULL);
    Py_END_ALLOW_THREADS
    if (st != AB_OK) {
      raise_and_release(st, mt);
      return -1;
    }
  }
  *out = mt;
  return 0;
}

/* The options converting t as import_and_convert was asked (see there),
 * into o; b holds what o points to. 0: t needs no conversion (the import
 * is the result), 1: convert with o, -1 with an exception set. No Python
 * runs. */
static int convert_opts(const DLTensor *t, const DLDevice *target, int copy, const DLDataType *dtype,
                        struct map_buf *b, enum layout layout, ab_convert_opts *o) {
  const int strides_ok = layout_ok(t, layout);
  const int moves = target != NULL && (target->device_type != t->device.device_type ||
                                       target->device_id != t->device.device_id);
  const int recast = dtype != NULL && (dtype->code != t->dtype.code || dtype->bits != t->dtype.bits ||
                                       dtype->lanes != t->dtype.lanes);
  if (!moves && !recast && !b->given && copy != 1 && strides_ok) return 0;
  *o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
  o->copy = copy == 1 ? AB_COPY_ALWAYS : copy == 0 ? AB_COPY_NEVER : AB_COPY_IF_NEEDED;
  /* A strided tensor on its own device may stay a view, unless the layout
   * asked for rules its strides out (a compact copy then). */
  o->flags = strides_ok ? AB_CONVERT_ALLOW_STRIDED_VIEW : 0;
  if (dtype != NULL) o->dtype = *dtype;
  return map_apply(b, t, o) < 0 ? -1 : 1;
}

/* The core of from_dlpack and to_device: import x, then move or copy
 * it as asked. target NULL = stay where it is. copy: -1 if needed, 0 never,
 * 1 always. dtype and map (NULL: none) convert the elements on the way.
 * A capsule given as x is planned before it is taken: what the core
 * refuses (a malformed tensor, copy=False where a copy is needed, options
 * that do not fit) leaves it unconsumed, for the caller to use again. */
static PyObject *import_and_convert(PyObject *x, const DLDevice *target, int copy, const DLDataType *dtype,
                                    const struct map_args *map, enum layout layout) {
  struct map_buf mb;
  if (map_parse(map, &mb) < 0) return NULL; /* before the import: it may run Python */
  ab_convert_opts o;
  ab_status st;
  const DLTensor *peek = capsule_peek(x);
  if (peek != NULL) {
    int r;
    if ((st = ab_tensor_validate(peek)) != AB_OK) {
      map_free(&mb);
      return raise_status(st);
    }
    if ((r = convert_opts(peek, target, copy, dtype, &mb, layout, &o)) < 0) {
      map_free(&mb);
      return NULL;
    }
    if (r == 1) {
      /* named as it was again after, for take_capsule below or the caller */
      /* no target: its own device, as import_tensor will set it */
      if (explain_unlocked(x, peek, target ? *target : memory_device(peek->device), &o, NULL, 0, &st) < 0 ||
          st != AB_OK) {
        map_free(&mb);
        return PyErr_Occurred() ? NULL : raise_status(st);
      }
    }
  }
  /* A producer asked for copy=False refuses what it cannot export without
   * copying: the standard's from_dlpack(copy=False). With a cast or map
   * too, as copy=False refuses any that is not a view (import_tensor asks
   * only where the target is the producer's own device). */
  const int no_copy = copy == 0;
  DLManagedTensorVersioned *mt;
  if (import_tensor(x, no_copy, target, &mt) < 0) {
    map_free(&mb);
    return NULL;
  }
  const DLTensor *t = &mt->dl_tensor;
  /* A copy the producer made for this import (or a capsule of one) is
   * the caller's alone: copy=True needs no second copy of it. */
  if (copy == 1 && (mt->flags & DLPACK_FLAG_BITMASK_IS_COPIED) && !(mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY))
    copy = -1;
  const int r = convert_opts(t, target, copy, dtype, &mb, layout, &o);
  if (r <= 0) {
    map_free(&mb);
    if (r == 0) return tensor_new_owning(mt, NULL);
    release_keeping_error(mt);
    return NULL;
  }
  DLManagedTensorVersioned *out;
  Py_BEGIN_ALLOW_THREADS
  st = ab_convert_memory(t, target ? *target : t->device, &o, &out);
  Py_END_ALLOW_THREADS
  map_free(&mb);
  if (st != AB_OK) return raise_and_release(st, mt);
  if (out->flags & DLPACK_FLAG_BITMASK_IS_COPIED) {
    release(mt);
    return tensor_new_owning(out, NULL);
  }
  /* A view: it borrows mt's memory, so the Tensor keeps mt too. */
  out->flags |= mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY;
  return tensor_new_owning(out, mt);
}

static PyObject *py_from_dlpack(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"", "device", "copy", "readonly", NULL}; /* x is positional-only, as documented */
  PyObject *x, *device = Py_None, *copy = Py_None;
  int readonly = 0;
  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OOp:from_dlpack", kwlist, &x, &device, &copy, &readonly))
    return NULL;
  DLDevice target;
  if (device != Py_None && device_from_object(device, &target) < 0) return NULL;
  int c = copy_arg(copy);
  if (c == -2) return NULL;
  PyObject *r = import_and_convert(x, device == Py_None ? NULL : &target, c, NULL, NULL, LAYOUT_ANY);
  /* A new Tensor of its own managed tensor: marking it read-only touches
   * nothing the producer still holds. (Not by default for JAX and
   * TensorFlow arrays, though they are immutable: a read-only Tensor goes
   * only to consumers that ask for versioned capsules, and they ask for
   * legacy ones, so jnp.from_dlpack(from_dlpack(x)) would fail.) */
  if (r != NULL && readonly) ((TensorObject *)r)->mt->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  return r;
}

/* to_device's and explain_route's gpu_id (None: target's own id) into
 * target. -1 with an exception. */
static int gpu_id_arg(PyObject *gpu_id, DLDevice *target) {
  if (gpu_id == Py_None) return 0;
  if (refuse_bool(gpu_id, "gpu_id must be an int or None") < 0) return -1;
  long id = PyLong_AsLong(gpu_id);
  if (id == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    id = LONG_MAX; /* out of range: the message below */
  }
  if (id < AB_DEVICE_AUTO || id > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "gpu_id %S is out of range (0 to 2147483647, or -1 for the device with most free memory)",
                 gpu_id);
    return -1;
  }
  target->device_id = (int32_t)id;
  return 0;
}

/* to_device's arguments, which explain_route takes alike: x, the target
 * (with gpu_id's id), dtype (NULL when not given), copy (-1, 0, 1), the
 * element maps and layout. move_args_parse fills it (fname: the function's
 * name, for its messages); -1 with an exception. */
struct move_args {
  PyObject *held[MOVE_ARGS]; /* the arguments as given, owned (NULL: not given); move_args_release */
  PyObject *x;
  DLDevice target;
  DLDataType dtype_buf;
  const DLDataType *dtype;
  int copy;
  struct map_args m;
  enum layout layout;
};

static void move_args_release(struct move_args *a) { args_release(a->held, MOVE_ARGS); }

static int move_args_read(struct move_args *a) {
  PyObject *v[MOVE_ARGS];
  for (int i = 0; i < MOVE_ARGS; i++) v[i] = a->held[i] != NULL ? a->held[i] : Py_None;
  a->x = v[MOVE_X];
  a->m = (struct map_args){v[MOVE_PERMUTE],      v[MOVE_SCALE],         v[MOVE_OFFSET],
                           v[MOVE_CHANNEL_AXIS], v[MOVE_CHANNEL_SCALE], v[MOVE_CHANNEL_OFFSET]};
  if (device_from_object(v[MOVE_TARGET], &a->target) < 0 || gpu_id_arg(v[MOVE_GPU_ID], &a->target) < 0) return -1;
  a->dtype = v[MOVE_DTYPE] == Py_None ? NULL : &a->dtype_buf;
  if (a->dtype != NULL && dtype_from_object(v[MOVE_DTYPE], &a->dtype_buf) < 0) return -1;
  if ((a->copy = copy_arg(v[MOVE_COPY])) == -2) return -1;
  return layout_arg(v[MOVE_LAYOUT], &a->layout);
}

/* 0 with a's arguments held until move_args_release; -1 with an exception
 * and nothing held. */
static int move_args_parse(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                           struct move_args *a) {
  if (fast_args(fname, args, nargs, kwnames, move_names, MOVE_ARGS, 3, 2, a->held) < 0) return -1;
  if (move_args_read(a) < 0) {
    move_args_release(a);
    return -1;
  }
  return 0;
}

static PyObject *py_to_device(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  struct move_args a;
  (void)mod;
  if (move_args_parse("to_device", args, nargs, kwnames, &a) < 0) return NULL;
  PyObject *r = import_and_convert(a.x, &a.target, a.copy, a.dtype, &a.m, a.layout);
  move_args_release(&a);
  return r;
}

/* Whether o is an array of a framework whose arrays are immutable (JAX,
 * TensorFlow): their DLPack export does not say read-only, but writing
 * into one changes a value the framework may share or have cached.
 * 1 with TypeError set, else 0. */
static int immutable_array(PyObject *o) {
  static const char *const frameworks[] = {"jax", "jaxlib", "tensorflow"};
  static const char *const names[] = {"JAX", "JAX", "TensorFlow"};
  PyObject *mod = PyObject_GetAttrString((PyObject *)Py_TYPE(o), "__module__");
  if (mod == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return 1; /* that error stands */
    PyErr_Clear();
    return 0;
  }
  const char *name = PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : NULL;
  if (name == NULL) PyErr_Clear(); /* not a str: no framework's */
  int hit = -1;
  for (size_t k = 0; name != NULL && k < sizeof frameworks / sizeof *frameworks && hit < 0; k++) {
    const size_t n = strlen(frameworks[k]);
    if (strncmp(name, frameworks[k], n) == 0 && (name[n] == '\0' || name[n] == '.')) hit = (int)k;
  }
  Py_DECREF(mod); /* name is not read past here */
  if (hit >= 0)
    PyErr_Format(PyExc_TypeError, "out is a %s array, which is immutable: convert_into writes only into mutable "
                                  "arrays (NumPy, PyTorch, CuPy, pyclesperanto, arraybridge Tensors)",
                 names[hit]);
  return hit >= 0;
}

/* One array of convert_into. A Tensor or a producer's array is imported
 * (mt, released after). An unconsumed capsule is read in place (cap: the
 * capsule still owns the tensor), so that a refusal leaves it the
 * caller's, and it is taken and its tensor deleted only once the
 * conversion has succeeded (into_done). */
struct into_arg {
  PyObject *cap;                /* the capsule read in place, else NULL */
  const char *name;             /* its own name, while it has the busy one */
  DLManagedTensorVersioned *mt; /* else the import, owned */
  const DLTensor *t;
  uint64_t flags;
};

/* o imported by import_tensor (a capsule taken). -1 with an exception. */
static int into_take(PyObject *o, struct into_arg *a) {
  if (import_tensor(o, 0, NULL, &a->mt) < 0) return -1;
  a->t = &a->mt->dl_tensor;
  a->flags = a->mt->flags;
  return 0;
}

/* o imported, unless it is a capsule (into_read's). This runs Python (a
 * producer's __dlpack__), which could take and delete a capsule's tensor,
 * so both imports come before either capsule is read. -1 with an
 * exception. */
static int into_import(PyObject *o, struct into_arg *a) { return PyCapsule_CheckExact(o) ? 0 : into_take(o, a); }

/* A capsule o read in place and given the busy name (see explain_unlocked)
 * at once, with no Python in between, so that nothing takes it while it
 * is read. One that cannot be read in place (consumed, busy in another
 * call, of another DLPack major) goes to import_tensor, which says why it
 * cannot be taken either. -1 with an exception. */
static int into_read(PyObject *o, struct into_arg *a) {
  if (!PyCapsule_CheckExact(o)) return 0;
  const DLTensor *peek = capsule_peek(o);
  if (peek == NULL) return into_take(o, a);
  ab_status st = ab_tensor_validate(peek);
  if (st != AB_OK) {
    raise_status(st);
    return -1;
  }
  const int versioned = PyCapsule_IsValid(o, VERSIONED_NAME);
  if (versioned) a->flags = ((const DLManagedTensorVersioned *)PyCapsule_GetPointer(o, VERSIONED_NAME))->flags;
  const char *name = PyCapsule_GetName(o);
  if (PyCapsule_SetName(o, versioned ? BUSY_VERSIONED_NAME : BUSY_LEGACY_NAME) < 0) return -1;
  a->cap = o;
  a->name = name;
  a->t = peek;
  return 0;
}

/* The capsule's name as it was, then, where ok, the capsule taken and its
 * tensor deleted (the conversion has read or written it); an import is
 * released either way. Keeps a pending exception. */
static void into_done(struct into_arg *a, int ok) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (a->name != NULL && PyCapsule_SetName(a->cap, a->name) < 0) PyErr_Clear(); /* a capsule: cannot fail */
  if (a->cap != NULL && ok) {
    if (PyCapsule_IsValid(a->cap, VERSIONED_NAME)) {
      DLManagedTensorVersioned *m = PyCapsule_GetPointer(a->cap, VERSIONED_NAME);
      if (PyCapsule_SetName(a->cap, USED_VERSIONED_NAME) == 0 && m->deleter != NULL) m->deleter(m);
    } else if (PyCapsule_IsValid(a->cap, LEGACY_NAME)) {
      DLManagedTensor *m = PyCapsule_GetPointer(a->cap, LEGACY_NAME);
      if (PyCapsule_SetName(a->cap, USED_LEGACY_NAME) == 0 && m->deleter != NULL) m->deleter(m);
    }
  }
  release(a->mt);
  *a = (struct into_arg){0};
  PyErr_Restore(type, value, tb);
}

/* A producer's device data read in place must be complete: as import_tensor
 * waits for the imports. Without the GIL. */
static ab_status into_ready(const struct into_arg *a) {
  const DLDeviceType dt = a->t->device.device_type;
  if (a->cap == NULL || dt == kDLCPU || dt == kDLOpenCL) return AB_OK;
  return ab_synchronize(a->t->device, NULL);
}

static PyObject *py_convert_into(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"x",      "out",          "index",         "permute",        "scale",
                           "offset", "channel_axis", "channel_scale", "channel_offset", NULL};
  PyObject *x, *out_o, *index = Py_None;
  struct map_args m = {Py_None, Py_None, Py_None, Py_None, Py_None, Py_None};
  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OOOOOOO:convert_into", kwlist, &x, &out_o, &index, &m.permute,
                                   &m.scale, &m.offset, &m.channel_axis, &m.channel_scale, &m.channel_offset))
    return NULL;
  if (immutable_array(out_o)) return NULL;
  if (x == out_o && PyCapsule_CheckExact(x)) {
    PyErr_SetString(PyExc_BufferError, "x and out are the same DLPack capsule, which only one of them can take");
    return NULL;
  }
  struct map_buf mb;
  if (map_parse(&m, &mb) < 0) return NULL; /* before the imports: it may run Python */
  long long idx = 0;
  if (index != Py_None) {
    if (refuse_bool(index, "index must be an int or None") < 0) {
      map_free(&mb);
      return NULL;
    }
    idx = PyLong_AsLongLong(index);
    if (idx == -1 && PyErr_Occurred()) {
      if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_IndexError, "index %S is out of range", index);
      }
      map_free(&mb);
      return NULL;
    }
  }
  struct into_arg src = {0}, dst = {0};
  ab_status st = AB_OK;
  if (into_import(x, &src) < 0 || into_import(out_o, &dst) < 0 || into_read(x, &src) < 0 ||
      into_read(out_o, &dst) < 0)
    goto fail;
  DLTensor plane = *dst.t;
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  if (dst.flags & DLPACK_FLAG_BITMASK_READ_ONLY) {
    PyErr_SetString(PyExc_ValueError, "out is read-only");
    goto fail;
  }
  if (index != Py_None) {
    /* out[index]: the plane at that index of axis 0, by byte offset. */
    if (plane.ndim < 1) {
      PyErr_SetString(PyExc_ValueError, "index needs an out with at least one dimension");
      goto fail;
    }
    long long i = idx;
    if (i < 0) i += plane.shape[0];
    if (i < 0 || i >= plane.shape[0]) {
      PyErr_Format(PyExc_IndexError, "index %S is out of range for axis 0 of length %lld", index,
                   (long long)plane.shape[0]);
      goto fail;
    }
    int64_t step = 1;
    if (plane.strides != NULL) step = plane.strides[0];
    else
      for (int32_t k = 1; k < plane.ndim; k++) step *= plane.shape[k];
    if (step == 0 && plane.shape[0] > 1) {
      /* Every index of axis 0 is the same memory: writing one plane
       * would write them all. */
      PyErr_SetString(PyExc_ValueError, "out's axis 0 has stride 0 (a broadcast view): its planes are not separate");
      goto fail;
    }
    /* Within the validated extent of out: no overflow. A negative stride
     * puts the plane below out's first element: byte_offset (unsigned)
     * takes what it can, and an address-like data pointer the rest. */
    const int64_t off = (int64_t)i * step * (int64_t)((plane.dtype.bits / 8u) * plane.dtype.lanes);
    const int64_t at = (int64_t)plane.byte_offset + off;
    if (at >= 0) {
      plane.byte_offset = (uint64_t)at;
    } else if (plane.device.device_type != kDLOpenCL) {
      plane.data = (char *)plane.data + at;
      plane.byte_offset = 0;
    } else {
      PyErr_SetString(PyExc_ValueError, "out[index] lies before out's buffer (a negative stride with too small a "
                                        "byte_offset)");
      goto fail;
    }
    plane.ndim -= 1;
    plane.shape += 1;
    if (plane.strides != NULL) plane.strides += 1;
  }
  if (map_apply(&mb, src.t, &o) < 0) goto fail;
  Py_BEGIN_ALLOW_THREADS
  if ((st = into_ready(&src)) == AB_OK && (st = into_ready(&dst)) == AB_OK)
    st = ab_convert_into(src.t, &plane, &o);
  Py_END_ALLOW_THREADS
  map_free(&mb);
  if (st != AB_OK) {
    raise_status(st);
    goto fail;
  }
  into_done(&src, 1);
  into_done(&dst, 1);
  Py_RETURN_NONE;
fail:
  map_free(&mb);
  into_done(&src, 0);
  into_done(&dst, 0);
  return NULL;
}

/* A shape given as a sequence of ints, into shape[AB_MAX_NDIM]; -1 with an
 * exception otherwise. */
static int shape_from_object(PyObject *o, int64_t *shape, int32_t *ndim) {
  PyObject *items = items_of(o, "shape", AB_MAX_NDIM);
  if (items == NULL) return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(items);
  if (n > AB_MAX_NDIM) {
    Py_DECREF(items);
    PyErr_Format(PyExc_ValueError, "shape has more than %d dims", AB_MAX_NDIM);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = refuse_bool(PyTuple_GET_ITEM(items, i), "a shape's dimension must be an int") < 0
                      ? -1
                      : PyLong_AsLongLong(PyTuple_GET_ITEM(items, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(items);
      return -1;
    }
    shape[i] = (int64_t)v;
  }
  Py_DECREF(items);
  *ndim = (int32_t)n;
  return 0;
}

static PyObject *py_empty(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"shape", "dtype", "device", NULL};
  PyObject *shape_o, *dtype_o, *device_o = Py_None;
  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:empty", kwlist, &shape_o, &dtype_o, &device_o)) return NULL;
  DLDataType dtype;
  DLDevice dev = {kDLCPU, 0};
  int64_t shape[AB_MAX_NDIM];
  int32_t n;
  if (dtype_from_object(dtype_o, &dtype) < 0) return NULL;
  if (device_o != Py_None && device_from_object(device_o, &dev) < 0) return NULL;
  if (shape_from_object(shape_o, shape, &n) < 0) return NULL;
  DLManagedTensorVersioned *mt;
  ab_status st;
  Py_BEGIN_ALLOW_THREADS
  st = ab_tensor_alloc(dev, n, shape, dtype, &mt);
  Py_END_ALLOW_THREADS
  if (st != AB_OK) return raise_status(st);
  return tensor_new_owning(mt, NULL);
}

/* Unpickling (Tensor.__reduce_ex__): the bytes into a new host tensor,
 * then onto the device it came from when this process has that device;
 * else it stays in host memory (AB_UNPICKLE_MISSING_DEVICE=host, the
 * default; =fail raises instead). Read-only survives. */
/* A managed tensor over the memory of a Python buffer view it holds
 * (buffer_tensor). */
struct buffer_tensor {
  DLManagedTensorVersioned mt;
  Py_buffer view;
  int64_t shape[AB_MAX_NDIM];
};

/* The view released, then the tensor freed (both, or neither when the
 * interpreter is finalising: with_gil). */
static void release_buffer_tensor(void *self) {
  struct buffer_tensor *bt = self;
  PyBuffer_Release(&bt->view);
  PyMem_RawFree(bt);
}

static void buffer_tensor_deleter(DLManagedTensorVersioned *self) { with_gil(release_buffer_tensor, self); }

/* A tensor over the memory of *view (already checked: its length is the
 * elements', its address aligned for them), which it takes over: the
 * caller no longer releases it. NULL (no exception, *view still the
 * caller's) when out of host memory. */
static DLManagedTensorVersioned *buffer_tensor(Py_buffer *view, int32_t ndim, const int64_t *shape, DLDataType dtype) {
  struct buffer_tensor *bt = PyMem_RawCalloc(1, sizeof *bt);
  if (bt == NULL) return NULL;
  bt->view = *view;
  memcpy(bt->shape, shape, (size_t)ndim * sizeof *shape);
  managed_init(&bt->mt, bt, buffer_tensor_deleter);
  bt->mt.flags = bt->view.readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  bt->mt.dl_tensor = (DLTensor){bt->view.buf, {kDLCPU, 0}, ndim, dtype, bt->shape, NULL, 0};
  return &bt->mt;
}

static PyObject *place_rebuilt(DLManagedTensorVersioned *mt, DLDevice dev, int readonly, int copied);

/* A host tensor in memory of its own outside the library's pools
 * (PyMem_RawMalloc: freed by its deleter on any thread, GIL or not). */
struct raw_tensor {
  DLManagedTensorVersioned mt;
  void *block;
  int64_t shape[AB_MAX_NDIM];
};

static void raw_tensor_deleter(DLManagedTensorVersioned *self) {
  struct raw_tensor *rt = self->manager_ctx;
  PyMem_RawFree(rt->block);
  PyMem_RawFree(rt);
}

/* A tensor over a copy of the b->len bytes at b->buf (the elements of
 * shape and dtype), at a 64-byte aligned address (every element's, and
 * what TensorFlow and JAX take without a copy of their own), in memory
 * outside the library's pools. NULL with MemoryError where the host has
 * no room. */
static DLManagedTensorVersioned *aligned_copy(const Py_buffer *b, int32_t ndim, const int64_t *shape,
                                              DLDataType dtype) {
  const size_t align = 64;
  char refused[512]; /* the pool's words, before anything can replace them */
  snprintf(refused, sizeof refused, "%s", ab_last_error());
  struct raw_tensor *rt = PyMem_RawCalloc(1, sizeof *rt);
  void *block = (size_t)b->len <= SIZE_MAX - align ? PyMem_RawMalloc((size_t)b->len + align) : NULL;
  if (rt == NULL || block == NULL) {
    PyMem_RawFree(rt);
    PyMem_RawFree(block);
    PyErr_Format(PyExc_MemoryError, "out of host memory copying a %zd-byte buffer outside the pool, which refused it: %s",
                 b->len, refused);
    return NULL;
  }
  char *at = (char *)block + (align - (uintptr_t)block % align) % align;
  if (b->len > 0) memcpy(at, b->buf, (size_t)b->len);
  rt->block = block;
  memcpy(rt->shape, shape, (size_t)ndim * sizeof *shape);
  managed_init(&rt->mt, rt, raw_tensor_deleter);
  rt->mt.dl_tensor = (DLTensor){at, {kDLCPU, 0}, ndim, dtype, rt->shape, NULL, 0};
  return &rt->mt;
}

/* A managed tensor over memory another Python object owns (it holds a
 * reference until deleted): what _from_cuda_array_interface makes. */
struct object_tensor {
  DLManagedTensorVersioned mt;
  PyObject *owner;
  int64_t dims[2 * AB_MAX_NDIM];
};

static void object_tensor_deleter(DLManagedTensorVersioned *self) {
  struct object_tensor *ot = (struct object_tensor *)self;
  drop_owner(ot->owner);
  PyMem_RawFree(ot);
}

/* The dtype of an array-interface type string; -1 with ValueError. */
static int dtype_of_typestr(const char *ts, DLDataType *out) {
  for (uint8_t code = 0; code <= kDLBool; code++)
    for (uint8_t bits = 8; bits != 0 && bits <= 128; bits = (uint8_t)(bits * 2)) {
      const DLDataType d = {code, bits, 1};
      const char *s = typestr_of(d);
      /* "<" and "=" (native, little-endian here) are alike */
      if (s != NULL && (strcmp(s, ts) == 0 || (ts[0] == '=' && strcmp(s + 1, ts + 1) == 0))) {
        *out = d;
        return 0;
      }
    }
  PyErr_Format(PyExc_ValueError, "__cuda_array_interface__ typestr \"%s\" is not a dtype arraybridge takes", ts);
  return -1;
}

/* _from_cuda_array_interface(obj, gpu_id, dtype=None, shape=None): a
 * Tensor on cuda:gpu_id over the memory obj describes with its
 * __cuda_array_interface__ (version 2 or 3), zero-copy, holding obj.
 * dtype (a name, or (code, bits, lanes) as Dask headers and pickles carry
 * it) and shape reinterpret a compact buffer (a Dask frame of bytes) as
 * the tensor it carries. A stream the interface names is waited for. */
static PyObject *py_from_cai(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"obj", "gpu_id", "dtype", "shape", "readonly", NULL};
  PyObject *obj, *dtype_o = Py_None, *shape_o = Py_None;
  int gpu_id, force_readonly = 0;
  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oi|OOp:_from_cuda_array_interface", kwlist, &obj, &gpu_id, &dtype_o,
                                   &shape_o, &force_readonly))
    return NULL;
  PyObject *given = PyObject_GetAttrString(obj, "__cuda_array_interface__");
  if (given == NULL) return NULL;
  if (!PyDict_Check(given)) {
    Py_DECREF(given);
    PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__ is not a dict");
    return NULL;
  }
  /* A copy of our own, holding its values: reading them may run the
   * producer's code, which must not be able to free them under us. */
  PyObject *cai = PyDict_Copy(given);
  Py_DECREF(given);
  if (cai == NULL) return NULL;
  struct object_tensor *ot = NULL;
  PyObject *result = NULL;
  PyObject *data = PyDict_GetItemString(cai, "data"), *shape = PyDict_GetItemString(cai, "shape");
  PyObject *ts = PyDict_GetItemString(cai, "typestr"), *strides = PyDict_GetItemString(cai, "strides");
  PyObject *stream = PyDict_GetItemString(cai, "stream");
  if (data == NULL || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 || shape == NULL || ts == NULL ||
      !PyUnicode_Check(ts)) {
    PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ lacks data (ptr, readonly), shape or typestr");
    goto done;
  }
  if (stream != NULL && stream != Py_None && (!PyLong_Check(stream) || PyBool_Check(stream))) {
    PyErr_SetString(PyExc_TypeError, "__cuda_array_interface__ stream must be None or an integer");
    goto done;
  }
  /* CUDA Array Interface v3: "0 is disallowed due to its ambiguity" (the
   * legacy or the per-thread default stream); 1 and 2 name them. */
  if (stream != NULL && PyLong_Check(stream)) {
    int overflow;
    const long long sv = PyLong_AsLongLongAndOverflow(stream, &overflow);
    if (sv == -1 && PyErr_Occurred()) goto done;
    if (sv == 0 && !overflow) {
      PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ stream 0 is disallowed (version 3: ambiguous); "
                                        "1 is the legacy default stream, 2 the per-thread one");
      goto done;
    }
  }
  ot = PyMem_RawCalloc(1, sizeof *ot);
  if (ot == NULL) {
    PyErr_NoMemory();
    goto done;
  }
  DLTensor *t = &ot->mt.dl_tensor;
  t->shape = ot->dims;
  t->device = (DLDevice){kDLCUDA, gpu_id};
  const char *ts_utf8 = text_of(ts, "__cuda_array_interface__ typestr");
  if (ts_utf8 == NULL || dtype_of_typestr(ts_utf8, &t->dtype) < 0 || shape_from_object(shape, t->shape, &t->ndim) < 0)
    goto done;
  const unsigned long long ptr = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(data, 0));
  if (ptr == (unsigned long long)-1 && PyErr_Occurred()) goto done;
  const int readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
  if (readonly < 0) goto done;
  t->data = (void *)(uintptr_t)ptr;
  const int64_t es = (int64_t)(t->dtype.bits / 8u);
  if (strides != NULL && strides != Py_None) {
    int32_t n;
    if (shape_from_object(strides, ot->dims + AB_MAX_NDIM, &n) < 0) goto done;
    if (n != t->ndim) {
      PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ strides and shape differ in length");
      goto done;
    }
    for (int32_t i = 0; i < n; i++) {
      if (ot->dims[AB_MAX_NDIM + i] % es != 0) {
        PyErr_SetString(PyExc_ValueError, "__cuda_array_interface__ strides are not whole elements");
        goto done;
      }
      ot->dims[AB_MAX_NDIM + i] /= es;
    }
    t->strides = ot->dims + AB_MAX_NDIM;
  }
  if (dtype_o != Py_None || shape_o != Py_None) {
    /* A compact buffer read as the tensor it carries. */
    int64_t have = es;
    for (int32_t i = 0; i < t->ndim; i++) have *= t->shape[i];
    DLDataType d = t->dtype;
    int64_t want_shape[AB_MAX_NDIM];
    int32_t want_ndim = 1;
    if (dtype_o != Py_None && dtype_from_pickle(dtype_o, &d) < 0) goto done; /* a name or (code, bits, lanes) */
    const int64_t des = (int64_t)(d.bits / 8u) * d.lanes;
    want_shape[0] = des > 0 ? have / des : 0; /* no shape: one dim of the new elements */
    if (shape_o != Py_None && shape_from_object(shape_o, want_shape, &want_ndim) < 0) goto done;
    int64_t want = des;
    for (int32_t i = 0; i < want_ndim; i++) want *= want_shape[i];
    if (t->strides != NULL || want != have || ptr % (d.bits / 8u ? d.bits / 8u : 1) != 0) {
      PyErr_Format(PyExc_ValueError, "a %lld-byte buffer%s is not the %lld bytes of that dtype and shape",
                   (long long)have, t->strides != NULL ? " with strides" : "", (long long)want);
      goto done;
    }
    t->dtype = d;
    t->ndim = want_ndim;
    memcpy(t->shape, want_shape, (size_t)want_ndim * sizeof *want_shape);
  }
  Py_INCREF(obj);
  ot->owner = obj;
  managed_init(&ot->mt, ot, object_tensor_deleter);
  ot->mt.flags = readonly || force_readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
  DLManagedTensorVersioned *mt = &ot->mt;
  ot = NULL; /* owned by mt from here */
  ab_status st = ab_tensor_validate(&mt->dl_tensor);
  if (st == AB_OK && stream != NULL && stream != Py_None) {
    const unsigned long long sv = PyLong_AsUnsignedLongLong(stream);
    if (sv == (unsigned long long)-1 && PyErr_Occurred()) {
      release_keeping_error(mt);
      goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    st = ab_synchronize(mt->dl_tensor.device, (void *)(uintptr_t)sv);
    Py_END_ALLOW_THREADS
  }
  if (st != AB_OK) {
    raise_and_release(st, mt);
    goto done;
  }
  result = tensor_new_owning(mt, NULL);
done:
  PyMem_RawFree(ot);
  Py_DECREF(cai);
  return result;
}



/* memory_is_bytes' answer where a read failed: 0 at the walk's end (an
 * object with no such attribute, when `attribute`), else 1 (cannot tell:
 * copy) for an Exception, cleared, and -1 for one that is none, kept. */
static int walk_failed(int attribute) {
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  const int end = attribute && PyErr_ExceptionMatches(PyExc_AttributeError);
  PyErr_Clear();
  return end ? 0 : 1;
}

/* Whether a payload's memory is a bytes object's, through the memoryviews
 * and PickleBuffers pickle and Dask wrap it in and the arrays made over it
 * (np.frombuffer: an exporter's `base`). Such memory is never adopted, even
 * for a read-only tensor: bytes are immutable and shared (b"\x05" is one
 * object interpreter-wide, constants are interned), and a consumer that
 * ignores DLPack's read-only flag (torch does) would rewrite them for the
 * whole process. Where the walk cannot tell (a `base` or memoryview owner
 * that cannot be read, a released PickleBuffer met on the way, a chain
 * longer than the walk) it answers 1: the payload is copied, which is
 * always safe. A memoryview's owner is read through its `obj` attribute,
 * which refuses a released view, whose owner may be freed. -1 with the
 * exception set for one that is no Exception (KeyboardInterrupt). */
static int memory_is_bytes(PyObject *payload) {
  PyObject *o = Py_NewRef(payload);
  int found = 0;
  for (int depth = 0; o != NULL && depth < 16 && !found; depth++) {
    PyObject *next = NULL;
    if (PyBytes_Check(o)) {
      found = 1;
    } else if (PyPickleBuffer_Check(o)) {
      const Py_buffer *view = PyPickleBuffer_GetBuffer(o);
      if (view != NULL)
        next = Py_XNewRef(view->obj);
      else
        found = walk_failed(0); /* released */
    } else if ((next = PyObject_GetAttrString(o, PyMemoryView_Check(o) ? "obj" : "base")) == NULL) {
      found = walk_failed(1);
    }
    if (next == Py_None) Py_CLEAR(next);
    Py_DECREF(o);
    o = next;
  }
  if (o != NULL) { /* the walk stopped short */
    Py_DECREF(o);
    found = 1;
  }
  return found;
}

static PyObject *py_rebuild_tensor(PyObject *mod, PyObject *args) {
  PyObject *payload, *dtype_o, *shape_o, *device_o;
  int readonly;
  (void)mod;
  if (!PyArg_ParseTuple(args, "OOOpO:_rebuild_tensor", &payload, &dtype_o, &shape_o, &readonly, &device_o))
    return NULL;
  DLDataType dtype;
  DLDevice dev;
  int64_t shape[AB_MAX_NDIM];
  int32_t n;
  if (dtype_from_pickle(dtype_o, &dtype) < 0 || shape_from_object(shape_o, shape, &n) < 0 ||
      device_from_object(device_o, &dev) < 0)
    return NULL;
  if (dev.device_type == AB_DEVICE_OPENCL_HOST) /* whatever its id: no tensor is ever on it, so no pickle of ours names it */
    return PyErr_Format(PyExc_ValueError, "pickled tensor names %s:%d, the library's own staging memory, "
                        "which no tensor is ever on", ab_device_type_name(dev.device_type), (int)dev.device_id);
  Py_buffer b;
  if (PyObject_GetBuffer(payload, &b, PyBUF_SIMPLE) < 0) return NULL;
  /* The payload must hold exactly the elements, checked before anything
   * is allocated: a forged pickle cannot ask for memory it does not carry.
   * (Negative dims are left to the library's check below.) */
  int zero = 0, negative = 0;
  for (int32_t k = 0; k < n; k++) zero |= shape[k] == 0, negative |= shape[k] < 0;
  uint64_t need = zero ? 0 : (uint64_t)(dtype.bits / 8u) * dtype.lanes;
  int fits = 1;
  for (int32_t k = 0; k < n && !zero && !negative && fits; k++) {
    fits = need <= UINT64_MAX / (uint64_t)shape[k];
    need *= fits ? (uint64_t)shape[k] : 1;
  }
  if (!negative && (!fits || need != (uint64_t)b.len)) {
    PyBuffer_Release(&b);
    return PyErr_Format(PyExc_ValueError, "pickled tensor has %zd bytes, which its dtype and shape do not match",
                        b.len);
  }
  /* The tensor described must be one by the library's rules (a dtype's
   * code and bits, its dims), checked before either path below: the
   * payload's memory, adopted, was taken unchecked, and so any failure of
   * ab_tensor_alloc below is the pool's. */
  const DLTensor described = {b.buf, {kDLCPU, 0}, n, dtype, shape, NULL, 0};
  ab_status st = ab_tensor_validate(&described);
  if (st != AB_OK) {
    PyBuffer_Release(&b);
    return raise_status(st);
  }
  DLManagedTensorVersioned *mt;
  /* The payload's memory itself when it can be the tensor's (as NumPy's
   * unpickling does): pickle's out-of-band buffers and Dask's frames are
   * handed over without a copy. It must be writable unless the tensor is
   * read-only, never a bytes object's (memory_is_bytes), and aligned for
   * the elements. */
  const size_t align = dtype.bits / 8u > 0 ? dtype.bits / 8u : 1;
  const int is_bytes = b.readonly && readonly ? memory_is_bytes(payload) : 0;
  if (is_bytes < 0) {
    PyBuffer_Release(&b);
    return NULL;
  }
  if ((!b.readonly || (readonly && !is_bytes)) && (uintptr_t)b.buf % align == 0 &&
      (mt = buffer_tensor(&b, n, shape, dtype)) != NULL)
    return place_rebuilt(mt, dev, readonly, 0);
  st = ab_tensor_alloc((DLDevice){kDLCPU, 0}, n, shape, dtype, &mt);
  if (st != AB_OK) {
    /* The host pool refuses the checked tensor: its limit leaves no room
     * (a Dask worker capped as scaling.md says), or AB_MEMORY_LIMIT is
     * malformed, which fails every pool allocation (logged, and met again
     * at the process's next one). The bytes are in this process already,
     * and a failure here is a transfer Dask cannot report (the task waits
     * for ever). The copy goes outside the pool instead. */
    mt = aligned_copy(&b, n, shape, dtype);
    PyBuffer_Release(&b);
    return mt == NULL ? NULL : place_rebuilt(mt, dev, readonly, 1);
  }
  const size_t want = byte_size(&mt->dl_tensor);
  if (want > 0) memcpy(mt->dl_tensor.data, b.buf, want);
  PyBuffer_Release(&b);
  return place_rebuilt(mt, dev, readonly, 1);
}

/* AB_UNPICKLE_MISSING_DEVICE: 1 for "fail", 0 for "host" (the default:
 * unset or empty alike; anything else is warned about, as the C library
 * logs a malformed AB_* value, and the default used), -1 with the
 * exception where that warning was made an error. */
static int unpickle_fails(void) {
  const char *v = getenv("AB_UNPICKLE_MISSING_DEVICE");
  if (v == NULL || *v == '\0' || strcmp(v, "host") == 0) return 0;
  if (strcmp(v, "fail") == 0) return 1;
  return PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                          "AB_UNPICKLE_MISSING_DEVICE=\"%s\" ignored: want host or fail; using host", v) < 0 ? -1 : 0;
}

/* A rebuilt host tensor, flagged read-only and copied (its bytes from the
 * payload's) as said, onto the device it was pickled from, when this
 * process has it (else it stays in host memory, and its device says so),
 * and it can be placed there (else the same, with a RuntimeWarning that
 * says why: no room on the device, its staging, a malformed
 * AB_MEMORY_LIMIT; an error while Dask receives a transfer is one it
 * cannot report, and the task waits for ever). With
 * AB_UNPICKLE_MISSING_DEVICE=fail the error is raised instead. */
static PyObject *place_rebuilt(DLManagedTensorVersioned *mt, DLDevice dev, int readonly, int copied) {
  mt->flags |= (readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0) | (copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0);
  PyObject *t = tensor_new_owning(mt, NULL);
  if (t == NULL || dev.device_type == kDLCPU) return t;
  if (dev.device_id >= ab_device_count(dev.device_type)) {
    const int fails = unpickle_fails();
    if (fails < 0) {
      Py_DECREF(t); /* warnings made errors */
      return NULL;
    }
    if (fails) {
      Py_DECREF(t);
      struct ab_device_info info;
      ab_device_info(dev, &info); /* fails: its message says why the device is missing */
      return PyErr_Format(PyExc_ValueError, "the pickled tensor was on %s:%d, which this process does not have "
                          "(AB_UNPICKLE_MISSING_DEVICE=fail): %s", ab_device_type_name(dev.device_type),
                          (int)dev.device_id, ab_last_error());
    }
    return t; /* host memory; its device says so */
  }
  PyObject *moved = import_and_convert(t, &dev, 1, NULL, NULL, LAYOUT_ANY);
  if (moved == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int fails = unpickle_fails();
    if (fails == 0)
      fails = PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                               "the unpickled tensor stays in host memory: it could not be placed on %s:%d (%S)",
                               ab_device_type_name(dev.device_type), (int)dev.device_id, value) < 0 ? -1 : 0;
    if (fails > 0) {
      PyErr_Restore(type, value, tb); /* the error, as asked */
    } else {
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
      if (fails == 0) return t; /* host memory; its device says so */
    }
  }
  Py_DECREF(t);
  if (moved != NULL && readonly) ((TensorObject *)moved)->mt->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  return moved;
}

/* ---- module functions ------------------------------------------------------------ */

static PyObject *py_devices(PyObject *mod, PyObject *unused) {
  (void)mod, (void)unused;
  DLDeviceType types[32];
  const int ntypes = ab_device_types(types, 32);
  PyObject *list = PyList_New(0);
  if (list == NULL) return NULL;
  for (int k = 0; k < ntypes && k < 32; k++)
    for (int32_t i = 0; i < ab_device_count(types[k]); i++) {
      PyObject *s = device_string((DLDevice){types[k], i});
      if (s == NULL || PyList_Append(list, s) < 0) {
        Py_XDECREF(s);
        Py_DECREF(list);
        return NULL;
      }
      Py_DECREF(s);
    }
  return list;
}

static PyObject *py_device_info(PyObject *mod, PyObject *device) {
  (void)mod;
  DLDevice d;
  struct ab_device_info info;
  if (device_from_object(device, &d) < 0) return NULL;
  ab_status st = ab_device_info(d, &info);
  if (st != AB_OK) return raise_status(st);
  PyObject *dev = device_string(info.device);
  if (dev == NULL) return NULL;
  return Py_BuildValue("{s:N,s:s,s:s,s:s,s:s,s:K,s:K,s:K,s:O,s:O,s:i,s:s}", "device", dev, "name", info.name,
                       "backend", info.backend, "vendor", info.vendor, "version", info.version, "total_memory",
                       (unsigned long long)info.total_memory, "free_memory", (unsigned long long)info.free_memory,
                       "max_alloc_size", (unsigned long long)info.max_alloc_size, "host_accessible",
                       info.host_accessible ? Py_True : Py_False, "unified_memory",
                       info.unified_memory ? Py_True : Py_False, "compute_capability", info.compute_capability,
                       "pci_bus_id", info.pci_bus_id);
}

static PyObject *py_memory_stats(PyObject *mod, PyObject *device) {
  (void)mod;
  DLDevice d;
  struct ab_pool_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  if (device_from_object(device, &d) < 0) return NULL;
  ab_status st = ab_pool_stats(d, &s);
  if (st != AB_OK) return raise_status(st);
  PyObject *dict = PyDict_New();
  if (dict == NULL) return NULL;
#define PUT(key, value)                                                  \
  do {                                                                   \
    PyObject *v_ = (value);                                              \
    if (v_ == NULL || PyDict_SetItemString(dict, (key), v_) < 0) {       \
      Py_XDECREF(v_);                                                    \
      Py_DECREF(dict);                                                   \
      return NULL;                                                       \
    }                                                                    \
    Py_DECREF(v_);                                                       \
  } while (0)
#define GAUGE(name) \
  PUT(#name, Py_BuildValue("{s:K,s:K}", "current", (unsigned long long)s.name.current, "peak", \
                           (unsigned long long)s.name.peak));
#define COUNTER(name) PUT(#name, PyLong_FromUnsignedLongLong((unsigned long long)s.name));
  AB_POOL_GAUGE_FIELDS(GAUGE)
  AB_POOL_COUNTER_FIELDS(COUNTER)
  PUT("limit_bytes", PyLong_FromUnsignedLongLong((unsigned long long)s.limit_bytes));
  PUT("cached_blocks", PyLong_FromUnsignedLongLong((unsigned long long)s.cached_blocks));
#undef GAUGE
#undef COUNTER
#undef PUT
  return dict;
}

static PyObject *py_pool_summary(PyObject *mod, PyObject *device) {
  (void)mod;
  DLDevice d;
  char buf[4096];
  if (device_from_object(device, &d) < 0) return NULL;
  ab_status st = ab_pool_summary(d, buf, sizeof buf);
  if (st != AB_OK) return raise_status(st);
  return PyUnicode_FromString(buf);
}

static PyObject *py_empty_cache(PyObject *mod, PyObject *args, PyObject *kwargs) {
  static char *kwlist[] = {"device", NULL};
  PyObject *device = Py_None;
  (void)mod;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:empty_cache", kwlist, &device)) return NULL;
  if (device == Py_None) {
    ab_pool_trim_all();
    Py_RETURN_NONE;
  }
  DLDevice d;
  if (device_from_object(device, &d) < 0) return NULL;
  ab_status st = ab_pool_trim(d);
  if (st != AB_OK) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_set_memory_limit(PyObject *mod, PyObject *args) {
  PyObject *device, *bytes_o;
  (void)mod;
  if (!PyArg_ParseTuple(args, "OO!:set_memory_limit", &device, &PyLong_Type, &bytes_o)) return NULL;
  if (refuse_bool(bytes_o, "bytes must be an int") < 0) return NULL;
  unsigned long long bytes = PyLong_AsUnsignedLongLong(bytes_o); /* OverflowError when negative or too big */
  if (bytes == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  DLDevice d;
  if (device_from_object(device, &d) < 0) return NULL;
  if (bytes > SIZE_MAX) {
    PyErr_SetString(PyExc_OverflowError, "bytes does not fit in size_t");
    return NULL;
  }
  ab_status st = ab_set_memory_limit(d, (size_t)bytes);
  if (st != AB_OK) return raise_status(st);
  Py_RETURN_NONE;
}

static PyObject *py_best_device(PyObject *mod, PyObject *unused) {
  (void)mod, (void)unused;
  return device_string(ab_best_device());
}

static PyObject *explain_route_of(const struct move_args *a);

static PyObject *py_explain_route(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  struct move_args a;
  (void)mod;
  if (move_args_parse("explain_route", args, nargs, kwnames, &a) < 0) return NULL;
  PyObject *r = explain_route_of(&a);
  move_args_release(&a);
  return r;
}

/* explain_route with its arguments read. */
static PyObject *explain_route_of(const struct move_args *a) {
  PyObject *x = a->x;
  struct map_buf mb;
  if (map_parse(&a->m, &mb) < 0) return NULL; /* before the import: it may run Python */
  /* A capsule is read in place and left unconsumed (explaining a move
   * does not make it); anything else is imported zero-copy. */
  const DLTensor *src = capsule_peek(x);
  PyObject *t = NULL;
  ab_status st;
  if (src != NULL) {
    if ((st = ab_tensor_validate(src)) != AB_OK) {
      map_free(&mb);
      return raise_status(st);
    }
  } else {
    if ((t = import_and_convert(x, NULL, -1, NULL, NULL, LAYOUT_ANY)) == NULL) {
      map_free(&mb);
      return NULL;
    }
    src = &((TensorObject *)t)->mt->dl_tensor;
  }
  char buf[2048];
  /* the options to_device would give the core (its own when it returns x
   * as it is: a view, strided as x is) */
  ab_convert_opts o;
  const int r = convert_opts(src, &a->target, a->copy, a->dtype, &mb, a->layout, &o);
  if (r < 0) {
    map_free(&mb);
    Py_XDECREF(t);
    return NULL;
  }
  if (r == 0) {
    o = (ab_convert_opts)AB_CONVERT_OPTS_INIT;
    o.flags = AB_CONVERT_ALLOW_STRIDED_VIEW;
  }
  const int rc = explain_unlocked(t == NULL ? x : NULL, src, a->target, &o, buf, sizeof buf, &st);
  map_free(&mb);
  Py_XDECREF(t);
  if (rc < 0) return NULL;
  if (st != AB_OK) return raise_status(st);
  return PyUnicode_FromString(buf);
}

/* _note_driver_started(device): ab_note_driver_started of device's type
 * (the Python layer calls it before a fork while pyclesperanto, which
 * starts OpenCL at its import, is imported). */
/* _claim_fork_hooks(): True the first time a process asks, False after:
 * os.register_at_fork cannot take a hook back, and the Python package,
 * imported again, would register its hooks again. A static of the shared
 * object, which stays loaded whatever Python does with its modules (the
 * GIL orders the callers). */
static PyObject *py_claim_fork_hooks(PyObject *mod, PyObject *noargs) {
  static int claimed;
  (void)mod;
  (void)noargs;
  const int first = !claimed;
  claimed = 1;
  return PyBool_FromLong(first);
}

static PyObject *py_note_driver_started(PyObject *mod, PyObject *arg) {
  (void)mod;
  DLDevice d;
  if (device_from_object(arg, &d) < 0) return NULL;
  ab_status st = ab_note_driver_started(d.device_type);
  if (st != AB_OK) return raise_status(st);
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
  {"from_dlpack", (PyCFunction)(void (*)(void))py_from_dlpack, METH_VARARGS | METH_KEYWORDS,
   "from_dlpack(x, /, *, device=None, copy=None, readonly=False)\n--\n\n"
   "A Tensor with the data of any DLPack producer (an object with __dlpack__), zero-copy when it can be.\n"
   "device: a string ('cpu', 'cuda:1', 'opencl:0') or (type, id) tuple; another device than x's copies there.\n"
   "copy: None (copy only if needed), True (always), False (never: BufferError when a copy is needed).\n"
   "readonly: mark the Tensor read-only whatever the producer said (JAX and TensorFlow arrays are immutable,\n"
   "but their DLPack exports do not say so)."},
  {"to_device", (PyCFunction)(void (*)(void))py_to_device, METH_FASTCALL | METH_KEYWORDS,
   "to_device(x, target, gpu_id=None, *, dtype=None, copy=None, permute=None, scale=None, offset=None,\n"
   "          channel_axis=None, channel_scale=None, channel_offset=None, layout='any')\n--\n\n"
   "Moves x (any DLPack producer) to target ('cpu', 'cuda', 'opencl:1', ...); gpu_id sets the device id\n"
   "(-1: the device with the most free memory). Returns a Tensor.\n"
   "On the way, in the same pass: dtype casts the elements; permute reorders the axes (result axis i is\n"
   "x's axis permute[i], as NumPy's transpose); scale and offset map y = x * scale + offset; channel_axis\n"
   "(an axis of x) with channel_scale and/or channel_offset (one number per index of that axis) maps each\n"
   "channel with its own numbers (mean/std normalisation). The rules are those of the C library\n"
   "(docs/guide.md, 'Converting on the way').\n"
   "layout: which strides a result may keep when it can be a view: 'any', 'nonnegative' or 'compact'\n"
   "(a source with others is copied compact). x may also be a DLPack capsule."},
  {"convert_into", (PyCFunction)(void (*)(void))py_convert_into, METH_VARARGS | METH_KEYWORDS,
   "convert_into(x, out, *, index=None, permute=None, scale=None, offset=None, channel_axis=None,\n"
   "             channel_scale=None, channel_offset=None)\n--\n\n"
   "Converts x (any DLPack producer) into out, an existing writable compact array of any DLPack producer\n"
   "(or Tensor), on out's device and in out's dtype: out[index] (a plane along axis 0) when index is given.\n"
   "The shape must match x's (permuted by permute). Memory of another library (an OpenCL buffer of another\n"
   "context) is written through host memory. Returns None."},
  {"empty", (PyCFunction)(void (*)(void))py_empty, METH_VARARGS | METH_KEYWORDS,
   "empty(shape, dtype, device='cpu')\n--\n\nA new compact Tensor of that shape and dtype on device, from the "
   "device's pool; its elements are not set."},
  {"devices", py_devices, METH_NOARGS, "devices()\n--\n\nDevice strings of every device present."},
  {"_claim_fork_hooks", py_claim_fork_hooks, METH_NOARGS,
   "_claim_fork_hooks()\n--\n\nTrue the first time a process asks, then False (internal: the package's fork "
   "hooks are registered once a process)."},
  {"_note_driver_started", py_note_driver_started, METH_O,
   "_note_driver_started(device)\n--\n\nab_note_driver_started of device's type ('opencl:0'): another library "
   "started that driver here, so a process forked from this one has none of its devices."},
  {"device_info", py_device_info, METH_O, "device_info(device)\n--\n\nA dict describing the device."},
  {"memory_stats", py_memory_stats, METH_O, "memory_stats(device)\n--\n\nThe device pool's statistics as a dict."},
  {"_from_cuda_array_interface", (PyCFunction)(void (*)(void))py_from_cai, METH_VARARGS | METH_KEYWORDS,
   "_from_cuda_array_interface(obj, gpu_id, dtype=None, shape=None)\n--\n\nA Tensor on cuda:gpu_id over obj's "
   "__cuda_array_interface__, zero-copy (internal: Dask's cuda deserializer)."},
  {"byte_view", py_byte_view, METH_O,
   "byte_view(t)\n--\n\nA 1-D uint8 Tensor of the bytes of t (a Tensor in compact host memory), sharing them and "
   "keeping them alive: the way to the bytes of dtypes the buffer protocol cannot name (bfloat16, float8, "
   "multi-lane), e.g. np.frombuffer(byte_view(t), ml_dtypes.bfloat16)."},
  {"_rebuild_tensor", py_rebuild_tensor, METH_VARARGS,
   "_rebuild_tensor(data, dtype, shape, readonly, device)\n--\n\nUnpickles a Tensor (see Tensor.__reduce_ex__)."},
  {"pool_summary", py_pool_summary, METH_O,
   "pool_summary(device)\n--\n\nThe device pool's statistics as a readable table (ab_pool_summary)."},
  {"empty_cache", (PyCFunction)(void (*)(void))py_empty_cache, METH_VARARGS | METH_KEYWORDS,
   "empty_cache(device=None)\n--\n\nReturns cached, unused blocks of one device's pool (all pools when None) to "
   "the driver."},
  {"set_memory_limit", py_set_memory_limit, METH_VARARGS,
   "set_memory_limit(device, bytes)\n--\n\nCaps the bytes a device's pool may reserve (0 = no limit)."},
  {"best_device", py_best_device, METH_NOARGS,
   "best_device()\n--\n\nThe best device for work: a CUDA GPU, else an OpenCL GPU, else 'cpu:0' "
   "(AB_DEFAULT_DEVICE overrides)."},
  {"explain_route", (PyCFunction)(void (*)(void))py_explain_route, METH_FASTCALL | METH_KEYWORDS,
   "explain_route(x, target, gpu_id=None, *, dtype=None, copy=None, permute=None, scale=None, offset=None,\n"
   "              channel_axis=None, channel_scale=None, channel_offset=None, layout='any')\n--\n\n"
   "How to_device(x, target, ...) with the "
   "same options would move x, step by step, and where a conversion would run."},
  {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
  PyModuleDef_HEAD_INIT,
  .m_name = "arraybridge._arraybridge",
  .m_doc = "CPython bindings of the arraybridge C library.",
  .m_size = -1,
  .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__arraybridge(void) {
  /* Before any framework imported after us opens the OpenCL drivers
   * itself (pyclesperanto's ICD loader), in a process that may hold
   * TensorFlow's LLVM: see ab_preload_drivers. */
  ab_preload_drivers();
  if (intern_names() < 0 || PyType_Ready(&TensorType) < 0) return NULL;
  PyObject *m = PyModule_Create(&moduledef);
  if (m == NULL) return NULL;
  Py_INCREF(&TensorType);
  if (PyModule_AddObject(m, "Tensor", (PyObject *)&TensorType) < 0) {
    Py_DECREF(&TensorType); /* not stolen on failure */
    Py_DECREF(m);
    return NULL;
  }
  /* From here the module owns the type's reference. */
  rebuild_fn = PyObject_GetAttrString(m, "_rebuild_tensor"); /* kept for the process's life */
  static int fork_handlers; /* once, however often the module is initialised */
  if (!fork_handlers && pthread_atfork(live_fork_prepare, live_fork_done, live_fork_child) == 0) fork_handlers = 1;
  if (rebuild_fn == NULL || !fork_handlers) {
    if (!PyErr_Occurred()) PyErr_NoMemory(); /* pthread_atfork's one failure */
    Py_DECREF(m);
    return NULL;
  }
  if (PyModule_AddStringConstant(m, "__version__", ab_version_string()) < 0 ||
      PyModule_AddIntConstant(m, "DEVICE_AUTO", AB_DEVICE_AUTO) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
