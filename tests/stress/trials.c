/* First large transposes on several threads at once, a plain program (so
 * it also runs under ThreadSanitizer):
 *
 *   stress_trials
 *
 * Eight threads each convert a uint8 transpose large enough to stream, two
 * of each kind of rows (output rows on cache lines or not, source rows at
 * one offset in a line or not), at the same moment, in a fresh process:
 * each asks for its kind's trial (converters/host/gather.c) while the
 * others ask for theirs, the same kind's included; the trials run one at
 * a time under a lock. Each thread converts its transpose four times, so
 * the two threads of a kind also time the streaming variants on their
 * transposes together (the 6 bands that gather.c's learner times, and the
 * pick after them, where the trial picked a streaming variant). ctest
 * runs it with AB_HOST_STREAMING=auto, so that the trials and the
 * measuring run whatever the environment says. Then the eight threads
 * each make ten 1 MiB moves on up to two threads, a copy or a float32
 * transpose, which time the first calls of each kind on one thread and on
 * two (the measured bound of src/parallel.c; ctest leaves AB_PARALLEL_MIN
 * unset).
 * Every result is checked against the source. Exits non-zero on any
 * difference or error. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "arraybridge/arraybridge.h"

static pthread_barrier_t start;

/* Thread i converts kind i % 4. */
static void *transpose(void *arg) {
  const int kind = (int)(intptr_t)arg % 4;
  /* source rows of 2048 or 2056 bytes (on lines, or 8 bytes further each
   * row), output rows likewise: 4 MiB, above any streaming threshold */
  const int64_t rows = 2048 + (kind & 1) * 8, cols = 2048 + (kind >> 1) * 8;
  uint8_t *a = malloc((size_t)(rows * cols));
  if (a == NULL) return "out of memory";
  for (int64_t i = 0; i < rows * cols; i++) a[i] = (uint8_t)(i * 7 + kind);
  int64_t shape[2] = {rows, cols}, st[2] = {1, rows}; /* a cols x rows source read transposed */
  DLTensor t = {a, {kDLCPU, 0}, 2, {kDLUInt, 8, 1}, shape, st, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.threads = 1;
  DLManagedTensorVersioned *r = NULL;
  pthread_barrier_wait(&start);
  const char *bad = NULL;
  for (int rep = 0; rep < 4 && bad == NULL; rep++) {
    if (ab_convert_memory(&t, (DLDevice){kDLCPU, 0}, &o, &r) != AB_OK) {
      fprintf(stderr, "stress_trials: kind %d: %s\n", kind, ab_last_error());
      bad = "conversion failed";
      break;
    }
    const uint8_t *d = r->dl_tensor.data;
    for (int64_t i = 0; i < rows && bad == NULL; i++)
      for (int64_t j = 0; j < cols; j++)
        if (d[i * cols + j] != a[j * rows + i]) {
          fprintf(stderr, "stress_trials: kind %d, conversion %d: element (%lld, %lld) differs\n", kind, rep,
                  (long long)i, (long long)j);
          bad = "wrong result";
          break;
        }
    r->deleter(r);
  }
  free(a);
  return (void *)bad;
}

/* Thread i: ten 1 MiB copies (even i) or float32 transposes (odd i),
 * on up to two threads each. */
static void *learn(void *arg) {
  const int i = (int)(intptr_t)arg;
  const int64_t side = 512;
  float *a = malloc((size_t)(side * side) * sizeof *a);
  if (a == NULL) return "out of memory";
  for (int64_t k = 0; k < side * side; k++) a[k] = (float)(k * 3 + i);
  int64_t shape[2] = {side, side}, st[2] = {1, side};
  DLTensor t = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, i % 2 ? st : NULL, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.threads = 2;
  o.copy = AB_COPY_ALWAYS;
  pthread_barrier_wait(&start);
  const char *bad = NULL;
  for (int rep = 0; rep < 10 && bad == NULL; rep++) {
    DLManagedTensorVersioned *r = NULL;
    if (ab_convert_memory(&t, (DLDevice){kDLCPU, 0}, &o, &r) != AB_OK) {
      fprintf(stderr, "stress_trials: mover %d: %s\n", i, ab_last_error());
      bad = "conversion failed";
      break;
    }
    const float *d = r->dl_tensor.data;
    for (int64_t y = 0; y < side && bad == NULL; y++)
      for (int64_t x = 0; x < side; x++)
        if (d[y * side + x] != (i % 2 ? a[x * side + y] : a[y * side + x])) {
          fprintf(stderr, "stress_trials: mover %d: element (%lld, %lld) differs\n", i, (long long)y, (long long)x);
          bad = "wrong result";
          break;
        }
    r->deleter(r);
  }
  free(a);
  return (void *)bad;
}

/* Eight threads at once through f; the number that failed. */
static int together(void *(*f)(void *)) {
  pthread_t th[8];
  for (intptr_t k = 0; k < 8; k++)
    if (pthread_create(&th[k], NULL, f, (void *)k) != 0) return 8;
  int failed = 0;
  for (int k = 0; k < 8; k++) {
    void *bad = NULL;
    pthread_join(th[k], &bad);
    failed += bad != NULL;
  }
  return failed;
}

int main(void) {
  pthread_barrier_init(&start, NULL, 8);
  const int failed = together(transpose), moved = together(learn);
  pthread_barrier_destroy(&start);
  ab_shutdown();
  printf("stress_trials: %d of 8 first transposes right, %d of 8 movers right\n", 8 - failed, 8 - moved);
  return failed != 0 || moved != 0;
}
