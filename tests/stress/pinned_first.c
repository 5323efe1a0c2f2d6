/* A first caller pinned to one core does not decide the thread count for
 * the whole process: the default is the process's cores (its main
 * thread's mask, as taskset sets it). On musl the count was read only
 * through sysconf, which musl answers from the calling thread's own mask,
 * so one pinned first call left every later call, the main thread's too,
 * on one thread (probe, 2026-12-06). A plain program, so that the musl
 * and armhf tiers, which have no Criterion, run it too.
 *   pinned_first   exit 0, 1 (failed, saying why) or 77 (skipped: one core) */
#define _GNU_SOURCE 1
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arraybridge/arraybridge.h"

/* Threads of this process named "arraybridge": the library's workers. */
static int workers(void) {
  DIR *d = opendir("/proc/self/task");
  int n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
    char path[300], name[32] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE *f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
    if (f == NULL) continue;
    n += fgets(name, sizeof name, f) != NULL && strcmp(name, "arraybridge\n") == 0;
    fclose(f);
  }
  if (d != NULL) closedir(d);
  return n;
}

/* Pins itself to one of the process's cores, then makes the process's
 * first call: a 16 MiB transpose at the default thread count. */
static void *pinned_call(void *core) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(*(const int *)core, &one);
  if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) return NULL;
  static unsigned char big[4096 * 4096];
  int64_t shape[2] = {4096, 4096}, strides[2] = {1, 4096};
  DLTensor t = {big, {kDLCPU, 0}, 2, {kDLUInt, 8, 1}, shape, strides, 0};
  ab_convert_opts o = AB_CONVERT_OPTS_INIT;
  DLManagedTensorVersioned *r;
  if (ab_convert_memory(&t, (DLDevice){kDLCPU, 0}, &o, &r) != AB_OK) return NULL;
  r->deleter(r);
  return core;
}

int main(void) {
  cpu_set_t had;
  if (sched_getaffinity(0, sizeof had, &had) != 0 || CPU_COUNT(&had) < 2) {
    printf("pinned_first: SKIP: this process may run on one core only\n");
    return 77;
  }
  int first = 0;
  while (!CPU_ISSET(first, &had)) first++;
  pthread_t th;
  void *ok = NULL;
  if (pthread_create(&th, NULL, pinned_call, &first) != 0 || pthread_join(th, &ok) != 0 || ok == NULL) {
    fprintf(stderr, "pinned_first: the pinned thread's transpose failed: %s\n", ab_last_error());
    return 1;
  }
  const int n = workers();
  if (n < 1) {
    fprintf(stderr,
            "pinned_first: a 16 MiB transpose from a thread pinned to one core, at the default thread count, in a "
            "process of %d cores started no worker (or none named arraybridge: the count needs pthread_setname_np)\n",
            CPU_COUNT(&had));
    return 1;
  }
  printf("pinned_first: %d worker%s for a process of %d cores\n", n, n == 1 ? "" : "s", CPU_COUNT(&had));
  ab_shutdown();
  return 0;
}
