/* Host layout work on all cores (parallel.c): large gathers and
 * conversions are cut into bands run by a small persistent worker pool
 * and the calling thread. */
#ifndef AB_PARALLEL_H
#define AB_PARALLEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "converters/host/convert.h"
#include "internal.h"

/* One host layout job: the ndim-dimensional array at src (byte strides,
 * any sign) into the compact row-major array dst. op NULL: a plain gather
 * of es-byte elements (ab__host_gather); else a conversion
 * (ab__host_convert_into; es is then op->from's size). Validated by the caller
 * as for those kernels. */
typedef struct ab__host_job {
  char *dst;
  const char *src;
  int32_t ndim;
  const int64_t *shape, *byte_strides;
  size_t es;
  const ab__cast_op *op;
  size_t min_part; /* bytes of output a thread at least, when below AB_PARALLEL_MIN; 0: AB_PARALLEL_MIN */
} ab__host_job;

/* Runs the job: in the caller's thread when it is small, its outer
 * dimensions short, or one thread is asked for; else in bands of one
 * dimension (parallel.c: the outermost, or the next one) on
 * up to AB_NUM_THREADS threads (the caller among them). Returns when
 * every band is done; the
 * result is the same bytes either way. Thread-safe: concurrent callers
 * share the workers. */
void ab__host_run(const ab__host_job *job);

/* Threads a large host move may use (AB_NUM_THREADS, else the online
 * cores), and bytes of output each thread gets at least (AB_PARALLEL_MIN,
 * 256 KiB when unset, auto or malformed): a move of fewer than twice that
 * is one thread's. Unset, auto or malformed, a move that a bound of four
 * times as many bytes a thread would give fewer threads takes the fewer
 * unless its kind's first calls at its size measured the more 10% faster,
 * and is measured again every AB__PARALLEL_RELEARN-th call (parallel.c,
 * "the measured bound"). */
int ab__num_threads(void);
size_t ab__parallel_min(void);

/* The measured bound's rule: whether the more threads, whose best call
 * took split_s seconds, stay against the fewer's fewer_s (10% faster). */
bool ab__parallel_split_wins(double fewer_s, double split_s);

/* The measured bound times a kind and size of move again at every this
 * many-th call after its pick. */
#define AB__PARALLEL_RELEARN 1024

/* For tests: what the measured bound knows of jobs of w's kind and
 * size: -1 for a size it does not measure, else 0 (not yet decided),
 * 1 (the fewer threads) or 2 (the more), and in done[] the calls timed on
 * the fewer and on the more. */
int ab__parallel_learned(const ab__host_job *w, int done[2]);

/* Threads a large host move of the calling thread may use now: its cap
 * (ab__parallel_call_threads) or else ab__num_threads(). */
int ab__parallel_threads(void);

/* Sets the calling thread's cap on threads for the host moves it runs
 * until the next call (ab_convert_opts.threads: 0 = the default, n = up to
 * n); returns the previous cap. ab_convert_memory sets it around a
 * conversion, so moves made for it through any backend see it. */
uint32_t ab__parallel_call_threads(uint32_t n);

/* How many indices of dim `cut` each band of w takes on t threads (for
 * tests; the last band may be shorter). */
int64_t ab__parallel_band(const ab__host_job *w, int cut, int64_t t);

/* Worker threads running now (for tests: a job that was cut into bands
 * started t - 1 of them). */
int ab__parallel_workers(void);

/* The most workers that were inside one job at once since the last call
 * (for tests: a job on t threads has at most t - 1 beside its caller). */
int ab__parallel_peak_in_job(void);
/* Jobs a worker took while it spun (AB_THREAD_SPIN_US) rather than
 * slept, since the library was loaded (tests). */
unsigned long ab__parallel_spun_pickups(void);
/* Workers that first ran on the core their creator was on, since the
 * library was loaded (tests: where the process has two cores or more,
 * start_workers keeps them off it). */
int ab__parallel_started_beside_creator(void);

/* Stops and joins the workers (ab_shutdown); they start again on demand. */
void ab__parallel_shutdown(void);

#endif
