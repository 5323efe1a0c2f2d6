/** \file
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
 *  - All functions are thread-safe, except ab_shutdown (see there).
 */
#ifndef ARRAYBRIDGE_ARRAYBRIDGE_H
#define ARRAYBRIDGE_ARRAYBRIDGE_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#error "arraybridge needs DLPack >= 1.0 (dlpack/dlpack.h); Debian bookworm's libdlpack-dev is 0.6"
#endif

/* DLPack 1.0 declares the struct without a typedef; 1.1 adds one, but
 * some 1.1 headers lack it (TensorFlow's). C11 and C++ take the same
 * typedef twice, so they always get it; C99 cannot, and gets it for 1.0
 * only (a C99 program with such a 1.1 header needs C11). */
#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L)
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;
#elif DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION < 1
typedef struct DLManagedTensorVersioned DLManagedTensorVersioned;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** \cond IMPLEMENTATION */
/* A cast in the header's macros that C++ compilers take without
 * -Wold-style-cast warnings. */
#ifdef __cplusplus
#define AB_IMPL_CAST(type, value) (static_cast<type>(value))
#else
#define AB_IMPL_CAST(type, value) ((type)(value))
#endif

/* ab_device_info and ab_pool_stats name both a function and the struct it
 * fills (C and C++ code write `struct ab_pool_stats s;`); in C++, g++'s
 * -Wshadow says the function hides the struct's constructor. The names
 * stay: the warning is turned off for those two declarations only. */
#if defined(__cplusplus) && defined(__GNUC__)
#define AB_IMPL_SAME_NAME_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wshadow\"")
#define AB_IMPL_SAME_NAME_END _Pragma("GCC diagnostic pop")
#else
#define AB_IMPL_SAME_NAME_BEGIN
#define AB_IMPL_SAME_NAME_END
#endif
/** \endcond */

/** Marks the library's public functions: default symbol visibility with GCC
 * and Clang (the library is compiled with -fvisibility=hidden); on Windows
 * __declspec(dllexport) / __declspec(dllimport) when AB_BUILDING_SHARED /
 * AB_USING_SHARED is defined; empty otherwise. */
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

/** Major version of this header. */
#define AB_VERSION_MAJOR 0
/** Minor version of this header. */
#define AB_VERSION_MINOR 1
/** Patch version of this header. */
#define AB_VERSION_PATCH 0
/** Version of this header as one number: major * 10000 + minor * 100 + patch. */
#define AB_VERSION_NUMBER \
  (AB_VERSION_MAJOR * 10000 + AB_VERSION_MINOR * 100 + AB_VERSION_PATCH)
#define AB_STRINGIFY_(x) #x
/** Expands the macro argument x, then turns it into a string literal. */
#define AB_STRINGIFY(x) AB_STRINGIFY_(x)
/** Version of this header as a string literal, "major.minor.patch". */
#define AB_VERSION_STRING                                              \
  AB_STRINGIFY(AB_VERSION_MAJOR) "." AB_STRINGIFY(AB_VERSION_MINOR) "." \
  AB_STRINGIFY(AB_VERSION_PATCH)

/** The version of the library actually loaded (may differ from the header's
 * AB_VERSION_STRING when linked dynamically). Static string, never NULL. */
AB_API const char *ab_version_string(void);
/** AB_VERSION_NUMBER of the loaded library. */
AB_API unsigned ab_version_number(void);

/* ---- status codes ----------------------------------------------------- */

/** X(name, value, message). Values are fixed forever and never reused. */
#define AB_STATUS_MAP(X)                                                   \
  X(OK, 0, "success")                                                      \
  X(ERR_INVALID_ARGUMENT, 1, "invalid argument")                           \
  X(ERR_UNSUPPORTED, 2, "unsupported operation or data type")              \
  X(ERR_NO_DEVICE, 3, "no such device")                                    \
  X(ERR_OUT_OF_MEMORY, 4, "out of memory")                                 \
  X(ERR_COPY_REQUIRED, 5, "a copy is required but AB_COPY_NEVER was given") \
  X(ERR_BACKEND, 6, "backend (driver or runtime) error")                   \
  X(ERR_INTERNAL, 7, "internal error")

/** Status code returned by the library's functions: AB_OK (0) on success,
 * one of the AB_ERR_* values (from AB_STATUS_MAP) on failure. */
typedef enum ab_status {
#define AB_STATUS_ENUM_(name, value, msg) AB_##name = value,
  AB_STATUS_MAP(AB_STATUS_ENUM_)
#undef AB_STATUS_ENUM_
} ab_status;

/** \var AB_OK
 * Success. */
/** \var AB_ERR_INVALID_ARGUMENT
 * Invalid argument: a malformed tensor, option or parameter. */
/** \var AB_ERR_UNSUPPORTED
 * Unsupported operation or data type. */
/** \var AB_ERR_NO_DEVICE
 * No such device. */
/** \var AB_ERR_OUT_OF_MEMORY
 * Out of memory. */
/** \var AB_ERR_COPY_REQUIRED
 * A copy is required but AB_COPY_NEVER was given. */
/** \var AB_ERR_BACKEND
 * Backend (driver or runtime) error. */
/** \var AB_ERR_INTERNAL
 * Internal error. */

/** Short fixed description of a status ("out of memory"); a static string,
 * never NULL ("unknown status" for values not in the table). */
AB_API const char *ab_status_str(ab_status status);

/** Symbolic name of a status ("AB_ERR_OUT_OF_MEMORY"); static, never NULL. */
AB_API const char *ab_status_name(ab_status status);

/** Detail message of the last failure of an arraybridge call on the calling
 * thread: what was wrong, with the argument, value and device. Successful
 * calls leave it unchanged; "" before any failure. The string lives in
 * thread-local storage and stays valid until the next failing arraybridge
 * call on this thread. Never NULL. */
AB_API const char *ab_last_error(void);

/* ---- devices ---------------------------------------------------------- */

/** The largest ndim a tensor may have (NumPy 2's limit). */
#define AB_MAX_NDIM 64

/** A target device_id that lets the library choose: the device of that type
 * with the most free memory (total memory where the backend cannot tell
 * free memory, as OpenCL cannot; ties go to the lowest id). Not valid in a
 * source tensor. */
#define AB_DEVICE_AUTO (-1)

/** arraybridge's own device type, outside DLPack's numbering: the
 * page-locked ("pinned") host memory of OpenCL device `device_id`, which
 * the library allocates (buffers created with CL_MEM_ALLOC_HOST_PTR and
 * mapped) for staging buffers on routes through host memory, as it uses
 * cuda_host memory for CUDA. It has a pool like every device, so
 * ab_pool_stats, ab_pool_summary, ab_pool_trim, ab_set_memory_limit,
 * ab_device_info, ab_device_count and AB_MEMORY_LIMIT ("opencl_host:0=1GiB")
 * take it; no tensor is ever labelled with it, and ab_convert_memory,
 * ab_tensor_alloc and ab_tensor_validate refuse it (AB_ERR_INVALID_ARGUMENT).
 * Whether a device stages through it: docs/pools.md (AB_OPENCL_PINNED). */
#define AB_DEVICE_OPENCL_HOST AB_IMPL_CAST(DLDeviceType, 0x10004)

/** The name of a dtype as NumPy and the frameworks spell it: "bool",
 * "int8" .. "int64", "uint8" .. "uint64", "float16", "float32", "float64",
 * "bfloat16", "complex64", "complex128", with "x<lanes>" appended for any
 * lane count but one ("float32x4", and "x0" for an invalid 0); any other bits of a DLPack code by the
 * code's name: the bits appended for the int, uint, float, bfloat, complex
 * and bool codes ("int4"; "float8" is the float code with 8 bits, none of
 * the float8 formats, which have codes of their own), beside the others
 * ("float8_e4m3fn(bits 8)"); a code DLPack does not define as
 * "code C bits B".
 * Writes into buf (NUL-terminated, cut to len) and returns buf; nothing
 * when buf is NULL or len 0. Never fails. */
AB_API const char *ab_dtype_name(DLDataType dt, char *buf, size_t len);

/** The one-lane dtype a name gives, as ab_dtype_name writes them ("bool",
 * "int8" .. "complex128", and DLPack's other types of those codes:
 * "complex32", "int1", "int2", "int4", "uint1", "uint2", "uint4"), and DLPack's float8, float6 and float4 formats
 * at their own width, bare as the frameworks name them ("float8_e4m3fn",
 * "float4_e2m1fn") or as ab_dtype_name writes them ("float8_e4m3fn(bits
 * 8)"); no conversion casts to or from those formats. AB_OK and *out, or
 * AB_ERR_INVALID_ARGUMENT (out untouched) with a message listing the
 * names. */
AB_API ab_status ab_parse_dtype(const char *name, DLDataType *out);

/** Number of devices of a type: kDLCPU is always 1; a type whose backend is
 * not built in, or whose driver or devices are absent, is 0. Never fails. */
AB_API int32_t ab_device_count(DLDeviceType type);

/** The DLPack device types this build of the library serves, so that a
 * program can list devices without a list of its own: kDLCPU first, then
 * the type of every backend built in (kDLCUDA, kDLCUDAHost, kDLCUDAManaged
 * with the CUDA backend; kDLOpenCL with the OpenCL backend), whether or not
 * a device of the type is present (ab_device_count says how many are). The
 * library's private staging types (AB_DEVICE_OPENCL_HOST) are not listed.
 * Writes at most `max` types into `out` (which may be NULL when `max` is 0)
 * and returns how many there are in all. Never fails.
 *
 *     DLDeviceType types[16];
 *     int n = ab_device_types(types, 16);
 *     for (int k = 0; k < n && k < 16; k++)
 *       for (int32_t i = 0; i < ab_device_count(types[k]); i++) ...
 */
AB_API int ab_device_types(DLDeviceType *out, int max);

/** Description of one device. Sizes are in bytes; 0 means unknown. */
struct ab_device_info {
  DLDevice device;    /**< the device described */
  char name[128];     /**< e.g. the CPU model, "NVIDIA H100 80GB HBM3" */
  char backend[16];   /**< "host", "cuda", "opencl" */
  char vendor[64];    /**< "" when the backend does not say; for cpu:0
                           /proc/cpuinfo's vendor_id ("GenuineIntel",
                           "AuthenticAMD"; "" where it has none) */
  char version[64];   /**< driver/platform version string, "" when unknown;
                           for OpenCL "OpenCL <x.y>, driver <its
                           CL_DRIVER_VERSION>"; for cpu:0 the host
                           kernels, threads and streaming-store choice
                           in use */
  uint64_t total_memory; /**< memory of the device */
  uint64_t free_memory;  /**< memory free now (0 on OpenCL, which cannot tell) */
  uint64_t max_alloc_size; /**< largest single allocation, 0 = unknown */
  /** tensor data of this device is a host pointer host code may use */
  int host_accessible;
  /** the device's memory is physically the host's (OpenCL CPU devices,
   * integrated GPUs), even when data is an opaque handle */
  int unified_memory;
  /** CUDA devices: the compute capability as major * 10 + minor (90 for
   * sm_90) and the PCI bus id ("0000:1b:00.0"); 0 and "" elsewhere */
  int compute_capability;
  char pci_bus_id[32]; /**< CUDA devices: the PCI bus id; "" elsewhere */
};

/** Fills *out for `dev`. AB_ERR_NO_DEVICE when the device does not exist
 * (type not built in, or id past the last device); AB_ERR_INVALID_ARGUMENT
 * for a NULL out, an unknown device type or a negative id (AB_DEVICE_AUTO
 * included: ask about a concrete device). */
AB_IMPL_SAME_NAME_BEGIN
AB_API ab_status ab_device_info(DLDevice dev, struct ab_device_info *out);
AB_IMPL_SAME_NAME_END

/** Short lower-case name of a device type ("cpu", "cuda", "cuda_host",
 * "opencl", ...; "opencl_host" for AB_DEVICE_OPENCL_HOST); "unknown" for
 * values DLPack does not define. Static. */
AB_API const char *ab_device_type_name(DLDeviceType type);

/** Parses a device string: a type name as ab_device_type_name gives it
 * (case-insensitive), optionally followed by ":" and a decimal id or
 * "auto" (AB_DEVICE_AUTO): "cpu", "cuda:1", "opencl:0", "cuda:auto".
 * Without an id the device is 0. Only the syntax is checked, not whether
 * the device exists (ab_device_info tells that).
 * On success writes *out; AB_ERR_INVALID_ARGUMENT (out untouched, the
 * message quotes the string and says what is wrong) otherwise. */
AB_API ab_status ab_parse_device(const char *text, DLDevice *out);

/** Parses a byte count as AB_MEMORY_LIMIT and the other size variables
 * read it: decimal digits, then optionally one suffix, case-sensitive:
 * "B"; binary "K", "KiB", "M", "MiB", "G", "GiB", "T", "TiB"; decimal
 * "KB", "MB", "GB", "TB" (powers of 1000). "512MiB", "2GB", "4096".
 * On success writes *bytes; AB_ERR_INVALID_ARGUMENT (bytes untouched, the
 * message quotes the text) for anything else, a count past 2^64 - 1
 * included. */
AB_API ab_status ab_parse_size(const char *text, uint64_t *bytes);

/** The best device for work: the AB_DEFAULT_DEVICE environment variable
 * when it is set and names a device that exists and tensors may live on (a
 * device string, read at every call; not AB_DEVICE_OPENCL_HOST); else the
 * accelerator with the most memory to offer, an accelerator being a device
 * whose memory is its own (not host memory such as cuda_host, nor the
 * host's RAM as an OpenCL CPU device's is): devices that report their free
 * memory (CUDA GPUs) come first, by free memory, then the others (OpenCL
 * GPUs) by total memory; else cpu:0. For the "cuda if available else cpu"
 * pattern. Never fails; never leaves an error message behind. */
AB_API DLDevice ab_best_device(void);

/** Loads the device drivers the library will use into the process, without
 * initialising them, in the way that keeps them apart from other libraries:
 * OpenCL drivers (ICDs, such as PoCL, which links LLVM) are opened with
 * RTLD_DEEPBIND, so that their LLVM does not bind to another copy already
 * in the process (TensorFlow's, which crashes PoCL's initialisers).
 *
 * The library does this itself before its first OpenCL call. Call it
 * earlier, before another library in the process (pyclesperanto, or any
 * ICD loader user) opens the same drivers, when that other library may be
 * loaded after one that holds LLVM: the Python module calls it at import.
 * Once per process; further calls do nothing. Never fails. Skipped in
 * builds with AddressSanitizer or ThreadSanitizer and in a process where a
 * sanitizer runtime is loaded (they refuse RTLD_DEEPBIND), in a process
 * whose malloc is not libc's (jemalloc, tcmalloc, mimalloc, linked or
 * preloaded: a driver opened with RTLD_DEEPBIND frees their blocks with
 * libc's free, and aborts), and when AB_OPENCL_DEEPBIND is 0 (or off,
 * false, no). Where it is skipped, the ICD loader opens the drivers as it
 * would without this library; but where malloc is not libc's and another
 * LLVM is in the global scope at the first OpenCL call, the OpenCL backend
 * has no devices instead (AB_ERR_NO_DEVICE, saying why), since opening PoCL
 * then would crash. AB_OPENCL_DEEPBIND=1 preloads even under a replacement
 * malloc. */
AB_API void ab_preload_drivers(void);

/** Notes that another library in this process has started the driver
 * behind `type` (kDLOpenCL, kDLCUDA, or any type of the same driver):
 * pyclesperanto, say, starts OpenCL at its import, before or without any
 * arraybridge call. A driver does not survive fork: its threads (PoCL's
 * workers) stay in the parent, and a forked child's first call into it
 * waits for them for ever. arraybridge's own start counts by itself; after
 * this note, a process forked from this one (or from a child of it) also
 * has no devices of that driver's backends (AB_ERR_NO_DEVICE, whose
 * message says so and names 'spawn'), arraybridge started or not; host
 * moves work there as before. Nothing changes in this process. Call it
 * before forking (the Python module does, at each fork, while
 * pyclesperanto is imported). AB_ERR_INVALID_ARGUMENT for kDLCPU;
 * AB_ERR_NO_DEVICE for a type with no backend in this build. */
AB_API ab_status ab_note_driver_started(DLDeviceType type);

/* ---- conversion ------------------------------------------------------- */

/** Copy semantics of ab_convert_memory, as the array API's
 * from_dlpack(copy=None/True/False). */
typedef enum ab_copy_mode {
  AB_COPY_IF_NEEDED = 0, /**< view when possible, copy otherwise */
  AB_COPY_ALWAYS = 1,    /**< always a fresh, owned copy */
  AB_COPY_NEVER = 2      /**< view or AB_ERR_COPY_REQUIRED */
} ab_copy_mode;

/** Bits of ab_convert_opts.flags. Unknown bits are rejected. */
enum {
  /** With AB_COPY_IF_NEEDED / AB_COPY_NEVER, also accept a non-compact
   * source (any strides) on the same device as a view with its strides. */
  AB_CONVERT_ALLOW_STRIDED_VIEW = 1u << 0,
  /** Mark the result DLPACK_FLAG_BITMASK_READ_ONLY. */
  AB_CONVERT_READ_ONLY = 1u << 1,
  /** Apply y = x * opts.scale + opts.offset to every element. */
  AB_CONVERT_AFFINE = 1u << 2,
  /** Apply y = x * channel_scale[c] + channel_offset[c] along
   * opts.channel_axis (replaces scale/offset). */
  AB_CONVERT_PER_CHANNEL = 1u << 3,
  /** Return early: where the whole move is one operation queued on the
   * stream (see ab_convert_opts.stream), the call returns once it is
   * queued, not when the data has arrived. That is so for a copy or a
   * device conversion within one CUDA GPU, a peer copy on a stream of the
   * target GPU, a copy, gather or conversion within one OpenCL device on
   * an in-order queue the caller gave, and a compact transfer between a
   * CUDA GPU and page-locked or managed memory (a kDLCUDAHost or
   * kDLCUDAManaged tensor, a result there, or host memory registered with
   * CUDA). Every other route completes before the call returns, as
   * without the flag (docs/guide.md, "Returning early", has the table).
   *
   * After an early return, until the work queued on the stream has
   * completed (ab_synchronize(dev, opts.stream), where dev is the device
   * the stream belongs to):
   *  - the result may be read only by work queued after it on that stream;
   *  - the source must stay alive and must not be written;
   *  - the result's deleter must not run, even if only later work on the
   *    stream reads the result (its memory goes back to the library's
   *    pool and may be handed out at once).
   * A failure is reported by the call, after the work already queued has
   * been waited for; an error of the queued work itself shows up in the
   * stream (CUDA: the next call that synchronises it; OpenCL: the queue's
   * events). */
  AB_CONVERT_ASYNC = 1u << 4
};
/** Every AB_CONVERT_* bit this version knows. */
#define AB_CONVERT_KNOWN_FLAGS                                                                  \
  AB_IMPL_CAST(uint32_t, AB_CONVERT_ALLOW_STRIDED_VIEW | AB_CONVERT_READ_ONLY | AB_CONVERT_AFFINE | \
                             AB_CONVERT_PER_CHANNEL | AB_CONVERT_ASYNC)

/** Options of ab_convert_memory. A NULL pointer and an all-zero struct both
 * mean the defaults (copy if needed, keep the dtype, default stream).
 *
 * Growth rule: later versions append fields. `size` tells the library how
 * much of the struct the caller knows: set it to sizeof(ab_convert_opts)
 * (AB_CONVERT_OPTS_INIT does) to use fields added after version 0.1; 0 means
 * "only the 0.1 fields below", so zero-initialised structs compiled against
 * any version keep meaning the defaults. Fields past `size` are read as 0;
 * AB_CONVERT_AFFINE and AB_CONVERT_PER_CHANNEL, whose numbers are such
 * fields, are refused (AB_ERR_INVALID_ARGUMENT) when `size` is 0. A `size`
 * above 4096 (no version's struct will be that large: an uninitialised
 * struct) is AB_ERR_INVALID_ARGUMENT, read no further. */
typedef struct ab_convert_opts {
  uint32_t size;      /**< 0 or sizeof(ab_convert_opts) (older layouts' sizes: docs/guide.md) */
  uint32_t flags;     /**< AB_CONVERT_* bits */
  ab_copy_mode copy;  /**< copy semantics; 0 is AB_COPY_IF_NEEDED */
  /** Result dtype; bits == 0 keeps the source dtype. Another dtype is
   * converted on the way: the rules (rounding half to even, saturation,
   * NaN to 0 for integers, float16/bfloat16 rounding) are in docs/guide.md,
   * "Converting on the way"; complex converts only to complex, and a pair
   * the library cannot convert is AB_ERR_UNSUPPORTED naming both. */
  DLDataType dtype;
  /** Backend stream (cudaStream_t, cl_command_queue) or NULL for the default
   * (CUDA: the legacy default stream; the DLPack values 1 and 2 are
   * cudaStreamLegacy and cudaStreamPerThread). It belongs to the target's
   * backend, or to the source's when the target is host memory (cpu,
   * kDLCUDAHost or kDLCUDAManaged), and is given only to that backend's
   * steps; ignored by the host backend. A CUDA stream must belong to that
   * GPU (the target's, or the source's when the target is host memory).
   * The call returns
   * when the data has arrived either way, unless AB_CONVERT_ASYNC says
   * otherwise; an OpenCL queue of another context than a buffer's, or an
   * out-of-order one, is finished first and not used (docs/guide.md). */
  void *stream;

  /* ---- appended after the first layout (size 0 or the 0.1 size means
   * none of them): read only when size covers them ---- */

  /** Result axis i is source axis permute[i] (NumPy's transpose(axes)):
   * {2, 0, 1} turns an HWC image into CHW. NULL keeps the order; otherwise
   * src->ndim distinct entries in [0, ndim), read during the call only.
   * The result is compact in the new order. */
  const int32_t *permute;
  /** With AB_CONVERT_AFFINE: y = x * scale + offset. */
  double scale, offset; /**< see scale */
  /** With AB_CONVERT_PER_CHANNEL: y = x * channel_scale[c] + channel_offset[c]
   * where c is the element's index along source axis channel_axis; arrays
   * of src->shape[channel_axis] entries, NULL for all 1 / all 0, read
   * during the call only. Mean/std normalisation of a 0..255 image is
   * scale = 1 / (255 * std), offset = -mean / std. */
  int32_t channel_axis;
  const double *channel_scale;  /**< see channel_axis */
  const double *channel_offset; /**< see channel_axis */

  /* ---- since threads were added: read only when size covers it ---- */

  /** Threads a large host move (gather, cast, copy in host memory) may
   * use: 0 = the library's default (AB_NUM_THREADS, else the cores the
   * process may run on: its CPU affinity), 1 = the calling thread only,
   * n = up to n (more than 64 is taken as 64). Each thread of a move gets
   * at least AB_PARALLEL_MIN bytes of its result (default 256 KiB), so
   * moves below twice that stay on the calling thread whatever this says.
   * With AB_PARALLEL_MIN unset, a move of less than 1 MiB a thread takes
   * as few threads as 1 MiB a thread would give it unless the first calls
   * of its kind and size, timed on both numbers, found the more 10%
   * faster; the pick is the process's, timed again every 1024th call, and
   * made for the first value of this field that asked (calls with another
   * value take 256 KiB a thread) (docs/performance.md, "Threads"). The
   * result is the same bytes either way. A call runs on no more threads
   * than this allows, whatever workers earlier calls started. Workers
   * with no job spin AB_THREAD_SPIN_US microseconds (default 100; 0:
   * none) before they sleep, so calls back to back skip the wake-up. */
  uint32_t threads;
} ab_convert_opts;

/** Initialiser of an ab_convert_opts: size set, every option at its default. */
#define AB_CONVERT_OPTS_INIT \
  {sizeof(ab_convert_opts), 0, AB_COPY_IF_NEEDED, {0, 0, 0}, NULL, NULL, 0, 0, 0, NULL, NULL, 0}

/** Returns a tensor with the contents of `src` on `target`.
 *
 * src:    a DLTensor on any device the library knows; validated before any
 *         byte of it is read (see docs/guide.md for what is accepted). A
 *         kDLCPU tensor is host memory whatever its device_id >= 0 (JAX
 *         exports its CPU devices' indices there); a view of it is cpu:0.
 *         Never modified, not retained after the call returns except as
 *         described for views below.
 * target: the device; device_id AB_DEVICE_AUTO picks one (see above).
 * opts:   NULL for the defaults.
 * out:    on success *out is a new DLManagedTensorVersioned owned by the
 *         caller, who must call (*out)->deleter(*out) exactly once.
 *
 * A copy is compact row-major, with non-NULL strides when ndim > 0 (DLPack
 * 1.2; a scalar has NULL shape and strides), its own
 * shape and strides arrays, byte_offset 0, data NULL when the tensor has no
 * elements, and flags DLPACK_FLAG_BITMASK_IS_COPIED. Host data is aligned
 * to 256 bytes (4096 from 64 KiB up); on OpenCL, data is a cl_mem buffer of
 * the library's context.
 *
 * A view (AB_COPY_IF_NEEDED or AB_COPY_NEVER when src is already acceptable
 * on target: same device, same dtype, compact or AB_CONVERT_ALLOW_STRIDED_VIEW)
 * has data and byte_offset equal to src's, its own copy of shape, strides
 * of its own (src's where src is strided; the compact ones, addressing the
 * same bytes, where src is compact, so a size-1 dimension's stride may
 * differ from src's), and IS_COPIED clear. It does not own the bytes:
 * the caller must keep the memory src points to alive, and unchanged if
 * it wants the view unchanged, until the view's deleter has run. The
 * view's deleter frees only the view.
 *
 * Errors: AB_ERR_INVALID_ARGUMENT (malformed tensor or options),
 * AB_ERR_UNSUPPORTED (dtype or route not supported), AB_ERR_NO_DEVICE,
 * AB_ERR_OUT_OF_MEMORY, AB_ERR_COPY_REQUIRED, AB_ERR_BACKEND. On any error
 * *out is not written, src is unchanged and nothing is leaked. */
AB_API ab_status ab_convert_memory(const DLTensor *src, DLDevice target,
                                   const ab_convert_opts *opts,
                                   DLManagedTensorVersioned **out);

/** Converts src into memory the caller already has: the existing tensor
 * dst, on dst's device, with the same routes, casts and maps as
 * ab_convert_memory (opts as there; NULL = defaults).
 *
 * dst must be a valid, compact row-major tensor on a concrete device (not
 * AB_DEVICE_AUTO; a kDLCPU one is host memory whatever its id, as src's
 * is), writable, not sharing bytes with src, with the result's
 * shape (src's, permuted by opts->permute) and dtype (opts->dtype may name
 * dst's dtype or be left unset; the result takes dst's). A view of part of
 * a larger buffer (a plane of a stack, by byte_offset) is fine. dst may be
 * memory of another library, such as an OpenCL buffer of another context:
 * bytes then reach it through host memory.
 *
 * Ownership: nothing changes hands; both tensors stay the caller's. The
 * call returns when the bytes are in dst (with AB_CONVERT_ASYNC and a
 * one-step route, when they are queued on opts->stream, as for
 * ab_convert_memory).
 *
 * Errors: those of ab_convert_memory; AB_ERR_INVALID_ARGUMENT for a dst
 * that is malformed, strided, of another shape or dtype, overlapping src
 * (checked by address for host and CUDA memory, pointers into one
 * allocation included, and for bytes of one OpenCL buffer, its
 * sub-buffers included), or opts with AB_CONVERT_READ_ONLY;
 * AB_ERR_COPY_REQUIRED for AB_COPY_NEVER. On error, src is unchanged; dst
 * may have been partly written. */
AB_API ab_status ab_convert_into(const DLTensor *src, const DLTensor *dst,
                                 const ab_convert_opts *opts);

/** Waits until the work queued on `stream` of `dev`'s backend is complete
 * (CUDA: cudaStreamSynchronize on that device, NULL the legacy default
 * stream; OpenCL: clFinish of the queue, NULL the library's queue for
 * dev; host memory: nothing to wait for). For consumers that take a
 * producer's memory zero-copy and then read it from another stream or
 * from the host. AB_ERR_NO_DEVICE / AB_ERR_INVALID_ARGUMENT for a bad
 * device, AB_ERR_BACKEND when the driver reports an error (CUDA, NULL
 * stream: where the event the wait records cannot be made or recorded,
 * the call still waits for the legacy stream's own work before it fails,
 * not for other blocking streams). */
AB_API ab_status ab_synchronize(DLDevice dev, void *stream);

/** Whether device `to` reaches the memory of device `from` directly, so
 * that copies between them need no trip through host memory: for two CUDA
 * GPUs, cudaDeviceCanAccessPeer (peer access is then enabled on first use),
 * but 0 where AB_CUDA_PEER=0 keeps it off or enabling it was refused (the
 * driver stages those copies; see docs/guide.md); for one device with
 * itself, 1; otherwise 0. Two OpenCL devices give 0 even in one context, where a
 * copy between them is one clEnqueueCopyBuffer (ab_explain_route shows
 * it): OpenCL does not say whether the driver stages it through host
 * memory. On success writes 0 or 1 to *can;
 * AB_ERR_INVALID_ARGUMENT for a NULL can, AB_ERR_NO_DEVICE for a device
 * that does not exist. */
AB_API ab_status ab_peer_access(DLDevice from, DLDevice to, int *can);

/** Writes into buf a description of the plan ab_convert_memory(src, target,
 * NULL, ...) would run: the devices, the byte count, and each step (views,
 * backend copies, host packs, uploads and downloads, with the memory they
 * stage in), one per line (a copy of no elements has no step: nothing
 * moves). Nothing is allocated on any device and no byte of src is read.
 * For users who want to know why a transfer is slow.
 *
 * buf/len: as snprintf: at most len bytes including the terminating NUL;
 * a longer text is cut. buf may be NULL only when len is 0: the call then
 * only says whether the plan stands, without composing the text.
 * Returns AB_OK, or the status ab_convert_memory would fail with before
 * moving data (invalid tensor, missing device, no route); buf is then
 * not written. */
AB_API ab_status ab_explain_route(const DLTensor *src, DLDevice target, char *buf, size_t len);

/** ab_explain_route for ab_convert_memory(src, target, opts, ...): with a
 * dtype, an affine map or a permutation in `opts` (NULL: the defaults), it
 * also says where the conversion runs (on the host, or on which device,
 * and how many bytes that saves on the link), as AB_CONVERT_PLACE and the
 * devices' kernels decide. Asking a device whether it can convert may
 * build its kernels once; no tensor memory is allocated and no byte of src
 * is read. Same buffer rules and errors as ab_explain_route, plus
 * AB_ERR_INVALID_ARGUMENT / AB_ERR_UNSUPPORTED for options
 * ab_convert_memory would refuse. */
AB_API ab_status ab_explain_convert(const DLTensor *src, DLDevice target, const ab_convert_opts *opts, char *buf,
                                    size_t len);

/** Allocates an owned, compact row-major tensor of `shape` (ndim entries;
 * may be NULL when ndim == 0) and `dtype` on `dev` (device_id may be
 * AB_DEVICE_AUTO). The contents are
 * uninitialised. strides are non-NULL when ndim > 0, flags are 0. The caller calls
 * (*out)->deleter(*out) exactly once. */
AB_API ab_status ab_tensor_alloc(DLDevice dev, int32_t ndim,
                                 const int64_t *shape, DLDataType dtype,
                                 DLManagedTensorVersioned **out);

/** Validates a DLTensor as ab_convert_memory would, without touching its
 * data: AB_OK or the status and message the conversion would give. */
AB_API ab_status ab_tensor_validate(const DLTensor *t);

/* ---- legacy DLPack (0.x DLManagedTensor) -------------------------------- */

/** Wraps a legacy DLManagedTensor as a DLManagedTensorVersioned without
 * copying data. On success the new tensor takes ownership of `legacy`:
 * calling the new tensor's deleter runs legacy->deleter exactly once (if it
 * is not NULL). The new tensor shares `legacy`'s shape and strides arrays;
 * its flags are 0, except that a tensor which ab_to_legacy made is
 * unwrapped: the original versioned tensor comes back, flags included,
 * with the wrapper's DLTensor as it is now (a consumer may have moved its
 * byte_offset, say). On failure the caller still owns `legacy`. */
AB_API ab_status ab_from_legacy(DLManagedTensor *legacy,
                                DLManagedTensorVersioned **out);

/** Wraps a DLManagedTensorVersioned as a legacy DLManagedTensor without
 * copying data, taking ownership of `versioned` on success in the same way
 * (a tensor which ab_from_legacy made is unwrapped likewise, with the
 * wrapper's DLTensor as it is now). Fails with AB_ERR_UNSUPPORTED when versioned->version.major is not 1 or
 * when the tensor is read-only or has padded sub-byte elements (legacy
 * DLPack cannot say so); the caller then still owns `versioned`. */
AB_API ab_status ab_to_legacy(DLManagedTensorVersioned *versioned,
                              DLManagedTensor **out);

/* ---- memory pools --------------------------------------------------------
 *
 * Every device (DLDevice; the host is cpu:0) has a caching pool, created on
 * first use. Data blocks of tensors the library makes come from it, and a
 * tensor's deleter gives its block back to the pool for reuse instead of to
 * the driver. Sizes are rounded to size classes: multiples of 256 bytes up
 * to 4 KiB, then 8 classes per power of two (at most 12.5% rounding) up to
 * 32 MiB, then multiples of 2 MiB. A pool of memory the host reaches (cpu,
 * pinned and managed CUDA memory, unified-memory devices) keeps at most
 * four times the most it has had in use (and at least 512 MiB) of cached
 * blocks over 32 MiB, giving the oldest unused ones back to the driver
 * past that; a discrete device's memory stays cached until a trim or the
 * OOM sequence. See docs/pools.md.
 *
 * When an allocation fails, or would take the pool's reserved bytes past its
 * limit, the pool (1) uses any cached block big enough (where the limit
 * refused and a release makes room, one of at most twice the request's
 * size), (2) returns its cached blocks to the driver and retries, (3) calls
 * the registered OOM
 * callbacks, releases what they gave back, and retries, for at most
 * AB_OOM_MAX_CALLBACK_ROUNDS rounds while they report progress, and then
 * (4) fails with AB_ERR_OUT_OF_MEMORY and a message with the numbers. A
 * size the driver refuses for itself (OpenCL: past
 * CL_DEVICE_MAX_MEM_ALLOC_SIZE), which no release could cure, fails with
 * AB_ERR_OUT_OF_MEMORY without steps 1-3, after one try at the request's
 * own size where its class alone was past it. */

/** A gauge: the value now and its highest value since the last reset. */
typedef struct ab_gauge {
  uint64_t current; /**< the value now */
  uint64_t peak;    /**< the highest value since the last reset */
} ab_gauge;

/** The statistics of one pool, listed once here. Gauges, in bytes:
 *   in_use_bytes     blocks held by live tensors (the blocks' sizes)
 *   requested_bytes  what those tensors asked for (before rounding)
 *   reserved_bytes   obtained from the driver: in use plus cached
 * Counters, since the pool was created:
 *   allocations, frees      blocks handed out and given back
 *   cache_hits, cache_misses  requests served from the cache or not (every
 *                    request counts as one, so hits + misses = allocations
 *                    + the requests that failed, out of memory or not)
 *   backend_allocs, backend_frees  raw driver allocations and releases
 *   oom_retries      retries after a failed or over-limit allocation
 *   oom_failures     allocations that failed with AB_ERR_OUT_OF_MEMORY, and
 *                    conversions that ran out at a buffer's first use
 *                    (OpenCL; no failed request: docs/pools.md)
 *   trims            ab_pool_trim calls and OOM cache releases */
#define AB_POOL_GAUGE_FIELDS(F) F(in_use_bytes) F(requested_bytes) F(reserved_bytes)
/** The counter fields of ab_pool_stats (described at AB_POOL_GAUGE_FIELDS). */
#define AB_POOL_COUNTER_FIELDS(F)                                               \
  F(allocations) F(frees) F(cache_hits) F(cache_misses) F(backend_allocs)       \
  F(backend_frees) F(oom_retries) F(oom_failures) F(trims)

/** Statistics of one device's pool, as ab_pool_stats() fills them. The
 * gauges and counters are listed at AB_POOL_GAUGE_FIELDS. */
struct ab_pool_stats {
  /** The caller sets size = sizeof(struct ab_pool_stats); the library fills
   * at most that many bytes (fields are only ever appended) and sets size
   * to the number it filled. */
  uint32_t size;
  DLDevice device;        /**< the pool's device */
  uint64_t limit_bytes;   /**< 0 = no limit */
  uint64_t cached_blocks; /**< blocks waiting in the cache */
#define AB_POOL_GAUGE_DECL_(name) ab_gauge name;
  AB_POOL_GAUGE_FIELDS(AB_POOL_GAUGE_DECL_)
#undef AB_POOL_GAUGE_DECL_
#define AB_POOL_COUNTER_DECL_(name) uint64_t name;
  AB_POOL_COUNTER_FIELDS(AB_POOL_COUNTER_DECL_)
#undef AB_POOL_COUNTER_DECL_
};

/** \var ab_pool_stats::in_use_bytes
 * Bytes of blocks held by live tensors: each block's size, the request
 * rounded up, or more where a bigger cached block served it, or the
 * request's own size where only that fit (docs/pools.md). */
/** \var ab_pool_stats::requested_bytes
 * Bytes those tensors asked for (before rounding). */
/** \var ab_pool_stats::reserved_bytes
 * Bytes obtained from the driver: in use plus cached. */
/** \var ab_pool_stats::allocations
 * Blocks handed out. */
/** \var ab_pool_stats::frees
 * Blocks given back. */
/** \var ab_pool_stats::cache_hits
 * Requests served from the cache. */
/** \var ab_pool_stats::cache_misses
 * Requests not served from the cache: a driver allocation, or a failure
 * (hits + misses = allocations + the requests that failed). */
/** \var ab_pool_stats::backend_allocs
 * Raw driver allocations. */
/** \var ab_pool_stats::backend_frees
 * Raw driver releases. */
/** \var ab_pool_stats::oom_retries
 * Retries after a failed or over-limit allocation. */
/** \var ab_pool_stats::oom_failures
 * Allocations that failed with AB_ERR_OUT_OF_MEMORY, and conversions that
 * ran out of memory at a buffer's first use (which fail no request). */
/** \var ab_pool_stats::trims
 * ab_pool_trim calls and OOM cache releases. */

/** Fills *out with `dev`'s pool statistics (all zero but device if nothing
 * was allocated there yet). Counters and current values are exact at the
 * moment of the call, the threads' caches summed in; a peak is exact while
 * no thread but the one allocating holds idle blocks in its cache of the
 * pool (always with AB_POOL_THREAD_CACHE=0), and otherwise may overstate
 * by the blocks idle in the other threads' caches (at most 1 MiB and one
 * larger block per thread; docs/pools.md).
 * AB_ERR_INVALID_ARGUMENT for NULL out or an out->size that does not cover
 * the size field itself (0-3); AB_ERR_NO_DEVICE for a device that does not
 * exist. */
AB_IMPL_SAME_NAME_BEGIN
AB_API ab_status ab_pool_stats(DLDevice dev, struct ab_pool_stats *out);
AB_IMPL_SAME_NAME_END

/** Sets every gauge's peak to its current value. */
AB_API ab_status ab_pool_reset_peak(DLDevice dev);

/** Writes a human-readable table of the pool's statistics (like PyTorch's
 * memory_summary) into buf, NUL-terminated and truncated to len bytes.
 * AB_ERR_INVALID_ARGUMENT for a NULL buf or a len of 0 (unlike
 * ab_explain_route, there is no length to ask for: any len works);
 * AB_ERR_NO_DEVICE for a device that does not exist, buf then untouched. */
AB_API ab_status ab_pool_summary(DLDevice dev, char *buf, size_t len);

/** Returns every cached, unused block of `dev`'s pool to the driver (what
 * torch.cuda.empty_cache() does). Blocks held by live tensors stay. */
AB_API ab_status ab_pool_trim(DLDevice dev);

/** ab_pool_trim on every pool that exists. */
AB_API void ab_pool_trim_all(void);

/** Caps the bytes `dev`'s pool may reserve from the driver; 0 removes the
 * cap. The cap is checked when the pool would grow, at the block's size
 * (the request rounded up to its size class: up to 12.5% more, 2 MiB steps
 * above 32 MiB, where a request that fits only unrounded gets a block of
 * its own size; docs/pools.md): an allocation that would take the pool
 * past it runs the OOM sequence as a driver failure does. Lowering it
 * below what is reserved frees nothing by itself, and blocks already
 * cached are still handed out (ab_pool_trim frees them). The
 * environment variable AB_MEMORY_LIMIT sets limits at first use, e.g.
 * "cuda:0=8GiB,opencl:1=512MiB,cpu=2GiB" (a type without ":id" means every
 * device of that type; see docs/pools.md). */
AB_API ab_status ab_set_memory_limit(DLDevice dev, size_t bytes);

/** An OOM callback: asked to free memory on `dev` because `requested` bytes
 * could not be allocated; returns how many bytes it believes it freed (0 =
 * nothing). Called on the allocating thread with no library lock held, so
 * it may delete tensors. It must not itself allocate from the library. */
typedef size_t (*ab_oom_callback)(DLDevice dev, size_t requested, void *user);

/** The most rounds of callbacks one allocation runs while they report
 * progress but the allocation still fails. */
#define AB_OOM_MAX_CALLBACK_ROUNDS 4
/** The most callbacks registered at once. */
#define AB_OOM_MAX_CALLBACKS 32

/** Registers fn(user) to run, in registration order, during the OOM
 * sequence. AB_ERR_INVALID_ARGUMENT for NULL fn or a pair already
 * registered; AB_ERR_UNSUPPORTED past AB_OOM_MAX_CALLBACKS. */
AB_API ab_status ab_register_oom_callback(ab_oom_callback fn, void *user);

/** Removes a registered (fn, user) pair; AB_ERR_INVALID_ARGUMENT if absent.
 * A callback already running on another thread may still finish. */
AB_API ab_status ab_unregister_oom_callback(ab_oom_callback fn, void *user);

/* ---- lifetime --------------------------------------------------------- */

/** Releases the library's global state (pools and their cached blocks,
 * backend contexts). Optional; call it after every tensor the library made
 * has been deleted and no other thread is inside the library. (A tensor
 * still alive is tolerated: its memory is released when it is deleted.) Limits set
 * with ab_set_memory_limit are forgotten; OOM callbacks stay registered.
 * The library re-initialises on next use, reading AB_MEMORY_LIMIT,
 * AB_OPENCL_PLATFORM, AB_OPENCL_DEVICE_TYPE and AB_OPENCL_PINNED again;
 * most others keep the values first read (docs/guide.md, "Environment
 * variables", says which). */
AB_API void ab_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* ARRAYBRIDGE_ARRAYBRIDGE_H */
