/* A replacement malloc for tests/stress/replaced_malloc.c, LD_PRELOADed as
 * jemalloc, tcmalloc or mimalloc are under many programs: it serves every
 * allocation of the process from libc's own, but hands out a pointer past a
 * header of its own, so that a block given to libc's free (a library whose
 * free was bound past the replacement, as RTLD_DEEPBIND binds it) is not a
 * block libc knows: glibc aborts ("free(): invalid pointer"), as it does
 * for a jemalloc block. glibc documents which functions a replacement must
 * define ("Replacing malloc" in its manual): all of them are here. Counts
 * its calls, so that the test can tell it was in use. */
#define _GNU_SOURCE 1
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

#define HEAD 32 /* keeps malloc's 16-byte alignment on 32 and 64 bits */
#define MAGIC ((uintptr_t)0x5ab1e5a3u) /* odd: as a chunk size, libc refuses it */

struct head {
  void *raw;    /* what libc gave */
  size_t size;  /* what the caller asked */
  char pad[HEAD - 2 * sizeof(void *) - sizeof(uintptr_t)];
  uintptr_t magic; /* where libc reads a chunk's size */
};
_Static_assert(sizeof(struct head) == HEAD, "header size");

atomic_ulong ab_test_shim_calls;

static void *wrap(void *raw, size_t at, size_t size) {
  if (raw == NULL) return NULL;
  struct head *h = (struct head *)((char *)raw + at) - 1;
  h->raw = raw;
  h->size = size;
  h->magic = MAGIC;
  atomic_fetch_add_explicit(&ab_test_shim_calls, 1, memory_order_relaxed);
  return h + 1;
}

static struct head *head_of(void *p) { return (struct head *)p - 1; }

void *malloc(size_t n) { return n > SIZE_MAX - HEAD ? NULL : wrap(__libc_malloc(n + HEAD), HEAD, n); }

void free(void *p) {
  if (p == NULL) return;
  __libc_free(head_of(p)->raw);
}

void *calloc(size_t k, size_t n) {
  if (n != 0 && k > SIZE_MAX / n) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = malloc(k * n);
  if (p != NULL) memset(p, 0, k * n);
  return p;
}

void *realloc(void *p, size_t n) {
  if (p == NULL) return malloc(n);
  if (n == 0) {
    free(p);
    return NULL;
  }
  void *q = malloc(n);
  if (q == NULL) return NULL;
  size_t old = head_of(p)->size;
  memcpy(q, p, old < n ? old : n);
  free(p);
  return q;
}

void *memalign(size_t align, size_t n) {
  if (align <= 16) return malloc(n); /* what malloc aligns to */
  if ((align & (align - 1)) != 0 || n > SIZE_MAX - align) {
    errno = EINVAL;
    return NULL;
  }
  return wrap(__libc_memalign(align, n + align), align, n);
}

int posix_memalign(void **out, size_t align, size_t n) {
  if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0) return EINVAL;
  void *p = memalign(align, n);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) & ~(size_t)4095); }
size_t malloc_usable_size(void *p) { return p == NULL ? 0 : head_of(p)->size; }
