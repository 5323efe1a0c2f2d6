/* Host benchmarks: every speed is printed beside a baseline measured in the
 * same run (memcpy), because shared machines are noisy; per-call overheads
 * beside malloc + memcpy + free of the same size.
 *
 *   bench_host [--quick]
 *
 * Each figure is the median of several repetitions. "GB/s" counts the
 * tensor's bytes once (as memcpy's size argument does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_util.h"

#include <pthread.h>
#include <stdint.h>

#include "arraybridge/arraybridge.h"
#include "converters/host/convert.h"
#include "converters/host/gather.h"
#include "internal.h" /* ab__env_reload */
#include "parallel.h"

static int reps = 11;
static volatile unsigned sink;

typedef void (*job_fn)(void *ctx);

/* Median seconds of one run of fn. */
static double time_job(job_fn fn, void *ctx) {
  double t[64];
  fn(ctx); /* warm up: page faults, caches */
  for (int i = 0; i < reps; i++) {
    double t0 = bench_now();
    fn(ctx);
    t[i] = bench_now() - t0;
  }
  return bench_median(t, reps);
}

struct mc { void *dst; const void *src; size_t n; };
static void job_memcpy(void *p) {
  struct mc *c = p;
  memcpy(c->dst, c->src, c->n);
  sink += ((unsigned char *)c->dst)[c->n / 2];
}

struct mcf { const void *src; size_t n; };
static void job_memcpy_fresh(void *p) {
  struct mcf *c = p;
  void *d = malloc(c->n); /* malloc, as the rows say (posix_memalign took 2-4x as long for 4 KiB) */
  if (d == NULL) abort();
  memcpy(d, c->src, c->n);
  sink += ((unsigned char *)d)[c->n / 2];
  free(d);
}

struct cv { DLTensor t; ab_convert_opts o; };
/* The conversion to the host; a failure ends the benchmark. */
static DLManagedTensorVersioned *convert(struct cv *c) {
  DLManagedTensorVersioned *r;
  if (ab_convert_memory(&c->t, (DLDevice){kDLCPU, 0}, &c->o, &r) != AB_OK) {
    fprintf(stderr, "bench: %s\n", ab_last_error());
    exit(1);
  }
  return r;
}
static void job_convert(void *p) {
  DLManagedTensorVersioned *r = convert(p);
  sink += ((unsigned char *)r->dl_tensor.data)[0];
  r->deleter(r);
}

/* One pass reading n bytes, as the next step of a pipeline reads the
 * result: what it pays depends on where the result was left (a copy or
 * a transpose with ordinary stores leaves it in the cache; streaming
 * stores send it to memory). */
static uint64_t read_all(const void *p, size_t n) {
  const uint64_t *q = p;
  uint64_t s = 0;
  for (size_t i = 0; i < n / 8; i++) s += q[i];
  return s;
}
static void job_memcpy_read(void *p) {
  struct mc *c = p;
  memcpy(c->dst, c->src, c->n);
  sink += (unsigned)read_all(c->dst, c->n);
}
struct cvr { struct cv c; size_t bytes; };
static void job_convert_read(void *p) {
  struct cvr *c = p;
  DLManagedTensorVersioned *r = convert(&c->c);
  sink += (unsigned)read_all(r->dl_tensor.data, c->bytes);
  r->deleter(r);
}

struct gk { void *dst; const DLTensor *t; int64_t st[8]; size_t es; };
static void job_gather(void *p) {
  struct gk *c = p;
  ab__host_gather(c->dst, c->t->data, c->t->ndim, c->t->shape, c->st, c->es);
  sink += ((unsigned char *)c->dst)[0];
}

static void row(const char *what, size_t bytes, double secs, double base_secs) {
  printf("%-44s %9.2f GB/s   %5.2fx memcpy\n", what, (double)bytes / secs / 1e9, base_secs / secs);
}

static void bench_layout(const char *name, DLTensor *t, size_t bytes, void *dst, double base) {
  struct cv c = {*t, AB_CONVERT_OPTS_INIT};
  c.o.copy = AB_COPY_ALWAYS;
  struct gk g = {dst, t, {0}, (size_t)(t->dtype.bits / 8) * t->dtype.lanes};
  for (int i = 0; i < t->ndim; i++) g.st[i] = t->strides[i] * (int64_t)g.es;
  char label[96];
  snprintf(label, sizeof label, "%s: gather kernel (warm dst)", name);
  row(label, bytes, time_job(job_gather, &g), base);
  snprintf(label, sizeof label, "%s: ab_convert_memory (alloc+copy)", name);
  row(label, bytes, time_job(job_convert, &c), base);
}

/* memcpy cut into one slice per thread (the all-core baseline). The
 * helpers are started once and woken for each copy through a condition
 * variable, as the library's workers are: starting threads for every copy
 * (as this baseline did before 2026-11-28) charged it a pthread_create
 * and join per slice, tens of microseconds that made the library's share
 * look better at 1-4 MiB than it was. */
struct mct { struct mc whole; int threads; };
static struct {
  pthread_mutex_t lock;
  pthread_cond_t go, done;
  pthread_t th[64];
  int started, left, slices; /* helpers running; slices of this round not done; of all */
  unsigned round;            /* bumped for each copy */
  struct mc part[64];
} team = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};
static void *team_helper(void *p) {
  const int me = (int)(intptr_t)p;
  unsigned seen = 0;
  pthread_mutex_lock(&team.lock);
  for (;;) {
    while (team.round == seen) pthread_cond_wait(&team.go, &team.lock);
    seen = team.round;
    if (me >= team.slices) continue; /* a round with fewer slices than helpers */
    const struct mc part = team.part[me];
    pthread_mutex_unlock(&team.lock);
    memcpy(part.dst, part.src, part.n);
    pthread_mutex_lock(&team.lock);
    if (--team.left == 0) pthread_cond_signal(&team.done);
  }
  return NULL;
}
static void job_memcpy_threads(void *p) {
  struct mct *c = p;
  size_t per = c->whole.n / (size_t)c->threads;
  pthread_mutex_lock(&team.lock);
  for (; team.started < c->threads - 1; team.started++)
    if (pthread_create(&team.th[team.started], NULL, team_helper, (void *)(intptr_t)(team.started + 1)) != 0) abort();
  for (int i = 0; i < c->threads; i++) {
    size_t off = per * (size_t)i, n = i == c->threads - 1 ? c->whole.n - off : per;
    team.part[i] = (struct mc){(char *)c->whole.dst + off, (const char *)c->whole.src + off, n};
  }
  team.left = c->threads - 1;
  team.slices = c->threads;
  team.round++;
  pthread_cond_broadcast(&team.go);
  pthread_mutex_unlock(&team.lock);
  memcpy(team.part[0].dst, team.part[0].src, team.part[0].n);
  pthread_mutex_lock(&team.lock);
  while (team.left > 0) pthread_cond_wait(&team.done, &team.lock);
  pthread_mutex_unlock(&team.lock);
  sink += ((unsigned char *)c->whole.dst)[c->whole.n / 2];
}

/* 2-D transposes of arrays of n x m elements of `es` bytes (m = n where
 * not given) through ab_convert_memory (and batched ones: `batch` planes,
 * each transposed), on one thread and on all, beside memcpy on one thread
 * and on all; on one thread with one read of the whole result after each
 * call, beside memcpy and the same read (what a pipeline that uses the
 * result next pays; bench/results/2026-11-28-plain-and-read.md); and on
 * one thread from a copy of the source offered for
 * huge pages (as NumPy's large arrays and ab_tensor_alloc's blocks are;
 * the first source is plain aligned_alloc memory, 4 KiB pages where
 * transparent huge pages are `madvise`). The rectangular ones have source
 * rows that do not all start at one offset in a cache line (4104 float32
 * or uint16 columns, 2052 float64), or are uint8 from memory (8192^2, 64
 * MiB); the next three have outputs of 2-4 MiB, past the L2 of most
 * cores and within the last-level cache; then a 1024^2 uint8 image and
 * 512^2 float64 (1 and 2 MiB, rows a power of two apart), about an L2's
 * size, a uint16 frame the other way round (output rows of 3840
 * bytes, on lines, where 1080 x 1920's are not), and a uint8 frame whose
 * output rows (1080 bytes) are off lines. */
static void bench_transposes(int quick) {
  static const struct { int64_t batch, n, m; DLDataType d; const char *name; } cases[] = {
    {1, 4000, 0, {kDLFloat, 32, 1}, "f32"},  {1, 4096, 0, {kDLFloat, 32, 1}, "f32"},
    {1, 4104, 0, {kDLFloat, 32, 1}, "f32"},  {1, 4096, 0, {kDLUInt, 8, 1}, "u8"},
    {1, 4096, 0, {kDLUInt, 16, 1}, "u16"},   {1, 4096, 0, {kDLFloat, 64, 1}, "f64"},
    {16, 1024, 0, {kDLFloat, 32, 1}, "f32"}, {16, 1000, 0, {kDLUInt, 8, 1}, "u8"},
    {1, 4096, 4104, {kDLFloat, 32, 1}, "f32"}, {1, 4096, 4104, {kDLUInt, 16, 1}, "u16"},
    {1, 2048, 2052, {kDLFloat, 64, 1}, "f64"}, {1, 8192, 0, {kDLUInt, 8, 1}, "u8"},
    {1, 1536, 0, {kDLUInt, 8, 1}, "u8"},     {1, 1080, 1920, {kDLUInt, 16, 1}, "u16"},
    {1, 1000, 0, {kDLFloat, 32, 1}, "f32"},  {1, 1024, 0, {kDLUInt, 8, 1}, "u8"},
    {1, 512, 0, {kDLFloat, 64, 1}, "f64"},   {1, 1920, 1080, {kDLUInt, 16, 1}, "u16"},
    {1, 1080, 1920, {kDLUInt, 8, 1}, "u8"},
  };
  const int all = ab__num_threads();
  printf("\n%-30s %10s %10s %12s %12s %12s %12s\n", "transpose (ab_convert_memory)", "1 thr GB/s", "all GB/s",
         "1thr/memcpy", "all/memcpy*", "huge/memcpy", "1thr+read");
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    const int64_t m0 = cases[k].m > 0 ? cases[k].m : cases[k].n;
    const int64_t n = quick ? cases[k].n / 4 : cases[k].n, m = quick ? m0 / 4 : m0, nb = cases[k].batch;
    const size_t es = cases[k].d.bits / 8u, bytes = (size_t)(nb * n * m) * es;
    char *a = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096), *b = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    for (size_t i = 0; i < bytes; i++) a[i] = (char)(i * 13);
    memset(b, 0, bytes);
    struct mc mc1 = {b, a, bytes};
    struct mct mt = {{b, a, bytes}, all};
    const double one_mc = time_job(job_memcpy, &mc1), all_mc_split = time_job(job_memcpy_threads, &mt);
    /* the all-thread baseline is the faster memcpy: split over the threads
     * (and woken) is slower than one thread's where the array is small */
    const double all_mc = all_mc_split < one_mc ? all_mc_split : one_mc;
    int64_t shape[3] = {nb, m, n}, str[3] = {n * m, 1, m}; /* the transpose of n rows of m */
    const int batched = nb > 1;
    struct cv c = {{a, {kDLCPU, 0}, batched ? 3 : 2, cases[k].d, batched ? shape : shape + 1, batched ? str : str + 1, 0},
                   AB_CONVERT_OPTS_INIT};
    c.o.threads = 1;
    const double one = time_job(job_convert, &c);
    c.o.threads = 0;
    const double many = time_job(job_convert, &c);
    /* one thread, then the result read once; against memcpy, then the same read */
    c.o.threads = 1;
    struct cvr cr = {c, bytes};
    const double one_read = time_job(job_convert_read, &cr), mc_read = time_job(job_memcpy_read, &mc1);
    /* the same from a source on huge pages, where the kernel gives them */
    const size_t huge = (size_t)2 << 20, hb = (bytes + huge - 1) / huge * huge;
    char *ah = aligned_alloc(huge, hb);
    if (ah == NULL) abort();
#ifdef MADV_HUGEPAGE
    (void)madvise(ah, hb, MADV_HUGEPAGE);
#endif
    memcpy(ah, a, bytes);
    c.t.data = ah;
    c.o.threads = 1;
    const double one_huge = time_job(job_convert, &c);
    free(ah);
    char label[64];
    if (batched) snprintf(label, sizeof label, "%lldx(%lldx%lld) %s", (long long)nb, (long long)n, (long long)n, cases[k].name);
    else snprintf(label, sizeof label, "%lldx%lld %s", (long long)n, (long long)m, cases[k].name);
    printf("%-30s %10.2f %10.2f %11.2fx %11.2fx %11.2fx %11.2fx\n", label, (double)bytes / one / 1e9,
           (double)bytes / many / 1e9, one_mc / one, all_mc / many, one_mc / one_huge, mc_read / one_read);
    free(a);
    free(b);
  }
  printf("(n x m: the array transposed, n rows of m elements; memcpy*: the faster of memcpy on one thread and on %d\n"
         " threads, one slice each; huge: one\n"
         " thread from a copy of the source offered for huge pages, against the same memcpy; 1thr+read: one thread's call\n"
         " and one read of the whole result, against memcpy and the same read)\n", all);
}

/* Images of 2, 3 and 4 channels between packed pixels (HWC) and planes
 * (CHW), both ways, through ab_convert_memory on one thread, beside
 * memcpy of the same bytes. */
static void bench_pixels(int quick) {
  static const struct { DLDataType d; const char *name; } types[] = {
      {{kDLUInt, 8, 1}, "u8"}, {{kDLUInt, 16, 1}, "u16"}, {{kDLFloat, 32, 1}, "f32"}};
  const int64_t H = quick ? 540 : 2160, W = quick ? 960 : 3840;
  printf("\n%-30s %10s %10s %12s %12s\n", "pixels <-> planes (1 thread)", "HWC->CHW", "CHW->HWC", "/memcpy", "/memcpy");
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
    for (int64_t C = 2; C <= 4; C++) {
      const size_t bytes = (size_t)(H * W * C) * (types[k].d.bits / 8u);
      char *a = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096), *b = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
      for (size_t i = 0; i < bytes; i++) a[i] = (char)(i * 7);
      memset(b, 0, bytes);
      struct mc m = {b, a, bytes};
      const double base = time_job(job_memcpy, &m);
      int64_t pshape[3] = {C, H, W}, pst[3] = {1, W * C, C}; /* HWC read as CHW */
      int64_t ishape[3] = {H, W, C}, ist[3] = {W, 1, H * W}; /* CHW read as HWC */
      struct cv to_planes = {{a, {kDLCPU, 0}, 3, types[k].d, pshape, pst, 0}, AB_CONVERT_OPTS_INIT};
      struct cv to_pixels = {{a, {kDLCPU, 0}, 3, types[k].d, ishape, ist, 0}, AB_CONVERT_OPTS_INIT};
      to_planes.o.threads = to_pixels.o.threads = 1;
      const double tp = time_job(job_convert, &to_planes), tx = time_job(job_convert, &to_pixels);
      char label[64];
      snprintf(label, sizeof label, "%lldx%lldx%lld %s", (long long)H, (long long)W, (long long)C, types[k].name);
      printf("%-30s %10.2f %10.2f %11.2fx %11.2fx\n", label, (double)bytes / tp / 1e9, (double)bytes / tx / 1e9,
             base / tp, base / tx);
      free(a);
      free(b);
    }
  printf("(GB/s of the image's bytes; memcpy on one thread)\n");
}

/* Casts through ab_convert_memory on one thread: contiguous, and from
 * sources whose rows are not contiguous (CHW planes to HWC pixels, HWC to
 * CHW, a transposed 2880^2 view), against memcpy of the larger side's
 * bytes (a cast reads one size and writes another; "GB/s" counts the
 * source and result bytes together, halved, as memcpy's would be). */
static void bench_casts(int quick) {
  const int64_t H = quick ? 540 : 2160, W = quick ? 960 : 3840, C = 3, N = quick ? 720 : 2880;
  static const struct { const char *name; DLDataType from, to; int layout, affine; } cases[] = {
    {"f32 -> u8 *255", {kDLFloat, 32, 1}, {kDLUInt, 8, 1}, 0, 1},
    {"u8 -> f32", {kDLUInt, 8, 1}, {kDLFloat, 32, 1}, 0, 0},
    {"f64 -> f32", {kDLFloat, 64, 1}, {kDLFloat, 32, 1}, 0, 0},
    {"i16 -> f32 /255", {kDLInt, 16, 1}, {kDLFloat, 32, 1}, 0, 1},
    {"f32 -> f16", {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, 0, 0},
    {"f16 -> f32", {kDLFloat, 16, 1}, {kDLFloat, 32, 1}, 0, 0},
    {"bf16 -> f32", {kDLBfloat, 16, 1}, {kDLFloat, 32, 1}, 0, 0},
    {"f32 -> bf16", {kDLFloat, 32, 1}, {kDLBfloat, 16, 1}, 0, 0},
    {"u8 -> f16 /255", {kDLUInt, 8, 1}, {kDLFloat, 16, 1}, 0, 1},
    {"CHW f32 -> HWC u8 *255", {kDLFloat, 32, 1}, {kDLUInt, 8, 1}, 1, 1},
    {"CHW u8 -> HWC f32", {kDLUInt, 8, 1}, {kDLFloat, 32, 1}, 1, 0},
    {"HWC f32 -> CHW f16", {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, 2, 0},
    {"transposed f32 -> f16", {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, 3, 0},
    {"transposed u8 -> f32", {kDLUInt, 8, 1}, {kDLFloat, 32, 1}, 3, 0},
    {"transposed u8 -> f16 /255", {kDLUInt, 8, 1}, {kDLFloat, 16, 1}, 3, 1},
    {"transposed u16 -> f32", {kDLUInt, 16, 1}, {kDLFloat, 32, 1}, 3, 0},
    {"transposed f16 -> f32", {kDLFloat, 16, 1}, {kDLFloat, 32, 1}, 3, 0},
  };
  const size_t n = (size_t)(H * W * C), most = n * 8; /* elements of every case: H x W x 3, or N^2 <= that */
  char *a = aligned_alloc(4096, most), *b = aligned_alloc(4096, most);
  for (size_t i = 0; i < most / 4; i++) ((float *)(void *)a)[i] = (float)(i % 251) / 251.0f;
  memset(b, 0, most);
  printf("\n%-30s %10s %12s   (%lldx%lldx3 images, %lld^2 transposed)\n", "casts (1 thread)", "GB/s", "/memcpy",
         (long long)H, (long long)W, (long long)N);
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    int64_t shape[3], st[3];
    int32_t perm[3] = {0, 1, 2};
    int nd = 3;
    const int lay = cases[k].layout;
    if (lay == 0) {
      nd = 1;
      shape[0] = (int64_t)n;
      st[0] = 1;
    } else if (lay == 1) { /* planes (C, H, W) to pixels (H, W, C) */
      shape[0] = C, shape[1] = H, shape[2] = W;
      st[0] = H * W, st[1] = W, st[2] = 1;
      perm[0] = 1, perm[1] = 2, perm[2] = 0;
    } else if (lay == 2) { /* pixels (H, W, C) to planes (C, H, W) */
      shape[0] = H, shape[1] = W, shape[2] = C;
      st[0] = W * C, st[1] = C, st[2] = 1;
      perm[0] = 2, perm[1] = 0, perm[2] = 1;
    } else { /* a transposed N x N view */
      nd = 2;
      shape[0] = N, shape[1] = N;
      st[0] = 1, st[1] = N;
    }
    struct cv c = {{a, {kDLCPU, 0}, nd, cases[k].from, shape, st, 0}, AB_CONVERT_OPTS_INIT};
    c.o.dtype = cases[k].to;
    c.o.threads = 1;
    if (lay == 1 || lay == 2) c.o.permute = perm;
    if (cases[k].affine) {
      c.o.flags = AB_CONVERT_AFFINE;
      c.o.scale = cases[k].to.bits == 8 ? 255.0 : 1.0 / 255;
    }
    size_t el = 1;
    for (int i = 0; i < nd; i++) el *= (size_t)shape[i];
    const size_t in = el * cases[k].from.bits / 8, out = el * cases[k].to.bits / 8, big = in > out ? in : out;
    struct mc m = {b, a, big};
    const double base = time_job(job_memcpy, &m), t = time_job(job_convert, &c);
    printf("%-30s %10.2f %11.2fx\n", cases[k].name, (double)(in + out) / 2 / t / 1e9, base / t * (double)(in + out) / 2 / (double)big);
  }
  printf("(memcpy of the larger side, one thread)\n");
  free(a);
  free(b);
}

/* Where casts start streaming their results (ab__host_cast_streams):
 * uint8 -> float32 on one thread at results around the bound, with
 * ordinary stores, streamed, and as the rule picks, so the bound can be
 * checked on each machine. GB/s of the result's bytes. The caller's
 * AB_HOST_CAST_STREAMING is put back afterwards. */
static void bench_cast_bound(int quick) {
  static const int sizes[] = {4, 8, 16, 24, 32, 64}, quick_sizes[] = {8, 32};
  const int *mib = quick ? quick_sizes : sizes;
  const int nsizes = quick ? 2 : (int)(sizeof sizes / sizeof sizes[0]);
  const size_t most = (size_t)mib[nsizes - 1] << 20;
  unsigned char *a = aligned_alloc(4096, most / 4);
  for (size_t i = 0; i < most / 4; i++) a[i] = (unsigned char)(i * 7);
  const char *env = getenv("AB_HOST_CAST_STREAMING");
  char *saved = env != NULL ? strdup(env) : NULL;
  printf("\n%-30s %10s %10s %10s %10s   (the rule streams from %.1f MiB read and written)\n",
         "u8 -> f32 (1 thread, GB/s)", "ordinary", "streamed", "auto", "str/ord", (double)ab__host_cast_stream_min() / (1 << 20));
  static const char *const modes[] = {"0", "1", NULL};
  for (int k = 0; k < nsizes; k++) {
    int64_t shape[1] = {(int64_t)((size_t)mib[k] << 20) / 4};
    struct cv c = {{a, {kDLCPU, 0}, 1, {kDLUInt, 8, 1}, shape, NULL, 0}, AB_CONVERT_OPTS_INIT};
    c.o.dtype = (DLDataType){kDLFloat, 32, 1};
    c.o.threads = 1;
    double gbs[3];
    for (int m = 0; m < 3; m++) {
      if (modes[m] != NULL) setenv("AB_HOST_CAST_STREAMING", modes[m], 1);
      else unsetenv("AB_HOST_CAST_STREAMING");
      ab__env_reload();
      gbs[m] = (double)((size_t)mib[k] << 20) / time_job(job_convert, &c) / 1e9;
    }
    char label[64];
    snprintf(label, sizeof label, "%d MiB result", mib[k]);
    const size_t whole = (size_t)shape[0] * 5;
    printf("%-30s %10.2f %10.2f %10.2f %9.2fx   auto: %s\n", label, gbs[0], gbs[1], gbs[2], gbs[1] / gbs[0],
           ab__host_cast_streams(c.t.dtype, c.o.dtype, whole) ? "streamed" : "ordinary");
  }
  printf("(source warm; the result's pool block reused, so a result that fits stays cached)\n");
  if (saved != NULL) setenv("AB_HOST_CAST_STREAMING", saved, 1);
  else unsetenv("AB_HOST_CAST_STREAMING");
  ab__env_reload();
  free(saved);
  free(a);
}

static double per_call_ns(job_fn fn, void *ctx, long iters) {
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    for (long i = 0; i < iters; i++) fn(ctx);
    t[r] = (bench_now() - t0) / (double)iters * 1e9;
  }
  return bench_median(t, reps);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  if (quick) reps = 3;
  const int64_t N = quick ? 1024 : 4096;
  const int64_t H = quick ? 540 : 2160, W = quick ? 960 : 3840, C = 3;

  printf("arraybridge %s host benchmark%s: median of %d runs\n\n", ab_version_string(),
         quick ? " (quick)" : "", reps);

  /* -- contiguous and 2-D transpose, N x N float32 -- */
  size_t nb = (size_t)(N * N) * 4;
  float *a = aligned_alloc(256, nb), *b = aligned_alloc(256, nb);
  for (int64_t i = 0; i < N * N; i++) a[i] = (float)i;
  memset(b, 0, nb);
  struct mc m = {b, a, nb};
  double base = time_job(job_memcpy, &m);
  struct mcf mf = {a, nb};
  char label[96];
  snprintf(label, sizeof label, "memcpy %lldx%lld f32 (baseline)", (long long)N, (long long)N);
  row(label, nb, base, base);
  row("malloc + memcpy + free (fresh pages)", nb, time_job(job_memcpy_fresh, &mf), base);

  int64_t shape[2] = {N, N}, cstr[2] = {N, 1}, tstr[2] = {1, N};
  DLTensor contig = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, cstr, 0};
  bench_layout("contiguous f32", &contig, nb, b, base);
  DLTensor tr = {a, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, tstr, 0};
  bench_layout("transpose f32", &tr, nb, b, base);

  /* -- HWC -> CHW, uint8: the logical CHW view of an HWC image -- */
  size_t ib = (size_t)(H * W * C);
  unsigned char *img = aligned_alloc(256, ib), *out = aligned_alloc(256, ib);
  for (size_t i = 0; i < ib; i++) img[i] = (unsigned char)(i * 7);
  memset(out, 0, ib);
  struct mc mi = {out, img, ib};
  double ibase = time_job(job_memcpy, &mi);
  snprintf(label, sizeof label, "memcpy %lldx%lldx3 u8 (baseline)", (long long)H, (long long)W);
  printf("\n");
  row(label, ib, ibase, ibase);
  int64_t ishape[3] = {C, H, W}, istr[3] = {1, W * C, C};
  DLTensor hwc = {img, {kDLCPU, 0}, 3, {kDLUInt, 8, 1}, ishape, istr, 0};
  bench_layout("HWC->CHW u8", &hwc, ib, out, ibase);

  bench_transposes(quick);
  bench_pixels(quick);
  bench_casts(quick);
  bench_cast_bound(quick);

  /* -- per-call overheads -- */
  printf("\n");
  int64_t small_shape[1] = {1024};
  DLTensor small = {a, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, small_shape, NULL, 0};
  struct cv view = {small, AB_CONVERT_OPTS_INIT};
  struct cv copy = {small, AB_CONVERT_OPTS_INIT};
  copy.o.copy = AB_COPY_ALWAYS;
  struct mcf small_base = {a, 4096};
  long iters = quick ? 20000 : 200000;
  double v_ns = per_call_ns(job_convert, &view, iters);
  double c_ns = per_call_ns(job_convert, &copy, iters);
  double m_ns = per_call_ns(job_memcpy_fresh, &small_base, iters);
  printf("%-44s %9.1f ns/call\n", "zero-copy convert (view + deleter)", v_ns);
  printf("%-44s %9.1f ns/call   %5.2fx the time of malloc+memcpy+free\n", "4 KiB copy convert (+ deleter)", c_ns,
         c_ns / m_ns);
  printf("%-44s %9.1f ns/call\n", "malloc + memcpy + free 4 KiB (baseline)", m_ns);

  free(a);
  free(b);
  free(img);
  free(out);
  return sink == 12345 ? 2 : 0;
}
