/* The OpenCL backend on real devices (PoCL in CI, with
 * POCL_DEVICES="pthread pthread" giving two). Every test skips, saying why,
 * when the devices it needs are absent; the test registered with an empty
 * OCL_ICD_VENDORS directory checks that absence is handled. */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef AB_HAVE_OPENCL
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#endif

#include "internal.h"
#include "pool.h"
#include "converters/host/convert.h"
#include "support.h"

#define CL(i) ((DLDevice){kDLOpenCL, (i)})

static void need_devices(int n) { need_devices_of(kDLOpenCL, n); }

/* No OpenCL device: a conversion to opencl:0 is AB_ERR_NO_DEVICE, the
 * caller's pointer untouched, and the message has both words. */
static void no_opencl_device_says(const char *a, const char *b) {
  cr_assert_eq(ab_device_count(kDLOpenCL), 0);
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&t, CL(0), NULL, &r), AB_ERR_NO_DEVICE);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), a), "message: %s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), b), "message: %s", ab_last_error());
}

Test(opencl, absent_platform_means_zero_devices_and_a_clear_error) {
  if (getenv("AB_TEST_EXPECT_NO_OPENCL") == NULL)
    cr_skip_test("only meaningful with OCL_ICD_VENDORS pointing at an empty directory (the opencl_absent test)");
  no_opencl_device_says("opencl", "OpenCL platform");
}

/* No ICD loader to open (AB_OPENCL_LIBRARY naming a file that is not
 * there, as on a machine with no OpenCL installed: the opencl_no_loader
 * test): no OpenCL device, every call that names one refused with a
 * status that says which loader was missing, nothing called through the
 * pointers the loader would have filled, and the host unharmed. */
Test(opencl, no_loader_means_zero_devices_and_says_which) {
  const char *lib = getenv("AB_OPENCL_LIBRARY");
  if (getenv("AB_TEST_EXPECT_NO_LOADER") == NULL || lib == NULL)
    cr_skip_test("only meaningful with AB_OPENCL_LIBRARY naming no file (the opencl_no_loader test)");
  cr_assert_eq(ab_device_count(kDLCPU), 1);
  no_opencl_device_says("ICD loader", "could not be opened");
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  /* an OpenCL tensor handed in (its data no cl_mem: nothing may look at it) */
  DLTensor c = {(void *)(uintptr_t)0x1000, CL(0), 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_tensor_validate(&c), AB_ERR_NO_DEVICE, "%s", ab_last_error());
  cr_assert_eq(ab_convert_memory(&c, CPU0, NULL, &r), AB_ERR_NO_DEVICE, "%s", ab_last_error());
  cr_assert_eq(r, SENTINEL_OUT);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CL(0), &info), AB_ERR_NO_DEVICE);
  struct ab_pool_stats ps = {.size = sizeof ps};
  cr_assert_neq(ab_pool_stats(CL(0), &ps), AB_OK);
  cr_assert_neq(ab_synchronize(CL(0), NULL), AB_OK);
  /* the host converts as ever */
  DLTensor h = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(memcmp(r->dl_tensor.data, v, sizeof v), 0);
  r->deleter(r);
}

/* AB_OPENCL_DEVICE_TYPE went into the message raw and whole: a newline and
 * 500 two-byte characters there left the message cut inside a character
 * and short of what it explains. Needs no device: the value is refused
 * before any driver is asked. */
Test(opencl, a_bad_device_type_is_named_short_and_printable) {
#ifndef AB_HAVE_OPENCL
  cr_skip_test("built without OpenCL (AB_WITH_OPENCL=OFF): nothing reads AB_OPENCL_DEVICE_TYPE");
#endif
  static char v[1200] = "gpux\n";
  for (int i = 0; i < 500; i++) strcat(v, "\xc3\xa9");
  setenv("AB_OPENCL_DEVICE_TYPE", v, 1);
  ab_shutdown(); /* read again at the next start */
  cr_assert_eq(ab_device_count(kDLOpenCL), 0);
  float f[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {f, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&t, CL(0), NULL, &r), AB_ERR_NO_DEVICE);
  cr_assert_eq(r, SENTINEL_OUT);
  const char *msg = ab_last_error();
  cr_assert_not_null(strstr(msg, "AB_OPENCL_DEVICE_TYPE=\"gpux?"), "%s", msg);
  cr_assert_not_null(strstr(msg, "is not one of all, gpu, cpu, accelerator"), "%s", msg);
  for (const char *c = msg; *c != '\0'; c++)
    cr_assert(*c >= 0x20 && *c < 0x7f, "byte 0x%02x at %td of: %s", (unsigned char)*c, c - msg, msg);
  unsetenv("AB_OPENCL_DEVICE_TYPE");
  ab_shutdown();
}

/* Python's multiprocessing forks by default on Linux. A child forked after
 * OpenCL started has none of the driver's threads (PoCL's workers), and
 * the first OpenCL call there waited for them for ever: OpenCL is refused
 * in such a child, host moves still work, and the parent is untouched. */
Test(opencl, a_child_forked_after_opencl_started_refuses_it_and_still_moves_host_data) {
  need_devices(1);
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *on_cl = convert_ok(&t, CL(0), AB_COPY_IF_NEEDED, NULL);
  const bool cuda_down = ab_device_count(kDLCUDA) == 0;
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    alarm(120); /* a hang ends in SIGALRM, a failure below, not a stuck suite */
    int bad = 0;
    if (ab_device_count(kDLOpenCL) != 0) bad |= 1;
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    if (ab_convert_memory(&t, CL(0), NULL, &r) != AB_ERR_NO_DEVICE || r != SENTINEL_OUT) bad |= 2;
    if (strstr(ab_last_error(), "this process was forked from it") == NULL) bad |= 4;
    /* The parent's OpenCL tensor cannot be read here; deleting it hands
     * nothing to the driver. */
    if (ab_convert_memory(&on_cl->dl_tensor, CPU0, NULL, &r) != AB_ERR_NO_DEVICE || r != SENTINEL_OUT) bad |= 8;
    on_cl->deleter(on_cl);
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.copy = AB_COPY_ALWAYS;
    if (ab_convert_memory(&t, CPU0, &o, &r) != AB_OK || memcmp(r->dl_tensor.data, v, sizeof v) != 0) bad |= 16;
    else r->deleter(r);
    ab_shutdown(); /* returns: the pool's cached OpenCL blocks go to no driver */
    if (ab__dev_frees_left_behind() == 0) bad |= 32;
    if (ab_device_count(kDLOpenCL) != 0) bad |= 1; /* and starting again keeps OpenCL off */
    /* The wrappers that cannot fail ask the driver nothing either: the
     * memory gauges read zero (the driver would answer, or hang). */
    uint64_t free_b = 1, total_b = 1;
    ab__dev_meminfo(ab__backend_for(kDLOpenCL), 0, &free_b, &total_b);
    if (free_b != 0 || total_b != 0) bad |= 64;
    /* A backend that had not started in the parent keeps its own reason. */
    if (cuda_down && (ab_convert_memory(&t, (DLDevice){kDLCUDA, 0}, NULL, &r) != AB_ERR_NO_DEVICE ||
                      strstr(ab_last_error(), "forked") != NULL))
      bad |= 128;
    _exit(bad);
  }
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child did not exit: signal %d (SIGALRM: it hung)",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  cr_assert_eq(WEXITSTATUS(status), 0, "the child's failed checks (bits): %d", WEXITSTATUS(status));
  DLManagedTensorVersioned *back = convert_ok(&on_cl->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, v, sizeof v), 0);
  back->deleter(back);
  on_cl->deleter(on_cl);
  assert_pool_clean(CL(0));
}

/* The same for a driver another library started (pyclesperanto at its
 * import) while arraybridge had not: noted, a child forked after it has
 * no OpenCL devices, says why, and does not hang; host moves work; the
 * note changes nothing in the process that made it. Run in a child of
 * its own, so that the note does not reach the other tests' forks. */
Test(opencl, a_child_forked_after_another_library_started_opencl_refuses_it) {
  /* No arraybridge call before these forks (need_devices would start the
   * backends, and any fork after that is refused anyway): the noting
   * child checks that it has OpenCL itself. */
  fflush(NULL);
  pid_t noter = fork();
  cr_assert_neq(noter, -1);
  if (noter == 0) {
    alarm(120);
    int bad = 0;
    if (ab_note_driver_started(kDLOpenCL) != AB_OK) bad |= 1;
    if (ab_note_driver_started(kDLCPU) != AB_ERR_INVALID_ARGUMENT) bad |= 1;
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    DLTensor t = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      int cbad = 0;
      if (ab_device_count(kDLOpenCL) != 0 || ab_device_count(AB_DEVICE_OPENCL_HOST) != 0) cbad |= 1;
      if (ab_convert_memory(&t, CL(0), NULL, &r) != AB_ERR_NO_DEVICE || r != SENTINEL_OUT) cbad |= 2;
      if (strstr(ab_last_error(), "by another library") == NULL || strstr(ab_last_error(), "spawn") == NULL)
        cbad |= 4;
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.copy = AB_COPY_ALWAYS;
      if (ab_convert_memory(&t, CPU0, &o, &r) != AB_OK || memcmp(r->dl_tensor.data, v, sizeof v) != 0) cbad |= 8;
      else r->deleter(r);
      _exit(cbad);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) bad |= 16;
    else bad |= WEXITSTATUS(status) << 5;
    /* here, where the note was made: OpenCL works */
    if (ab_device_count(kDLOpenCL) < 1) _exit(100); /* none on this machine: need_devices below says so */
    if (ab_convert_memory(&t, CL(0), NULL, &r) != AB_OK) bad |= 4;
    else r->deleter(r);
    _exit(bad);
  }
  int status;
  cr_assert_eq(waitpid(noter, &status, 0), noter);
  cr_assert(WIFEXITED(status), "the noting child did not exit: signal %d (SIGALRM: a hang)",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (WEXITSTATUS(status) == 100) need_devices(1); /* fails where the machine should have one, else skips */
  cr_assert_eq(WEXITSTATUS(status), 0,
               "failed checks: %d (bits 5 up: the grandchild's, 1: devices listed, 2: converted, 4: message; "
               "4 alone: no OpenCL where the note was made)",
               WEXITSTATUS(status));
}

static volatile sig_atomic_t app_signals_seen;
static void count_app_signal(int sig) {
  (void)sig;
  app_signals_seen++;
}

/* The driver's start-up leaves the program's signals to it. At the first
 * call (here a host copy's, which starts every backend), PoCL's LLVM
 * replaced the handlers of 15 signals: SIGUSR1's swallowed the signal
 * (so did SIGQUIT's, SIGXCPU's and SIGXFSZ's), PoCL's SIGUSR2 one printed
 * counts, and the first SIGINT put back every handler LLVM had found,
 * undoing those the program installed since. And PoCL's threads took the
 * caller's mask, so a signal the program's threads block to sigwait for
 * could go to them (a probe, 2026-12-06: sigwait hung in 2 runs of 6). */
Test(opencl, the_drivers_start_leaves_the_programs_signals_to_it) {
  cr_assert_neq(signal(SIGUSR1, count_app_signal), SIG_ERR);
  cr_assert_neq(signal(SIGUSR2, count_app_signal), SIG_ERR);
  cr_assert_neq(signal(SIGINT, count_app_signal), SIG_ERR);
  struct sigaction was[32];
  for (int sig = 1; sig < 32; sig++)
    cr_assert_eq(sigaction(sig, NULL, &was[sig]), 0);
  int before[256], after[256];
  const int nb = thread_ids(before, 256);
  cr_assert_leq(nb, 256);
  float x[16] = {0};
  int64_t shape[1] = {16};
  DLTensor t = {x, CPU0, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  DLManagedTensorVersioned *r;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  need_devices(1);
  /* every handler but a fault's is the program's (or the default) still */
  for (int sig = 1; sig < 32; sig++) {
    struct sigaction now;
    cr_assert_eq(sigaction(sig, NULL, &now), 0);
    if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP || sig == SIGSYS ||
        sig == SIGABRT)
      continue;
    cr_assert(now.sa_handler == was[sig].sa_handler && (now.sa_flags & SA_SIGINFO) == (was[sig].sa_flags & SA_SIGINFO),
              "signal %d's handler was replaced", sig);
  }
  /* a handler installed after the start survives a signal whose handler
   * ran, and so does the driver's SIGFPE one */
  struct sigaction fpe, fpe_after;
  cr_assert_eq(sigaction(SIGFPE, NULL, &fpe), 0);
  cr_assert_neq(signal(SIGTERM, count_app_signal), SIG_ERR);
  raise(SIGINT);
  raise(SIGUSR1);
  raise(SIGUSR2);
  cr_assert_eq(app_signals_seen, 3);
  struct sigaction term;
  cr_assert_eq(sigaction(SIGTERM, NULL, &term), 0);
  cr_assert(term.sa_handler == count_app_signal, "a SIGINT undid the SIGTERM handler installed after the start");
  cr_assert_eq(sigaction(SIGFPE, NULL, &fpe_after), 0);
  cr_assert(fpe_after.sa_handler == fpe.sa_handler, "a SIGINT undid the driver's SIGFPE handler");
  const int na = thread_ids(after, 256);
  int started = 0;
  for (int i = 0; i < na && i < 256; i++) {
    bool old = false;
    for (int j = 0; j < nb && !old; j++)
      old = before[j] == after[i];
    unsigned long long blk;
    if (old) continue;
    started++;
    cr_assert(thread_leaves_signals_to_the_program(after[i], &blk),
              "thread %d, started at the driver's start-up, has SigBlk %016llx: the program's signals can go to it, "
              "or a fault's cannot run the handlers",
              after[i], blk);
  }
  if (started == 0) cr_log_warn("the OpenCL driver started no thread: only the handlers were checked");
}

Test(opencl, device_info_describes_each_device) {
  need_devices(1);
  for (int32_t i = 0; i < ab_device_count(kDLOpenCL); i++) {
    struct ab_device_info info;
    cr_assert_eq(ab_device_info(CL(i), &info), AB_OK, "%s", ab_last_error());
    cr_assert_str_eq(info.backend, "opencl");
    cr_assert_neq(info.name[0], '\0');
    cr_assert_neq(info.vendor[0], '\0');
    cr_assert_not_null(strstr(info.version, "OpenCL"), "version \"%s\"", info.version);
    cr_assert_not_null(strstr(info.version, ", driver "), "no driver version in \"%s\"", info.version);
    cr_assert_gt(info.total_memory, 0);
    cr_assert_gt(info.max_alloc_size, 0);
    cr_assert_leq(info.max_alloc_size, info.total_memory);
    cr_assert_eq(info.host_accessible, 0, "cl_mem data is a handle, never a host pointer");
  }
}

static atomic_int oom_calls;
static size_t count_oom_call(DLDevice dev, size_t requested, void *user) {
  (void)dev, (void)requested, (void)user;
  atomic_fetch_add(&oom_calls, 1);
  return 0;
}

Test(opencl, a_request_past_the_largest_buffer_fails_without_emptying_the_cache) {
  need_devices(1);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CL(0), &info), AB_OK, "%s", ab_last_error());
  /* A block in the cache and a callback that would be asked: a request
   * no buffer of the device can hold used to release the one and ask the
   * other (the OOM sequence) before it failed. */
  int64_t one[1] = {(int64_t)(1 << 20)}, past[1] = {(int64_t)info.max_alloc_size + 1};
  DLManagedTensorVersioned *r = NULL;
  cr_assert_eq(ab_tensor_alloc(CL(0), 1, one, dt(kDLUInt, 8, 1), &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
  struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
  cr_assert_eq(ab_pool_stats(CL(0), &before), AB_OK);
  cr_assert_eq(ab_register_oom_callback(count_oom_call, NULL), AB_OK);
  atomic_store(&oom_calls, 0);
  r = SENTINEL_OUT;
  ab_status st = ab_tensor_alloc(CL(0), 1, past, dt(kDLUInt, 8, 1), &r);
  cr_assert_eq(ab_unregister_oom_callback(count_oom_call, NULL), AB_OK);
  cr_assert_eq(st, AB_ERR_OUT_OF_MEMORY, "%s: %s", ab_status_name(st), ab_last_error());
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "more than one buffer may hold"), "%s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), "no release or callback can make room for it"), "%s", ab_last_error());
  cr_assert_eq(atomic_load(&oom_calls), 0, "the OOM callbacks were asked");
  cr_assert_eq(ab_pool_stats(CL(0), &after), AB_OK);
  cr_assert_eq(after.cached_blocks, before.cached_blocks, "the cache was released");
  cr_assert_eq(after.trims, before.trims);
  cr_assert_eq(after.oom_retries, before.oom_retries);
  cr_assert_eq(after.oom_failures, before.oom_failures + 1, "a failed allocation is counted");
  assert_pool_clean(CL(0));
}

Test(opencl, out_of_range_ids_are_refused) {
  need_devices(1);
  int32_t n = ab_device_count(kDLOpenCL);
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&t, CL(n), NULL, &r), AB_ERR_NO_DEVICE);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "does not exist"), "%s", ab_last_error());
  DLTensor bad = t;
  bad.device = CL(-3);
  cr_assert_eq(ab_convert_memory(&bad, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
}

Test(opencl, a_tensor_reaching_outside_its_buffer_is_invalid) {
  need_devices(1);
  uint8_t bytes[64] = {0};
  int64_t flat[1] = {64};
  DLTensor whole = {bytes, CPU0, 1, dt(kDLUInt, 8, 1), flat, NULL, 0};
  DLManagedTensorVersioned *dev = convert_ok(&whole, CL(0), AB_COPY_ALWAYS, NULL);
  /* The pool rounds 64 bytes up to 256: the buffer is what the driver has. */
  int64_t shape[1] = {300};
  DLTensor t = {dev->dl_tensor.data, CL(0), 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "buffer"), "%s", ab_last_error());
  cr_assert_eq(strncmp(ab_last_error(), "src: ", 5), 0, "the argument is not named: %s", ab_last_error());
  /* the same past the end as ab_convert_into's destination */
  static uint8_t many[300];
  DLTensor big = {many, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  cr_assert_eq(ab_convert_into(&big, &t, NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(strncmp(ab_last_error(), "dst: ", 5), 0, "the argument is not named: %s", ab_last_error());
  /* negative strides reaching before byte 0 */
  int64_t s2[1] = {4}, st2[1] = {-1};
  DLTensor u = {dev->dl_tensor.data, CL(0), 1, dt(kDLUInt, 8, 1), s2, st2, 2};
  cr_assert_eq(ab_convert_memory(&u, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "src addresses bytes before the start"), "%s", ab_last_error());
  cr_assert_eq(ab_tensor_validate(&u), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "tensor addresses bytes before the start"), "%s", ab_last_error());
  /* the same as ab_convert_into's destination is named so */
  DLTensor four = {bytes, CPU0, 1, dt(kDLUInt, 8, 1), s2, NULL, 0};
  cr_assert_eq(ab_convert_into(&four, &u, NULL), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "dst addresses bytes before the start"), "%s", ab_last_error());
  u.byte_offset = 3; /* bytes 0..3: fine */
  cr_assert_eq(ab_tensor_validate(&u), AB_OK, "%s", ab_last_error());
  dev->deleter(dev);
}

#ifdef AB_HAVE_OPENCL
/* The first n OpenCL devices of the first platform, as the tests' own
 * contexts take them: opencl:0, opencl:1, ... in the library's order
 * (without AB_OPENCL_PLATFORM or AB_OPENCL_DEVICE_TYPE). */
static void first_devices(cl_device_id *d, cl_uint n) {
  cl_platform_id p;
  cr_assert_eq(clGetPlatformIDs(1, &p, NULL), CL_SUCCESS);
  cr_assert_eq(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n, d, NULL), CL_SUCCESS);
}

/* A cl_mem made by another library, in its own context, read with a
 * non-zero byte_offset. */
/* A context of the test's own (not the library's) on the first OpenCL
 * device, its queue, and a buffer there holding a copy of `init`. */
struct foreign {
  cl_context ctx;
  cl_command_queue q;
  cl_mem m;
};

static struct foreign foreign_buffer_flags(const void *init, size_t bytes, cl_mem_flags host_flags) {
  need_devices(1);
  cl_device_id d;
  cl_int e;
  struct foreign f;
  first_devices(&d, 1);
  f.ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
  cr_assert_eq(e, CL_SUCCESS);
  f.q = clCreateCommandQueue(f.ctx, d, 0, &e);
  cr_assert_eq(e, CL_SUCCESS);
  f.m = clCreateBuffer(f.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR | host_flags, bytes, (void *)init, &e);
  cr_assert_eq(e, CL_SUCCESS);
  return f;
}

static struct foreign foreign_buffer(const void *init, size_t bytes) { return foreign_buffer_flags(init, bytes, 0); }

static void foreign_release(struct foreign *f) {
  clReleaseMemObject(f->m);
  clReleaseCommandQueue(f->q);
  clReleaseContext(f->ctx);
}

/* A buffer whose flags keep the host out (CL_MEM_HOST_NO_ACCESS, or
 * HOST_READ_ONLY / HOST_WRITE_ONLY for the other direction) is refused in
 * those words, not as the driver's bare CL_INVALID_OPERATION, and the
 * direction its flags allow still works. */
Test(opencl, a_buffer_the_host_may_not_touch_is_refused_in_words) {
  const float init[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  float host[16] = {0};
  int64_t shape[1] = {16};
  DLTensor h = {host, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  const struct {
    cl_mem_flags flags;
    const char *name;
    bool read, write;
  } cases[3] = {{CL_MEM_HOST_NO_ACCESS, "CL_MEM_HOST_NO_ACCESS", false, false},
                {CL_MEM_HOST_READ_ONLY, "CL_MEM_HOST_READ_ONLY", true, false},
                {CL_MEM_HOST_WRITE_ONLY, "CL_MEM_HOST_WRITE_ONLY", false, true}};
  for (int k = 0; k < 3; k++) {
    struct foreign f = foreign_buffer_flags(init, sizeof init, cases[k].flags);
    DLTensor dev = {f.m, CL(0), 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
    DLManagedTensorVersioned *out = SENTINEL_OUT;
    ab_status st = ab_convert_memory(&dev, CPU0, NULL, &out);
    if (cases[k].read) {
      cr_assert_eq(st, AB_OK, "%s: reading: %s", cases[k].name, ab_last_error());
      cr_assert_eq(memcmp(out->dl_tensor.data, init, sizeof init), 0, "%s: read wrongly", cases[k].name);
      out->deleter(out);
    } else {
      cr_assert_eq(st, AB_ERR_INVALID_ARGUMENT, "%s: reading: %s (%s)", cases[k].name, ab_status_name(st),
                   ab_last_error());
      cr_assert_eq(out, SENTINEL_OUT, "%s: *out written on failure", cases[k].name);
      cr_assert(strstr(ab_last_error(), "cannot read") && strstr(ab_last_error(), cases[k].name), "%s",
                ab_last_error());
    }
    for (int i = 0; i < 16; i++) host[i] = (float)(100 + i);
    st = ab_convert_into(&h, &dev, NULL);
    if (cases[k].write) {
      cr_assert_eq(st, AB_OK, "%s: writing: %s", cases[k].name, ab_last_error());
    } else {
      cr_assert_eq(st, AB_ERR_INVALID_ARGUMENT, "%s: writing: %s (%s)", cases[k].name, ab_status_name(st),
                   ab_last_error());
      cr_assert(strstr(ab_last_error(), "cannot write") && strstr(ab_last_error(), cases[k].name), "%s",
                ab_last_error());
    }
    foreign_release(&f);
  }
  assert_pool_clean(CPU0);
  assert_pool_clean(CL(0));
}

/* ab_convert_into a buffer of another context (pyclesperanto's arrays are
 * such buffers): from the host, from our own device buffer (which cannot
 * be copied across contexts device-side) with a cast on the way, and into
 * a plane at a byte offset. */
Test(opencl, convert_into_writes_a_buffer_of_another_context) {
  float zeros[3 * 64] = {0};
  struct foreign f = foreign_buffer(zeros, sizeof zeros);
  cl_mem m = f.m;

  int16_t src[64];
  for (int i = 0; i < 64; i++) src[i] = (int16_t)(i * 7 - 100);
  int64_t shape[2] = {8, 8};
  DLTensor h = {src, CPU0, 2, dt(kDLInt, 16, 1), shape, NULL, 0};
  /* plane 0 from the host (int16 -> float32), plane 2 from our opencl:0
   * float32 copy of the same data, plane 1 left alone */
  DLTensor plane = {m, CL(0), 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_convert_into(&h, &plane, NULL), AB_OK, "%s", ab_last_error());
  /* our float32 copy: same dtype as the plane, so only the contexts stand
   * between it and a device-side copy */
  ab_convert_opts f32 = AB_CONVERT_OPTS_INIT;
  f32.dtype = dt(kDLFloat, 32, 1);
  DLManagedTensorVersioned *mine = NULL;
  cr_assert_eq(ab_convert_memory(&h, CL(0), &f32, &mine), AB_OK, "%s", ab_last_error());
  plane.byte_offset = 2 * 64 * sizeof(float);
  /* Our buffer cannot be copied into theirs device-side (drivers may
   * refuse a copy between contexts; PoCL happens not to): the bytes must
   * come through a host staging buffer, which the host pool or the
   * device's pinned pool (AB_OPENCL_PINNED=1) counts. */
  const DLDevice pools[2] = {CPU0, {AB_DEVICE_OPENCL_HOST, 0}};
  uint64_t staged = 0;
  for (int k = 0; k < 2; k++) {
    struct ab_pool_stats s = {.size = sizeof s};
    cr_assert_eq(ab_pool_stats(pools[k], &s), AB_OK, "%s", ab_last_error());
    staged -= s.allocations;
  }
  cr_assert_eq(ab_convert_into(&mine->dl_tensor, &plane, NULL), AB_OK, "%s", ab_last_error());
  for (int k = 0; k < 2; k++) {
    struct ab_pool_stats s = {.size = sizeof s};
    cr_assert_eq(ab_pool_stats(pools[k], &s), AB_OK, "%s", ab_last_error());
    staged += s.allocations;
  }
  cr_assert_gt(staged, 0, "the copy into another context did not go through the host");
  mine->deleter(mine);
  float got[3 * 64];
  cr_assert_eq(clEnqueueReadBuffer(f.q, m, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL), CL_SUCCESS);
  for (int i = 0; i < 64; i++) {
    cr_assert_eq(got[i], (float)src[i], "plane 0 element %d", i);
    cr_assert_eq(got[64 + i], 0.0f, "plane 1 element %d was written", i);
    cr_assert_eq(got[128 + i], (float)src[i], "plane 2 element %d", i);
  }
  /* a plane past the buffer's end is refused before anything moves */
  plane.byte_offset = 3 * 64 * sizeof(float);
  cr_assert_eq(ab_convert_into(&h, &plane, NULL), AB_ERR_INVALID_ARGUMENT);
  /* bytes of one buffer into themselves, or into a range they overlap,
   * are refused as on the host (the driver said CL_MEM_COPY_OVERLAP, a
   * backend failure); planes apart in it are fine */
  DLTensor from = {m, CL(0), 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  const uint64_t offsets[3] = {0, 4, 63 * sizeof(float)};
  for (int k = 0; k < 3; k++) {
    plane.byte_offset = offsets[k];
    cr_assert_eq(ab_convert_into(&from, &plane, NULL), AB_ERR_INVALID_ARGUMENT, "offset %d: %s", (int)offsets[k],
                 ab_last_error());
    cr_assert(strstr(ab_last_error(), "share memory") != NULL, "%s", ab_last_error());
  }
  plane.byte_offset = 64 * sizeof(float);
  cr_assert_eq(ab_convert_into(&from, &plane, NULL), AB_OK, "%s", ab_last_error());
  cr_assert_eq(clEnqueueReadBuffer(f.q, m, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL), CL_SUCCESS);
  for (int i = 0; i < 64; i++) cr_assert_eq(got[64 + i], (float)src[i], "plane 1 element %d", i);
  foreign_release(&f);
  assert_pool_clean(CL(0));
}

Test(opencl, a_foreign_buffer_with_a_byte_offset_is_imported) {
  uint8_t bytes[1024];
  fill_pattern(bytes, sizeof bytes, 77);
  struct foreign f = foreign_buffer(bytes, sizeof bytes);
  cl_mem m = f.m;

  int64_t shape[2] = {10, 20}, strides[2] = {40, 2}; /* every other int16 of 10 rows */
  DLTensor t = {m, CL(0), 2, dt(kDLInt, 16, 1), shape, strides, 96};
  DLTensor h = t;
  h.device = CPU0;
  h.data = bytes;
  char want[400];
  reference_gather(&h, want);
  DLManagedTensorVersioned *r = convert_ok(&t, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(r->dl_tensor.data, want, sizeof want), 0, "strided foreign buffer read wrongly");
  r->deleter(r);
  /* compact, same device: IF_NEEDED is a view of the foreign buffer */
  int64_t s1[1] = {500};
  DLTensor c = {m, CL(0), 1, dt(kDLUInt, 8, 1), s1, NULL, 24};
  DLManagedTensorVersioned *view = convert_ok(&c, CL(0), AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(view->dl_tensor.data, (void *)m);
  cr_assert_eq(view->dl_tensor.byte_offset, 24);
  cr_assert_eq(view->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0);
  view->deleter(view);
  /* a copy into our context cannot use clEnqueueCopyBuffer across
   * contexts: it goes through the host */
  DLManagedTensorVersioned *mine = convert_ok(&c, CL(0), AB_COPY_ALWAYS, NULL);
  cr_assert(mine->flags & DLPACK_FLAG_BITMASK_IS_COPIED);
  cr_assert_neq(mine->dl_tensor.data, (void *)m);
  DLManagedTensorVersioned *back = convert_ok(&mine->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, bytes + 24, 500), 0);
  back->deleter(back);
  mine->deleter(mine);
  foreign_release(&f);
}
#endif

/* A pool holding cached buffers under a limit: the cache is released to
 * make room and the allocation succeeds. */
Test(opencl, a_full_cache_is_trimmed_to_make_room) {
  need_devices(1);
  cr_assert_eq(ab_set_memory_limit(CL(0), 3 << 20), AB_OK);
  int64_t a[1] = {2 << 20}, b[1] = {(5 << 20) / 2};
  DLManagedTensorVersioned *t = NULL;
  cr_assert_eq(ab_tensor_alloc(CL(0), 1, a, dt(kDLUInt, 8, 1), &t), AB_OK, "%s", ab_last_error());
  t->deleter(t); /* 2 MiB now cached */
  struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
  ab_pool_stats(CL(0), &before);
  cr_assert_eq(before.reserved_bytes.current, 2 << 20);
  cr_assert_eq(ab_tensor_alloc(CL(0), 1, b, dt(kDLUInt, 8, 1), &t), AB_OK, "%s", ab_last_error());
  ab_pool_stats(CL(0), &after);
  cr_assert_gt(after.oom_retries, before.oom_retries);
  cr_assert_eq(after.backend_frees, before.backend_frees + 1, "the cached buffer was not released");
  cr_assert_leq(after.reserved_bytes.peak, 3 << 20);
  t->deleter(t);
  /* and past the limit it fails, with the numbers */
  int64_t big[1] = {4 << 20};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_tensor_alloc(CL(0), 1, big, dt(kDLUInt, 8, 1), &r), AB_ERR_OUT_OF_MEMORY);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "opencl:0"), "%s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), "limit"), "%s", ab_last_error());
  assert_pool_clean(CL(0));
}

struct worker {
  int id;
  int errors;
};

static void *work(void *arg) {
  struct worker *w = arg;
  int32_t ndev = ab_device_count(kDLOpenCL);
  for (int it = 0; it < 150; it++) {
    int64_t shape[2] = {8 + it % 5, 16 + w->id}, strides[2] = {1, 8 + it % 5};
    int64_t n = shape[0] * shape[1];
    uint32_t *v = malloc((size_t)n * 4);
    uint32_t *want = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = (uint32_t)(w->id * 1000003u + it * 7919u + (uint32_t)i);
    DLTensor h = {v, CPU0, 2, dt(kDLUInt, 32, 1), shape, strides, 0};
    reference_gather(&h, want);
    DLManagedTensorVersioned *a = NULL, *b = NULL;
    if (ab_convert_memory(&h, CL(it % ndev), NULL, &a) != AB_OK ||
        ab_convert_memory(&a->dl_tensor, CPU0, NULL, &b) != AB_OK || memcmp(b->dl_tensor.data, want, (size_t)n * 4))
      w->errors++;
    if (b) b->deleter(b);
    if (a) a->deleter(a);
    free(v);
    free(want);
  }
  return NULL;
}

Test(opencl, two_threads_convert_to_both_devices_at_once) {
  need_devices(1);
  pthread_t th[2];
  struct worker w[2] = {{0, 0}, {1, 0}};
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, work, &w[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_assert_eq(w[0].errors + w[1].errors, 0, "%d and %d wrong conversions", w[0].errors, w[1].errors);
  for (int32_t i = 0; i < ab_device_count(kDLOpenCL); i++) assert_pool_clean(CL(i));
}

Test(opencl, auto_picks_a_device_by_memory) {
  need_devices(1);
  uint64_t best = 0;
  int32_t want = 0;
  for (int32_t i = 0; i < ab_device_count(kDLOpenCL); i++) {
    struct ab_device_info info;
    cr_assert_eq(ab_device_info(CL(i), &info), AB_OK);
    uint64_t avail = info.free_memory ? info.free_memory : info.total_memory;
    if (i == 0 || avail > best) {
      best = avail;
      want = i;
    }
  }
  float v[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  DLTensor t = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = convert_ok(&t, CL(AB_DEVICE_AUTO), AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(r->dl_tensor.device.device_type, kDLOpenCL);
  cr_assert_eq(r->dl_tensor.device.device_id, want);
  r->deleter(r);
}

/* An empty tensor addresses nothing, so its data need not be a buffer: no
 * OpenCL call may look at it (regression: one did, and crashed). */
Test(opencl, an_empty_tensor_with_any_data_is_never_dereferenced) {
  need_devices(1);
  int64_t shape[2] = {0, 4};
  DLTensor z = {(void *)(uintptr_t)0x1234, CL(0), 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_tensor_validate(&z), AB_OK, "%s", ab_last_error());
  DLManagedTensorVersioned *v = convert_ok(&z, CL(0), AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(v->dl_tensor.data, z.data, "a view keeps data");
  v->deleter(v);
  DLManagedTensorVersioned *c = convert_ok(&z, CL(ab_device_count(kDLOpenCL) - 1), AB_COPY_ALWAYS, NULL);
  cr_assert_null(c->dl_tensor.data);
  c->deleter(c);
  DLManagedTensorVersioned *h = convert_ok(&z, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(h->dl_tensor.shape[0], 0);
  h->deleter(h);
}

#ifdef AB_HAVE_OPENCL
/* opts.stream: a queue of the result's context is used; a queue of another
 * context is finished first and the transfer still happens. */
Test(opencl, a_callers_queue_is_used_or_finished) {
  need_devices(1);
  uint32_t v[64];
  for (int i = 0; i < 64; i++) v[i] = (uint32_t)(i * 2654435761u);
  int64_t shape[1] = {64};
  DLTensor t = {v, CPU0, 1, dt(kDLUInt, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *first = convert_ok(&t, CL(0), AB_COPY_IF_NEEDED, NULL);
  cl_context ours;
  cl_device_id devs[64], dev;
  cl_int e;
  cr_assert_eq(clGetMemObjectInfo((cl_mem)first->dl_tensor.data, CL_MEM_CONTEXT, sizeof ours, &ours, NULL), CL_SUCCESS);
  cr_assert_eq(clGetContextInfo(ours, CL_CONTEXT_DEVICES, sizeof devs, devs, NULL), CL_SUCCESS);
  dev = devs[0]; /* opencl:0: the first device of the first platform */
  cl_command_queue same = clCreateCommandQueue(ours, dev, 0, &e);
  cr_assert_eq(e, CL_SUCCESS);
  /* a separate context on the same device */
  cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
  cr_assert_eq(e, CL_SUCCESS);
  cl_command_queue foreign = clCreateCommandQueue(other, dev, 0, &e);
  cr_assert_eq(e, CL_SUCCESS);
  cl_command_queue queues[2] = {same, foreign};
  for (int k = 0; k < 2; k++) {
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.stream = queues[k];
    DLManagedTensorVersioned *up = NULL, *down = NULL;
    cr_assert_eq(ab_convert_memory(&t, CL(0), &o, &up), AB_OK, "queue %d: %s", k, ab_last_error());
    o.copy = AB_COPY_ALWAYS;
    DLManagedTensorVersioned *dup = NULL;
    cr_assert_eq(ab_convert_memory(&up->dl_tensor, CL(0), &o, &dup), AB_OK, "queue %d: %s", k, ab_last_error());
    cr_assert_eq(ab_convert_memory(&dup->dl_tensor, CPU0, &o, &down), AB_OK, "queue %d: %s", k, ab_last_error());
    cr_assert_eq(memcmp(down->dl_tensor.data, v, sizeof v), 0, "queue %d: wrong data", k);
    down->deleter(down);
    dup->deleter(dup);
    up->deleter(up);
  }
  clReleaseCommandQueue(foreign);
  clReleaseContext(other);
  clReleaseCommandQueue(same);
  first->deleter(first);
}

/* A buffer of a context that lacks the named device: validation says so,
 * as the conversion does. */
Test(opencl, a_device_outside_the_buffers_context_is_invalid) {
  need_devices(2);
  cl_device_id d[2];
  cl_int e;
  first_devices(d, 2);
  cl_context ctx = clCreateContext(NULL, 1, &d[1], NULL, NULL, &e);
  cr_assert_eq(e, CL_SUCCESS);
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 256, NULL, &e);
  cr_assert_eq(e, CL_SUCCESS);
  int64_t shape[1] = {16};
  DLTensor t = {m, CL(0), 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  cr_assert_eq(ab_tensor_validate(&t), AB_ERR_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(ab_last_error(), "context"), "%s", ab_last_error());
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_convert_memory(&t, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
  t.device = CL(1);
  cr_assert_eq(ab_tensor_validate(&t), AB_OK, "%s", ab_last_error());
  clReleaseMemObject(m);
  clReleaseContext(ctx);
}

Test(opencl, convert_into_a_sub_buffer_overlapping_its_source_is_refused) {
  need_devices(1);
  /* A buffer and a sub-buffer of it: the handles differ, the bytes are
   * shared. A compact copy got the driver's CL_MEM_COPY_OVERLAP, and a
   * reversed one ran, reading bytes it had already overwritten. */
  DLManagedTensorVersioned *a = NULL;
  int64_t whole[1] = {4096}, half[1] = {2048}, back_stride[1] = {-1};
  cr_assert_eq(ab_tensor_alloc(CL(0), 1, whole, dt(kDLFloat, 32, 1), &a), AB_OK, "%s", ab_last_error());
  static float h[4096];
  for (int i = 0; i < 4096; i++) h[i] = (float)i;
  DLTensor host = {h, CPU0, 1, dt(kDLFloat, 32, 1), whole, NULL, 0};
  cr_assert_eq(ab_convert_into(&host, &a->dl_tensor, NULL), AB_OK, "%s", ab_last_error());
  cl_int e;
  cl_buffer_region inside = {4096, 8192}, after = {8192, 8192}; /* bytes [4096, 12288) and [8192, 16384) */
  cl_mem over = clCreateSubBuffer((cl_mem)a->dl_tensor.data, 0, CL_BUFFER_CREATE_TYPE_REGION, &inside, &e);
  cr_assert_eq(e, CL_SUCCESS, "clCreateSubBuffer: %d", e);
  cl_mem apart = clCreateSubBuffer((cl_mem)a->dl_tensor.data, 0, CL_BUFFER_CREATE_TYPE_REGION, &after, &e);
  cr_assert_eq(e, CL_SUCCESS, "clCreateSubBuffer: %d", e);
  DLTensor src = {a->dl_tensor.data, CL(0), 1, dt(kDLFloat, 32, 1), half, NULL, 0}; /* bytes [0, 8192) */
  DLTensor reversed = src;
  reversed.strides = back_stride;
  reversed.byte_offset = 2047 * 4;
  DLTensor dst = {over, CL(0), 1, dt(kDLFloat, 32, 1), half, NULL, 0};
  for (int k = 0; k < 2; k++) {
    ab_status st = ab_convert_into(k ? &reversed : &src, &dst, NULL);
    cr_assert_eq(st, AB_ERR_INVALID_ARGUMENT, "%s: %s", ab_status_name(st), ab_last_error());
    cr_assert_not_null(strstr(ab_last_error(), "share memory"), "%s", ab_last_error());
  }
  /* the same sub-buffer as the source, and a sub-buffer apart from it */
  cr_assert_eq(ab_convert_into(&dst, &src, NULL), AB_ERR_INVALID_ARGUMENT);
  dst.data = apart;
  cr_assert_eq(ab_convert_into(&reversed, &dst, NULL), AB_OK, "%s", ab_last_error());
  DLManagedTensorVersioned *o = convert_ok(&a->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
  const float *f = o->dl_tensor.data;
  for (int i = 0; i < 2048; i++) cr_assert_eq(f[2048 + i], (float)(2047 - i), "element %d", 2048 + i);
  for (int i = 0; i < 2048; i++) cr_assert_eq(f[i], (float)i, "the source changed at %d", i);
  o->deleter(o);
  clReleaseMemObject(over);
  clReleaseMemObject(apart);
  a->deleter(a);
}

/* A device whose largest buffer is not a multiple of the pool's 2 MiB
 * rounding above 32 MiB, as a driver's can be: while fake_max_alloc is
 * set, this clCreateBuffer (the library's calls in this executable come
 * here) refuses larger buffers as the driver would. */
static size_t fake_max_alloc;
typedef cl_mem (*create_buffer_fn)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
CL_API_ENTRY cl_mem CL_API_CALL clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host,
                                               cl_int *err) {
  const create_buffer_fn real = (create_buffer_fn)dlsym(RTLD_NEXT, "clCreateBuffer");
  if (real == NULL || (fake_max_alloc != 0 && size > fake_max_alloc)) {
    if (err != NULL) *err = real == NULL ? CL_INVALID_OPERATION : CL_INVALID_BUFFER_SIZE;
    return NULL;
  }
  return real(context, flags, size, host, err);
}

Test(opencl, blocks_of_their_own_size_below_the_largest_buffer_are_reused) {
  need_devices(1);
  /* 40 MiB + 50 KiB rounds to a 42 MiB class, past the largest buffer:
   * the block takes its own size. Freed and asked again, the cached block
   * was passed over for a new one each time (the driver's memory grew
   * by one block a cycle). */
  fake_max_alloc = ((size_t)40 << 20) + (100 << 10);
  int64_t shape[1] = {((int64_t)40 << 20) + (50 << 10)};
  struct ab_pool_stats s0 = {.size = sizeof s0}, s1 = {.size = sizeof s1};
  for (int k = 0; k < 4; k++) {
    DLManagedTensorVersioned *r = NULL;
    ab_status st = ab_tensor_alloc(CL(0), 1, shape, dt(kDLUInt, 8, 1), &r);
    cr_assert_eq(st, AB_OK, "cycle %d: %s", k, ab_last_error());
    r->deleter(r);
    cr_assert_eq(ab_pool_stats(CL(0), k == 0 ? &s0 : &s1), AB_OK);
  }
  fake_max_alloc = 0;
  cr_assert_eq(s1.backend_allocs, s0.backend_allocs, "%llu blocks made for one size", (unsigned long long)s1.backend_allocs);
  cr_assert_eq(s1.reserved_bytes.current, s0.reserved_bytes.current);
  cr_assert_eq(s1.cached_blocks, 1);
  cr_assert_eq(s1.oom_retries, 0, "the cache was released for a size no release could help");
  ab_pool_trim(CL(0));
  assert_pool_clean(CL(0));
}

/* A driver that allocates a buffer's memory at its first use, as PoCL's
 * and NVIDIA's OpenCL may: while first_use_refusals is above 0, this
 * clEnqueueWriteBuffer (the library's calls in this executable come here)
 * refuses that many writes with CL_MEM_OBJECT_ALLOCATION_FAILURE. */
static atomic_int first_use_refusals, first_use_refused;
typedef cl_int (*write_buffer_fn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,
                                  const cl_event *, cl_event *);
CL_API_ENTRY cl_int CL_API_CALL clEnqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset,
                                                     size_t size, const void *host, cl_uint nwait,
                                                     const cl_event *wait, cl_event *ev) {
  const write_buffer_fn real = (write_buffer_fn)dlsym(RTLD_NEXT, "clEnqueueWriteBuffer");
  if (real == NULL) return CL_INVALID_OPERATION;
  if (atomic_load(&first_use_refusals) > 0) {
    atomic_fetch_sub(&first_use_refusals, 1);
    atomic_fetch_add(&first_use_refused, 1);
    return CL_MEM_OBJECT_ALLOCATION_FAILURE;
  }
  return real(q, m, blocking, offset, size, host, nwait, wait, ev);
}

static atomic_int relief_calls;
static size_t relief_callback(DLDevice dev, size_t requested, void *user) {
  (void)dev, (void)requested;
  atomic_fetch_add(&relief_calls, 1);
  return (size_t)(uintptr_t)user; /* what it claims to have freed */
}

Test(opencl, memory_that_runs_out_at_first_use_runs_the_oom_sequence) {
  need_devices(1);
  static float v[1 << 16];
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) v[i] = (float)i;
  int64_t shape[1] = {1 << 16};
  DLTensor t = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  /* A block in the cache; the next write is refused once: the cache is
   * released and the conversion tried again, and succeeds. */
  DLManagedTensorVersioned *r = convert_ok(&t, CL(0), AB_COPY_ALWAYS, NULL);
  r->deleter(r);
  struct ab_pool_stats s0 = {.size = sizeof s0}, s1 = {.size = sizeof s1};
  cr_assert_eq(ab_pool_stats(CL(0), &s0), AB_OK);
  cr_assert_gt(s0.cached_blocks, 0);
  atomic_store(&first_use_refused, 0);
  atomic_store(&first_use_refusals, 1);
  r = convert_ok(&t, CL(0), AB_COPY_ALWAYS, NULL);
  cr_assert_eq(atomic_load(&first_use_refused), 1, "the stand-in write was not reached: the test proves nothing");
  DLManagedTensorVersioned *back = convert_ok(&r->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, v, sizeof v), 0);
  back->deleter(back);
  r->deleter(r);
  cr_assert_eq(ab_pool_stats(CL(0), &s1), AB_OK);
  cr_assert_eq(s1.oom_retries, s0.oom_retries + 1);
  cr_assert_gt(s1.trims, s0.trims, "the cache was not released");
  /* ab_convert_into a buffer of the caller's the same way */
  DLManagedTensorVersioned *dst = NULL, *spare = convert_ok(&t, CL(0), AB_COPY_ALWAYS, NULL);
  cr_assert_eq(ab_tensor_alloc(CL(0), 1, shape, dt(kDLFloat, 32, 1), &dst), AB_OK, "%s", ab_last_error());
  spare->deleter(spare); /* a block in the cache to release */
  atomic_store(&first_use_refused, 0);
  atomic_store(&first_use_refusals, 1);
  cr_assert_eq(ab_convert_into(&t, &dst->dl_tensor, NULL), AB_OK, "%s", ab_last_error());
  cr_assert_eq(atomic_load(&first_use_refused), 1);
  back = convert_ok(&dst->dl_tensor, CPU0, AB_COPY_ALWAYS, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, v, sizeof v), 0);
  back->deleter(back);
  dst->deleter(dst);
  cr_assert_eq(ab_pool_stats(CL(0), &s1), AB_OK);
  /* Refused for good: the callbacks are asked (one that frees nothing:
   * one round), then the failure says where the memory ran out; nothing
   * is left behind, src is as it was. */
  cr_assert_eq(ab_register_oom_callback(relief_callback, NULL), AB_OK);
  atomic_store(&relief_calls, 0);
  atomic_store(&first_use_refusals, 1000);
  r = SENTINEL_OUT;
  ab_status st = ab_convert_memory(&t, CL(0), NULL, &r);
  cr_assert_eq(st, AB_ERR_OUT_OF_MEMORY, "%s: %s", ab_status_name(st), ab_last_error());
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "CL_MEM_OBJECT_ALLOCATION_FAILURE"), "%s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), "at a buffer's first use"), "%s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), "1 round of the OOM callbacks"), "%s", ab_last_error());
  cr_assert_eq(atomic_load(&relief_calls), 1);
  /* one that claims progress every time: the rounds stop at the maximum */
  cr_assert_eq(ab_unregister_oom_callback(relief_callback, NULL), AB_OK);
  cr_assert_eq(ab_register_oom_callback(relief_callback, (void *)(uintptr_t)4096), AB_OK);
  atomic_store(&relief_calls, 0);
  st = ab_convert_memory(&t, CL(0), NULL, &r);
  cr_assert_eq(st, AB_ERR_OUT_OF_MEMORY);
  cr_assert_eq(atomic_load(&relief_calls), AB_OOM_MAX_CALLBACK_ROUNDS, "%d rounds", atomic_load(&relief_calls));
  cr_assert_eq(ab_unregister_oom_callback(relief_callback, (void *)(uintptr_t)4096), AB_OK);
  atomic_store(&first_use_refusals, 0);
  struct ab_pool_stats s2 = {.size = sizeof s2};
  cr_assert_eq(ab_pool_stats(CL(0), &s2), AB_OK);
  cr_assert_eq(s2.oom_failures, s1.oom_failures + 2);
  cr_assert_eq(v[12345], 12345.0f);
  ab_pool_trim(CL(0));
  assert_pool_clean(CL(0));
}

/* A context of more devices than the library lists (128), as a caller's
 * context of sub-devices can be: while padded_devices is set, this
 * clGetContextInfo (the library's calls in this executable come here)
 * answers as if the context held that many devices, the real ones last
 * and the rest ids of no device. The library once skipped the device
 * list past 64 (then its limit) and compared ids it had never read: what was on the stack
 * could hold the right id, so this test alone may pass on that code, but
 * the valgrind tier (make test-valgrind runs test_opencl) fails on the
 * uninitialised read. */
static cl_uint padded_devices;
static int padded_lists; /* CL_CONTEXT_DEVICES answered padded */
typedef cl_int (*context_info_fn)(cl_context, cl_context_info, size_t, void *, size_t *);
CL_API_ENTRY cl_int CL_API_CALL clGetContextInfo(cl_context context, cl_context_info param_name, size_t size,
                                                 void *value, size_t *size_ret) {
  const context_info_fn real = (context_info_fn)dlsym(RTLD_NEXT, "clGetContextInfo");
  if (real == NULL) return CL_INVALID_OPERATION;
  if (padded_devices == 0 || (param_name != CL_CONTEXT_NUM_DEVICES && param_name != CL_CONTEXT_DEVICES))
    return real(context, param_name, size, value, size_ret);
  cl_uint n = 0;
  cl_int e = real(context, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL);
  if (e != CL_SUCCESS || n > padded_devices) return e != CL_SUCCESS ? e : CL_INVALID_OPERATION;
  const size_t want = param_name == CL_CONTEXT_NUM_DEVICES ? sizeof(cl_uint) : padded_devices * sizeof(cl_device_id);
  if (size_ret != NULL) *size_ret = want;
  if (value == NULL) return CL_SUCCESS;
  if (size < want) return CL_INVALID_VALUE;
  if (param_name == CL_CONTEXT_NUM_DEVICES) {
    memcpy(value, &padded_devices, sizeof padded_devices);
    return CL_SUCCESS;
  }
  cl_device_id *ids = value;
  padded_lists++;
  for (cl_uint i = 0; i < padded_devices - n; i++) ids[i] = (cl_device_id)(uintptr_t)(0x100 + 8 * i);
  return real(context, CL_CONTEXT_DEVICES, n * sizeof(cl_device_id), ids + (padded_devices - n), NULL);
}

Test(opencl, a_buffer_of_a_context_of_more_devices_than_listed_is_checked_against_them_all) {
  need_devices(2);
  cl_device_id d[2];
  cl_int e;
  first_devices(d, 2);
  uint8_t bytes[64];
  fill_pattern(bytes, sizeof bytes, 5);
  int64_t shape[1] = {64};
  for (int k = 0; k < 2; k++) { /* a context of opencl:0 (the 130th device), then one of opencl:1 alone */
    cl_context ctx = clCreateContext(NULL, 1, &d[k], NULL, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof bytes, bytes, &e);
    cr_assert_eq(e, CL_SUCCESS);
    DLTensor t = {m, CL(0), 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
    padded_devices = 130; /* past the 128 the library lists */
    padded_lists = 0;
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    const ab_status st = ab_convert_memory(&t, CPU0, NULL, &r);
    padded_devices = 0;
    cr_assert_gt(padded_lists, 0, "the library did not ask the stand-in clGetContextInfo for the context's devices");
    if (k == 0) {
      cr_assert_eq(st, AB_OK, "%s", ab_last_error());
      cr_assert_eq(memcmp(r->dl_tensor.data, bytes, sizeof bytes), 0);
      r->deleter(r);
      /* no memory for the list of 70: a status and a message, nothing else */
      padded_devices = 130;
      ab__fault_arm(1);
      const ab_status oom = ab_tensor_validate(&t);
      const long injected = ab__fault_injected();
      ab__fault_arm(0);
      padded_devices = 0;
      cr_assert_eq(injected, 1);
      cr_assert_eq(oom, AB_ERR_OUT_OF_MEMORY, "%s", ab_last_error());
      cr_assert_not_null(strstr(ab_last_error(), "130 devices"), "%s", ab_last_error());
    } else {
      cr_assert_eq(st, AB_ERR_INVALID_ARGUMENT, "a context of 130 ids none of which is opencl:0 was taken");
      cr_assert_not_null(strstr(ab_last_error(), "context"), "%s", ab_last_error());
      cr_assert_eq(r, SENTINEL_OUT);
    }
    clReleaseMemObject(m);
    clReleaseContext(ctx);
  }
  assert_pool_clean(CL(0));
}
#endif

/* Crops (rows of contiguous bytes, up to 3-D) come down in one rectangle
 * read straight into the result: no staging block, not the whole extent. */
Test(opencl, crops_are_read_as_rectangles_without_staging) {
  /* (The crops' values, 3-D, 4-D and with a slice pitch OpenCL's
   * rectangles cannot say, are the conformance suite's.) */
  need_devices(1);

  /* a 16 x 16 crop of a 1024 x 1024 float image */
  size_t n = 1024 * 1024 * 4;
  float *img = malloc(n);
  fill_pattern(img, n, 9);
  int64_t flat[1] = {(int64_t)n};
  DLTensor whole = {img, CPU0, 1, dt(kDLUInt, 8, 1), flat, NULL, 0};
  DLManagedTensorVersioned *dev = convert_ok(&whole, CL(0), AB_COPY_ALWAYS, NULL);
  int64_t shape[2] = {16, 16}, strides[2] = {1024, 1};
  DLTensor crop = {dev->dl_tensor.data, CL(0), 2, dt(kDLFloat, 32, 1), shape, strides, 4 * (1024 * 100 + 200)};
  DLTensor hcrop = crop;
  hcrop.device = CPU0;
  hcrop.data = img;
  float want[256];
  reference_gather(&hcrop, want);
  ab_pool_trim(CPU0);
  ab_pool_reset_peak(CPU0);
  struct ab_pool_stats before = {.size = sizeof before}, after = {.size = sizeof after};
  ab_pool_stats(CPU0, &before);
  DLManagedTensorVersioned *r = convert_ok(&crop, CPU0, AB_COPY_IF_NEEDED, NULL);
  ab_pool_stats(CPU0, &after);
  cr_assert_eq(memcmp(r->dl_tensor.data, want, sizeof want), 0, "crop read wrongly");
  cr_assert_eq(after.allocations - before.allocations, 1, "%llu host blocks for a crop: staged, not a rectangle read",
               (unsigned long long)(after.allocations - before.allocations));
  cr_assert_lt(after.reserved_bytes.peak, 64 << 10, "the crop pulled %llu bytes to the host",
               (unsigned long long)after.reserved_bytes.peak);
  r->deleter(r);
  dev->deleter(dev);

  /* the reverse: a host crop goes up as one rectangle write, no packing */
  DLTensor hup = hcrop;
  ab_pool_trim(CPU0);
  ab_pool_stats(CPU0, &before);
  DLManagedTensorVersioned *up = convert_ok(&hup, CL(0), AB_COPY_IF_NEEDED, NULL);
  ab_pool_stats(CPU0, &after);
  cr_assert_eq(after.allocations, before.allocations, "the crop was packed in a host staging buffer");
  DLManagedTensorVersioned *down = convert_ok(&up->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(down->dl_tensor.data, want, sizeof want), 0, "crop written wrongly");
  down->deleter(down);
  up->deleter(up);
  free(img);
}

/* Sparse strided sources are gathered by a kernel on their device and only
 * the tensor's bytes cross to the host; odd element sizes and offsets that
 * do not suit a typed move use the byte kernel. */
Test(opencl, sparse_sources_are_gathered_on_the_device) {
  need_devices(1);
  size_t n = 1 << 20;
  unsigned char *buf = malloc(n);
  fill_pattern(buf, n, 31);
  int64_t flat[1] = {(int64_t)n};
  DLTensor whole = {buf, CPU0, 1, dt(kDLUInt, 8, 1), flat, NULL, 0};
  DLManagedTensorVersioned *dev = convert_ok(&whole, CL(0), AB_COPY_ALWAYS, NULL);
  static const struct {
    DLDataType type;
    int64_t shape[2], strides[2];
    uint64_t offset;
  } cases[] = {
    /* all over 16x sparser than dense, so even a device whose memory is
     * the host's (PoCL) takes the kernel */
    {{kDLFloat, 32, 1}, {64, 100}, {2000, 10}, 4 * 7},   /* every 10th float of 64 rows */
    {{kDLFloat, 64, 1}, {50, 20}, {-400, 9}, 8 * 20000}, /* reversed rows, gaps */
    {{kDLUInt, 8, 3}, {40, 30}, {600, 7}, 5},            /* 3-byte elements */
    {{kDLInt, 32, 1}, {30, 30}, {700, 3}, 6},            /* misaligned for a typed move */
    {{kDLComplex, 128, 1}, {10, 12}, {300, 4}, 16 * 3},  /* 16-byte elements */
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    DLTensor t = {dev->dl_tensor.data, CL(0), 2, cases[k].type, (int64_t *)cases[k].shape,
                  (int64_t *)cases[k].strides, cases[k].offset};
    DLTensor h = t;
    h.device = CPU0;
    h.data = buf;
    size_t bytes = (size_t)numel_of(2, t.shape) * elsize_of(t.dtype);
    unsigned char *want = malloc(bytes);
    reference_gather(&h, want);
    ab_pool_trim(CPU0);
    ab_pool_reset_peak(CPU0);
    DLManagedTensorVersioned *r = convert_ok(&t, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(memcmp(r->dl_tensor.data, want, bytes), 0, "case %zu: gathered wrongly", k);
    struct ab_pool_stats s = {.size = sizeof s};
    ab_pool_stats(CPU0, &s);
    cr_assert_leq(s.reserved_bytes.peak, ab__pool_round(bytes) + 4096,
                  "case %zu: %llu host bytes for a %zu-byte tensor: the extent was staged", k,
                  (unsigned long long)s.reserved_bytes.peak, bytes);
    r->deleter(r);
    /* and device to device within the context, by the same kernel */
    if (ab_device_count(kDLOpenCL) > 1) {
      DLManagedTensorVersioned *o = convert_ok(&t, CL(1), AB_COPY_IF_NEEDED, NULL);
      DLManagedTensorVersioned *b = convert_ok(&o->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
      cr_assert_eq(memcmp(b->dl_tensor.data, want, bytes), 0, "case %zu: opencl:0 -> opencl:1 wrong", k);
      b->deleter(b);
      o->deleter(o);
    }
    free(want);
  }
  dev->deleter(dev);
  free(buf);
  assert_pool_clean(CL(0));
}

/* Regression: a layout whose merged stride overflows int64 when multiplied
 * out must not be merged (UBSan caught the rectangle check doing it). */
Test(opencl, rectangle_check_survives_overflowing_strides) {
  need_devices(1);
  uint8_t v[4] = {1, 2, 3, 4};
  int64_t shape[2] = {2, 2}, strides[2] = {1, (int64_t)1 << 62};
  DLTensor t = {v, CPU0, 2, dt(kDLUInt, 8, 1), shape, strides, 0};
  ab_convert_opts never = {.copy = AB_COPY_NEVER};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  ab_status st = ab_convert_memory(&t, CL(0), &never, &r);
  cr_assert_neq(st, AB_OK);
  cr_assert_eq(r, SENTINEL_OUT);
}

/* ---- pinned staging memory (AB_DEVICE_OPENCL_HOST) ---------------------- */

#define PINNED(i) ((DLDevice){AB_DEVICE_OPENCL_HOST, (i)})

/* Re-initialises the library with AB_OPENCL_PINNED=mode and a ring that
 * takes transfers of any size in 64 KiB chunks (Criterion runs each test
 * in a process of its own, so the environment stays with this test). */
static void pinned_mode(const char *mode) {
  if (mode) setenv("AB_OPENCL_PINNED", mode, 1);
  else unsetenv("AB_OPENCL_PINNED");
  setenv("AB_STAGING_MIN", "1", 1);
  setenv("AB_STAGING_CHUNK", "64KiB", 1);
  ab__env_reload();
  ab_shutdown();
}

static struct ab_pool_stats stats_of(DLDevice dev) {
  struct ab_pool_stats s = {.size = sizeof s};
  cr_assert_eq(ab_pool_stats(dev, &s), AB_OK, "%s", ab_last_error());
  return s;
}

Test(opencl, pageable_transfers_go_through_a_ring_of_reused_pinned_chunks) {
  need_devices(1);
  pinned_mode("1");
  cr_assert_eq(ab_device_count(AB_DEVICE_OPENCL_HOST), ab_device_count(kDLOpenCL));
  enum { N = (1 << 20) / 4 + 1234 }; /* ~1 MiB: 17 chunks of 64 KiB, the last one short */
  uint32_t *v = malloc(N * 4);
  fill_pattern(v, N * 4, 41);
  int64_t shape[1] = {N};
  DLTensor h = {v, CPU0, 1, dt(kDLUInt, 32, 1), shape, NULL, 0};
  for (int round = 0; round < 2; round++) {
    struct ab_pool_stats before = stats_of(PINNED(0));
    DLManagedTensorVersioned *up = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
    DLManagedTensorVersioned *down = convert_ok(&up->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(memcmp(down->dl_tensor.data, v, N * 4), 0, "round %d: wrong bytes", round);
    struct ab_pool_stats after = stats_of(PINNED(0));
    /* three 64 KiB slots per direction, whatever the transfer's length */
    cr_assert_eq(after.allocations - before.allocations, 6, "round %d: %llu chunk allocations", round,
                 (unsigned long long)(after.allocations - before.allocations));
    cr_assert_eq(after.in_use_bytes.current, 0, "chunks kept after the call");
    cr_assert_leq(after.in_use_bytes.peak, 3 * (64 << 10));
    if (round == 0) cr_assert_gt(after.backend_allocs, 0, "no pinned buffer was made");
    else cr_assert_eq(after.backend_allocs, before.backend_allocs, "round 1 did not reuse the cached chunks");
    down->deleter(down);
    up->deleter(up);
  }
  /* trim returns exactly what is cached, and every pinned buffer is freed */
  struct ab_pool_stats s = stats_of(PINNED(0));
  cr_assert_eq(s.reserved_bytes.current, 3 * (64 << 10));
  assert_pool_clean(PINNED(0));
  assert_pool_clean(CL(0));
  free(v);
}

Test(opencl, a_conversion_to_a_device_is_staged_in_its_pinned_memory) {
  need_devices(1);
  pinned_mode("1");
  enum { H = 64, W = 48, C = 3 };
  uint8_t img[H * W * C];
  fill_pattern(img, sizeof img, 9);
  int64_t shape[3] = {H, W, C};
  int32_t perm[3] = {2, 0, 1};
  DLTensor h = {img, CPU0, 3, dt(kDLUInt, 8, 1), shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  o.permute = perm;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 1.0 / 255.0;
  DLManagedTensorVersioned *up = NULL, *down = NULL;
  cr_assert_eq(ab_convert_memory(&h, CL(0), &o, &up), AB_OK, "%s", ab_last_error());
  struct ab_pool_stats s = stats_of(PINNED(0));
  cr_assert_eq(s.allocations, 1, "the CONVERT step's output was not pinned staging memory");
  cr_assert_eq(s.requested_bytes.peak, (uint64_t)H * W * C * 4);
  cr_assert_eq(ab_convert_memory(&up->dl_tensor, CPU0, NULL, &down), AB_OK, "%s", ab_last_error());
  const float *f = down->dl_tensor.data;
  for (int c = 0; c < C; c++)
    for (int i = 0; i < H * W; i++)
      cr_assert_eq(f[c * H * W + i], (float)img[i * C + c] * (float)(1.0 / 255.0) + 0.0f, "c %d i %d", c, i);
  down->deleter(down);
  up->deleter(up);
  assert_pool_clean(PINNED(0));
}

Test(opencl, cpu_devices_do_not_stage_unless_asked) {
  need_devices(1);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CL(0), &info), AB_OK);
  if (!info.unified_memory) cr_skip_test("opencl:0 is not a CPU device: it stages by default");
  uint8_t v[300000];
  fill_pattern(v, sizeof v, 3);
  int64_t shape[1] = {sizeof v};
  DLTensor h = {v, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  const char *modes[2] = {NULL, "0"};
  for (int m = 0; m < 2; m++) {
    pinned_mode(modes[m]);
    DLManagedTensorVersioned *up = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
    DLManagedTensorVersioned *down = convert_ok(&up->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(memcmp(down->dl_tensor.data, v, sizeof v), 0);
    if (m == 0) cr_assert_eq(stats_of(PINNED(0)).allocations, 0, "auto staged a CPU device's transfer");
    else cr_assert_eq(ab_device_count(AB_DEVICE_OPENCL_HOST), 0, "AB_OPENCL_PINNED=0 left pinned pools");
    down->deleter(down);
    up->deleter(up);
  }
}

Test(opencl, no_tensor_may_name_the_pinned_staging_memory) {
  need_devices(1);
  pinned_mode("1");
  int64_t shape[1] = {16};
  float v[16] = {0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  cr_assert_eq(ab_tensor_alloc(PINNED(0), 1, shape, dt(kDLFloat, 32, 1), &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
  cr_assert_not_null(strstr(ab_last_error(), "opencl_host:0"), "%s", ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), "staging memory"), "%s", ab_last_error());
  DLTensor h = {v, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  cr_assert_eq(ab_convert_memory(&h, PINNED(0), NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
  h.device = PINNED(0);
  cr_assert_eq(ab_convert_memory(&h, CPU0, NULL, &r), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(ab_tensor_validate(&h), AB_ERR_INVALID_ARGUMENT);
  cr_assert_eq(r, SENTINEL_OUT);
  /* but it is a device with a pool, a name and a description */
  DLDevice d;
  cr_assert_eq(ab_parse_device("opencl_host:0", &d), AB_OK);
  cr_assert_eq(d.device_type, AB_DEVICE_OPENCL_HOST);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(PINNED(0), &info), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(strstr(info.name, "pinned host memory of opencl:0"), "%s", info.name);
  cr_assert(info.host_accessible);
  char sum[2048];
  cr_assert_eq(ab_pool_summary(PINNED(0), sum, sizeof sum), AB_OK);
  cr_assert_not_null(strstr(sum, "opencl_host:0"), "%s", sum);
}

Test(opencl, a_pinned_limit_falls_back_to_pageable_staging_not_to_failure) {
  need_devices(1);
  pinned_mode("1");
  setenv("AB_MEMORY_LIMIT", "opencl_host:0=100KiB", 1);
  ab__env_reload();
  ab_shutdown();
  enum { N = 200000 };
  uint8_t *v = malloc(N);
  fill_pattern(v, N, 77);
  int64_t shape[1] = {N};
  DLTensor h = {v, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *up = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  DLManagedTensorVersioned *down = convert_ok(&up->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(down->dl_tensor.data, v, N), 0);
  struct ab_pool_stats s = stats_of(PINNED(0));
  cr_assert_eq(s.limit_bytes, 100 << 10, "AB_MEMORY_LIMIT did not reach opencl_host:0");
  cr_assert_gt(s.oom_failures, 0, "the limit was never reached");
  cr_assert_leq(s.reserved_bytes.peak, 100 << 10);
  cr_assert_eq(s.in_use_bytes.current, 0);
  down->deleter(down);
  up->deleter(up);
  assert_pool_clean(PINNED(0));
  unsetenv("AB_MEMORY_LIMIT");
  ab__env_reload();
  free(v);
}

/* ---- conversions on the device (converters/opencl/convert.cl) ----------- */

static void convert_place(const char *place) {
  setenv("AB_CONVERT_PLACE", place, 1);
  ab__env_reload();
}

static uint64_t pool_allocations(DLDevice dev) { return stats_of(dev).allocations; }


/* Fills a source with values that test the edges: for floats NaN, both
 * infinities and zeros, denormals, huge and tiny values among random bits;
 * for integers the extremes among random ones. */
static void edge_fill(void *p, size_t n, DLDataType d, test_rng *rng) {
  const size_t es = d.bits / 8u;
  fill_pattern(p, n * es, (uint32_t)rng_next(rng));
  if (d.code == kDLBool) /* any nonzero byte is true: 1, 2, 0x80, 0xff... */
    for (size_t i = 0; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)(rng_next(rng) % 3 == 0 ? 0 : 1 + rng_next(rng) % 255);
  if (d.code == kDLFloat && d.bits == 32) {
    static const uint32_t edge[] = {0x7fc00000u, 0xff800000u, 0x7f800000u, 0x80000000u, 0, 1, 0x807fffffu,
                                    0x7f7fffffu, 0x00800000u, 0x3f800000u};
    for (size_t i = 0; i < n && i < 10; i++) memcpy((char *)p + i * 4 * 7 % (n * 4), &edge[i], 4);
  } else if (es == 2 && d.code != kDLInt && d.code != kDLUInt) {
    static const uint16_t edge[] = {0x7e00, 0xfc00, 0x7c00, 0x8000, 0, 1, 0x83ff, 0x7bff, 0x7f80, 0xff80};
    for (size_t i = 0; i < n && i < 10; i++) memcpy((char *)p + (i * 2 * 7) % (n * 2), &edge[i], 2);
  }
}

Test(opencl, conversions_to_float32_run_on_the_device_bit_exact_with_the_host) {
  need_devices(1);
  static const DLDataType from[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1},   {kDLUInt, 16, 1},  {kDLInt, 16, 1},
                                    {kDLBool, 8, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}};
  static const double cscale[4] = {1 / 58.395, 1 / 57.12, 1 / 57.375, 3.0}, coff[4] = {-2.1, -2.03, -1.8, 0.5};
  test_rng rng = {2026};
  int device_runs = 0;
  for (size_t f = 0; f < sizeof from / sizeof from[0]; f++) {
    for (int trial = 0; trial < 12; trial++) {
      const int32_t ndim = 2 + trial % 4; /* 2- to 5-D */
      int64_t shape[5];
      int32_t perm[5];
      for (int32_t i = 0; i < ndim; i++) {
        shape[i] = rng_between(&rng, 1, ndim > 3 ? 5 : 17);
        perm[i] = i;
      }
      for (int32_t i = ndim - 1; i > 0; i--) { /* a random axis order */
        int32_t j = (int32_t)rng_between(&rng, 0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
      }
      if (from[f].code == kDLFloat && from[f].bits == 32 && trial % 3 == 0)
        for (int32_t i = 0; i < ndim; i++) perm[i] = (i + 1) % ndim; /* float32 unscaled: the order must change */
      const int32_t chan = (int32_t)rng_between(&rng, 0, ndim - 1);
      shape[chan] = rng_between(&rng, 1, 4);
      const int64_t n = numel_of(ndim, shape);
      void *v = malloc((size_t)n * 4 + 4);
      edge_fill(v, (size_t)n, from[f], &rng);
      DLTensor h = {v, CPU0, ndim, from[f], shape, NULL, 0};
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = dt(kDLFloat, 32, 1);
      o.permute = perm;
      const int mode = trial % 3; /* none, per tensor, per channel */
      if (mode == 1) {
        o.flags = AB_CONVERT_AFFINE;
        o.scale = 1.0 / 255.0;
        o.offset = -0.5;
      } else if (mode == 2) {
        o.flags = AB_CONVERT_PER_CHANNEL;
        o.channel_axis = chan;
        o.channel_scale = cscale;
        o.channel_offset = trial % 2 ? coff : NULL;
      }
      DLManagedTensorVersioned *want = NULL, *dev = NULL, *got = NULL;
      cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &want), AB_OK, "host: %s", ab_last_error());
      convert_place("device");
      const uint64_t before = pool_allocations(CL(0));
      cr_assert_eq(ab_convert_memory(&h, CL(0), &o, &dev), AB_OK, "device: %s", ab_last_error());
      /* the source's bytes in a buffer there, then the result: two blocks */
      cr_assert_eq(pool_allocations(CL(0)) - before, 2, "dtype %zu trial %d: not converted on the device", f, trial);
      convert_place("auto");
      cr_assert_eq(ab_convert_memory(&dev->dl_tensor, CPU0, NULL, &got), AB_OK, "%s", ab_last_error());
      const float *a = want->dl_tensor.data, *b = got->dl_tensor.data;
      for (int64_t i = 0; i < n; i++)
        cr_assert(same_f32(a[i], b[i], mode != 0), "dtype %zu trial %d mode %d element %lld: host %a, device %a", f,
                  trial, mode, (long long)i, (double)a[i], (double)b[i]);
      device_runs++;
      got->deleter(got);
      dev->deleter(dev);
      want->deleter(want);
      free(v);
    }
  }
  cr_assert_eq(device_runs, (int)(sizeof from / sizeof from[0]) * 12, "not every case ran");
  assert_pool_clean(CL(0));
}

Test(opencl, conversions_to_float16_and_bfloat16_run_on_the_device_bit_exact_with_the_host) {
  /* Every source kind into float16 and bfloat16 within one device (one
   * kernel: float32 arithmetic, then vstore_half_rte or the bfloat16
   * rounding), against the host converter. */
  need_devices(1);
  static const DLDataType from[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1},   {kDLUInt, 16, 1},  {kDLInt, 16, 1},
                                    {kDLBool, 8, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}};
  static const DLDataType to[] = {{kDLFloat, 16, 1}, {kDLBfloat, 16, 1}};
  static const double cscale[4] = {1 / 58.395, 3.0, -0.75, 1024.0}, coff[4] = {-2.1, 0.5, 1e-6, -3.0};
  test_rng rng = {2027};
  int runs = 0;
  for (size_t f = 0; f < sizeof from / sizeof from[0]; f++) {
    for (size_t t = 0; t < 2; t++) {
      for (int trial = 0; trial < 6; trial++) {
        const int32_t ndim = 2 + trial % 3;
        int64_t shape[4];
        int32_t perm[4];
        for (int32_t i = 0; i < ndim; i++) {
          shape[i] = rng_between(&rng, 1, 13);
          perm[i] = (i + trial) % ndim;
        }
        const int32_t chan = (int32_t)rng_between(&rng, 0, ndim - 1);
        shape[chan] = rng_between(&rng, 1, 4);
        const int64_t n = numel_of(ndim, shape);
        void *v = malloc((size_t)n * 4 + 4);
        edge_fill(v, (size_t)n, from[f], &rng);
        if (from[f].code == kDLFloat && from[f].bits == 32) fill_half_probes(v, n, &rng);
        DLTensor h = {v, CPU0, ndim, from[f], shape, NULL, 0};
        ab_convert_opts o = AB_CONVERT_OPTS_INIT;
        o.dtype = to[t];
        o.permute = perm;
        const int mode = trial % 3;
        if (mode == 1 || (mode == 0 && from[f].code == to[t].code && from[f].bits == 16)) {
          o.flags = AB_CONVERT_AFFINE; /* a bare float16 permutation is the host gather's */
          o.scale = 1.0 / 3.0;
          o.offset = 0.25;
        } else if (mode == 2) {
          o.flags = AB_CONVERT_PER_CHANNEL;
          o.channel_axis = chan;
          o.channel_scale = cscale;
          o.channel_offset = trial % 2 ? coff : NULL;
        }
        DLManagedTensorVersioned *want = NULL, *src = NULL, *dev = NULL, *got = NULL;
        cr_assert_eq(ab_convert_memory(&h, CPU0, &o, &want), AB_OK, "host: %s", ab_last_error());
        src = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
        convert_place("device");
        const uint64_t before = pool_allocations(CL(0));
        dev = convert_ok_with(&src->dl_tensor, CL(0), &o);
        cr_assert_eq(pool_allocations(CL(0)) - before, 1, "dtype %zu -> %zu trial %d: not one kernel on the device", f,
                     t, trial);
        convert_place("auto");
        got = convert_ok(&dev->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
        const uint16_t *a = want->dl_tensor.data, *b = got->dl_tensor.data;
        for (int64_t i = 0; i < n; i++)
          cr_assert(same_16(a[i], b[i], t == 0 ? 0x7c00 : 0x7f80),
                    "dtype %zu -> %s trial %d element %lld: host %#06x, device %#06x", f, t == 0 ? "f16" : "bf16",
                    trial, (long long)i, a[i], b[i]);
        runs++;
        got->deleter(got);
        dev->deleter(dev);
        src->deleter(src);
        want->deleter(want);
        free(v);
      }
    }
  }
  cr_assert_eq(runs, 8 * 2 * 6);
  assert_pool_clean(CL(0));
}

Test(opencl, the_planner_keeps_conversions_on_the_host_where_the_device_does_not_pay) {
  need_devices(1);
  struct ab_device_info info;
  cr_assert_eq(ab_device_info(CL(0), &info), AB_OK);
  uint8_t img[4 * 5 * 3];
  fill_pattern(img, sizeof img, 1);
  int64_t shape[3] = {4, 5, 3};
  DLTensor h = {img, CPU0, 3, dt(kDLUInt, 8, 1), shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  /* auto: uint8 -> float32 widens, but on a CPU device the host converts */
  convert_place("auto");
  uint64_t before = pool_allocations(CL(0));
  DLManagedTensorVersioned *r = convert_ok_with(&h, CL(0), &o);
  cr_assert_eq(pool_allocations(CL(0)) - before, info.unified_memory ? 1 : 2);
  r->deleter(r);
  /* host: always */
  convert_place("host");
  before = pool_allocations(CL(0));
  r = convert_ok_with(&h, CL(0), &o);
  cr_assert_eq(pool_allocations(CL(0)) - before, 1);
  r->deleter(r);
  /* a cast the kernels do not have (complex64 -> complex128) or a strided
   * source: the host, even when the device is asked for */
  convert_place("device");
  float cx[2 * 60];
  for (int i = 0; i < 120; i++) cx[i] = (float)img[i / 2] + (i % 2 ? 0.25f : 0.0f);
  DLTensor hc = {cx, CPU0, 3, dt(kDLComplex, 64, 1), shape, NULL, 0};
  o.dtype = dt(kDLComplex, 128, 1);
  before = pool_allocations(CL(0));
  r = convert_ok_with(&hc, CL(0), &o);
  cr_assert_eq(pool_allocations(CL(0)) - before, 1);
  DLManagedTensorVersioned *back = convert_ok(&r->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  for (int i = 0; i < 120; i++) cr_assert_eq(((double *)back->dl_tensor.data)[i], (double)cx[i]);
  back->deleter(back);
  r->deleter(r);
  int64_t strides[3] = {15, 3, 1};
  strides[0] = 16; /* rows padded: not compact */
  uint8_t padded[4 * 16];
  DLTensor s = {padded, CPU0, 3, dt(kDLUInt, 8, 1), shape, strides, 0};
  fill_pattern(padded, sizeof padded, 2);
  o.dtype = dt(kDLFloat, 32, 1);
  before = pool_allocations(CL(0));
  r = convert_ok_with(&s, CL(0), &o);
  cr_assert_eq(pool_allocations(CL(0)) - before, 1);
  r->deleter(r);
  assert_pool_clean(CL(0));
}

/* Every allocation and every transfer of the device conversion's route
 * fails in turn: each run ends in AB_OK with the right bytes, or in the
 * fault's status with nothing kept. */
/* A fault sweep over one conversion route: every allocation, then every
 * transfer, fails in turn. Each run ends in AB_OK, when `check` verifies
 * the result (and deletes it), or in the fault's status with nothing
 * kept: host blocks as before, cpu:0 clean, and opencl:0 holding exactly
 * `cl0_kept` bytes (0: clean). At least min_alloc and min_transfer sites. */
static void sweep_route(const DLTensor *src, DLDevice to, const ab_convert_opts *o,
                        void (*check)(DLManagedTensorVersioned *r, int n), uint64_t cl0_kept, int min_alloc,
                        int min_transfer) {
  for (int transfer = 0; transfer < 2; transfer++) {
    int n, faults = 0;
    for (n = 1; n < 200; n++) {
      long live = ab__alloc_live_settled();
      DLManagedTensorVersioned *r = SENTINEL_OUT;
      if (transfer) ab__fault_arm_transfer(n);
      else ab__fault_arm(n);
      ab_status st = ab_convert_memory(src, to, o, &r);
      long injected = transfer ? ab__fault_transfer_injected() : ab__fault_injected();
      ab__fault_arm(0);
      ab__fault_arm_transfer(0);
      if (st == AB_OK) {
        check(r, n);
      } else {
        cr_assert_eq(st, transfer ? AB_ERR_BACKEND : AB_ERR_OUT_OF_MEMORY, "N=%d: %s (%s)", n, ab_status_name(st),
                     ab_last_error());
        cr_assert_eq(r, SENTINEL_OUT);
      }
      if (cl0_kept == 0)
        assert_pool_clean(CL(0));
      else
        cr_assert_eq(stats_of(CL(0)).in_use_bytes.current, cl0_kept, "N=%d: device blocks kept besides the source", n);
      assert_pool_clean(CPU0);
      cr_assert_eq(ab__alloc_live_settled(), live, "N=%d: host blocks leaked", n);
      if (injected == 0) break;
      faults++;
    }
    cr_assert_lt(n, 200);
    cr_assert_geq(faults, transfer ? min_transfer : min_alloc, "%s faults: only %d sites",
                  transfer ? "transfer" : "allocation", faults);
  }
}

static uint16_t widen_src[6 * 7];

static void check_widened(DLManagedTensorVersioned *r, int n) {
  DLManagedTensorVersioned *back = convert_ok(&r->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  const float *f = back->dl_tensor.data;
  for (int j = 0; j < 7; j++)
    for (int i = 0; i < 6; i++) cr_assert_eq(f[j * 6 + i], (float)widen_src[i * 7 + j] * 0.25f, "N=%d", n);
  back->deleter(back);
  r->deleter(r);
}

Test(opencl, the_device_conversion_route_survives_every_fault) {
  need_devices(1);
  convert_place("device");
  for (int i = 0; i < 42; i++) widen_src[i] = (uint16_t)(i * 1543u);
  int64_t shape[2] = {6, 7};
  int32_t perm[2] = {1, 0};
  DLTensor h = {widen_src, CPU0, 2, dt(kDLUInt, 16, 1), shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  o.permute = perm;
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 0.25;
  sweep_route(&h, CL(0), &o, check_widened, 0, 3, 2);
}

/* Without the OpenCL headers (AB_WITH_OPENCL=OFF) every test here skips at
 * need_devices, before this is asked. */
static bool device_has_fp64(int32_t id) {
#ifndef AB_HAVE_OPENCL
  (void)id;
  return false;
#else
  cl_platform_id plats[16];
  cl_uint np = 0;
  char ext[8192] = "";
  int32_t seen = 0;
  clGetPlatformIDs(16, plats, &np);
  for (cl_uint p = 0; p < np; p++) {
    cl_device_id devs[64];
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &nd) != CL_SUCCESS) continue;
    if (id < seen + (int32_t)nd) {
      clGetDeviceInfo(devs[id - seen], CL_DEVICE_EXTENSIONS, sizeof ext, ext, NULL);
      return strstr(ext, "cl_khr_fp64") != NULL;
    }
    seen += (int32_t)nd;
  }
  return false;
#endif
}

/* float sources with the values that decide rounding and saturation:
 * ties, negatives, values past the integer's range, NaN, infinities. */
static void narrow_fill(void *p, int64_t n, DLDataType d, test_rng *rng) {
  static const float special[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 127.5f, 128.5f, 254.5f, 255.5f, 256.0f, 300.0f,
                                  -129.5f, 32767.5f, 65535.5f, 70000.0f, -40000.0f, 1e30f, -1e30f, 0.0f, -0.0f,
                                  __builtin_nanf(""), __builtin_inff(), -__builtin_inff(), 1e-40f};
  const int ns = sizeof special / sizeof special[0];
  if (d.code == kDLUInt || d.code == kDLInt || d.code == kDLBool) { /* random integers and their extremes */
    edge_fill(p, (size_t)n, d, rng);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float v = rng_next(rng) % 3 == 0 ? special[rng_next(rng) % ns]
                                     : (float)rng_between(rng, -70000, 70000) / (float)rng_between(rng, 1, 300);
    if (d.bits == 32) {
      ((float *)p)[i] = v;
    } else {
      uint32_t b;
      memcpy(&b, &v, 4);
      /* float16: through the library's own rounding; bfloat16: truncated */
      ((uint16_t *)p)[i] = d.code == kDLBfloat ? (uint16_t)(b >> 16) : ab__half_from_float(v);
    }
  }
}

Test(opencl, narrowing_conversions_run_on_the_source_device_bit_exact_with_the_host) {
  need_devices(1);
  if (!device_has_fp64(0)) cr_skip_test("opencl:0 has no cl_khr_fp64: narrowing stays on the host there");
  static const DLDataType from[] = {{kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}, {kDLUInt, 8, 1},
                                    {kDLInt, 8, 1},    {kDLUInt, 16, 1},   {kDLInt, 16, 1},   {kDLBool, 8, 1}};
  static const DLDataType to[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1}, {kDLUInt, 16, 1}, {kDLInt, 16, 1}};
  static const double cscale[3] = {255.0, 127.25, -3.0}, coff[3] = {0.5, -1.0, 100.0};
  test_rng rng = {99};
  for (size_t f = 0; f < sizeof from / sizeof from[0]; f++) {
    for (size_t g = 0; g < 4; g++) {
      for (int trial = 0; trial < 6; trial++) {
        int64_t shape[3] = {rng_between(&rng, 1, 9), rng_between(&rng, 2, 11), 3};
        const int64_t n = shape[0] * shape[1] * 3;
        void *v = malloc((size_t)n * 4);
        narrow_fill(v, n, from[f], &rng);
        DLTensor h = {v, CPU0, 3, from[f], shape, NULL, 0};
        /* the source on the device; every other trial read through a
         * transposed view of it */
        DLManagedTensorVersioned *a = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
        DLTensor src = a->dl_tensor, hsrc = h;
        int64_t tshape[3] = {shape[1], shape[0], 3}, tstrides[3] = {3, shape[1] * 3, 1};
        if (trial % 2) {
          src.shape = hsrc.shape = tshape;
          src.strides = hsrc.strides = tstrides;
        }
        int32_t perm[3] = {2, 0, 1}; /* HWC -> CHW */
        ab_convert_opts o = AB_CONVERT_OPTS_INIT;
        o.dtype = to[g];
        if (trial % 3 == 0) o.permute = perm;
        if (trial % 3 == 1) {
          o.flags = AB_CONVERT_AFFINE;
          o.scale = 255.0;
          o.offset = 0.25;
        } else if (trial % 3 == 2) {
          o.flags = AB_CONVERT_PER_CHANNEL;
          o.channel_axis = 2;
          o.channel_scale = cscale;
          o.channel_offset = coff;
        }
        DLManagedTensorVersioned *want = convert_ok_with(&hsrc, CPU0, &o), *got;
        convert_place("device");
        const uint64_t before = pool_allocations(CL(0));
        got = convert_ok_with(&src, CPU0, &o);
        cr_assert_eq(pool_allocations(CL(0)) - before, 1, "from %zu to %zu trial %d: not narrowed on the device", f, g,
                     trial);
        convert_place("auto");
        const size_t bytes = (size_t)n * (to[g].bits / 8u);
        if (memcmp(want->dl_tensor.data, got->dl_tensor.data, bytes) != 0) {
          const uint8_t *x = want->dl_tensor.data, *y = got->dl_tensor.data;
          size_t i = 0;
          while (x[i] == y[i]) i++;
          cr_assert_fail("from %zu to %zu trial %d: byte %zu differs: host %u, device %u", f, g, trial, i, x[i], y[i]);
        }
        got->deleter(got);
        want->deleter(want);
        a->deleter(a);
        free(v);
      }
    }
  }
  assert_pool_clean(CL(0));
}

Test(opencl, a_conversion_within_one_device_is_one_kernel) {
  need_devices(1);
  if (!device_has_fp64(0)) cr_skip_test("opencl:0 has no cl_khr_fp64: narrowing stays on the host there");
  float v[2 * 3 * 4];
  for (int i = 0; i < 24; i++) v[i] = (float)i / 23.0f;
  int64_t shape[3] = {2, 3, 4};
  DLTensor h = {v, CPU0, 3, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLUInt, 8, 1);
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 255.0;
  convert_place("device");
  struct ab_pool_stats host_before = stats_of(CPU0);
  const uint64_t before = pool_allocations(CL(0));
  DLManagedTensorVersioned *r = convert_ok_with(&a->dl_tensor, CL(0), &o);
  cr_assert_eq(pool_allocations(CL(0)) - before, 1, "more than the result was allocated on the device");
  cr_assert_eq(stats_of(CPU0).allocations, host_before.allocations, "the bytes went through the host");
  convert_place("auto");
  DLManagedTensorVersioned *back = convert_ok(&r->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  for (int i = 0; i < 24; i++)
    cr_assert_eq(((uint8_t *)back->dl_tensor.data)[i], (uint8_t)__builtin_nearbyint((double)v[i] * 255.0), "%d", i);
  back->deleter(back);
  r->deleter(r);
  a->deleter(a);
  assert_pool_clean(CL(0));
}

/* Converts a compact host source of `from` (values from fill_cast_probes)
 * to `to` within opencl:0 with AB_CONVERT_PLACE=device, checks the result
 * against the host's, and returns whether the plan was the one kernel. */
static bool converted_by_one_kernel(DLDataType from, DLDataType to) {
  test_rng rng = {(uint64_t)from.code * 1000 + from.bits * 10 + to.code * 7 + to.bits};
  int64_t shape[2] = {5, 7};
  const int32_t perm[2] = {1, 0};
  void *v = malloc(35 * 8);
  fill_cast_probes(v, 35, from, &rng);
  DLTensor h = {v, CPU0, 2, from, shape, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = to;
  o.permute = perm;
  DLManagedTensorVersioned *want = convert_ok_with(&h, CPU0, &o), *src = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  convert_place("device");
  char plan[2048];
  cr_assert_eq(ab_explain_convert(&src->dl_tensor, CL(0), &o, plan, sizeof plan), AB_OK, "%s", ab_last_error());
  DLManagedTensorVersioned *dev = convert_ok_with(&src->dl_tensor, CL(0), &o);
  convert_place("auto");
  DLManagedTensorVersioned *got = convert_ok(&dev->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  const int64_t bad = first_different_element(to, want->dl_tensor.data, got->dl_tensor.data, 35);
  cr_assert_eq(bad, -1, "%s: element %lld differs from the host's", plan, (long long)bad);
  got->deleter(got);
  dev->deleter(dev);
  src->deleter(src);
  want->deleter(want);
  free(v);
  return strstr(plan, "1. convert on opencl:0:") != NULL && strstr(plan, "2. ") == NULL;
}

/* h (host memory) uploaded to opencl:0 as it is, converted there to `to`
 * by the device's kernel (its plan must say so), and brought back: the
 * result in host memory. */
static DLManagedTensorVersioned *converted_by_the_device(const DLTensor *h, DLDataType to) {
  DLManagedTensorVersioned *src = convert_ok(h, CL(0), AB_COPY_IF_NEEDED, NULL);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = to;
  convert_place("device");
  char plan[1024];
  cr_assert_eq(ab_explain_convert(&src->dl_tensor, CL(0), &o, plan, sizeof plan), AB_OK);
  cr_assert(strstr(plan, "convert on opencl:0:") != NULL, "not converted on the device:\n%s", plan);
  DLManagedTensorVersioned *dev = convert_ok_with(&src->dl_tensor, CL(0), &o);
  convert_place("auto");
  DLManagedTensorVersioned *got = convert_ok(&dev->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  dev->deleter(dev);
  src->deleter(src);
  return got;
}

/* The guide: a float16 or bfloat16 NaN widened by the OpenCL kernels
 * keeps its sign and payload, quieted, as the host widens it, into
 * float32 and float64. bfloat16 was a bare shift, so a signalling NaN
 * stayed signalling (0x7f81 -> 0x7f810000); float16 went through
 * vload_half, which leaves the NaN to the implementation, and into
 * float64 both went through the device's float -> double. Each is
 * checked against the rule and against the host's own bits. */
Test(opencl, float16_and_bfloat16_nans_widen_as_on_the_host) {
  need_devices(1);
  static const uint16_t bits[2][10] = {
      {0x7c01, 0xfd23, 0x7e00, 0x7fff, 0xfe00, 0x7c00, 0xfc00, 0x0001, 0x8000, 0x3c00},
      {0x7f81, 0xff81, 0x7fc1, 0x7fff, 0xffc0, 0x7f80, 0xff80, 0x0001, 0x8000, 0x3f80}};
  const int n = 10;
  for (int kind = 0; kind < 2; kind++)
    for (int wide = 0; wide < 2; wide++) { /* into float32, into float64 */
      const int mbits = kind ? 7 : 10, es = wide ? 8 : 4;
      int64_t shape[1] = {n};
      DLTensor h = {(void *)bits[kind], CPU0, 1, dt(kind ? kDLBfloat : kDLFloat, 16, 1), shape, NULL, 0};
      DLManagedTensorVersioned *got = converted_by_the_device(&h, dt(kDLFloat, wide ? 64 : 32, 1));
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = dt(kDLFloat, wide ? 64 : 32, 1);
      DLManagedTensorVersioned *host = convert_ok_with(&h, CPU0, &o);
      for (int i = 0; i < n; i++) {
        const uint64_t b = bits[kind][i], m = b & ((1u << mbits) - 1);
        uint64_t u = 0, hv = 0;
        memcpy(&u, (char *)got->dl_tensor.data + got->dl_tensor.byte_offset + es * i, (size_t)es);
        memcpy(&hv, (char *)host->dl_tensor.data + host->dl_tensor.byte_offset + es * i, (size_t)es);
        const bool nan = (b & 0x7fffu) > (kind ? 0x7f80u : 0x7c00u);
        if (nan || kind == 1) { /* a NaN: quiet, its sign and payload; a bfloat16 number: float32's top half */
          uint64_t want = wide ? (b >> 15) << 63 | 0x7ff8000000000000ull | m << (52 - mbits)
                               : (b >> 15) << 31 | 0x7fc00000u | m << (23 - mbits);
          if (!nan) {
            const uint32_t top = (uint32_t)b << 16;
            float f;
            memcpy(&f, &top, 4);
            const double d = f;
            if (wide) memcpy(&want, &d, 8);
            else want = top;
          }
          cr_assert_eq(u, want, "%s 0x%04llx -> float%d 0x%llx, want 0x%llx", kind ? "bfloat16" : "float16",
                       (unsigned long long)b, wide ? 64 : 32, (unsigned long long)u, (unsigned long long)want);
        }
        cr_assert_eq(u, hv, "%s 0x%04llx -> float%d 0x%llx on the device, 0x%llx on the host",
                     kind ? "bfloat16" : "float16", (unsigned long long)b, wide ? 64 : 32, (unsigned long long)u,
                     (unsigned long long)hv);
      }
      host->deleter(host);
      got->deleter(got);
    }
}

/* And narrowed: a float32 NaN into float16 by the OpenCL kernels is the
 * host's (quiet, with its payload's top bits, its sign kept). vstore_half
 * leaves it to the implementation, and PoCL stored 0x7fff or 0xffff for
 * every NaN (found by tests/stress/soak.c through a device). */
Test(opencl, float32_nans_narrow_to_float16_as_on_the_host) {
  need_devices(1);
  static const uint32_t bits[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa00000, 0xff812345,
                                  0x7fffffff, 0x7f800000, 0x3f800000, 0x80000000};
  const int n = (int)(sizeof bits / sizeof bits[0]);
  int64_t shape[1] = {n};
  DLTensor h = {(void *)bits, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *got = converted_by_the_device(&h, dt(kDLFloat, 16, 1));
  /* and the host's own, for the same bits */
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 16, 1);
  DLManagedTensorVersioned *host = convert_ok_with(&h, CPU0, &o);
  for (int i = 0; i < n; i++) {
    const uint32_t u = bits[i];
    uint16_t want = 0, g, hv;
    if ((u & 0x7fffffffu) > 0x7f800000u) want = (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
    else if (u == 0x7f800000u) want = 0x7c00;
    else if (u == 0x3f800000u) want = 0x3c00;
    else want = 0x8000;
    memcpy(&g, (char *)got->dl_tensor.data + got->dl_tensor.byte_offset + 2 * i, 2);
    memcpy(&hv, (char *)host->dl_tensor.data + host->dl_tensor.byte_offset + 2 * i, 2);
    cr_assert_eq(g, want, "float32 0x%08x -> float16 0x%04x on opencl:0, want 0x%04x", u, g, want);
    cr_assert_eq(hv, want, "float32 0x%08x -> float16 0x%04x on the host, want 0x%04x", u, hv, want);
  }
  host->deleter(host);
  got->deleter(got);
}

/* Launches go in pieces of at most 2^30 work items, each at its global
 * offset (some drivers fail or misnumber past 2^31 and 2^32 items). Test
 * builds cut them at AB_TEST_OPENCL_MAX_ITEMS: 8 items a launch, so 35
 * elements take five, the last of 3, and a piece that ignored its offset
 * would leave elements 8.. wrong. */
Test(opencl, launches_cut_into_pieces_give_the_same_bytes) {
  setenv("AB_TEST_OPENCL_MAX_ITEMS", "8", 1);
  need_devices(1);
  const DLDataType pairs[][2] = {
      {{kDLUInt, 8, 1}, {kDLFloat, 32, 1}},  /* the float32 kernels */
      {{kDLInt, 32, 1}, {kDLInt, 64, 1}},    /* ab_convert_int */
      {{kDLInt, 64, 1}, {kDLFloat, 32, 1}},  /* ab_convert_wide */
      {{kDLFloat, 32, 1}, {kDLUInt, 8, 1}},  /* narrowing (where the device has doubles) */
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
    if (i < 3 || device_has_fp64(0))
      cr_assert(converted_by_one_kernel(pairs[i][0], pairs[i][1]), "pair %zu went elsewhere", i);
  /* a strided gather within the device */
  float v[12 * 10];
  for (int i = 0; i < 120; i++) v[i] = (float)i * 0.5f;
  int64_t flat[1] = {120}, shape[2] = {10, 6}, strides[2] = {1, 20};
  DLTensor whole = {v, CPU0, 1, dt(kDLFloat, 32, 1), flat, NULL, 0};
  DLManagedTensorVersioned *dev = convert_ok(&whole, CL(0), AB_COPY_ALWAYS, NULL);
  DLTensor t = {dev->dl_tensor.data, CL(0), 2, dt(kDLFloat, 32, 1), shape, strides, 4};
  DLManagedTensorVersioned *g = convert_ok(&t, CL(0), AB_COPY_ALWAYS, NULL);
  DLManagedTensorVersioned *back = convert_ok(&g->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  for (int a = 0; a < 10; a++)
    for (int b = 0; b < 6; b++)
      cr_assert_eq(((float *)back->dl_tensor.data)[a * 6 + b], v[1 + a + 20 * b], "element (%d, %d)", a, b);
  back->deleter(back);
  g->deleter(g);
  dev->deleter(dev);
  unsetenv("AB_TEST_OPENCL_MAX_ITEMS");
  assert_pool_clean(CL(0));
}

/* A piece that fails to start, after others did: the call fails naming
 * the kernel, nothing leaks or stays in use, and the next call (no fault)
 * gives the right bytes. (The pieces already started are waited for
 * before the buffers go back; an LD_PRELOAD shim counting clFinish showed
 * none before.) */
Test(opencl, a_launch_failing_after_some_pieces_started_fails_cleanly) {
  setenv("AB_TEST_OPENCL_MAX_ITEMS", "8", 1);
  need_devices(1);
  uint8_t v[35];
  for (int i = 0; i < 35; i++) v[i] = (uint8_t)(i * 7);
  int64_t shape[1] = {35};
  DLTensor h = {v, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *src = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  convert_place("device");
  for (int piece = 1; piece <= 5; piece++) {
    char p[8];
    snprintf(p, sizeof p, "%d", piece);
    setenv("AB_TEST_OPENCL_FAIL_PIECE", p, 1);
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    const ab_status st = ab_convert_memory(&src->dl_tensor, CL(0), &o, &r);
    cr_assert_neq(st, AB_OK, "piece %d: the failed launch was not reported", piece);
    cr_assert_eq(r, SENTINEL_OUT);
    cr_assert_not_null(strstr(ab_last_error(), "the conversion kernel"), "piece %d: %s", piece, ab_last_error());
  }
  unsetenv("AB_TEST_OPENCL_FAIL_PIECE");
  DLManagedTensorVersioned *dev = convert_ok_with(&src->dl_tensor, CL(0), &o);
  convert_place("auto");
  DLManagedTensorVersioned *back = convert_ok(&dev->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  for (int i = 0; i < 35; i++) cr_assert_eq(((float *)back->dl_tensor.data)[i], (float)v[i], "element %d", i);
  back->deleter(back);
  dev->deleter(dev);
  src->deleter(src);
  unsetenv("AB_TEST_OPENCL_MAX_ITEMS");
  assert_pool_clean(CL(0));
}

Test(opencl, a_compiler_refusing_the_generic_kernels_keeps_the_per_pair_ones) {
  /* convert.cl built as by a compiler that fails on ab_convert_int and
   * ab_convert_wide: built again without them, the per-pair kernels run
   * and the other pairs convert on the host, with the same bits. */
  setenv("AB_TEST_OPENCL_CONVERT_OPTIONS", "-DAB_TEST_REFUSE_GENERIC", 1);
  need_devices(1);
  if (!device_has_fp64(0)) cr_skip_test("opencl:0 has no cl_khr_fp64");
  cr_assert(converted_by_one_kernel(dt(kDLUInt, 8, 1), dt(kDLFloat, 32, 1)), "the float32 kernels went too");
  cr_assert(converted_by_one_kernel(dt(kDLFloat, 32, 1), dt(kDLUInt, 8, 1)), "the narrowing kernels went too");
  cr_assert(!converted_by_one_kernel(dt(kDLInt, 64, 1), dt(kDLFloat, 32, 1)), "ab_convert_wide still ran");
  cr_assert(!converted_by_one_kernel(dt(kDLInt, 32, 1), dt(kDLInt, 64, 1)), "ab_convert_int still ran");
  unsetenv("AB_TEST_OPENCL_CONVERT_OPTIONS");
  assert_pool_clean(CL(0));
}

/* A program that did not build was logged as "unknown OpenCL error, -11"
 * with nothing of what the compiler said: the warning now names the
 * error and quotes the start of the build log. */
Test(opencl, a_compiler_refusing_convert_cl_is_named_with_its_log, .init = cr_redirect_stderr) {
  setenv("AB_TEST_OPENCL_CONVERT_OPTIONS", "-DAB_TEST_REFUSE_ALL", 1);
  need_devices(1);
  cr_assert(!converted_by_one_kernel(dt(kDLUInt, 8, 1), dt(kDLFloat, 32, 1)), "a kernel ran");
  unsetenv("AB_TEST_OPENCL_CONVERT_OPTIONS");
  fflush(stderr);
  char text[4096];
  size_t n = fread(text, 1, sizeof text - 1, cr_get_redirected_stderr());
  text[n] = '\0';
  cr_assert_not_null(strstr(text, "OpenCL conversion kernels unavailable (CL_BUILD_PROGRAM_FAILURE, -11)"), "%s", text);
  cr_assert_not_null(strstr(text, "; the compiler said: "), "%s", text);
  cr_assert_not_null(strstr(text, "this compiler refuses convert.cl (a test)"), "%s", text);
  cr_assert_null(strchr(strstr(text, "the compiler said"), '\t'), "%s", text);
  assert_pool_clean(CL(0));
}

Test(opencl, a_compiler_without_doubles_keeps_the_integer_and_float32_kernels) {
  /* convert.cl built as by a compiler without cl_khr_fp64: integer pairs
   * and float32 arithmetic stay on the device, float64 arithmetic goes to
   * the host, with the same bits. */
  setenv("AB_TEST_OPENCL_CONVERT_OPTIONS", "-DAB_TEST_NO_FP64", 1);
  need_devices(1);
  cr_assert(converted_by_one_kernel(dt(kDLInt, 32, 1), dt(kDLInt, 64, 1)), "ab_convert_int needs no doubles");
  cr_assert(converted_by_one_kernel(dt(kDLUInt, 64, 1), dt(kDLInt, 8, 1)), "ab_convert_int needs no doubles");
  cr_assert(converted_by_one_kernel(dt(kDLUInt, 8, 1), dt(kDLBfloat, 16, 1)), "float32 arithmetic needs no doubles");
  cr_assert(!converted_by_one_kernel(dt(kDLFloat, 32, 1), dt(kDLUInt, 8, 1)), "a narrowing kernel without doubles");
  cr_assert(!converted_by_one_kernel(dt(kDLInt, 64, 1), dt(kDLFloat, 64, 1)), "ab_convert_wide without doubles");
  unsetenv("AB_TEST_OPENCL_CONVERT_OPTIONS");
  assert_pool_clean(CL(0));
}

static float narrow_src[5 * 6];

static void check_narrowed(DLManagedTensorVersioned *r, int n) {
  for (int i = 0; i < 30; i++) {
    double x = __builtin_nearbyint((double)narrow_src[i]);
    cr_assert_eq(((uint8_t *)r->dl_tensor.data)[i], x < 0 ? 0 : x > 255 ? 255 : (uint8_t)x, "N=%d i=%d", n, i);
  }
  r->deleter(r);
}

Test(opencl, the_narrowing_route_survives_every_fault) {
  need_devices(1);
  if (!device_has_fp64(0)) cr_skip_test("opencl:0 has no cl_khr_fp64: narrowing stays on the host there");
  for (int i = 0; i < 30; i++) narrow_src[i] = (float)i * 9.5f - 20.0f;
  int64_t shape[2] = {5, 6};
  DLTensor h = {narrow_src, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLUInt, 8, 1);
  convert_place("device");
  sweep_route(&a->dl_tensor, CPU0, &o, check_narrowed, ab__pool_round(sizeof narrow_src), 2, 2);
  a->deleter(a);
  assert_pool_clean(CL(0));
}

/* Sources the kernels must not take even when the device is asked for: a
 * byte_offset inside an element, and a buffer of another context. The
 * host converts them, correctly. */
Test(opencl, misaligned_or_foreign_sources_are_converted_on_the_host) {
  need_devices(1);
  uint8_t bytes[256];
  fill_pattern(bytes, sizeof bytes, 31);
  for (int i = 1; i < 256; i += 2) bytes[i] &= 0x3f; /* finite float16s wherever they are read */
  int64_t shape[1] = {100};
  /* int16 at byte 1 of our own buffer */
  int64_t all[1] = {256};
  DLTensor h = {bytes, CPU0, 1, dt(kDLUInt, 8, 1), all, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  DLTensor odd = {a->dl_tensor.data, CL(0), 1, dt(kDLInt, 16, 1), shape, NULL, 1};
  DLTensor odd_h = {bytes, CPU0, 1, dt(kDLInt, 16, 1), shape, NULL, 1};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  DLManagedTensorVersioned *want = convert_ok_with(&odd_h, CPU0, &o);
  convert_place("device");
  uint64_t before = pool_allocations(CL(0));
  DLManagedTensorVersioned *got = convert_ok_with(&odd, CL(0), &o);
  cr_assert_eq(pool_allocations(CL(0)) - before, 1, "only the result belongs on the device");
  DLManagedTensorVersioned *back = convert_ok(&got->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  cr_assert_eq(memcmp(back->dl_tensor.data, want->dl_tensor.data, 400), 0);
  back->deleter(back);
  got->deleter(got);
  want->deleter(want);
  a->deleter(a);
#ifdef AB_HAVE_OPENCL
  /* float16 in a buffer of another context */
  cl_device_id d;
  cl_int e;
  first_devices(&d, 1);
  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
  cr_assert_eq(e, CL_SUCCESS);
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof bytes, bytes, &e);
  cr_assert_eq(e, CL_SUCCESS);
  DLTensor f = {m, CL(0), 1, dt(kDLFloat, 16, 1), shape, NULL, 0};
  DLTensor f_h = {bytes, CPU0, 1, dt(kDLFloat, 16, 1), shape, NULL, 0};
  o.dtype = dt(kDLUInt, 8, 1);
  convert_place("auto");
  want = convert_ok_with(&f_h, CPU0, &o);
  convert_place("device");
  before = pool_allocations(CL(0));
  got = convert_ok_with(&f, CPU0, &o);
  cr_assert_eq(pool_allocations(CL(0)), before, "a foreign buffer went into our kernel");
  cr_assert_eq(memcmp(got->dl_tensor.data, want->dl_tensor.data, 100), 0);
  got->deleter(got);
  want->deleter(want);
  clReleaseMemObject(m);
  clReleaseContext(ctx);
#endif
  assert_pool_clean(CL(0));
}

#ifdef AB_HAVE_OPENCL
/* A caller's queue held shut by a user event behind a barrier: nothing
 * queued on it runs until the gate opens. A watchdog opens it after
 * `patience_ms` unless the test has opened it first, so a call that waits
 * for its work returns late instead of hanging, and the test can tell. */
struct gate {
  cl_event ev;
  int patience_ms;
  atomic_bool opened, by_watchdog;
  pthread_t th;
};

static void *gate_watchdog(void *arg) {
  struct gate *g = arg;
  for (int ms = 0; ms < g->patience_ms && !atomic_load(&g->opened); ms += 5)
    nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
  if (!atomic_exchange(&g->opened, true)) {
    atomic_store(&g->by_watchdog, true);
    clSetUserEventStatus(g->ev, CL_COMPLETE);
  }
  return NULL;
}

static void gate_close(struct gate *g, cl_context ctx, cl_command_queue q, int patience_ms) {
  cl_int e;
  g->ev = clCreateUserEvent(ctx, &e);
  cr_assert_eq(e, CL_SUCCESS);
  cr_assert_eq(clEnqueueBarrierWithWaitList(q, 1, &g->ev, NULL), CL_SUCCESS);
  cr_assert_eq(clFlush(q), CL_SUCCESS);
  g->patience_ms = patience_ms;
  atomic_store(&g->opened, false);
  atomic_store(&g->by_watchdog, false);
  cr_assert_eq(pthread_create(&g->th, NULL, gate_watchdog, g), 0);
}

/* Opens the gate (if the watchdog has not) and waits for the watchdog;
 * returns whether the watchdog had to open it. */
static bool gate_open(struct gate *g) {
  if (!atomic_exchange(&g->opened, true)) clSetUserEventStatus(g->ev, CL_COMPLETE);
  pthread_join(g->th, NULL);
  clReleaseEvent(g->ev);
  return atomic_load(&g->by_watchdog);
}

static cl_context context_of(const DLManagedTensorVersioned *t, cl_device_id *dev0) {
  cl_context ctx;
  cl_device_id devs[64];
  cr_assert_eq(clGetMemObjectInfo((cl_mem)t->dl_tensor.data, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL), CL_SUCCESS);
  cr_assert_eq(clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof devs, devs, NULL), CL_SUCCESS);
  *dev0 = devs[0]; /* opencl:0: the first device of the first platform */
  return ctx;
}

Test(opencl, an_early_return_leaves_the_work_queued_on_the_callers_queue) {
  need_devices(1);
  uint8_t v[96];
  for (int i = 0; i < 96; i++) v[i] = (uint8_t)(i * 37 + 5);
  int64_t shape[1] = {96}, half[1] = {48}, two[1] = {2};
  DLTensor h = {v, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *a = convert_ok(&h, CL(0), AB_COPY_IF_NEEDED, NULL);
  DLTensor every_other = a->dl_tensor; /* a strided view: the gather kernel */
  every_other.shape = half;
  every_other.strides = two;
  ab_convert_opts widen = AB_CONVERT_OPTS_INIT; /* one conversion kernel on opencl:0 */
  widen.dtype = dt(kDLFloat, 32, 1);
  widen.flags = AB_CONVERT_AFFINE;
  widen.scale = 0.5;
  widen.offset = -3.0;
  convert_place("device");
  /* Build the kernels now: a first use under valgrind takes seconds. */
  DLManagedTensorVersioned *warm[2] = {convert_ok(&every_other, CL(0), AB_COPY_ALWAYS, NULL),
                                       convert_ok_with(&a->dl_tensor, CL(0), &widen)};
  warm[0]->deleter(warm[0]);
  warm[1]->deleter(warm[1]);

  cl_device_id dev;
  cl_context ours = context_of(a, &dev);
  cl_int e;
  cl_command_queue q = clCreateCommandQueue(ours, dev, 0, &e);
  cr_assert_eq(e, CL_SUCCESS);
  struct gate g;
  gate_close(&g, ours, q, 20000);
  /* Queued behind the gate: the source is overwritten. Work that went on
   * any queue but the caller's would run first and see the old bytes. */
  const cl_uchar fill = 0x5a;
  cr_assert_eq(clEnqueueFillBuffer(q, (cl_mem)a->dl_tensor.data, &fill, 1, 0, sizeof v, 0, NULL, NULL), CL_SUCCESS);
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  o.flags = AB_CONVERT_ASYNC;
  o.stream = q;
  widen.flags |= AB_CONVERT_ASYNC;
  widen.stream = q;
  const uint64_t before = pool_allocations(CL(0));
  DLManagedTensorVersioned *copy = convert_ok_with(&a->dl_tensor, CL(0), &o);
  DLManagedTensorVersioned *gathered = convert_ok_with(&every_other, CL(0), &o);
  DLManagedTensorVersioned *widened = convert_ok_with(&a->dl_tensor, CL(0), &widen);
  cr_assert_eq(pool_allocations(CL(0)) - before, 3, "only the three results should be allocated");
  cl_event probe;
  cr_assert_eq(clEnqueueMarkerWithWaitList(q, 0, NULL, &probe), CL_SUCCESS);
  cl_int status = CL_COMPLETE;
  cr_assert_eq(clGetEventInfo(probe, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL), CL_SUCCESS);
  const bool still_shut = status != CL_COMPLETE;
  cr_assert_not(gate_open(&g), "a call with AB_CONVERT_ASYNC waited for its queued work");
  cr_assert(still_shut, "the queue ran while the gate was shut: the test proves nothing");
  clReleaseEvent(probe);
  cr_assert_eq(ab_synchronize(CL(0), q), AB_OK, "%s", ab_last_error());
  convert_place("auto");

  DLManagedTensorVersioned *back[3] = {convert_ok(&copy->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL),
                                       convert_ok(&gathered->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL),
                                       convert_ok(&widened->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL)};
  for (int i = 0; i < 96; i++) {
    cr_assert_eq(((uint8_t *)back[0]->dl_tensor.data)[i], fill, "the queued copy ran before the fill (%d)", i);
    cr_assert_eq(((float *)back[2]->dl_tensor.data)[i], fill * 0.5f - 3.0f, "the queued conversion is wrong at %d", i);
  }
  for (int i = 0; i < 48; i++)
    cr_assert_eq(((uint8_t *)back[1]->dl_tensor.data)[i], fill, "the queued gather ran before the fill (%d)", i);
  for (int i = 0; i < 3; i++) back[i]->deleter(back[i]);
  DLManagedTensorVersioned *restored = convert_ok(&h, CL(0), AB_COPY_ALWAYS, NULL);
  a->deleter(a);
  a = restored;
  every_other.data = a->dl_tensor.data;

  /* A route through host memory completes before the call returns, flag
   * or not: with the gate shut it can return only once the watchdog has
   * opened it, and its bytes are then all there. */
  gate_close(&g, ours, q, 200);
  DLManagedTensorVersioned *down = convert_ok_with(&copy->dl_tensor, CPU0, &o);
  cr_assert(atomic_load(&g.by_watchdog), "the download returned before its queue ran");
  gate_open(&g);
  for (int i = 0; i < 96; i++) cr_assert_eq(((uint8_t *)down->dl_tensor.data)[i], fill, "the download is wrong");
  down->deleter(down);

  /* So does a route of more than one step (the upload of a host source,
   * then the conversion on the device): its upload buffer is freed before
   * the call returns. */
  convert_place("device");
  widen.stream = q;
  gate_close(&g, ours, q, 200);
  DLManagedTensorVersioned *uc = convert_ok_with(&h, CL(0), &widen);
  cr_assert(atomic_load(&g.by_watchdog), "the upload-and-convert route returned before its queue ran");
  gate_open(&g);
  convert_place("auto");
  DLManagedTensorVersioned *two_back = convert_ok(&uc->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  for (int i = 0; i < 96; i++)
    cr_assert_eq(((float *)two_back->dl_tensor.data)[i], (float)v[i] * 0.5f - 3.0f, "upload and convert: %d", i);
  two_back->deleter(two_back);
  uc->deleter(uc);

  /* An out-of-order queue orders nothing: it is finished first and not
   * used, so the call waits for it, flag or not. */
  cl_command_queue_properties can = 0;
  cr_assert_eq(clGetDeviceInfo(dev, CL_DEVICE_QUEUE_PROPERTIES, sizeof can, &can, NULL), CL_SUCCESS);
  if (can & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) {
    cl_command_queue ooo = clCreateCommandQueue(ours, dev, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
    cr_assert_eq(e, CL_SUCCESS);
    o.stream = ooo;
    gate_close(&g, ours, ooo, 200);
    DLManagedTensorVersioned *oc = convert_ok_with(&a->dl_tensor, CL(0), &o);
    cr_assert(atomic_load(&g.by_watchdog), "work was left on an out-of-order queue");
    gate_open(&g);
    DLManagedTensorVersioned *oc_back = convert_ok(&oc->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
    cr_assert_eq(memcmp(oc_back->dl_tensor.data, v, sizeof v), 0);
    oc_back->deleter(oc_back);
    oc->deleter(oc);
    clReleaseCommandQueue(ooo);
  }

  /* Without a stream nothing is left queued: the library's queue is
   * shared, and another device's queue would not wait for it. */
  o.stream = NULL;
  DLManagedTensorVersioned *own = convert_ok_with(&every_other, CL(0), &o);
  DLManagedTensorVersioned *own_back = convert_ok(&own->dl_tensor, CPU0, AB_COPY_IF_NEEDED, NULL);
  for (int i = 0; i < 48; i++) cr_assert_eq(((uint8_t *)own_back->dl_tensor.data)[i], v[2 * i], "%d", i);
  own_back->deleter(own_back);
  own->deleter(own);

  widened->deleter(widened);
  gathered->deleter(gathered);
  copy->deleter(copy);
  clReleaseCommandQueue(q);
  a->deleter(a);
  assert_pool_clean(CL(0));
}
#endif
