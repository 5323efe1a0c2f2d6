/* Concurrency: threads converting at the same time get correct results,
 * their own error messages and no leaks. Threads do not call cr_assert
 * (Criterion reports from the test's main thread); each records its first
 * failure and the main thread asserts on it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "support.h"

#define ITERS (AB_TEST_SANITIZED ? 2000 : 4000)

struct worker {
  int id;
  int iters;
  pthread_barrier_t *start;
  long copies, views, errors; /* how many of each ran */
  char failure[256];          /* first failure, "" if none */
};

#define FAIL_IF(w, cond, ...)                                         \
  do {                                                                \
    if ((cond) && (w)->failure[0] == '\0') {                          \
      snprintf((w)->failure, sizeof (w)->failure, __VA_ARGS__);       \
    }                                                                 \
    if (cond) return;                                                 \
  } while (0)

/* A random strided layout over a thread-private buffer: a copy checked
 * against the reference gather. */
static void do_copy(struct worker *w, test_rng *g, char *buf, size_t cap) {
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  size_t es = sizes[rng_between(g, 0, 4)];
  int64_t R = rng_between(g, 1, 40), C = rng_between(g, 1, 40);
  if ((size_t)(R * C) * es * 2 > cap) R = C = 8;
  int64_t shape[2], st[2];
  int kind = (int)rng_between(g, 0, 3);
  char *data = buf;
  if (kind == 0) { /* transpose */
    shape[0] = C, shape[1] = R, st[0] = 1, st[1] = C;
  } else if (kind == 1) { /* every other column */
    shape[0] = R, shape[1] = C, st[0] = 2 * C, st[1] = 2;
  } else if (kind == 2) { /* reversed rows */
    shape[0] = R, shape[1] = C, st[0] = -C, st[1] = 1;
    data = buf + (size_t)((R - 1) * C) * es;
  } else { /* broadcast rows */
    shape[0] = R, shape[1] = C, st[0] = 0, st[1] = 1;
  }
  DLDataType d = {kDLUInt, 8, (uint16_t)es};
  DLTensor t = {data, CPU0, 2, d, shape, st, 0};
  ab_convert_opts o = {.copy = rng_between(g, 0, 1) ? AB_COPY_ALWAYS : AB_COPY_IF_NEEDED};
  DLManagedTensorVersioned *r = NULL;
  ab_status s = ab_convert_memory(&t, CPU0, &o, &r);
  FAIL_IF(w, s != AB_OK, "thread %d: copy failed: %s", w->id, ab_last_error());
  /* a layout that happens to be compact (a size-1 dim) may be a view */
  int ok = (r->flags & DLPACK_FLAG_BITMASK_IS_COPIED)
               ? is_compact_copy_of(r, &t)
               : o.copy != AB_COPY_ALWAYS && r->dl_tensor.data == t.data;
  int64_t diff = first_diff_vs_reference(&t, r);
  r->deleter(r);
  FAIL_IF(w, !ok, "thread %d: result of kind %d is neither a compact copy nor a view", w->id, kind);
  FAIL_IF(w, diff != -1, "thread %d: copy of kind %d differs at byte %lld", w->id, kind, (long long)diff);
  w->copies++;
}

static void do_view(struct worker *w, test_rng *g, char *buf) {
  int64_t shape[3] = {rng_between(g, 1, 5), rng_between(g, 1, 5), 4};
  DLTensor t = {buf, CPU0, 3, dt(kDLFloat, 32, 1), shape, NULL, (uint64_t)rng_between(g, 0, 16) * 4};
  DLManagedTensorVersioned *r = NULL;
  ab_status s = ab_convert_memory(&t, CPU0, NULL, &r);
  FAIL_IF(w, s != AB_OK, "thread %d: view failed: %s", w->id, ab_last_error());
  int ok = r->dl_tensor.data == t.data && r->dl_tensor.byte_offset == t.byte_offset &&
           !(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED) && r->dl_tensor.shape[0] == shape[0] &&
           r->dl_tensor.shape[1] == shape[1];
  r->deleter(r);
  FAIL_IF(w, !ok, "thread %d: view is wrong", w->id);
  w->views++;
}

/* A bad input whose message carries this thread's own number; the message
 * read right after must be this thread's, whatever the others do. */
static void do_error(struct worker *w, test_rng *g, char *buf) {
  int64_t shape[2] = {3, -(int64_t)(1000 + w->id)};
  DLTensor t = {buf, CPU0, 2, dt(kDLUInt, 8, 1), shape, NULL, 0};
  DLManagedTensorVersioned *r = SENTINEL_OUT;
  ab_status s;
  char want[32];
  if (rng_between(g, 0, 1)) {
    s = ab_convert_memory(&t, CPU0, NULL, &r);
    snprintf(want, sizeof want, "is -%d;", 1000 + w->id);
  } else {
    t.shape[1] = 3;
    s = ab_convert_memory(&t, (DLDevice){kDLCPU, 100 + w->id}, NULL, &r);
    snprintf(want, sizeof want, "cpu:%d ", 100 + w->id);
  }
  FAIL_IF(w, r != SENTINEL_OUT, "thread %d: *out written on failure", w->id);
  FAIL_IF(w, s == AB_OK, "thread %d: bad input accepted", w->id);
  FAIL_IF(w, strstr(ab_last_error(), want) == NULL, "thread %d: message \"%s\" is not about \"%s\"", w->id,
          ab_last_error(), want);
  w->errors++;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  test_rng g = {0x7417ead0u + (uint64_t)w->id};
  size_t cap = 2 * 40 * 40 * 16;
  char *buf = malloc(cap);
  if (buf == NULL) {
    snprintf(w->failure, sizeof w->failure, "thread %d: malloc", w->id);
    return NULL;
  }
  fill_pattern(buf, cap, (uint32_t)w->id);
  uint64_t sum = checksum(buf, cap);
  pthread_barrier_wait(w->start);
  for (int i = 0; i < w->iters && w->failure[0] == '\0'; i++) {
    switch (rng_between(&g, 0, 2)) {
    case 0: do_copy(w, &g, buf, cap); break;
    case 1: do_view(w, &g, buf); break;
    default: do_error(w, &g, buf); break;
    }
  }
  if (w->failure[0] == '\0' && checksum(buf, cap) != sum)
    snprintf(w->failure, sizeof w->failure, "thread %d: its source buffer was written", w->id);
  free(buf);
  return NULL;
}

static void run_workers(int n) {
  /* No library call before the threads start: they race the lazy init. */
  long live = ab__alloc_live_settled();
  pthread_t th[8];
  struct worker w[8];
  pthread_barrier_t start;
  cr_assert_eq(pthread_barrier_init(&start, NULL, (unsigned)n), 0);
  for (int i = 0; i < n; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].id = i;
    w[i].iters = ITERS;
    w[i].start = &start;
    cr_assert_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < n; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
  pthread_barrier_destroy(&start);
  for (int i = 0; i < n; i++) {
    cr_assert_str_eq(w[i].failure, "", "%s", w[i].failure);
    /* each kind of work really ran on each thread */
    cr_assert_gt(w[i].copies, ITERS / 5, "thread %d ran %ld copies", i, w[i].copies);
    cr_assert_gt(w[i].views, ITERS / 5, "thread %d ran %ld views", i, w[i].views);
    cr_assert_gt(w[i].errors, ITERS / 5, "thread %d ran %ld errors", i, w[i].errors);
  }
  cr_assert_eq(ab__alloc_live_settled(), live, "%ld blocks leaked", ab__alloc_live_settled() - live);
}

Test(threads, two_threads_mixed_conversions_are_correct, .timeout = 60) { run_workers(2); }

Test(threads, four_threads_mixed_conversions_are_correct, .timeout = 60) { run_workers(4); }

/* The message is per thread: two threads fail differently, wait for each
 * other, and each still reads its own message, not the other's (which a
 * shared buffer would show, since the other failed last). */
struct pair_arg {
  int id;
  pthread_barrier_t *b;
  int rounds;
  char failure[256];
};

static void *pair_main(void *arg) {
  struct pair_arg *a = arg;
  for (int round = 0; round < a->rounds; round++) {
    int64_t shape[1] = {-(int64_t)(10 * round + a->id + 1)};
    char buf[4];
    DLTensor t = {buf, CPU0, 1, dt(kDLUInt, 8, 1), shape, NULL, 0};
    DLManagedTensorVersioned *r = SENTINEL_OUT;
    char mine[48];
    snprintf(mine, sizeof mine, "shape[0] is %lld;", (long long)shape[0]);
    /* thread 0 fails first, thread 1 after it */
    if (a->id == 1) pthread_barrier_wait(a->b);
    ab_status s = ab_convert_memory(&t, CPU0, NULL, &r);
    if (a->id == 0) pthread_barrier_wait(a->b);
    pthread_barrier_wait(a->b); /* both have failed now */
    if ((s != AB_ERR_INVALID_ARGUMENT || strstr(ab_last_error(), mine) == NULL) && a->failure[0] == '\0') {
      snprintf(a->failure, sizeof a->failure, "thread %d round %d: status %d, message \"%s\", want \"%s\"", a->id,
               round, (int)s, ab_last_error(), mine);
    }
    pthread_barrier_wait(a->b); /* neither starts the next round before both checked */
  }
  return NULL;
}

Test(threads, last_error_is_per_thread) {
  /* the main thread's own message, which the workers must not touch */
  cr_assert_eq(ab_tensor_validate(NULL), AB_ERR_INVALID_ARGUMENT);
  char main_msg[512];
  snprintf(main_msg, sizeof main_msg, "%s", ab_last_error());
  pthread_barrier_t b;
  cr_assert_eq(pthread_barrier_init(&b, NULL, 2), 0);
  struct pair_arg a[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&a[i], 0, sizeof a[i]);
    a[i].id = i;
    a[i].b = &b;
    a[i].rounds = 200;
    cr_assert_eq(pthread_create(&th[i], NULL, pair_main, &a[i]), 0);
  }
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_join(th[i], NULL), 0);
  pthread_barrier_destroy(&b);
  cr_assert_str_eq(a[0].failure, "", "%s", a[0].failure);
  cr_assert_str_eq(a[1].failure, "", "%s", a[1].failure);
  cr_assert_str_eq(ab_last_error(), main_msg, "the main thread's message changed");
}
