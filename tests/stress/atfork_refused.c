/* An LD_PRELOAD shim for the test atfork_refused: every registration of
 * fork handlers fails as glibc's does when it runs out of memory, so that
 * the library's constructors meet a refusing pthread_atfork. glibc's
 * pthread_atfork is a stub linked into each caller (libc_nonshared.a)
 * that calls __register_atfork, which this replaces. */
#include <errno.h>

int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso);
int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso) {
  (void)prepare;
  (void)parent;
  (void)child;
  (void)dso;
  return ENOMEM;
}
