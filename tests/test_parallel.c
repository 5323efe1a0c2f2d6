/* Host moves on several threads (src/parallel.c): the bands give the same
 * bytes as one thread, for gathers and conversions of every kind of
 * layout, with concurrent callers, after fork and after ab_shutdown. */
#define _GNU_SOURCE 1 /* sched_getaffinity, CPU_COUNT */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "converters/host/convert.h"
#include "converters/host/gather.h"
#include "core.h"
#include "parallel.h"
#include "support.h"

/* Every move on 4 threads, however small (1 byte per thread is enough). */
static void many_threads(void) {
  setenv("AB_NUM_THREADS", "4", 1);
  setenv("AB_PARALLEL_MIN", "1", 1);
  ab__env_reload();
}

static void one_thread(void) {
  setenv("AB_NUM_THREADS", "1", 1);
  ab__env_reload();
}

TestSuite(parallel, .init = many_threads);

/* A random view of a buffer: 1..4 dims of 1..40 (1..12 past two dims), strides permuted,
 * stepped, reversed; dtype of 1, 2, 4 or 8 bytes. */
struct view {
  DLTensor t;
  int64_t shape[4], strides[4];
};

static void random_view(test_rng *r, void *buf, size_t cap, struct view *v) {
  static const DLDataType types[] = {{kDLUInt, 8, 1}, {kDLInt, 16, 1}, {kDLFloat, 32, 1}, {kDLFloat, 64, 1}};
  const int32_t ndim = (int32_t)rng_between(r, 1, 4);
  const DLDataType d = types[rng_between(r, 0, 3)];
  const size_t es = d.bits / 8u;
  int64_t dense[4], step[4], acc = 1;
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; i--) { /* a random axis order */
    int j = (int)rng_between(r, 0, i), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int32_t i = 0; i < ndim; i++) {
    v->shape[i] = rng_between(r, 1, ndim <= 2 ? 40 : 12);
    step[i] = rng_between(r, 1, 2);
  }
  for (int k = 3; k >= 0; k--) { /* strides of a dense buffer in that order */
    if (order[k] >= ndim) continue;
    dense[order[k]] = acc;
    acc *= v->shape[order[k]] * step[order[k]];
  }
  cr_assert_leq((size_t)acc * es, cap);
  uint64_t offset = 0;
  for (int32_t i = 0; i < ndim; i++) {
    v->strides[i] = dense[i] * step[i];
    if (rng_between(r, 0, 3) == 0) { /* reversed */
      offset += (uint64_t)((v->shape[i] - 1) * v->strides[i]) * es;
      v->strides[i] = -v->strides[i];
    }
  }
  v->t = (DLTensor){buf, CPU0, ndim, d, v->shape, v->strides, offset};
}

Test(parallel, random_views_gather_to_the_reference_bytes) {
  static uint8_t buf[4 << 20];
  test_rng r = {2024};
  fill_pattern(buf, sizeof buf, 5);
  for (int i = 0; i < 300; i++) {
    struct view v;
    random_view(&r, buf, sizeof buf, &v);
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.copy = AB_COPY_ALWAYS;
    DLManagedTensorVersioned *out;
    cr_assert_eq(ab_convert_memory(&v.t, CPU0, &o, &out), AB_OK, "case %d: %s", i, ab_last_error());
    cr_assert_eq(first_diff_vs_reference(&v.t, out), -1, "case %d: bands differ from the reference", i);
    out->deleter(out);
  }
}

/* Conversions with casts, permutations and per-channel maps on every axis:
 * four threads give the bytes one thread gives. */
Test(parallel, conversions_on_threads_match_one_thread) {
  static float src[6 * 37 * 41];
  static double cs[41], co[41];
  fill_pattern(src, sizeof src, 9);
  for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) src[i] = (float)(i % 251) * 0.37f - 40.0f;
  for (int i = 0; i < 41; i++) cs[i] = 0.5 + i * 0.01, co[i] = i - 20.0;
  int64_t shape[3] = {6, 37, 41};
  DLTensor t = {src, CPU0, 3, {kDLFloat, 32, 1}, shape, NULL, 0};
  static const int32_t perms[3][3] = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}};
  static const DLDataType outs[3] = {{kDLUInt, 8, 1}, {kDLFloat, 16, 1}, {kDLInt, 32, 1}};
  for (int p = 0; p < 3; p++)
    for (int d = 0; d < 3; d++)
      for (int axis = -1; axis < 3; axis++) {
        ab_convert_opts o = AB_CONVERT_OPTS_INIT;
        int32_t perm[3] = {perms[p][0], perms[p][1], perms[p][2]};
        o.permute = perm;
        o.dtype = outs[d];
        if (axis >= 0) {
          o.flags = AB_CONVERT_PER_CHANNEL;
          o.channel_axis = axis;
          o.channel_scale = cs;
          o.channel_offset = co;
        }
        DLManagedTensorVersioned *many, *one;
        cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &many), AB_OK, "%s", ab_last_error());
        one_thread();
        cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &one), AB_OK, "%s", ab_last_error());
        many_threads();
        const size_t n = (size_t)numel_of(3, shape) * elsize_of(outs[d]);
        cr_assert_eq(memcmp(many->dl_tensor.data, one->dl_tensor.data, n), 0,
                     "perm %d dtype %d channel axis %d: threads differ from one thread", p, d, axis);
        many->deleter(many);
        one->deleter(one);
      }
}

/* Callers at once share the workers; each gets its own bytes. */
static void *caller(void *arg) {
  const int seed = (int)(intptr_t)arg;
  static _Thread_local uint16_t img[64][48][3];
  fill_pattern(img, sizeof img, (uint32_t)seed);
  int64_t hwc[3] = {64, 48, 3};
  DLTensor t = {img, CPU0, 3, {kDLUInt, 16, 1}, hwc, NULL, 0};
  int32_t chw[3] = {2, 0, 1};
  for (int i = 0; i < 50; i++) {
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.permute = chw;
    DLManagedTensorVersioned *r;
    if (ab_convert_memory(&t, CPU0, &o, &r) != AB_OK) return (void *)1;
    const uint16_t *out = r->dl_tensor.data;
    for (int c = 0; c < 3; c++)
      for (int y = 0; y < 64; y++)
        for (int x = 0; x < 48; x++)
          if (out[(c * 64 + y) * 48 + x] != img[y][x][c]) {
            r->deleter(r);
            return (void *)2;
          }
    r->deleter(r);
  }
  return NULL;
}

Test(parallel, concurrent_callers_share_the_workers) {
  pthread_t th[4];
  for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, caller, (void *)(intptr_t)(i + 1)), 0);
  for (int i = 0; i < 4; i++) {
    void *rc;
    pthread_join(th[i], &rc);
    cr_assert_null(rc, "caller %d got wrong bytes (%p)", i, rc);
  }
}

/* Workers spin AB_THREAD_SPIN_US before they sleep, so calls back to back
 * find them awake (a wake-up cost more than a 512 KiB copy on the 2-core
 * VM); with 0 they sleep at once and none is taken while spinning. The
 * calls go on until one is taken so, for at most 10 s: a worker spinning
 * on a core another process holds gets no time to see the job before the
 * caller has done every band itself (ctest -j2). */
static unsigned long spun_in_calls(const DLTensor *t, int calls, bool until_one) {
  const unsigned long before = ab__parallel_spun_pickups();
  const double end = ab__seconds() + 10;
  for (int i = 0; i < calls || (until_one && ab__parallel_spun_pickups() == before && ab__seconds() < end); i++) {
    DLManagedTensorVersioned *r;
    cr_assert_eq(ab_convert_memory(t, CPU0, NULL, &r), AB_OK, "%s", ab_last_error());
    if (i < 4) cr_assert_eq(first_diff_vs_reference(t, r), -1, "call %d", i);
    r->deleter(r);
  }
  return ab__parallel_spun_pickups() - before;
}

Test(parallel, workers_spin_before_they_sleep_unless_told_not_to) {
  static float src[512 * 512]; /* 1 MiB, bands on 4 threads at AB_PARALLEL_MIN = 1 */
  fill_pattern(src, sizeof src, 5);
  int64_t shape[2] = {512, 512}, strides[2] = {1, 512};
  DLTensor t = {src, CPU0, 2, {kDLFloat, 32, 1}, shape, strides, 0};
  setenv("AB_THREAD_SPIN_US", "1000000", 1); /* a second: the next call comes sooner, even under valgrind */
  ab__env_reload();
  (void)spun_in_calls(&t, 1, false); /* workers started */
  cr_assert_gt(spun_in_calls(&t, 1, true), 0, "calls back to back for 10 s, and no worker took a job while spinning");
  setenv("AB_THREAD_SPIN_US", "0", 1);
  ab__env_reload();
  ab__parallel_shutdown(); /* workers spinning since before stop; new ones read 0 */
  const unsigned long spun = spun_in_calls(&t, 40, false);
  unsetenv("AB_THREAD_SPIN_US");
  ab__env_reload();
  cr_assert_eq(spun, 0, "AB_THREAD_SPIN_US=0, yet %lu jobs were taken while spinning", spun);
}

Test(parallel, fork_and_shutdown_leave_working_threads) {
  cr_assert_null(caller((void *)7)); /* workers running */
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) _exit(caller((void *)8) == NULL ? 0 : 1); /* the child makes its own */
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's conversion failed");
  ab_shutdown();
  cr_assert_null(caller((void *)9)); /* started again on demand */
  cr_assert_eq(pool_in_use(CPU0), 0);
}

/* A fork while other threads read the settings: after ab__env_reload the
 * next host move reads AB_NUM_THREADS and AB_PARALLEL_MIN under a lock of
 * parallel.c's, and the next staged transfer its settings under one of
 * staging.c's. The child must find both free. It used to find them held
 * by a thread it does not have, and wait for ever: they had no fork
 * handlers, and with handlers registered at their first use the child of
 * the first fork or two still hung (glibc runs a fork's prepare handlers
 * without its registration lock, so a thread can register, then lock,
 * while a fork is under way: the handlers are now registered at load). */
static atomic_bool reread_stop;
static void *reread_settings(void *staging) {
  while (!atomic_load(&reread_stop)) {
    ab__env_reload();
    if (staging != NULL) (void)ab__staging_config();
    else (void)ab__num_threads();
  }
  return NULL;
}

Test(parallel, a_fork_while_other_threads_read_the_settings_leaves_the_child_able_to_read_them) {
#if defined(AB_TESTS_UNDER_QEMU)
  /* as fork_and_shutdown_leave_working_threads, left out there (tools/check-cross.sh) */
  cr_skip_test("qemu-user's emulation asserts in a child forked from a process with threads");
#endif
  pthread_t th[2];
  atomic_store(&reread_stop, false);
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, reread_settings, i ? &th : NULL), 0);
  int hung = 0, failed = 0;
  enum { FORKS = 200 };
  for (int f = 0; f < FORKS && hung + failed == 0; f++) {
    fflush(NULL);
    const pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
      alarm(5); /* a lock held for ever ends in SIGALRM */
      const bool ok = ab__num_threads() == 4 && ab__staging_config().count >= 2;
      _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    hung += WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
    failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  atomic_store(&reread_stop, true);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_assert_eq(hung, 0, "a child hung on a lock");
  cr_assert_eq(failed, 0, "a child failed");
}

Test(parallel, the_environment_is_read_and_checked, .init = NULL) {
  setenv("AB_NUM_THREADS", "3", 1);
  setenv("AB_PARALLEL_MIN", "2MiB", 1);
  ab__env_reload();
  cr_assert_eq(ab__num_threads(), 3);
  cr_assert_eq(ab__parallel_min(), (size_t)2 << 20);
  setenv("AB_NUM_THREADS", "0", 1); /* refused: the cores the process may use */
  setenv("AB_PARALLEL_MIN", "lots", 1);
  ab__env_reload();
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(getpid(), sizeof set, &set), 0);
  cr_assert_eq(ab__num_threads(), CPU_COUNT(&set) > 64 ? 64 : CPU_COUNT(&set));
  cr_assert_eq(ab__parallel_min(), (size_t)256 << 10);
  /* past what the process addresses (a 32-bit build): no move is split,
   * as asked, not auto */
  setenv("AB_PARALLEL_MIN", "8GiB", 1);
  ab__env_reload();
  cr_assert_eq(ab__parallel_min(), (uint64_t)8 << 30 > SIZE_MAX ? SIZE_MAX : (size_t)((uint64_t)8 << 30));
  /* digits alone: a blank or a sign on either side is refused alike (" 3"
   * was read as 3, "3 " refused) */
  const int cores = ab__num_threads(); /* the default, so the value tried is another */
  const char *const spaced[2][4] = {{" 3", "3 ", "+3", "\t3"}, {" 2", "2 ", "+2", "\t2"}};
  for (size_t k = 0; k < 4; k++) {
    const char *v = spaced[cores == 3][k];
    setenv("AB_NUM_THREADS", v, 1);
    ab__env_reload();
    cr_assert_eq(ab__num_threads(), cores, "\"%s\" was read", v);
  }
  unsetenv("AB_NUM_THREADS");
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
}

/* A malformed AB_PARALLEL_MIN is logged quoted, as every variable's value
 * is: a newline in it forged a second log line, an escape reached the
 * terminal, and a long value made a line of hundreds of characters (a
 * probe's finding). The log goes to stderr, read back here from a file. */
Test(parallel, a_malformed_parallel_min_is_logged_quoted, .init = NULL) {
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  cr_assert_geq(saved, 0);
  cr_assert_geq(dup2(fileno(log), STDERR_FILENO), 0);
  setenv("AB_PARALLEL_MIN", "1M\nFAKE: arraybridge error: injected \x1b[31m and then a long tail of words", 1);
  ab__env_reload();
  (void)ab__parallel_min();
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
  char text[1024] = "";
  rewind(log);
  const size_t n = fread(text, 1, sizeof text - 1, log);
  fclose(log);
  text[n] = '\0';
  cr_assert_not_null(strstr(text, "AB_PARALLEL_MIN=\"1M?FAKE: arraybridge error: injected ?[3..."), "%s", text);
  cr_assert_null(strchr(text, '\x1b'), "%s", text);
  cr_assert_eq(strchr(text, '\n'), text + n - 1, "more than one line: %s", text);
}

/* Pins the calling thread to `core` alone. */
static bool pin_to(int core) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(core, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
}

/* A thread that pins itself to one core and reads the settings first. */
static void *read_pinned(void *core) {
  if (!pin_to(*(const int *)core)) return NULL;
  ab__env_reload();
  static int n;
  n = ab__num_threads();
  return &n;
}

/* The default is the cores the process may run on (taskset, a container's
 * cpuset), not every online core: on a 2-core machine a process bound to
 * one core started a worker that only took turns with it. The process's
 * mask, not that of whichever thread reads the settings first. */
Test(parallel, the_default_thread_count_is_the_processs_cpu_affinity, .init = NULL) {
  const pid_t self = getpid();
  cpu_set_t had, one;
  cr_assert_eq(sched_getaffinity(self, sizeof had, &had), 0);
  const int all = CPU_COUNT(&had) > 64 ? 64 : CPU_COUNT(&had);
  int first = 0;
  while (!CPU_ISSET(first, &had)) first++;
  unsetenv("AB_NUM_THREADS");
  pthread_t th;
  void *got = NULL;
  cr_assert_eq(pthread_create(&th, NULL, read_pinned, &first), 0);
  cr_assert_eq(pthread_join(th, &got), 0);
  cr_assert_not_null(got, "pthread_setaffinity_np");
  cr_assert_eq(*(int *)got, all, "a thread pinned to one core made the default %d threads, not %d", *(int *)got,
               all);
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  cr_assert_eq(sched_setaffinity(self, sizeof one, &one), 0, "sched_setaffinity");
  ab__env_reload();
  cr_assert_eq(ab__num_threads(), 1, "bound to one core, the default is %d threads", ab__num_threads());
  cr_assert_eq(sched_setaffinity(self, sizeof had, &had), 0);
  ab__env_reload();
  cr_assert_eq(ab__num_threads(), all);
}

/* A 4 MiB transpose on 2 threads (which starts a worker): whether it
 * succeeded. */
static bool move_on_two_threads(void) {
  static float big[1 << 20];
  int64_t shape[2] = {1024, 1024}, strides[2] = {1, 1024};
  DLTensor t = {big, CPU0, 2, {kDLFloat, 32, 1}, shape, strides, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.threads = 2;
  DLManagedTensorVersioned *r;
  if (ab_convert_memory(&t, CPU0, &o, &r) != AB_OK) return false;
  r->deleter(r);
  return true;
}

/* A thread pinned to one core that moves data first, on 2 threads. */
static void *move_pinned(void *core) {
  return pin_to(*(const int *)core) && move_on_two_threads() ? core : NULL;
}

/* Whether thread tid of this process is named "arraybridge" (a worker);
 * false where it is gone. */
static bool is_worker(int tid) {
  char path[64], name[32] = "";
  snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return false; /* gone meanwhile */
  const bool named = fgets(name, sizeof name, f) != NULL && strcmp(name, "arraybridge\n") == 0;
  fclose(f);
  return named;
}

/* The process's threads named "arraybridge" (the workers; a driver's
 * threads started from a pinned thread keep its mask, which is theirs to
 * choose) whose mask is not `want`'s count of cores, or -1 when there is
 * no worker; *id: one of them. */
static int workers_not_on(int want, int *id) {
  int ids[256], seen = 0, off = 0;
  const int n = thread_ids(ids, 256);
  for (int i = 0; i < n && i < 256; i++) {
    if (!is_worker(ids[i])) continue;
    cpu_set_t m;
    cr_assert_eq(sched_getaffinity((pid_t)ids[i], sizeof m, &m), 0);
    seen++;
    if (CPU_COUNT(&m) != want) {
      off++;
      *id = ids[i];
    }
  }
  return seen > 0 ? off : -1;
}

/* Workers run on the process's cores: a new thread takes its creator's
 * mask, so workers started for a caller pinned to one core stayed on that
 * core, for every later caller too (cold review, 2026-12-03). They start
 * on the cores other than their creator's (there it could not run while
 * the caller works: on the 2-core VM 4-6 processes of 15 ran 1 MiB
 * transposes on 2 threads at one thread's speed), then widen their mask
 * to the process's once they run: the test waits up to 10 s for that. */
Test(parallel, workers_started_for_a_pinned_caller_run_on_the_processs_cores) {
  cpu_set_t had;
  cr_assert_eq(sched_getaffinity(getpid(), sizeof had, &had), 0);
  if (CPU_COUNT(&had) < 2) cr_skip_test("one core: every mask is that core");
  int first = 0;
  while (!CPU_ISSET(first, &had)) first++;
  pthread_t th;
  void *ok = NULL;
  cr_assert_eq(pthread_create(&th, NULL, move_pinned, &first), 0);
  cr_assert_eq(pthread_join(th, &ok), 0);
  cr_assert_not_null(ok, "the pinned move failed: %s", ab_last_error());
  cr_assert_geq(ab__parallel_workers(), 1);
  int id = 0, off = 0;
  const double end = ab__seconds() + 10;
  while ((off = workers_not_on(CPU_COUNT(&had), &id)) > 0 && ab__seconds() < end) usleep(1000);
  cr_assert_neq(off, -1, "no thread named arraybridge among the process's");
  cr_assert_eq(off, 0, "after 10 s, %d workers (thread %d among them) run on fewer than the process's %d cores", off,
               id, CPU_COUNT(&had));
  /* every worker has run (it widens its mask after it counts where it started) */
  cr_assert_eq(ab__parallel_started_beside_creator(), 0, "a worker first ran on its pinned creator's core");
}

/* Workers leave the program's signals to its threads, and a fault's signal
 * open: with SIGSEGV blocked, a fault in a worker killed the process
 * without running the program's handlers (Python's faulthandler, a
 * sanitizer's report). */
Test(parallel, workers_leave_signals_to_the_program_but_a_faults) {
  cr_assert(move_on_two_threads(), "%s", ab_last_error());
  cr_assert_geq(ab__parallel_workers(), 1);
  int ids[256], seen = 0;
  const int n = thread_ids(ids, 256);
  for (int i = 0; i < n && i < 256; i++) {
    unsigned long long blk;
    if (!is_worker(ids[i])) continue;
    seen++;
    cr_assert(thread_leaves_signals_to_the_program(ids[i], &blk), "worker %d has SigBlk %016llx", ids[i], blk);
  }
  cr_assert_gt(seen, 0, "no thread named arraybridge among the process's");
}

Test(parallel, scalars_and_empty_tensors_stay_on_the_caller) {
  float x = 2.5f;
  DLTensor s = {&x, CPU0, 0, {kDLFloat, 32, 1}, NULL, NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = (DLDataType){kDLFloat, 64, 1};
  DLManagedTensorVersioned *r;
  cr_assert_eq(ab_convert_memory(&s, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(*(double *)r->dl_tensor.data, 2.5);
  r->deleter(r);
  int64_t shape[2] = {64, 0};
  DLTensor e = {NULL, CPU0, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
  cr_assert_eq(ab_convert_memory(&e, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  r->deleter(r);
}

/* Threads of this process, from /proc/self/status. */
static int threads_now(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  if (f != NULL) fclose(f);
  return n;
}

Test(parallel, opts_threads_caps_the_threads_of_one_call) {
  static float big[1 << 18]; /* 1 MiB, 4 bands' worth per thread at AB_PARALLEL_MIN = 1 */
  int64_t shape[2] = {512, 512}, strides[2] = {1, 512};
  DLTensor t = {big, CPU0, 2, {kDLFloat, 32, 1}, shape, strides, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  DLManagedTensorVersioned *r;
  /* The backends first (PoCL starts threads of its own at init). */
  for (DLDeviceType k = kDLCPU; k <= kDLOpenCL; k++) (void)ab_device_count(k);
  const int before = threads_now();
  cr_assert_gt(before, 0);
  o.threads = 1; /* the caller's thread only: no worker starts */
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(first_diff_vs_reference(&t, r), -1);
  r->deleter(r);
  cr_assert_eq(threads_now(), before, "threads = 1 started workers (%d -> %d)", before, threads_now());
  o.threads = 3; /* up to 3: two workers beside the caller */
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(first_diff_vs_reference(&t, r), -1);
  r->deleter(r);
  cr_assert_eq(threads_now(), before + 2, "threads = 3 did not start two workers");
  /* More than 64 is 64, however many more (2^31 was a negative int: one thread) */
  static const uint32_t many[] = {65, 1000, 0x7fffffffu, 0x80000000u, 0xffffffffu};
  for (size_t i = 0; i < sizeof many / sizeof many[0]; i++) {
    const uint32_t prev = ab__parallel_call_threads(many[i]);
    const int got = ab__parallel_threads();
    ab__parallel_call_threads(prev);
    cr_assert_eq(got, 64, "threads = %u runs on %d threads, not 64", many[i], got);
  }
}

/* A call keeps to its own thread count when the pool holds more workers
 * (an earlier call's, or AB_NUM_THREADS's): every idle worker was woken
 * and took bands, so a call with threads = 2 ran on up to 8 after one
 * with 8 (cold audit, 2026-12-03). */
Test(parallel, a_call_runs_on_no_more_threads_than_it_asked_for_whatever_the_pool_holds) {
  static float big[1 << 22]; /* 16 MiB: bands of 2 MiB on two threads */
  int64_t shape[2] = {2048, 2048}, strides[2] = {1, 2048};
  DLTensor t = {big, CPU0, 2, {kDLFloat, 32, 1}, shape, strides, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  DLManagedTensorVersioned *r;
  o.threads = 8; /* seven workers; until one of them has taken a band (a loaded machine may wake them late) */
  int took = 0;
  for (int k = 0; k < 20 && took == 0; k++) {
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    r->deleter(r);
    took = ab__parallel_peak_in_job();
  }
  cr_assert_geq(ab__parallel_workers(), 7);
  cr_assert_gt(took, 0, "no worker took a band of 20 calls on 8 threads");
  for (uint32_t want = 2; want <= 3; want++) {
    o.threads = want;
    for (int k = 0; k < 6; k++) {
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      cr_assert_eq(first_diff_vs_reference(&t, r), -1);
      r->deleter(r);
    }
    const int peak = ab__parallel_peak_in_job();
    cr_assert_leq(peak, (int)want - 1, "a call of %u threads had %d workers in it", want, peak);
  }
}

/* Gathers whose outermost dim is too short for bands of its own: the
 * planes of HWC -> CHW (cut along the rows, every band a strip of every
 * plane, the pixel kernels taking the channels whole), a batch of fewer
 * planes than threads, one plane behind a dim of 1, and a batch of a few
 * planes per thread (one band a plane). Each starts workers (it ran on
 * the caller alone before) and gives the reference's bytes. */
Test(parallel, short_outer_dims_still_take_every_thread) {
  static uint8_t buf[4 << 20];
  fill_pattern(buf, sizeof buf, 21);
  static const DLDataType types[] = {{kDLUInt, 8, 1}, {kDLUInt, 16, 1}, {kDLFloat, 32, 1}, {kDLFloat, 64, 1}};
  for (int k = 0; k < 4; k++) {
    const int64_t es = types[k].bits / 8;
    struct {
      int64_t shape[3], strides[3];
    } cases[] = {
        {{2, 64, 301}, {1, 2 * 301, 2}}, /* HWC -> CHW, 2, 3 and 4 channels */
        {{3, 64, 301}, {1, 3 * 301, 3}},
        {{4, 64, 301}, {1, 4 * 301, 4}},
        {{2, 130, 100}, {13000, 1, 130}}, /* 2 planes of 100 x 130, transposed */
        {{1, 130, 100}, {13000, 1, 130}}, /* one, behind a dim of 1 */
        {{6, 40, 50}, {2000, 1, 40}},     /* 6 planes of 50 x 40 on 3 threads */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      DLTensor t = {buf, CPU0, 3, types[k], cases[c].shape, cases[c].strides, 0};
      cr_assert_leq((size_t)numel_of(3, cases[c].shape) * (size_t)es * 2, sizeof buf);
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.copy = AB_COPY_ALWAYS;
      o.threads = 3;
      ab__parallel_shutdown(); /* no workers: the call below starts what it uses */
      cr_assert_eq(ab__parallel_workers(), 0);
      DLManagedTensorVersioned *r;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      cr_assert_eq(first_diff_vs_reference(&t, r), -1, "%d-byte case %zu: bands differ from the reference",
                   (int)es, c);
      r->deleter(r);
      cr_assert_eq(ab__parallel_workers(), 2, "%d-byte case %zu ran on %d workers, not 2", (int)es, c,
                   ab__parallel_workers());
    }
  }
}

/* Every small 2-D shape, transposed or not, on 2, 3 and 4 threads: bands
 * of one row of every plane (the tail of a cut along dim 1, whose output
 * row is not contiguous) once went through a memcpy as if it were. */
Test(parallel, every_small_shape_on_two_to_four_threads) {
  static uint32_t buf[40 * 40];
  for (int i = 0; i < 40 * 40; i++) buf[i] = (uint32_t)i * 2654435761u;
  for (uint32_t threads = 2; threads <= 4; threads++)
    for (int64_t r = 1; r <= 40; r++)
      for (int64_t c = 1; c <= 40; c++)
        for (int tr = 0; tr < 2; tr++) {
          int64_t shape[2] = {tr ? c : r, tr ? r : c}, strides[2] = {tr ? 1 : c, tr ? c : 1};
          DLTensor t = {buf, CPU0, 2, {kDLUInt, 32, 1}, shape, strides, 0};
          ab_convert_opts o = AB_CONVERT_OPTS_INIT;
          o.copy = AB_COPY_ALWAYS;
          o.threads = threads;
          DLManagedTensorVersioned *out;
          cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &out), AB_OK, "%s", ab_last_error());
          cr_assert_eq(first_diff_vs_reference(&t, out), -1, "%lld x %lld%s on %u threads differs", (long long)r,
                       (long long)c, tr ? " transposed" : "", threads);
          out->deleter(out);
        }
}

/* Bands along dim 1 of a transpose large enough for streaming stores (two
 * planes of 1100 x 1000 float32, 8.8 MB, on 3 threads): each band's rows
 * start mid-line and share lines with their neighbours', in every way
 * the transposes write. */
Test(parallel, strips_of_every_plane_in_every_store_mode) {
  const int64_t rows = 1100, cols = 1000;
  float *a = malloc((size_t)(2 * rows * cols) * sizeof *a);
  cr_assert_not_null(a);
  for (int64_t i = 0; i < 2 * rows * cols; i++) a[i] = (float)i;
  int64_t shape[3] = {2, cols, rows}, strides[3] = {rows * cols, 1, cols};
  DLTensor t = {a, CPU0, 3, {kDLFloat, 32, 1}, shape, strides, 0};
  static const char *modes[] = {"0", "1", "blocked"};
  const bool variants = ab__host_stream_min() != SIZE_MAX;
  for (int m = 0; m < 3; m++) {
    setenv("AB_HOST_STREAMING", modes[m], 1);
    ab__env_reload();
    /* the variable is read at a trial, once per process: the first mode's
     * would hold for the others, so each is set as a trial's pick */
    ab__host_transpose_preset(4, m);
    ab_convert_opts o = AB_CONVERT_OPTS_INIT;
    o.threads = 3;
    DLManagedTensorVersioned *r;
    cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
    cr_assert_eq(first_diff_vs_reference(&t, r), -1, "AB_HOST_STREAMING=%s: strips differ", modes[m]);
    r->deleter(r);
    if (variants) { /* the variant the bands run: on one thread, the caller's (on three it may run none) */
      o.threads = 1;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
      r->deleter(r);
      cr_assert_eq(ab__host_last_transpose_mode(), m, "AB_HOST_STREAMING=%s: ran %d", modes[m], ab__host_last_transpose_mode());
    }
    cr_assert_eq(ab__parallel_workers() >= 2, 1);
  }
  unsetenv("AB_HOST_STREAMING");
  ab__env_reload();
  free(a);
}

/* A job's own min_part (the staging ring's copies) splits finer than
 * AB_PARALLEL_MIN, never coarser. */
Test(parallel, a_jobs_min_part_splits_finer_than_the_default) {
  setenv("AB_PARALLEL_MIN", "1GiB", 1);
  ab__env_reload();
  const size_t n = (size_t)1 << 20;
  char *src = malloc(n), *dst = malloc(n);
  cr_assert(src != NULL && dst != NULL);
  fill_pattern(src, n, 33);
  const int64_t shape[1] = {(int64_t)n}, stride[1] = {1};
  ab__host_job job = {.dst = dst, .src = src, .ndim = 1, .shape = shape, .byte_strides = stride, .es = 1};
  const uint32_t prev = ab__parallel_call_threads(4);
  ab__parallel_shutdown();
  ab__host_run(&job); /* 1 MiB < 1 GiB: the caller alone */
  cr_assert_eq(ab__parallel_workers(), 0);
  cr_assert_eq(memcmp(dst, src, n), 0);
  memset(dst, 0, n);
  job.min_part = (size_t)256 << 10; /* four parts of 256 KiB: the caller and three workers */
  ab__host_run(&job);
  cr_assert_eq(ab__parallel_workers(), 3);
  cr_assert_eq(memcmp(dst, src, n), 0);
  setenv("AB_PARALLEL_MIN", "64KiB", 1); /* a larger min_part does not hold the default back */
  ab__env_reload();
  ab__parallel_shutdown();
  job.min_part = (size_t)1 << 30;
  memset(dst, 0, n);
  ab__host_run(&job);
  cr_assert_eq(ab__parallel_workers(), 3);
  cr_assert_eq(memcmp(dst, src, n), 0);
  ab__parallel_call_threads(prev);
  many_threads(); /* the suite's settings back: a test leaves none of its own behind */
  free(src);
  free(dst);
}

/* The default bound (AB_PARALLEL_MIN unset): 256 KiB of result a thread,
 * so 512 KiB is the least that two threads share, and 1 MiB goes four
 * ways; set to that, no call is measured against a coarser bound. */
Test(parallel, the_default_bound_is_256_KiB_a_thread) {
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
  cr_assert_eq(ab__parallel_min(), (size_t)256 << 10);
  setenv("AB_PARALLEL_MIN", "auto", 1);
  ab__env_reload();
  cr_assert_eq(ab__parallel_min(), (size_t)256 << 10);
  setenv("AB_PARALLEL_MIN", "256KiB", 1);
  ab__env_reload();
  const size_t n = (size_t)1 << 20;
  char *src = malloc(n), *dst = malloc(n);
  cr_assert(src != NULL && dst != NULL);
  fill_pattern(src, n, 71);
  const uint32_t prev = ab__parallel_call_threads(4);
  const size_t sizes[] = {((size_t)512 << 10) - 1, (size_t)512 << 10, n - 1, n};
  const int workers[] = {0, 1, 2, 3};
  for (int i = 0; i < 4; i++) {
    const int64_t shape[1] = {(int64_t)sizes[i]}, stride[1] = {1};
    const ab__host_job job = {.dst = dst, .src = src, .ndim = 1, .shape = shape, .byte_strides = stride, .es = 1};
    ab__parallel_shutdown();
    memset(dst, 0, n);
    ab__host_run(&job);
    cr_assert_eq(ab__parallel_workers(), workers[i], "%zu bytes: %d workers, not %d", sizes[i], ab__parallel_workers(),
                 workers[i]);
    cr_assert_eq(memcmp(dst, src, sizes[i]), 0);
  }
  ab__parallel_call_threads(prev);
  many_threads();
  free(src);
  free(dst);
}

/* Casts cut along dim 1 (ab__host_convert_into): HWC -> CHW of 2-4
 * channels (the uint8 -> float32 image loop, and the chunked casts with
 * the channels riding along), per-channel maps on the channel axis and on
 * the rows (whose arrays each band starts at its own first row), and a
 * batch of 2 planes, transposed or not, on 3 threads: the bytes of one
 * thread, on 3. */
Test(parallel, casts_of_short_outer_dims_on_threads_match_one_thread) {
  const int64_t H = 70, W = 333;
  uint8_t *img = malloc((size_t)(H * W * 4));
  cr_assert_not_null(img);
  fill_pattern(img, (size_t)(H * W * 4), 41);
  static double cs[512], co[512];
  for (int i = 0; i < 512; i++) cs[i] = 1.0 / (50 + i % 17), co[i] = -2.0 + 0.01 * i;
  static const DLDataType outs[] = {{kDLFloat, 32, 1}, {kDLFloat, 16, 1}, {kDLUInt, 8, 1}, {kDLFloat, 64, 1}};
  for (int64_t C = 2; C <= 4; C++)
    for (int d = 0; d < 4; d++)
      for (int m = 0; m < 5; m++) {
        int64_t shape[3] = {H, W, C};
        DLTensor t = {img, CPU0, 3, {kDLUInt, 8, 1}, shape, NULL, 0};
        int32_t perm[3] = {2, 0, 1};
        int64_t bshape[3] = {2, H, W}, bst[3] = {H * W, 1, H}; /* or 2 planes, transposed, */
        if (m == 4) bst[1] = W, bst[2] = 1;                     /* or not */
        DLTensor b = {img, CPU0, 3, {kDLUInt, 8, 1}, bshape, bst, 0};
        ab_convert_opts o = AB_CONVERT_OPTS_INIT;
        o.dtype = outs[d];
        o.permute = m < 3 ? perm : NULL;
        if (m == 1) o.flags = AB_CONVERT_PER_CHANNEL, o.channel_axis = 2, o.channel_scale = cs, o.channel_offset = co;
        if (m == 2) o.flags = AB_CONVERT_PER_CHANNEL, o.channel_axis = 0, o.channel_scale = cs, o.channel_offset = co;
        if (m == 3) o.flags = AB_CONVERT_PER_CHANNEL, o.channel_axis = 1, o.channel_scale = cs, o.channel_offset = NULL;
        if (m == 4) o.flags = AB_CONVERT_AFFINE, o.scale = 0.5, o.offset = 3;
        const DLTensor *src = m < 3 ? &t : &b;
        DLManagedTensorVersioned *one, *many;
        o.threads = 1;
        cr_assert_eq(ab_convert_memory(src, CPU0, &o, &one), AB_OK, "%s", ab_last_error());
        ab__parallel_shutdown();
        o.threads = 3;
        cr_assert_eq(ab_convert_memory(src, CPU0, &o, &many), AB_OK, "%s", ab_last_error());
        cr_assert_eq(ab__parallel_workers(), 2, "C %lld dtype %d map %d: not on 3 threads", (long long)C, d, m);
        const size_t n = (size_t)numel_of(3, m < 3 ? shape : bshape) * elsize_of(outs[d]);
        cr_assert_eq(memcmp(many->dl_tensor.data, one->dl_tensor.data, n), 0, "C %lld dtype %d map %d: threads differ",
                     (long long)C, d, m);
        many->deleter(many);
        one->deleter(one);
      }
  free(img);
}

/* Bands that cut the result's rows (its last dim) start on cache lines
 * for 1- and 2-byte results (parallel.c, ab__parallel_band): a float32
 * -> float16 transpose of 69 x 3008 on 20 threads, whose bands were 48
 * wide (every other one starting mid-line), takes bands of 64; uint8
 * results of 80 round to 128 (under 64 they stay); where rounding up
 * would leave fewer bands than threads (95 x 88301 float16 from a
 * row-major source on 64 threads, widened to 1380 a thread: 63 of 1408)
 * they round down instead (1376, 65 bands); float32 results keep 16-index
 * blocks (48 is 192 bytes, on lines), and so do elements that do not
 * divide a line (3 bytes) and cuts of other dims (dim 0 of a 3008 x 69
 * float16 result, contiguous in the source: a band a thread, 151). */
Test(parallel, bands_along_result_rows_start_on_cache_lines) {
  const DLDataType f32 = {kDLFloat, 32, 1}, f16 = {kDLFloat, 16, 1}, u8 = {kDLUInt, 8, 1};
  const struct { /* automatic: C11 does not take the const variables above in a static initializer (GCC does) */
    DLDataType from, to;
    bool plain; /* a gather of es bytes, no op */
    size_t es;
    int64_t n0, n1, t;
    int cut;
    bool rows; /* the source row-major (its rows cut in strips), else read transposed */
    int64_t want;
  } cases[] = {
      {f32, f16, false, 4, 69, 3008, 20, 1, false, 64},   {f32, f32, false, 4, 69, 3008, 20, 1, false, 48},
      {f32, u8, false, 4, 69, 3008, 20, 1, false, 48},    /* under a line of uint8: as it was */
      {f32, u8, false, 4, 69, 6016, 20, 1, false, 128},   {f32, f16, false, 4, 95, 88301, 64, 1, true, 1376},
      {f32, f16, false, 4, 3008, 69, 20, 0, false, 151},  {u8, u8, true, 3, 69, 3008, 20, 1, false, 48},
      {u8, u8, true, 2, 69, 3008, 20, 1, false, 64},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int64_t shape[2] = {cases[k].n0, cases[k].n1}, es = (int64_t)cases[k].es;
    const int64_t bst[2] = {cases[k].rows ? cases[k].n1 * es : es, cases[k].rows ? es : cases[k].n0 * es};
    const ab__cast_op op = {.from = cases[k].from, .to = cases[k].to, .channel_dim = -1};
    const ab__host_job job = {.ndim = 2, .shape = shape, .byte_strides = bst, .es = cases[k].es,
                              .op = cases[k].plain ? NULL : &op};
    const int64_t band = ab__parallel_band(&job, cases[k].cut, cases[k].t);
    const int64_t n = shape[cases[k].cut], bands = (n + band - 1) / band;
    cr_assert_eq(band, cases[k].want, "case %zu: bands of %lld, want %lld", k, (long long)band,
                 (long long)cases[k].want);
    cr_assert(bands >= cases[k].t || cases[k].cut == 0, "case %zu: %lld bands on %lld threads", k, (long long)bands,
              (long long)cases[k].t);
  }
}

/* Narrowing casts of transposed planes (convert.c, cast_then_transpose)
 * in bands: one float32 plane of 700 x 650 read transposed, cut along its
 * rows, and a batch of 2 such planes on 3 threads, cut along dim 1 (each
 * band a strip of both planes, into result planes of their own), into
 * float16 with a map and into uint8: the bytes of one thread. */
Test(parallel, narrowing_casts_of_transposed_planes_on_threads_match_one_thread) {
  const int64_t n0 = 700, n1 = 650;
  float *a = malloc((size_t)(2 * n0 * n1) * sizeof *a);
  cr_assert_not_null(a);
  for (int64_t i = 0; i < 2 * n0 * n1; i++) a[i] = (float)((i * 37) % 1001) * 0.25f - 60.0f;
  static const DLDataType outs[] = {{kDLFloat, 16, 1}, {kDLUInt, 8, 1}};
  for (int b = 0; b < 2; b++)
    for (int d = 0; d < 2; d++) {
      int64_t shape[3] = {2, n0, n1}, st[3] = {n0 * n1, 1, n0};
      DLTensor t = {a, CPU0, b ? 3 : 2, {kDLFloat, 32, 1}, b ? shape : shape + 1, b ? st : st + 1, 0};
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = outs[d];
      o.flags = AB_CONVERT_AFFINE;
      o.scale = d == 0 ? 0.5 : 1.0;
      o.offset = d == 0 ? 0.0 : 70.0;
      DLManagedTensorVersioned *one, *many;
      o.threads = 1;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &one), AB_OK, "%s", ab_last_error());
      ab__parallel_shutdown();
      o.threads = 3;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &many), AB_OK, "%s", ab_last_error());
      cr_assert_eq(ab__parallel_workers(), 2, "batch %d dtype %d: not on 3 threads", b, d);
      const size_t n = (size_t)((b ? 2 : 1) * n0 * n1) * elsize_of(outs[d]);
      cr_assert_eq(memcmp(many->dl_tensor.data, one->dl_tensor.data, n), 0, "batch %d dtype %d: threads differ", b,
                   d);
      many->deleter(many);
      one->deleter(one);
    }
  free(a);
}

/* The same converter handed a band cut along dim 1 of one plane (as
 * ab__host_run cuts planes of fewer rows than it wants bands, with 17
 * threads or more): result rows dst0 bytes apart. Columns 200..399 of a
 * 100 x 650 plane read transposed, into float16 with a map, against the
 * whole plane's result; the bytes around the band stay untouched. */
Test(parallel, a_band_of_a_transposed_plane_cut_along_its_columns_matches_the_whole) {
  const int64_t n0 = 100, n1 = 650, c0 = 200, w = 200;
  float *a = malloc((size_t)(n0 * n1) * sizeof *a);
  uint16_t *band = malloc((size_t)(n0 * n1) * sizeof *band);
  cr_assert(a != NULL && band != NULL);
  for (int64_t i = 0; i < n0 * n1; i++) a[i] = (float)((i * 53) % 997) * 0.125f - 40.0f;
  memset(band, 0xab, (size_t)(n0 * n1) * sizeof *band);
  int64_t shape[2] = {n0, n1}, st[2] = {1, n0};
  DLTensor t = {a, CPU0, 2, {kDLFloat, 32, 1}, shape, st, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = (DLDataType){kDLFloat, 16, 1};
  o.flags = AB_CONVERT_AFFINE;
  o.scale = 0.5;
  o.offset = 1.0;
  o.threads = 1;
  DLManagedTensorVersioned *whole;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &whole), AB_OK, "%s", ab_last_error());
  const ab__cast_op op = {{kDLFloat, 32, 1}, {kDLFloat, 16, 1}, true, 0.5, 1.0, -1, NULL, NULL};
  const int64_t bshape[2] = {n0, w}, bst[2] = {4, n0 * 4};
  ab__host_convert_into(band + c0, n1 * 2, a + c0 * n0, 2, bshape, bst, &op, 0);
  const uint16_t *ref = whole->dl_tensor.data;
  for (int64_t i = 0; i < n0; i++)
    for (int64_t j = 0; j < n1; j++) {
      const bool in = j >= c0 && j < c0 + w;
      cr_assert_eq(band[i * n1 + j], in ? ref[i * n1 + j] : 0xabab, "row %lld column %lld", (long long)i,
                   (long long)j);
    }
  whole->deleter(whole);
  free(band);
  free(a);
}

/* Chunked casts with every dim after the cut one in each chunk and more
 * (k > 1 in convert_in_chunks): 2 x 12 x 20 x 20000 uint8 read as
 * 2 x 20000 x 12 x 20, a per-channel map on the cut dim or none, on 5
 * threads against one (a case of the cold review's). */
Test(parallel, chunked_casts_of_deep_bands_match_one_thread) {
  const int64_t n = 2 * 12 * 20 * 20000;
  uint8_t *a = malloc((size_t)n);
  double *cs = malloc(20000 * sizeof *cs);
  cr_assert(a != NULL && cs != NULL);
  fill_pattern(a, (size_t)n, 43);
  for (int i = 0; i < 20000; i++) cs[i] = 0.25 + (i % 97) * 0.01;
  int64_t shape[4] = {2, 12, 20, 20000};
  int32_t perm[4] = {0, 3, 1, 2};
  DLTensor t = {a, CPU0, 4, {kDLUInt, 8, 1}, shape, NULL, 0};
  static const DLDataType outs[] = {{kDLFloat, 32, 1}, {kDLFloat, 16, 1}};
  for (int d = 0; d < 2; d++)
    for (int m = 0; m < 2; m++) {
      ab_convert_opts o = AB_CONVERT_OPTS_INIT;
      o.dtype = outs[d];
      o.permute = perm;
      if (m == 1) o.flags = AB_CONVERT_PER_CHANNEL, o.channel_axis = 3, o.channel_scale = cs;
      DLManagedTensorVersioned *one, *many;
      o.threads = 1;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &one), AB_OK, "%s", ab_last_error());
      ab__parallel_shutdown();
      o.threads = 5;
      cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &many), AB_OK, "%s", ab_last_error());
      cr_assert_eq(ab__parallel_workers(), 4, "dtype %d map %d: not on 5 threads", d, m);
      cr_assert_eq(memcmp(many->dl_tensor.data, one->dl_tensor.data, (size_t)n * elsize_of(outs[d])), 0,
                   "dtype %d map %d: threads differ", d, m);
      many->deleter(many);
      one->deleter(one);
    }
  free(a);
  free(cs);
}

/* A broadcast source (strides 0) cut along dim 1: its dims 0 and 1 are
 * contiguous in the source (0 == 0 x anything) but not in the output, so
 * they must not merge (ab__merge_dims2 asks both). */
Test(parallel, broadcast_rows_cut_along_dim_1_fill_every_plane) {
  static float row[500];
  for (int i = 0; i < 500; i++) row[i] = (float)i + 0.5f;
  int64_t shape[3] = {2, 90, 500}, strides[3] = {0, 0, 1};
  DLTensor t = {row, CPU0, 3, {kDLFloat, 32, 1}, shape, strides, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.copy = AB_COPY_ALWAYS;
  o.threads = 3;
  ab__parallel_shutdown();
  DLManagedTensorVersioned *r;
  cr_assert_eq(ab_convert_memory(&t, CPU0, &o, &r), AB_OK, "%s", ab_last_error());
  cr_assert_eq(ab__parallel_workers(), 2);
  cr_assert_eq(first_diff_vs_reference(&t, r), -1, "broadcast rows differ");
  r->deleter(r);
}

/* The measured bound (AB_PARALLEL_MIN unset): a 1 MiB copy on up to two
 * threads (one, by a bound four times the default) runs its first three
 * calls on one thread and the next three on two, each timed; then every
 * call takes the number picked, up to the AB__PARALLEL_RELEARN-th after
 * the pick, which starts over; calls with another cap on threads are not
 * timed and keep 256 KiB a thread. Other kinds and sizes learn apart, and
 * a change of settings starts over. */
Test(parallel, the_measured_bound_times_both_then_keeps_the_faster) {
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
  const size_t n = (size_t)1 << 20;
  char *src = malloc(n), *dst = malloc(n);
  cr_assert(src != NULL && dst != NULL);
  fill_pattern(src, n, 5);
  const uint32_t prev = ab__parallel_call_threads(2);
  const int64_t shape[1] = {(int64_t)n}, stride[1] = {1}, half[1] = {(int64_t)n / 2};
  const ab__host_job job = {.dst = dst, .src = src, .ndim = 1, .shape = shape, .byte_strides = stride, .es = 1};
  int done[2] = {-1, -1};
  cr_assert_eq(ab__parallel_learned(&job, done), 0);
  cr_assert(done[0] == 0 && done[1] == 0);
  ab__parallel_shutdown();
  for (int call = 1; call <= 6; call++) {
    memset(dst, 0, n);
    ab__host_run(&job);
    cr_assert_eq(memcmp(dst, src, n), 0, "call %d", call);
    const int pick = ab__parallel_learned(&job, done);
    cr_assert_eq(done[0], call < 3 ? call : 3, "call %d: %d timed on one thread", call, done[0]);
    cr_assert_eq(done[1], call > 3 ? call - 3 : 0, "call %d: %d timed on two", call, done[1]);
    cr_assert_eq(pick != 0, call == 6, "call %d: pick %d", call, pick);
    cr_assert_eq(ab__parallel_workers(), call <= 3 ? 0 : 1, "call %d", call);
  }
  const int pick = ab__parallel_learned(&job, done);
  ab__parallel_shutdown();
  memset(dst, 0, n);
  ab__host_run(&job);
  cr_assert_eq(memcmp(dst, src, n), 0);
  cr_assert_eq(ab__parallel_workers(), pick == 2 ? 1 : 0, "picked %d", pick);
  cr_assert_eq(ab__parallel_learned(&job, done), pick, "a pick stays");
  cr_assert(done[0] == 3 && done[1] == 3, "calls after the pick are not timed");
  /* a call with another cap takes 256 KiB a thread (3 threads), untimed */
  ab__parallel_call_threads(3);
  ab__parallel_shutdown();
  memset(dst, 0, n);
  ab__host_run(&job);
  cr_assert_eq(memcmp(dst, src, n), 0);
  cr_assert_eq(ab__parallel_workers(), 2);
  cr_assert_eq(ab__parallel_learned(&job, done), pick);
  cr_assert(done[0] == 3 && done[1] == 3);
  ab__parallel_call_threads(2);
  /* ... and with the first cap, every call keeps the pick until the
   * AB__PARALLEL_RELEARN-th after it, which times again */
  for (int call = 2; call < AB__PARALLEL_RELEARN; call++) ab__host_run(&job);
  cr_assert_eq(ab__parallel_learned(&job, done), pick);
  cr_assert(done[0] == 3 && done[1] == 3);
  memset(dst, 0, n);
  ab__host_run(&job);
  cr_assert_eq(memcmp(dst, src, n), 0);
  cr_assert_eq(ab__parallel_learned(&job, done), 0, "timed again");
  cr_assert(done[0] == 1 && done[1] == 0, "timed %d and %d", done[0], done[1]);

  /* another size, another element size, a cast: nothing timed yet */
  ab__host_job other = job;
  other.shape = half;
  cr_assert_eq(ab__parallel_learned(&other, done), 0);
  cr_assert(done[0] == 0 && done[1] == 0);
  other = job;
  other.es = 2;
  other.shape = half;
  cr_assert_eq(ab__parallel_learned(&other, done), 0);
  cr_assert(done[0] == 0 && done[1] == 0);
  const ab__cast_op op = {.from = {kDLUInt, 8, 1}, .to = {kDLFloat, 32, 1}, .channel_dim = -1};
  other = job;
  other.op = &op;
  cr_assert_eq(ab__parallel_learned(&other, done), 0);
  cr_assert(done[0] == 0 && done[1] == 0);
  /* results under 512 KiB never split by the default; from 128 MiB the table ends */
  const int64_t small[1] = {(int64_t)(n / 2) - 1}, huge[1] = {(int64_t)128 << 20};
  other = job;
  other.shape = small;
  cr_assert_eq(ab__parallel_learned(&other, done), -1);
  other.shape = huge;
  cr_assert_eq(ab__parallel_learned(&other, done), -1);

  /* new settings: learned again; a malformed bound is the default, measured */
  setenv("AB_PARALLEL_MIN", "auto", 1);
  ab__env_reload();
  cr_assert_eq(ab__parallel_learned(&job, done), 0);
  cr_assert(done[0] == 0 && done[1] == 0);
  setenv("AB_PARALLEL_MIN", "lots", 1);
  ab__env_reload();
  cr_assert_eq(ab__parallel_min(), (size_t)256 << 10);
  ab__host_run(&job);
  cr_assert_eq(ab__parallel_learned(&job, done), 0);
  cr_assert(done[0] == 1 && done[1] == 0, "timed %d and %d", done[0], done[1]);
  /* a bound set: nothing timed, the bound kept (two threads at once) */
  setenv("AB_PARALLEL_MIN", "256KiB", 1);
  ab__env_reload();
  ab__parallel_shutdown();
  ab__host_run(&job);
  cr_assert_eq(memcmp(dst, src, n), 0);
  cr_assert_eq(ab__parallel_workers(), 1);
  cr_assert_eq(ab__parallel_learned(&job, done), 0);
  cr_assert(done[0] == 0 && done[1] == 0);
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
  ab__parallel_call_threads(prev);
  free(src);
  free(dst);
}

/* The rule: the more threads stay only where they are 10% faster. */
Test(parallel, the_measured_bound_keeps_threads_that_gain_a_tenth) {
  cr_assert(ab__parallel_split_wins(100e-6, 50e-6));
  cr_assert(ab__parallel_split_wins(111e-6, 100e-6));
  cr_assert_not(ab__parallel_split_wins(109e-6, 100e-6));
  cr_assert_not(ab__parallel_split_wins(50e-6, 100e-6));
}

/* A 1 MiB copy learned by four callers at once: every call's bytes right,
 * and both kinds of call timed exactly three times. */
static void *learner(void *arg) {
  const size_t n = (size_t)1 << 20;
  char *src = arg, *dst = malloc(n);
  if (dst == NULL) return (void *)1;
  const uint32_t prev = ab__parallel_call_threads(2);
  const int64_t shape[1] = {(int64_t)n}, stride[1] = {1};
  const ab__host_job job = {.dst = dst, .src = src, .ndim = 1, .shape = shape, .byte_strides = stride, .es = 1};
  void *bad = NULL;
  for (int i = 0; i < 10 && bad == NULL; i++) {
    memset(dst, 0, n);
    ab__host_run(&job);
    if (memcmp(dst, src, n) != 0) bad = (void *)2;
  }
  ab__parallel_call_threads(prev);
  free(dst);
  return bad;
}

Test(parallel, concurrent_callers_learn_the_bound_once) {
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
  const size_t n = (size_t)1 << 20;
  char *src = malloc(n);
  cr_assert_not_null(src);
  fill_pattern(src, n, 9);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, learner, src), 0);
  for (int i = 0; i < 4; i++) {
    void *rc;
    pthread_join(th[i], &rc);
    cr_assert_null(rc, "caller %d got wrong bytes", i);
  }
  const int64_t shape[1] = {(int64_t)n}, stride[1] = {1};
  const ab__host_job job = {.dst = NULL, .src = src, .ndim = 1, .shape = shape, .byte_strides = stride, .es = 1};
  int done[2];
  cr_assert_neq(ab__parallel_learned(&job, done), 0);
  cr_assert(done[0] == 3 && done[1] == 3, "timed %d and %d", done[0], done[1]);
  unsetenv("AB_PARALLEL_MIN");
  ab__env_reload();
  free(src);
}
