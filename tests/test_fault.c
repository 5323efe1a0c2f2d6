/* The fault sweep (as SQLite's malloc tests): for N = 1, 2, ... make the
 * N-th allocation (host or device) fail and run the operation. Every run
 * ends in AB_OK or AB_ERR_OUT_OF_MEMORY; a failed run leaves *out alone,
 * says how many bytes it wanted, leaks nothing and leaves the source intact.
 * The sweep stops at the first N that injects no fault, which must succeed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "support.h"

/* One operation under test. run() does the call; on AB_OK, check() verifies
 * the result and releases it; on failure, cleanup() releases whatever the
 * caller still owns. */
struct op {
  const char *name;
  ab_status (*run)(struct op *op, void **out);
  void (*check)(struct op *op, void *result);
  void (*cleanup)(struct op *op);
  const void *src_bytes; /* bytes that must never change */
  size_t src_len;
  void *ctx;
};

#define OUT_SENTINEL ((void *)SENTINEL_OUT)
#define MAX_N 1000

/* Returns how many runs had a fault injected. */
static int sweep(struct op *op) {
  int faults = 0, n;
  uint64_t sum = op->src_bytes ? checksum(op->src_bytes, op->src_len) : 0;
  for (n = 1; n < MAX_N; n++) {
    long live = ab__alloc_live_settled();
    void *out = OUT_SENTINEL;
    ab__fault_arm(n);
    ab_status st = op->run(op, &out);
    long injected = ab__fault_injected();
    ab__fault_arm(0);
    if (st == AB_OK) {
      cr_assert_neq(out, OUT_SENTINEL, "%s, N=%d: AB_OK without a result", op->name, n);
      op->check(op, out);
    } else {
      cr_assert_eq(st, AB_ERR_OUT_OF_MEMORY, "%s, N=%d: %s (%s)", op->name, n, ab_status_name(st),
                   ab_last_error());
      cr_assert_gt(injected, 0, "%s, N=%d: out of memory with no injected fault", op->name, n);
      cr_assert_eq(out, OUT_SENTINEL, "%s, N=%d: *out written on failure", op->name, n);
      cr_assert_not_null(strstr(ab_last_error(), "bytes"), "%s, N=%d: message \"%s\" names no bytes",
                         op->name, n, ab_last_error());
      if (op->cleanup) op->cleanup(op);
    }
    cr_assert_eq(ab__alloc_live_settled(), live, "%s, N=%d: %ld blocks leaked", op->name, n, ab__alloc_live_settled() - live);
    if (op->src_bytes)
      cr_assert_eq(checksum(op->src_bytes, op->src_len), sum, "%s, N=%d: source changed", op->name, n);
    if (injected == 0) {
      cr_assert_eq(st, AB_OK, "%s, N=%d: failed with no fault injected", op->name, n);
      break;
    }
    faults++;
  }
  cr_assert_lt(n, MAX_N, "%s: the sweep never ran out of allocation points", op->name);
  return faults;
}

/* ---- a strided copy ------------------------------------------------------ */

struct copy_ctx {
  DLTensor t;
  ab_convert_opts opts;
};

static ab_status run_convert(struct op *op, void **out) {
  struct copy_ctx *c = op->ctx;
  return ab_convert_memory(&c->t, CPU0, &c->opts, (DLManagedTensorVersioned **)out);
}

static void check_copy(struct op *op, void *result) {
  struct copy_ctx *c = op->ctx;
  DLManagedTensorVersioned *r = result;
  cr_assert(is_compact_copy_of(r, &c->t), "%s: not a compact copy", op->name);
  cr_assert_eq(first_diff_vs_reference(&c->t, r), -1, "%s: wrong bytes", op->name);
  r->deleter(r);
}

static void check_view(struct op *op, void *result) {
  struct copy_ctx *c = op->ctx;
  DLManagedTensorVersioned *r = result;
  cr_assert_eq(r->dl_tensor.data, c->t.data, "%s: not a view", op->name);
  cr_assert_eq(r->flags & DLPACK_FLAG_BITMASK_IS_COPIED, 0, "%s", op->name);
  r->deleter(r);
}

Test(fault, strided_copy_survives_every_allocation_failure) {
  float buf[37 * 29];
  fill_pattern(buf, sizeof buf, 1);
  int64_t shape[2] = {29, 37}, strides[2] = {1, 29};
  struct copy_ctx c = {{buf, CPU0, 2, dt(kDLFloat, 32, 1), shape, strides, 0}, {.copy = AB_COPY_ALWAYS}};
  struct op op = {"strided copy", run_convert, check_copy, NULL, buf, sizeof buf, &c};
  int faults = sweep(&op);
  /* at least the tensor header and the data block */
  cr_assert_geq(faults, 2, "the copy hit only %d fault points", faults);
}

Test(fault, copy_if_needed_of_non_compact_and_read_only_copy_survive) {
  uint16_t buf[64 * 3];
  fill_pattern(buf, sizeof buf, 2);
  int64_t shape[2] = {64, 3}, strides[2] = {3, -1};
  struct copy_ctx c = {{buf + 2, CPU0, 2, dt(kDLUInt, 16, 1), shape, strides, 0},
                       {.copy = AB_COPY_IF_NEEDED, .flags = AB_CONVERT_READ_ONLY}};
  struct op op = {"reversed-column copy", run_convert, check_copy, NULL, buf, sizeof buf, &c};
  cr_assert_geq(sweep(&op), 2);
}

Test(fault, view_survives_every_allocation_failure) {
  double buf[24];
  fill_pattern(buf, sizeof buf, 3);
  int64_t shape[3] = {2, 3, 4};
  struct copy_ctx c = {{buf, CPU0, 3, dt(kDLFloat, 64, 1), shape, NULL, 0}, {.copy = AB_COPY_NEVER}};
  struct op op = {"view", run_convert, check_view, NULL, buf, sizeof buf, &c};
  cr_assert_geq(sweep(&op), 1, "a view allocates its header");
}

Test(fault, empty_and_scalar_copies_survive) {
  float one = 3.0f;
  struct copy_ctx c = {{&one, CPU0, 0, dt(kDLFloat, 32, 1), NULL, NULL, 0}, {.copy = AB_COPY_ALWAYS}};
  struct op op = {"scalar copy", run_convert, check_copy, NULL, &one, sizeof one, &c};
  cr_assert_geq(sweep(&op), 2);
  int64_t shape[2] = {0, 7};
  struct copy_ctx e = {{NULL, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0}, {.copy = AB_COPY_ALWAYS}};
  struct op op2 = {"empty copy", run_convert, check_copy, NULL, NULL, 0, &e};
  cr_assert_geq(sweep(&op2), 1);
}

/* ---- ab_tensor_alloc -------------------------------------------------- */

static ab_status run_alloc(struct op *op, void **out) {
  (void)op;
  int64_t shape[2] = {5, 9};
  return ab_tensor_alloc((DLDevice){kDLCPU, AB_DEVICE_AUTO}, 2, shape, dt(kDLInt, 32, 1),
                         (DLManagedTensorVersioned **)out);
}

static void check_alloc(struct op *op, void *result) {
  DLManagedTensorVersioned *r = result;
  cr_assert_not_null(r->dl_tensor.data, "%s", op->name);
  memset(r->dl_tensor.data, 0x11, 45 * sizeof(int32_t));
  cr_assert_eq(r->dl_tensor.shape[1], 9);
  r->deleter(r);
}

Test(fault, tensor_alloc_survives_every_allocation_failure) {
  struct op op = {"ab_tensor_alloc", run_alloc, check_alloc, NULL, NULL, 0, NULL};
  cr_assert_geq(sweep(&op), 2);
}

/* ---- legacy wrappers ---------------------------------------------------- */

struct legacy_ctx {
  int deleted;
  float data[4];
  int64_t shape[1];
  DLManagedTensor l;
  DLManagedTensorVersioned v;
};

static void legacy_deleter(DLManagedTensor *self) { ((struct legacy_ctx *)self->manager_ctx)->deleted++; }
static void versioned_deleter(DLManagedTensorVersioned *self) {
  ((struct legacy_ctx *)self->manager_ctx)->deleted++;
}

static void legacy_ctx_init(struct legacy_ctx *c) {
  memset(c, 0, sizeof *c);
  c->shape[0] = 4;
  DLTensor t = {c->data, CPU0, 1, dt(kDLFloat, 32, 1), c->shape, NULL, 0};
  c->l.dl_tensor = t;
  c->l.manager_ctx = c;
  c->l.deleter = legacy_deleter;
  c->v.version.major = 1;
  c->v.dl_tensor = t;
  c->v.manager_ctx = c;
  c->v.deleter = versioned_deleter;
}

static ab_status run_from_legacy(struct op *op, void **out) {
  struct legacy_ctx *c = op->ctx;
  return ab_from_legacy(&c->l, (DLManagedTensorVersioned **)out);
}

static void check_from_legacy(struct op *op, void *result) {
  struct legacy_ctx *c = op->ctx;
  DLManagedTensorVersioned *v = result;
  cr_assert_eq(v->dl_tensor.data, (void *)c->data);
  cr_assert_eq(c->deleted, 0, "%s: deleted while wrapped", op->name);
  v->deleter(v);
  cr_assert_eq(c->deleted, 1, "%s: original deleter ran %d times", op->name, c->deleted);
  c->deleted = 0;
}

/* On failure the caller still owns the original: not deleted. */
static void cleanup_legacy(struct op *op) {
  struct legacy_ctx *c = op->ctx;
  cr_assert_eq(c->deleted, 0, "%s: a failed call deleted the caller's tensor", op->name);
}

static ab_status run_to_legacy(struct op *op, void **out) {
  struct legacy_ctx *c = op->ctx;
  return ab_to_legacy(&c->v, (DLManagedTensor **)out);
}

static void check_to_legacy(struct op *op, void *result) {
  struct legacy_ctx *c = op->ctx;
  DLManagedTensor *l = result;
  cr_assert_eq(l->dl_tensor.data, (void *)c->data);
  l->deleter(l);
  cr_assert_eq(c->deleted, 1, "%s: original deleter ran %d times", op->name, c->deleted);
  c->deleted = 0;
}

Test(fault, legacy_wrappers_survive_every_allocation_failure) {
  struct legacy_ctx c;
  legacy_ctx_init(&c);
  struct op from = {"ab_from_legacy", run_from_legacy, check_from_legacy, cleanup_legacy, NULL, 0, &c};
  cr_assert_geq(sweep(&from), 1);
  struct op to = {"ab_to_legacy", run_to_legacy, check_to_legacy, cleanup_legacy, NULL, 0, &c};
  cr_assert_geq(sweep(&to), 1);
}

/* A converted copy exported as legacy: convert, then wrap. On a failure
 * after the convert, the converted tensor is the caller's to delete. */
struct chain_ctx {
  DLTensor t;
  DLManagedTensorVersioned *pending; /* converted, not yet wrapped */
};

static ab_status run_chain(struct op *op, void **out) {
  struct chain_ctx *c = op->ctx;
  ab_convert_opts o = {.copy = AB_COPY_ALWAYS};
  DLManagedTensorVersioned *r = NULL;
  c->pending = NULL;
  AB_FORWARD(ab_convert_memory(&c->t, CPU0, &o, &r));
  c->pending = r;
  AB_FORWARD(ab_to_legacy(r, (DLManagedTensor **)out));
  c->pending = NULL;
  return AB_OK;
}

static void check_chain(struct op *op, void *result) {
  struct chain_ctx *c = op->ctx;
  DLManagedTensor *l = result;
  int64_t n = 6 * 5 * 2;
  unsigned char want[6 * 5 * 2];
  reference_gather(&c->t, want);
  cr_assert(memcmp(l->dl_tensor.data, want, (size_t)n) == 0, "%s: wrong bytes", op->name);
  l->deleter(l);
}

static void cleanup_chain(struct op *op) {
  struct chain_ctx *c = op->ctx;
  if (c->pending) c->pending->deleter(c->pending);
  c->pending = NULL;
}

Test(fault, convert_then_export_as_legacy_survives) {
  uint16_t buf[5 * 6];
  fill_pattern(buf, sizeof buf, 4);
  int64_t shape[2] = {6, 5}, strides[2] = {1, 6};
  struct chain_ctx c = {{buf, CPU0, 2, dt(kDLUInt, 16, 1), shape, strides, 0}, NULL};
  struct op op = {"convert + to_legacy", run_chain, check_chain, cleanup_chain, buf, sizeof buf, &c};
  cr_assert_geq(sweep(&op), 3, "convert and wrap together have at least 3 fault points");
}

/* A call that the out-of-memory sequence rescues (one failed allocation,
 * then the retry succeeds) is a successful call: it leaves the thread's
 * message as it found it (the header's promise), not the driver's
 * failure. For N = 1, 2, ...: N-th allocation fails once; every AB_OK run
 * that had a fault injected keeps the message set before it. */
Test(fault, a_rescued_call_leaves_the_last_error_as_it_was) {
  int64_t shape[1] = {1 << 20};
  int rescued = 0;
  DLManagedTensorVersioned *warm = NULL; /* the pool made: each run below grows it, nothing else */
  cr_assert_eq(ab_tensor_alloc(CPU0, 1, shape, dt(kDLUInt, 8, 1), &warm), AB_OK);
  warm->deleter(warm);
  ab_pool_trim(CPU0);
  for (long n = 1; n < 20; n++) {
    DLDevice d;
    cr_assert_eq(ab_parse_device("no-such-device", &d), AB_ERR_INVALID_ARGUMENT);
    char before[512];
    snprintf(before, sizeof before, "%s", ab_last_error());
    DLManagedTensorVersioned *r = NULL;
    ab__fault_arm(n);
    ab_status st = ab_tensor_alloc(CPU0, 1, shape, dt(kDLUInt, 8, 1), &r);
    long injected = ab__fault_injected();
    ab__fault_arm(0);
    if (st != AB_OK) continue; /* a fault that ended the call: its own message */
    r->deleter(r);
    ab_pool_trim(CPU0); /* the next run grows again */
    if (injected == 0) break;
    rescued++;
    cr_assert_str_eq(ab_last_error(), before, "fault %ld, rescued: the message changed", n);
  }
  cr_assert_gt(rescued, 0, "no run was rescued: the sweep tested nothing");
}

/* Disarming really disarms: after ab__fault_arm(0), allocations succeed
 * and no fault is counted. */
Test(fault, disarmed_hook_injects_nothing) {
  ab__fault_arm(1);
  ab__fault_arm(0);
  int64_t shape[1] = {3};
  DLManagedTensorVersioned *r = NULL;
  for (int i = 0; i < 10; i++) {
    cr_assert_eq(ab_tensor_alloc(CPU0, 1, shape, dt(kDLUInt, 8, 1), &r), AB_OK, "%s", ab_last_error());
    r->deleter(r);
  }
  cr_assert_eq(ab__fault_injected(), 0);
}

/* ---- transfer faults: every backend copy, read, write, staged chunk,
 * fence and host sync is a numbered fault site (ab__fault_arm_transfer).
 * For N = 1, 2, ... the N-th fails until a run hits none: each faulted
 * run returns AB_ERR_BACKEND saying the fault was injected, leaves *out
 * and the source untouched, and gives every block back. */

struct transfer_case {
  const char *name;
  DLTensor src; /* on the host, or made on a device by `make_on` */
  DLDevice make_on, to;
  ab_convert_opts opts;
  int min_sites; /* backend calls the route makes at least */
};

static int transfer_sweep(struct transfer_case *c) {
  const int ncl = ab_device_count(kDLOpenCL);
  DLManagedTensorVersioned *dev_src = NULL;
  DLTensor src = c->src;
  if (c->make_on.device_type != kDLCPU) {
    /* The source lives on a device: the whole host buffer copied there
     * before arming (freed after), viewed with the case's layout. */
    int64_t all[1] = {4096};
    DLTensor whole = {c->src.data, CPU0, 1, c->src.dtype, all, NULL, 0};
    cr_assert_eq(ab_convert_memory(&whole, c->make_on, NULL, &dev_src), AB_OK, "%s", ab_last_error());
    src = dev_src->dl_tensor;
    src.ndim = c->src.ndim;
    src.shape = c->src.shape;
    src.strides = c->src.strides;
    src.byte_offset = c->src.byte_offset;
  }
  const uint64_t sum = checksum(c->src.data, 4096 * 4);
  const long live = ab__alloc_live_settled();
  const uint64_t cpu0 = pool_in_use(CPU0);
  const uint64_t cl0 = ncl ? pool_in_use((DLDevice){kDLOpenCL, 0}) : 0;
  const uint64_t cl1 = ncl > 1 ? pool_in_use((DLDevice){kDLOpenCL, 1}) : 0;
  int n = 1;
  for (;; n++) {
    cr_assert_lt(n, 100, "%s: the sweep does not end", c->name);
    DLManagedTensorVersioned *out = (DLManagedTensorVersioned *)(uintptr_t)0x7;
    ab__fault_arm_transfer(n);
    ab_status st = ab_convert_memory(&src, c->to, &c->opts, &out);
    const long hit = ab__fault_transfer_injected();
    ab__fault_arm_transfer(0);
    if (hit == 0) {
      cr_assert_eq(st, AB_OK, "%s: fault site %d: no fault injected, yet %s (%s)", c->name, n, ab_status_name(st),
                   ab_last_error());
      out->deleter(out);
      break;
    }
    cr_assert_eq(st, AB_ERR_BACKEND, "%s: fault site %d: %s (%s)", c->name, n, ab_status_name(st), ab_last_error());
    cr_assert_not_null(strstr(ab_last_error(), "injected transfer fault"), "%s: %s", c->name, ab_last_error());
    cr_assert_eq((uintptr_t)out, 0x7, "%s: fault site %d: *out written", c->name, n);
    cr_assert_eq(checksum(c->src.data, 4096 * 4), sum, "%s: the source changed", c->name);
    cr_assert_eq(pool_in_use(CPU0), cpu0, "%s: fault site %d: host staging not returned", c->name, n);
    cr_assert_eq(ab__alloc_live_settled(), live, "%s: fault site %d: host blocks leaked", c->name, n);
    if (ncl) cr_assert_eq(pool_in_use((DLDevice){kDLOpenCL, 0}), cl0, "%s: opencl:0 blocks kept", c->name);
    if (ncl > 1) cr_assert_eq(pool_in_use((DLDevice){kDLOpenCL, 1}), cl1, "%s: opencl:1 blocks kept", c->name);
  }
  if (dev_src) dev_src->deleter(dev_src);
  return n - 1; /* fault sites the conversion passed */
}

Test(fault, every_transfer_failure_is_reported_and_cleaned_up) {
  static float buf[4096];
  for (int i = 0; i < 4096; i++) buf[i] = (float)i * 0.5f;
  int64_t shape[2] = {32, 32}, crop[2] = {64, 1}, tr[2] = {1, 64}, sparse[2] = {128, 2};
  const DLTensor compact = {buf, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  DLTensor rows = compact, trans = compact, wide = compact;
  rows.strides = crop;
  trans.strides = tr;
  wide.strides = sparse;
  const DLDevice cl0 = {kDLOpenCL, 0}, cl1 = {kDLOpenCL, 1};
  ab_convert_opts plain = AB_CONVERT_OPTS_INIT, cast = AB_CONVERT_OPTS_INIT;
  plain.copy = AB_COPY_ALWAYS;
  cast.dtype = dt(kDLFloat, 16, 1);
  static const int32_t perm[2] = {1, 0};
  cast.permute = perm;
  struct transfer_case cases[] = {
    {"cpu strided -> cpu", trans, CPU0, CPU0, plain, 1},
    {"cpu compact -> opencl:0", compact, CPU0, cl0, plain, 1},
    {"cpu crop -> opencl:0 (rectangle)", rows, CPU0, cl0, plain, 1},
    {"cpu transpose -> opencl:0 (pack, upload)", trans, CPU0, cl0, plain, 2},
    {"opencl:0 compact -> cpu", compact, cl0, CPU0, plain, 1},
    {"opencl:0 crop -> cpu (rectangle)", rows, cl0, CPU0, plain, 1},
    {"opencl:0 sparse -> cpu (gather, download)", wide, cl0, CPU0, plain, 2},
    {"opencl:0 transpose -> opencl:1 (one context: the gather kernel)", trans, cl0, cl1, plain, 1},
    {"opencl:0 -> opencl:1 with a cast and permutation", compact, cl0, cl1, cast, 2},
    /* a host conversion calls no backend: it must simply not be disturbed */
    {"cpu -> cpu with a cast", trans, CPU0, CPU0, cast, 0},
  };
  int ran = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    /* OpenCL cases need the devices they name (the sanitizer tiers hide PoCL). */
    const bool uses_cl = cases[i].make_on.device_type == kDLOpenCL || cases[i].to.device_type == kDLOpenCL;
    const int need = cases[i].to.device_type == kDLOpenCL ? cases[i].to.device_id + 1 : 1;
    if (uses_cl && ab_device_count(kDLOpenCL) < need) continue;
    const int sites = transfer_sweep(&cases[i]);
    cr_assert_geq(sites, cases[i].min_sites, "%s: passed %d fault sites, expected at least %d", cases[i].name, sites,
                  cases[i].min_sites);
    ran++;
  }
  cr_assert_geq(ran, 2);
}
