/*
 * arraybridge: move and translate DLPack tensors between memory spaces.
 *
 * One umbrella header. Everything public starts with ab_ / AB_.
 *
 * Conventions that hold for every function below unless its comment says
 * otherwise:
 *  - The return value is an ab_status; AB_OK (0) means success.
 *  - Results are written through trailing `out` parameters, and only on
 *    success: on failure every output is left exactly as it was.
 *  - On failure ab_last_error() returns a message naming the argument, the
 *    value and the device involved.
 *  - The caller keeps ownership of everything it passes in, unless the
 *    comment says "takes ownership", and then only on success.
 *  - All functions are thread-safe.
 */
#ifndef ARRAYBRIDGE_ARRAYBRIDGE_H
#define ARRAYBRIDGE_ARRAYBRIDGE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#error "arraybridge needs DLPack >= 1.0 (dlpack/dlpack.h); Debian bookworm's libdlpack-dev is 0.6"
#endif

/* DLPack 1.0 declares the struct without a typedef (1.1 adds one); C11 and
 * C++ both allow repeating an identical typedef, so this is safe with both. */
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  if defined(AB_BUILDING_SHARED)
#    define AB_API __declspec(dllexport)
#  elif defined(AB_USING_SHARED)
#    define AB_API __declspec(dllimport)
#  else
#    define AB_API
#  endif
#elif defined(__GNUC__)
#  define AB_API __attribute__((visibility("default")))
#else
#  define AB_API
#endif

/* ---- version ---------------------------------------------------------- */

#define AB_VERSION_MAJOR 0
#define AB_VERSION_MINOR 1
#define AB_VERSION_PATCH 0
#define AB_VERSION_NUMBER \
  (AB_VERSION_MAJOR * 10000 + AB_VERSION_MINOR * 100 + AB_VERSION_PATCH)
#define AB_STRINGIFY_(x) #x
#define AB_STRINGIFY(x) AB_STRINGIFY_(x)
#define AB_VERSION_STRING                                              \
  AB_STRINGIFY(AB_VERSION_MAJOR) "." AB_STRINGIFY(AB_VERSION_MINOR) "." \
  AB_STRINGIFY(AB_VERSION_PATCH)

/* The version of the library actually loaded (may differ from the header's
 * AB_VERSION_STRING when linked dynamically). Static string, never NULL. */
AB_API const char *ab_version_string(void);
/* AB_VERSION_NUMBER of the loaded library. */
AB_API unsigned ab_version_number(void);

/* ---- status codes ----------------------------------------------------- */

/* X(name, value, message). Values are fixed forever and never reused. */
#define AB_STATUS_MAP(X)                                                   \
  X(OK, 0, "success")                                                      \
  X(ERR_INVALID_ARGUMENT, 1, "invalid argument")                           \
  X(ERR_UNSUPPORTED, 2, "unsupported operation or data type")              \
  X(ERR_NO_DEVICE, 3, "no such device")                                    \
  X(ERR_OUT_OF_MEMORY, 4, "out of memory")                                 \
  X(ERR_COPY_REQUIRED, 5, "a copy is required but AB_COPY_NEVER was given") \
  X(ERR_BACKEND, 6, "backend (driver or runtime) error")                   \
  X(ERR_INTERNAL, 7, "internal error")

typedef enum ab_status {
#define AB_STATUS_ENUM_(name, value, msg) AB_##name = value,
  AB_STATUS_MAP(AB_STATUS_ENUM_)
#undef AB_STATUS_ENUM_
} ab_status;

/* Short fixed description of a status ("out of memory"); a static string,
 * never NULL ("unknown status" for values not in the table). */
AB_API const char *ab_status_str(ab_status status);

/* Symbolic name of a status ("AB_ERR_OUT_OF_MEMORY"); static, never NULL. */
AB_API const char *ab_status_name(ab_status status);

/* Detail message of the last failure of an arraybridge call on the calling
 * thread: what was wrong, with the argument, value and device. Successful
 * calls leave it unchanged; "" before any failure. The string lives in
 * thread-local storage and stays valid until the next failing arraybridge
 * call on this thread. Never NULL. */
AB_API const char *ab_last_error(void);

/* ---- devices ---------------------------------------------------------- */

/* The largest ndim a tensor may have (NumPy 2's limit). */
#define AB_MAX_NDIM 64

/* A target device_id that lets the library choose: the device of that type
 * with the most free memory. Not valid in a source tensor. */
#define AB_DEVICE_AUTO (-1)

/* Number of devices of a type: kDLCPU is always 1; a type whose backend is
 * not built in, or whose driver or devices are absent, is 0. Never fails. */
AB_API int32_t ab_device_count(DLDeviceType type);

/* Description of one device. Sizes are in bytes; 0 means unknown. */
struct ab_device_info {
  DLDevice device;
  char name[128];     /* e.g. the CPU model, "NVIDIA H100 80GB HBM3" */
  char backend[16];   /* "host", "cuda", "opencl" */
  uint64_t total_memory;
  uint64_t free_memory;
  /* Memory of this device is directly addressable by host code. */
  int host_accessible;
};

/* Fills *out for `dev`. AB_ERR_NO_DEVICE when the device does not exist
 * (type not built in, or id out of range); AB_ERR_INVALID_ARGUMENT for a
 * NULL out or an unknown device type. */
AB_API ab_status ab_device_info(DLDevice dev, struct ab_device_info *out);

/* Short lower-case name of a device type ("cpu", "cuda", "cuda_host",
 * "opencl", ...); "unknown" for values DLPack does not define. Static. */
AB_API const char *ab_device_type_name(DLDeviceType type);

/* ---- conversion ------------------------------------------------------- */

/* Copy semantics of ab_convert_memory, as the array API's
 * from_dlpack(copy=None/True/False). */
typedef enum ab_copy_mode {
  AB_COPY_IF_NEEDED = 0, /* view when possible, copy otherwise */
  AB_COPY_ALWAYS = 1,    /* always a fresh, owned copy */
  AB_COPY_NEVER = 2      /* view or AB_ERR_COPY_REQUIRED */
} ab_copy_mode;

/* Bits of ab_convert_opts.flags. Unknown bits are rejected. */
enum {
  /* With AB_COPY_IF_NEEDED / AB_COPY_NEVER, also accept a non-compact
   * source (any strides) on the same device as a view with its strides. */
  AB_CONVERT_ALLOW_STRIDED_VIEW = 1u << 0,
  /* Mark the result DLPACK_FLAG_BITMASK_READ_ONLY. */
  AB_CONVERT_READ_ONLY = 1u << 1
};
#define AB_CONVERT_KNOWN_FLAGS \
  ((uint32_t)(AB_CONVERT_ALLOW_STRIDED_VIEW | AB_CONVERT_READ_ONLY))

/* Options of ab_convert_memory. A NULL pointer and an all-zero struct both
 * mean the defaults (copy if needed, keep the dtype, default stream).
 *
 * Growth rule: later versions append fields. `size` tells the library how
 * much of the struct the caller knows: set it to sizeof(ab_convert_opts)
 * (AB_CONVERT_OPTS_INIT does) to use fields added after version 0.1; 0 means
 * "only the 0.1 fields below", so zero-initialised structs compiled against
 * any version keep meaning the defaults. Fields past `size` are read as 0. */
typedef struct ab_convert_opts {
  uint32_t size;      /* 0 or sizeof(ab_convert_opts) */
  uint32_t flags;     /* AB_CONVERT_* bits */
  ab_copy_mode copy;
  /* Result dtype; bits == 0 keeps the source dtype. A dtype that differs
   * from the source's is AB_ERR_UNSUPPORTED in this version. */
  DLDataType dtype;
  /* Backend stream (cudaStream_t, cl_command_queue) or NULL for the default;
   * ignored by the host backend. */
  void *stream;
} ab_convert_opts;

#define AB_CONVERT_OPTS_INIT {sizeof(ab_convert_opts), 0, AB_COPY_IF_NEEDED, {0, 0, 0}, NULL}

/* Returns a tensor with the contents of `src` on `target`.
 *
 * src:    a DLTensor on any device the library knows; validated before any
 *         byte of it is read (see docs/guide.md for what is accepted).
 *         Never modified, not retained after the call returns except as
 *         described for views below.
 * target: the device; device_id AB_DEVICE_AUTO picks one (see above).
 * opts:   NULL for the defaults.
 * out:    on success *out is a new DLManagedTensorVersioned owned by the
 *         caller, who must call (*out)->deleter(*out) exactly once.
 *
 * A copy is compact row-major, with non-NULL strides (DLPack 1.2), its own
 * shape and strides arrays, data aligned to 256 bytes (NULL when the tensor
 * has no elements), and flags DLPACK_FLAG_BITMASK_IS_COPIED.
 *
 * A view (AB_COPY_IF_NEEDED or AB_COPY_NEVER when src is already acceptable
 * on target: same device, same dtype, compact or AB_CONVERT_ALLOW_STRIDED_VIEW)
 * has data and byte_offset equal to src's, its own copy of shape and strides,
 * and IS_COPIED clear. It does not own the bytes: the caller must keep the
 * memory src points to alive, and unchanged if it wants the view unchanged,
 * until the view's deleter has run. The view's deleter frees only the view.
 *
 * Errors: AB_ERR_INVALID_ARGUMENT (malformed tensor or options),
 * AB_ERR_UNSUPPORTED (dtype or route not supported), AB_ERR_NO_DEVICE,
 * AB_ERR_OUT_OF_MEMORY, AB_ERR_COPY_REQUIRED, AB_ERR_BACKEND. On any error
 * *out is not written, src is unchanged and nothing is leaked. */
AB_API ab_status ab_convert_memory(const DLTensor *src, DLDevice target,
                                   const ab_convert_opts *opts,
                                   DLManagedTensorVersioned **out);

/* Allocates an owned, compact row-major tensor of `shape` (ndim entries;
 * may be NULL when ndim == 0) and `dtype` on `dev` (device_id may be
 * AB_DEVICE_AUTO). The contents are
 * uninitialised. strides are non-NULL, flags are 0. The caller calls
 * (*out)->deleter(*out) exactly once. */
AB_API ab_status ab_tensor_alloc(DLDevice dev, int32_t ndim,
                                 const int64_t *shape, DLDataType dtype,
                                 DLManagedTensorVersioned **out);

/* Validates a DLTensor as ab_convert_memory would, without touching its
 * data: AB_OK or the status and message the conversion would give. */
AB_API ab_status ab_tensor_validate(const DLTensor *t);

/* ---- legacy DLPack (0.x DLManagedTensor) -------------------------------- */

/* Wraps a legacy DLManagedTensor as a DLManagedTensorVersioned without
 * copying data. On success the new tensor takes ownership of `legacy`:
 * calling the new tensor's deleter runs legacy->deleter exactly once (if it
 * is not NULL). The new tensor shares `legacy`'s shape and strides arrays;
 * its flags are 0. On failure the caller still owns `legacy`. */
AB_API ab_status ab_from_legacy(DLManagedTensor *legacy,
                                DLManagedTensorVersioned **out);

/* Wraps a DLManagedTensorVersioned as a legacy DLManagedTensor without
 * copying data, taking ownership of `versioned` on success in the same way.
 * Fails with AB_ERR_UNSUPPORTED when versioned->version.major is not 1 or
 * when the tensor is read-only (legacy DLPack cannot say so); the caller
 * then still owns `versioned`. */
AB_API ab_status ab_to_legacy(DLManagedTensorVersioned *versioned,
                              DLManagedTensor **out);

/* ---- lifetime --------------------------------------------------------- */

/* Releases the library's global state (backend contexts, caches). Optional;
 * call it after every tensor the library made has been deleted and no other
 * thread is inside the library. The library re-initialises on next use. */
AB_API void ab_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* ARRAYBRIDGE_ARRAYBRIDGE_H */
