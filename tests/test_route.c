/* The route planner as a pure function: hand-built descriptions of source,
 * target and capabilities in, steps (or the reason there are none) out.
 * Devices here need not exist: the planner never asks a backend. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "route.h"
#include "support.h"

#define DEV(type, id) ((DLDevice){(type), (id)})

static ab__route_query query(DLDevice src, DLDevice dst) {
  ab__route_query q;
  memset(&q, 0, sizeof q);
  q.src = src;
  q.dst = dst;
  q.src_caps = src.device_type == kDLCPU ? AB_CAP_HOST_ACCESSIBLE : 0;
  q.dst_caps = dst.device_type == kDLCPU ? AB_CAP_HOST_ACCESSIBLE : 0;
  q.same_dtype = true;
  q.src_compact = true;
  q.copy = AB_COPY_IF_NEEDED;
  q.flags = 0;
  /* As if the backend could copy between any two of its devices. */
  q.direct = src.device_type == dst.device_type;
  return q;
}

static int dev_eq(DLDevice a, DLDevice b) { return a.device_type == b.device_type && a.device_id == b.device_id; }

static void assert_one_step(const ab__route_query *q, ab__step_kind kind, DLDeviceType via, const char *what) {
  ab__plan plan;
  memset(&plan, 0xee, sizeof plan);
  ab__route_query before = *q;
  ab_status st = ab__plan_route(q, &plan);
  cr_assert_eq(st, AB_OK, "%s: %s (%s)", what, ab_status_name(st), ab_last_error());
  cr_assert(memcmp(&before, q, sizeof *q) == 0, "%s: the query was modified", what);
  cr_assert_eq(plan.nsteps, 1, "%s: %d steps", what, plan.nsteps);
  cr_assert_eq(plan.steps[0].kind, kind, "%s: step kind %d, want %d", what, (int)plan.steps[0].kind, (int)kind);
  cr_assert(dev_eq(plan.steps[0].from, q->src), "%s: step starts at %d:%d", what, plan.steps[0].from.device_type,
            plan.steps[0].from.device_id);
  cr_assert(dev_eq(plan.steps[0].to, q->dst), "%s: step ends at %d:%d", what, plan.steps[0].to.device_type,
            plan.steps[0].to.device_id);
  cr_assert_eq(plan.steps[0].via, via, "%s: via %d, want %d", what, (int)plan.steps[0].via, (int)via);
}

static void assert_no_route(const ab__route_query *q, ab_status want, const char *word, const char *what) {
  ab__plan plan, before;
  memset(&plan, 0xee, sizeof plan);
  before = plan;
  ab_status st = ab__plan_route(q, &plan);
  cr_assert_eq(st, want, "%s: %s, want %s (%s)", what, ab_status_name(st), ab_status_name(want), ab_last_error());
  cr_assert_not_null(strstr(ab_last_error(), word), "%s: message \"%s\" does not mention \"%s\"", what,
                     ab_last_error(), word);
  cr_assert(memcmp(&plan, &before, sizeof plan) == 0, "%s: the plan was written on failure", what);
}

Test(route, same_device_same_dtype_compact_is_a_view) {
  ab__route_query q = query(CPU0, CPU0);
  assert_one_step(&q, AB_STEP_VIEW, kDLCPU, "cpu:0 -> cpu:0");
  q.copy = AB_COPY_NEVER;
  assert_one_step(&q, AB_STEP_VIEW, kDLCPU, "cpu:0 -> cpu:0, COPY_NEVER");
  /* the same holds on devices this machine lacks */
  ab__route_query g = query(DEV(kDLCUDA, 3), DEV(kDLCUDA, 3));
  assert_one_step(&g, AB_STEP_VIEW, kDLCUDA, "cuda:3 -> cuda:3");
  ab__route_query o = query(DEV(kDLOpenCL, 1), DEV(kDLOpenCL, 1));
  assert_one_step(&o, AB_STEP_VIEW, kDLOpenCL, "opencl:1 -> opencl:1");
}

/* The view rule over every combination of device pair, dtype, conversion,
 * layout, strided-view flag and copy mode: ab__route_view (which
 * ab_convert_memory asks before it builds a query), ab__route_is_view and
 * the plan give one answer, and it is a view in exactly the 12 cases the
 * rule names. (test_convert checks ab_convert_memory's own call against
 * the planner.) */
Test(route, the_view_test_without_a_query_agrees_with_the_planner) {
  const DLDevice devs[][2] = {{CPU0, CPU0}, {CPU0, DEV(kDLCPU, 1)}, {DEV(kDLCUDA, 0), DEV(kDLCUDA, 0)},
                              {DEV(kDLCUDA, 0), DEV(kDLCUDA, 1)}, {CPU0, DEV(kDLCUDA, 0)}};
  const ab_copy_mode copies[] = {AB_COPY_IF_NEEDED, AB_COPY_ALWAYS, AB_COPY_NEVER};
  int views = 0, cases = 0;
  for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++)
    for (int bits = 0; bits < 16; bits++)
      for (size_t c = 0; c < 3; c++) {
        ab__route_query q = query(devs[d][0], devs[d][1]);
        q.same_dtype = (bits & 1) != 0;
        q.convert = (bits & 2) != 0;
        q.src_compact = (bits & 4) != 0;
        q.flags = (bits & 8) ? AB_CONVERT_ALLOW_STRIDED_VIEW : 0;
        q.copy = copies[c];
        ab__plan plan;
        const bool planned_view = ab__plan_route(&q, &plan) == AB_OK && plan.steps[0].kind == AB_STEP_VIEW;
        const bool view = ab__route_view(q.src, q.dst, q.convert || !q.same_dtype, q.src_compact, q.flags, q.copy);
        cr_assert_eq(view, planned_view, "devices %zu, bits %d, copy %d: ab__route_view says %d, the plan %d", d,
                     bits, (int)q.copy, view, planned_view);
        cr_assert_eq(ab__route_is_view(&q), view, "devices %zu, bits %d, copy %d", d, bits, (int)q.copy);
        views += view;
        cases++;
      }
  /* same device (2 pairs), same dtype, no conversion, a layout it takes
   * (compact, or strided with the flag: 3 of 4), no forced copy (2 of 3) */
  cr_assert_eq(views, 2 * 3 * 2, "%d views in %d cases", views, cases);
}

Test(route, copy_always_copies_within_the_backend) {
  ab__route_query q = query(CPU0, CPU0);
  q.copy = AB_COPY_ALWAYS;
  assert_one_step(&q, AB_STEP_COPY, kDLCPU, "cpu:0 -> cpu:0, COPY_ALWAYS");
  q.flags = AB_CONVERT_ALLOW_STRIDED_VIEW;
  q.src_compact = false;
  assert_one_step(&q, AB_STEP_COPY, kDLCPU, "cpu:0 -> cpu:0, COPY_ALWAYS, strided view allowed");
  ab__route_query g = query(DEV(kDLCUDA, 0), DEV(kDLCUDA, 0));
  g.copy = AB_COPY_ALWAYS;
  assert_one_step(&g, AB_STEP_COPY, kDLCUDA, "cuda:0 -> cuda:0, COPY_ALWAYS");
}

Test(route, non_compact_source_is_copied_unless_strided_views_are_allowed) {
  ab__route_query q = query(CPU0, CPU0);
  q.src_compact = false;
  assert_one_step(&q, AB_STEP_COPY, kDLCPU, "non-compact, IF_NEEDED");
  q.flags = AB_CONVERT_ALLOW_STRIDED_VIEW;
  assert_one_step(&q, AB_STEP_VIEW, kDLCPU, "non-compact, IF_NEEDED, strided view allowed");
  q.copy = AB_COPY_NEVER;
  assert_one_step(&q, AB_STEP_VIEW, kDLCPU, "non-compact, NEVER, strided view allowed");
  /* READ_ONLY does not change the route */
  q.flags |= AB_CONVERT_READ_ONLY;
  assert_one_step(&q, AB_STEP_VIEW, kDLCPU, "non-compact, NEVER, strided view, read-only");
}

Test(route, other_device_of_the_same_type_is_one_backend_copy) {
  ab__route_query q = query(DEV(kDLCUDA, 0), DEV(kDLCUDA, 1));
  assert_one_step(&q, AB_STEP_COPY, kDLCUDA, "cuda:0 -> cuda:1");
  /* a strided view cannot cross devices */
  q.flags = AB_CONVERT_ALLOW_STRIDED_VIEW;
  q.src_compact = false;
  assert_one_step(&q, AB_STEP_COPY, kDLCUDA, "cuda:0 -> cuda:1, strided");
}

Test(route, copy_never_needing_a_copy_is_copy_required_with_the_reason) {
  ab__route_query q = query(CPU0, DEV(kDLCPU, 1));
  q.copy = AB_COPY_NEVER;
  assert_no_route(&q, AB_ERR_COPY_REQUIRED, "another device", "NEVER, cpu:0 -> cpu:1");
  assert_no_route(&q, AB_ERR_COPY_REQUIRED, "cpu:1", "NEVER, cpu:0 -> cpu:1 names the target");
  ab__route_query x = query(DEV(kDLCUDA, 0), DEV(kDLOpenCL, 1));
  x.copy = AB_COPY_NEVER;
  assert_no_route(&x, AB_ERR_COPY_REQUIRED, "another device", "NEVER, cuda:0 -> opencl:1");

  ab__route_query d = query(CPU0, CPU0);
  d.copy = AB_COPY_NEVER;
  d.same_dtype = false;
  assert_no_route(&d, AB_ERR_COPY_REQUIRED, "dtype", "NEVER, dtype change");

  ab__route_query s = query(CPU0, CPU0);
  s.copy = AB_COPY_NEVER;
  s.src_compact = false;
  assert_no_route(&s, AB_ERR_COPY_REQUIRED, "compact", "NEVER, non-compact");
  assert_no_route(&s, AB_ERR_COPY_REQUIRED, "AB_CONVERT_ALLOW_STRIDED_VIEW", "NEVER, non-compact names the flag");
}

/* Checks a multi-step plan: kinds, and which backend runs each step. */
static void assert_steps(const ab__route_query *q, int n, const ab__step_kind *kinds, const DLDeviceType *via,
                         const char *what) {
  ab__plan plan;
  memset(&plan, 0xee, sizeof plan);
  ab_status st = ab__plan_route(q, &plan);
  cr_assert_eq(st, AB_OK, "%s: %s (%s)", what, ab_status_name(st), ab_last_error());
  cr_assert_eq(plan.nsteps, n, "%s: %d steps, want %d", what, plan.nsteps, n);
  for (int i = 0; i < n; i++) {
    cr_assert_eq(plan.steps[i].kind, kinds[i], "%s: step %d is kind %d, want %d", what, i, (int)plan.steps[i].kind,
                 (int)kinds[i]);
    cr_assert_eq(plan.steps[i].via, via[i], "%s: step %d via %d, want %d", what, i, (int)plan.steps[i].via,
                 (int)via[i]);
  }
  cr_assert(dev_eq(plan.steps[0].from, q->src), "%s: the first step does not start at the source", what);
  cr_assert(dev_eq(plan.steps[n - 1].to, q->dst) || (q->dst_caps & AB_CAP_HOST_ACCESSIBLE),
            "%s: the last step does not end at the target", what);
}

Test(route, host_to_device_uploads_after_packing_a_strided_source) {
  ab__route_query q = query(CPU0, DEV(kDLCUDA, 0));
  assert_steps(&q, 1, (ab__step_kind[]){AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCUDA}, "cpu -> cuda, compact");
  q.src_compact = false;
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_PACK, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, kDLCUDA},
               "cpu -> cuda, strided");
  /* a crop the target writes as one rectangle needs no packing */
  q.dst_rect = true;
  assert_steps(&q, 1, (ab__step_kind[]){AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCUDA}, "cpu -> cuda, rect");
}

Test(route, device_to_host_downloads_then_unpacks_a_strided_source) {
  ab__route_query q = query(DEV(kDLCUDA, 2), CPU0);
  assert_steps(&q, 1, (ab__step_kind[]){AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLCUDA}, "cuda:2 -> cpu, compact");
  q.src_compact = false;
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UNPACK}, (DLDeviceType[]){kDLCUDA, kDLCPU},
               "cuda:2 -> cpu, strided");
  /* rows of contiguous bytes: one rectangle read lands compact */
  q.src_rect = true;
  assert_steps(&q, 1, (ab__step_kind[]){AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLCUDA}, "cuda:2 -> cpu, rect");
  ab__route_query x = query(DEV(kDLOpenCL, 0), DEV(kDLCUDA, 0));
  x.src_compact = false;
  x.src_rect = true;
  assert_steps(&x, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLOpenCL, kDLCUDA},
               "opencl -> cuda, rect");
}

Test(route, a_sparse_device_source_is_gathered_where_it_is) {
  ab__route_query q = query(DEV(kDLOpenCL, 1), CPU0);
  q.src_compact = false;
  q.src_gather = true;
  q.nbytes = 1000;
  q.extent = 100000;
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_COPY, AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLOpenCL, kDLOpenCL},
               "sparse opencl -> cpu");
  /* the copy runs on the source's own device */
  ab__plan plan;
  cr_assert_eq(ab__plan_route(&q, &plan), AB_OK);
  cr_assert(dev_eq(plan.steps[0].to, DEV(kDLOpenCL, 1)));
  /* dense enough (broadcast, transposes): the extent is no larger, so no kernel */
  q.extent = 1000;
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UNPACK}, (DLDeviceType[]){kDLOpenCL, kDLCPU},
               "dense strided opencl -> cpu");
  /* memory that is the host's: only a very sparse source is worth a kernel */
  q.src_caps = AB_CAP_UNIFIED_MEMORY;
  q.extent = 10000;
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UNPACK}, (DLDeviceType[]){kDLOpenCL, kDLCPU},
               "10x sparse, unified memory");
  q.extent = 100000;
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_COPY, AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLOpenCL, kDLOpenCL},
               "100x sparse, unified memory");
  q.src_caps = 0;
  /* a rectangle read wins over both */
  q.extent = 100000;
  q.src_rect = true;
  assert_steps(&q, 1, (ab__step_kind[]){AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLOpenCL}, "rect opencl -> cpu");
}

Test(route, devices_that_cannot_copy_directly_go_through_host) {
  ab__route_query q = query(DEV(kDLCUDA, 0), DEV(kDLOpenCL, 1));
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCUDA, kDLOpenCL},
               "cuda:0 -> opencl:1, compact");
  q.src_compact = false;
  assert_steps(&q, 3, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UNPACK, AB_STEP_UPLOAD},
               (DLDeviceType[]){kDLCUDA, kDLCPU, kDLOpenCL}, "cuda:0 -> opencl:1, strided");
  /* Same backend, but the backend says no (OpenCL across contexts). */
  ab__route_query o = query(DEV(kDLOpenCL, 0), DEV(kDLOpenCL, 1));
  o.direct = false;
  assert_steps(&o, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLOpenCL, kDLOpenCL},
               "opencl:0 -> opencl:1, not direct");
  o.direct = true;
  assert_steps(&o, 1, (ab__step_kind[]){AB_STEP_COPY}, (DLDeviceType[]){kDLOpenCL}, "opencl:0 -> opencl:1, direct");
}

Test(route, host_accessible_spaces_of_different_backends_are_one_host_copy) {
  /* Pageable, pinned and managed memory are all host-addressable: one host
   * gather moves between any two, strided or not, whichever backends own
   * them (and even when their own backends cannot copy). */
  const DLDeviceType types[] = {kDLCPU, kDLCUDAHost, kDLCUDAManaged};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      if (a == 0 && b == 0) continue;
      ab__route_query q = query(DEV(types[a], 0), DEV(types[b], 0));
      q.src_caps = q.dst_caps = AB_CAP_HOST_ACCESSIBLE;
      q.direct = false;
      q.copy = AB_COPY_ALWAYS;
      char what[64];
      snprintf(what, sizeof what, "%s -> %s", ab_device_type_name(types[a]), ab_device_type_name(types[b]));
      assert_one_step(&q, AB_STEP_COPY, kDLCPU, what);
      q.src_compact = false;
      assert_one_step(&q, AB_STEP_COPY, kDLCPU, what);
    }
}

Test(route, planning_is_deterministic) {
  ab__route_query qs[4] = {query(CPU0, CPU0), query(CPU0, CPU0), query(DEV(kDLCUDA, 0), DEV(kDLCUDA, 1)),
                           query(CPU0, CPU0)};
  qs[1].copy = AB_COPY_ALWAYS;
  qs[3].src_compact = false;
  for (int k = 0; k < 4; k++) {
    ab__plan a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0xff, sizeof b);
    cr_assert_eq(ab__plan_route(&qs[k], &a), AB_OK);
    cr_assert_eq(ab__plan_route(&qs[k], &b), AB_OK);
    cr_assert_eq(a.nsteps, b.nsteps);
    cr_assert(memcmp(a.steps, b.steps, (size_t)a.nsteps * sizeof a.steps[0]) == 0, "query %d planned two ways", k);
  }
}

Test(route, conversions_run_on_the_host_between_transfers) {
  const DLDevice cl0 = DEV(kDLOpenCL, 0), cl1 = DEV(kDLOpenCL, 1);
  for (int k = 0; k < 2; k++) {
    ab__route_query q = query(CPU0, CPU0);
    /* a dtype change, then an affine map or permutation alone */
    q.same_dtype = k == 0;
    q.convert = true;
    q.flags = AB_CONVERT_ALLOW_STRIDED_VIEW; /* never a view all the same */
    assert_one_step(&q, AB_STEP_CONVERT, kDLCPU, "cpu -> cpu");
    q.src_compact = false;
    assert_one_step(&q, AB_STEP_CONVERT, kDLCPU, "cpu strided -> cpu");
    ab__route_query up = q;
    up.dst = cl0;
    up.dst_caps = 0;
    up.direct = false;
    assert_steps(&up, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, kDLOpenCL},
                 "cpu -> opencl");
    ab__route_query down = query(cl0, CPU0);
    down.same_dtype = q.same_dtype;
    down.convert = true;
    assert_steps(&down, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT},
                 (DLDeviceType[]){kDLOpenCL, kDLCPU}, "opencl -> cpu");
    /* even where the backend could copy directly, the host converts */
    ab__route_query dd = query(cl0, cl1);
    dd.same_dtype = q.same_dtype;
    dd.convert = true;
    assert_steps(&dd, 3, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT, AB_STEP_UPLOAD},
                 (DLDeviceType[]){kDLOpenCL, kDLCPU, kDLOpenCL}, "opencl -> opencl");
    dd.dst = cl0;
    assert_steps(&dd, 3, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT, AB_STEP_UPLOAD},
                 (DLDeviceType[]){kDLOpenCL, kDLCPU, kDLOpenCL}, "opencl:0 -> itself");
    /* COPY_NEVER says why */
    q.copy = AB_COPY_NEVER;
    assert_no_route(&q, AB_ERR_COPY_REQUIRED, k == 0 ? "converted" : "dtype changes", "convert, NEVER");
  }
}

/* ---- ab_explain_route: the plan in words, from the real library ---------- */

Test(explain, names_devices_bytes_and_each_step) {
  static float x[64 * 64];
  int64_t shape[2] = {32, 32}, rows[2] = {64, 1}, cols[2] = {1, 64};
  DLTensor t = {x, CPU0, 2, dt(kDLFloat, 32, 1), shape, NULL, 0};
  char buf[512];
  cr_assert_eq(ab_explain_route(&t, CPU0, buf, sizeof buf), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(strstr(buf, "cpu:0 -> cpu:0: 4096 bytes, compact source, 1 step\n"), "%s", buf);
  cr_assert_not_null(strstr(buf, "1. view"), "%s", buf);
  t.strides = cols;
  cr_assert_eq(ab_explain_route(&t, CPU0, buf, sizeof buf), AB_OK);
  cr_assert_not_null(strstr(buf, "strided source"), "%s", buf);
  cr_assert_not_null(strstr(buf, "1. host copy"), "%s", buf);
  if (ab_device_count(kDLOpenCL) == 0) cr_skip_test("the upload plans need an OpenCL device");
  const DLDevice cl = {kDLOpenCL, 0};
  t.strides = rows; /* a crop: one rectangle write */
  cr_assert_eq(ab_explain_route(&t, cl, buf, sizeof buf), AB_OK);
  cr_assert_not_null(strstr(buf, "1. upload cpu:0 -> opencl:0, 4096 bytes as one rectangle of 128-byte rows"), "%s",
                     buf);
  t.strides = cols; /* a transpose: packed first */
  cr_assert_eq(ab_explain_route(&t, cl, buf, sizeof buf), AB_OK);
  cr_assert_not_null(strstr(buf, "2 steps"), "%s", buf);
  cr_assert_not_null(strstr(buf, "1. pack on the host"), "%s", buf);
  cr_assert_not_null(strstr(buf, "2. upload cpu:0 -> opencl:0, 4096 bytes\n"), "%s", buf);
}

Test(explain, says_where_a_conversion_runs) {
  static uint8_t img[4 * 5 * 3];
  int64_t shape[3] = {4, 5, 3};
  DLTensor t = {img, CPU0, 3, dt(kDLUInt, 8, 1), shape, NULL, 0};
  int32_t chw[3] = {2, 0, 1};
  static const double scale[3] = {1 / 58.0, 1 / 57.0, 1 / 57.5};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  o.dtype = dt(kDLFloat, 32, 1);
  o.permute = chw;
  o.flags = AB_CONVERT_PER_CHANNEL;
  o.channel_axis = 2;
  o.channel_scale = scale;
  char buf[1024];
  cr_assert_eq(ab_explain_convert(&t, CPU0, &o, buf, sizeof buf), AB_OK, "%s", ab_last_error());
  cr_assert_not_null(strstr(buf, "1. convert on the host: uint8 -> float32, scaled per channel into compact cpu:0 "
                                 "memory in axis order (2, 0, 1)\n"),
                     "%s", buf);
  /* the options are checked as ab_convert_memory checks them */
  o.channel_axis = 3;
  cr_assert_eq(ab_explain_convert(&t, CPU0, &o, buf, sizeof buf), AB_ERR_INVALID_ARGUMENT);
  o.channel_axis = 2;
  if (ab_device_count(kDLOpenCL) == 0) cr_skip_test("the device plans need an OpenCL device");
  const DLDevice cl = {kDLOpenCL, 0};
  setenv("AB_CONVERT_PLACE", "device", 1);
  ab__env_reload();
  ab_status st = ab_explain_convert(&t, cl, &o, buf, sizeof buf);
  unsetenv("AB_CONVERT_PLACE");
  ab__env_reload();
  cr_assert_eq(st, AB_OK, "%s", ab_last_error());
  cr_assert_not_null(strstr(buf, "2 steps"), "%s", buf);
  cr_assert_not_null(strstr(buf, "1. upload cpu:0 -> opencl:0, 60 bytes as they are, for the conversion there"), "%s",
                     buf);
  cr_assert_not_null(strstr(buf, "2. convert on opencl:0: uint8 -> float32"), "%s", buf);
  cr_assert_not_null(strstr(buf, "in axis order (2, 0, 1) (60 bytes"), "%s", buf);
  cr_assert_not_null(strstr(buf, "(60 bytes crossed the link instead of 240)"), "%s", buf);
  /* ab_explain_route is the same with no options */
  char plain[1024], none[1024];
  cr_assert_eq(ab_explain_route(&t, cl, plain, sizeof plain), AB_OK);
  cr_assert_eq(ab_explain_convert(&t, cl, NULL, none, sizeof none), AB_OK);
  cr_assert_str_eq(plain, none);
}

Test(explain, cuts_like_snprintf_and_fails_like_convert) {
  float x[4] = {0};
  int64_t shape[1] = {4};
  DLTensor t = {x, CPU0, 1, dt(kDLFloat, 32, 1), shape, NULL, 0};
  char full[256], cut[12];
  cr_assert_eq(ab_explain_route(&t, CPU0, full, sizeof full), AB_OK);
  memset(cut, 'x', sizeof cut);
  cr_assert_eq(ab_explain_route(&t, CPU0, cut, sizeof cut), AB_OK);
  cr_assert_eq(cut[sizeof cut - 1], '\0', "a cut text is terminated");
  cr_assert(strncmp(cut, full, sizeof cut - 1) == 0, "a cut text is a prefix: \"%s\" of \"%s\"", cut, full);
  cr_assert_eq(ab_explain_route(&t, CPU0, NULL, 0), AB_OK, "len 0 writes nothing");
  cr_assert_eq(ab_explain_route(&t, CPU0, NULL, 8), AB_ERR_INVALID_ARGUMENT);

  /* What ab_convert_memory refuses, the explainer refuses the same way,
   * without touching buf. */
  memset(cut, 'x', sizeof cut);
  shape[0] = -1;
  cr_assert_eq(ab_explain_route(&t, CPU0, cut, sizeof cut), AB_ERR_INVALID_ARGUMENT);
  shape[0] = 4;
  cr_assert_eq(ab_explain_route(&t, (DLDevice){kDLCPU, 3}, cut, sizeof cut), AB_ERR_NO_DEVICE);
  cr_assert_eq(ab_explain_route(NULL, CPU0, cut, sizeof cut), AB_ERR_INVALID_ARGUMENT);
  for (size_t i = 0; i < sizeof cut; i++) cr_assert_eq(cut[i], 'x', "buf written on failure at %zu", i);
}

/* Conversions from compact host memory to a device that can convert them:
 * on the device when the result is the bigger (fewer bytes cross the link)
 * and the device's memory is not the host's, or when forced; on the host
 * otherwise. */
Test(route, a_widening_conversion_runs_on_the_target_when_that_moves_fewer_bytes) {
  const DLDevice cl0 = DEV(kDLOpenCL, 0), cu1 = DEV(kDLCUDA, 1);
  const DLDevice targets[2] = {cl0, cu1};
  for (int t = 0; t < 2; t++) {
    ab__route_query q = query(CPU0, targets[t]);
    q.same_dtype = false;
    q.convert = true;
    q.dst_convert = true;
    q.nbytes = 1000;      /* uint8 ... */
    q.out_nbytes = 4000;  /* ... to float32 */
    const DLDeviceType tt = targets[t].device_type;
    assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_UPLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){tt, tt}, "u8 -> f32");
    ab__plan plan;
    cr_assert_eq(ab__plan_route(&q, &plan), AB_OK);
    cr_assert(dev_eq(plan.steps[0].to, targets[t]) && dev_eq(plan.steps[1].from, targets[t]) &&
              dev_eq(plan.steps[1].to, targets[t]), "the conversion must run on the target");
    /* narrowing, or equal sizes: the host converts before the upload */
    ab__route_query n = q;
    n.out_nbytes = 250;
    assert_steps(&n, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, tt}, "f32 -> u8");
    n.out_nbytes = 1000;
    assert_steps(&n, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, tt}, "same size");
    /* ... unless the device is asked for */
    n.place = AB_PLACE_DEVICE;
    assert_steps(&n, 2, (ab__step_kind[]){AB_STEP_UPLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){tt, tt}, "forced");
    /* a device whose memory is the host's: the host, unless forced */
    ab__route_query u = q;
    u.dst_caps = AB_CAP_UNIFIED_MEMORY;
    assert_steps(&u, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, tt}, "unified");
    u.place = AB_PLACE_DEVICE;
    assert_steps(&u, 2, (ab__step_kind[]){AB_STEP_UPLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){tt, tt},
                 "unified, forced");
    /* the host when asked, when the device cannot, or for a strided source */
    ab__route_query h = q;
    h.place = AB_PLACE_HOST;
    assert_steps(&h, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, tt}, "host");
    h = q;
    h.dst_convert = false;
    h.place = AB_PLACE_DEVICE;
    assert_steps(&h, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, tt},
                 "no kernel");
    h = q;
    h.src_compact = false;
    assert_steps(&h, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_UPLOAD}, (DLDeviceType[]){kDLCPU, tt}, "strided");
    /* device to device, or to the host: the host converts, as before */
    ab__route_query dd = q;
    dd.src = DEV(kDLOpenCL, 1);
    dd.src_caps = 0;
    dd.direct = false;
    assert_steps(&dd, 3, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT, AB_STEP_UPLOAD},
                 (DLDeviceType[]){kDLOpenCL, kDLCPU, tt}, "device -> device");
  }
}

/* From a device that can convert: narrow there before the download, or
 * convert in place when the target is the same device. */
Test(route, a_narrowing_conversion_runs_on_the_source_before_the_download) {
  const DLDevice cl0 = DEV(kDLOpenCL, 0), cl1 = DEV(kDLOpenCL, 1);
  ab__route_query q = query(cl0, CPU0);
  q.same_dtype = false;
  q.convert = true;
  q.src_convert = true;
  q.nbytes = 4000;    /* float32 ... */
  q.out_nbytes = 1000; /* ... to uint8 */
  assert_steps(&q, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLOpenCL, kDLOpenCL},
               "f32 -> u8 to the host");
  ab__plan plan;
  cr_assert_eq(ab__plan_route(&q, &plan), AB_OK);
  cr_assert(dev_eq(plan.steps[0].from, cl0) && dev_eq(plan.steps[0].to, cl0), "the conversion must run on the source");
  ab__route_query o = q;
  o.dst = cl1;
  o.dst_caps = 0;
  assert_steps(&o, 3, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_DOWNLOAD, AB_STEP_UPLOAD},
               (DLDeviceType[]){kDLOpenCL, kDLOpenCL, kDLOpenCL}, "f32 -> u8 to another device");
  /* the same device: one step, whatever the sizes */
  ab__route_query h = q;
  h.dst = cl0;
  h.dst_caps = 0;
  h.out_nbytes = 8000;
  assert_one_step(&h, AB_STEP_CONVERT, kDLOpenCL, "in place");
  /* widening to the host, a unified-memory source, host asked, or no
   * kernel: download, then the host converts */
  ab__route_query w = q;
  w.out_nbytes = 8000;
  assert_steps(&w, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){kDLOpenCL, kDLCPU},
               "widening");
  w.place = AB_PLACE_DEVICE;
  assert_steps(&w, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLOpenCL, kDLOpenCL},
               "widening, forced");
  ab__route_query u = q;
  u.src_caps = AB_CAP_UNIFIED_MEMORY;
  assert_steps(&u, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){kDLOpenCL, kDLCPU},
               "unified");
  u.place = AB_PLACE_DEVICE;
  assert_steps(&u, 2, (ab__step_kind[]){AB_STEP_CONVERT, AB_STEP_DOWNLOAD}, (DLDeviceType[]){kDLOpenCL, kDLOpenCL},
               "unified, forced");
  ab__route_query n = q;
  n.place = AB_PLACE_HOST;
  assert_steps(&n, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){kDLOpenCL, kDLCPU},
               "host asked");
  n = q;
  n.src_convert = false;
  n.place = AB_PLACE_DEVICE;
  assert_steps(&n, 2, (ab__step_kind[]){AB_STEP_DOWNLOAD, AB_STEP_CONVERT}, (DLDeviceType[]){kDLOpenCL, kDLCPU},
               "no kernel");
}
