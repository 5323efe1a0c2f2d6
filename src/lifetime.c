/* ab_shutdown: the library's parts stopped in the order that keeps each
 * one's users alive: the worker threads (which may be converting), the
 * pools (which give their cached blocks back to the backends), then the
 * backends. Here rather than in any one part, so that none of them has to
 * know the others (the registry does not depend on the pools). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include "core.h"
#include "parallel.h"
#include "pool.h"

/* fork. A child has one thread, the one that forked; a lock some other
 * thread held at that instant stays held in the child for ever. So every
 * lock a child's host moves can take has a pthread_atfork prepare handler
 * that takes it (and parent and child handlers that release it):
 *   device.c   init_lock (but where the forking thread holds it: a driver
 *              forking inside its init)
 *   gather.c   trial_lock (store and line-tile trials)
 *   pool.c     the registry, the thread caches' locks, every pool's lock
 *              (the orphaned ones too), its settings and callback locks
 *   parallel.c its settings lock, the workers' lock
 *   staging.c  its settings lock
 * The device backends' locks are not taken: a child uses no device
 * (device.c).
 *
 * The rule that keeps the handlers from deadlocking: no thread holds a
 * lock of one of these files while it takes a lock of another (each
 * file's own order is its handler's). The handlers' order among files is
 * the constructors', which the link decides (it differs between the
 * shared library and a static link), so it must not matter.
 *
 * Each file registers its handlers from a constructor, as the library is
 * loaded (in a static link: at program start, after the constructors of
 * objects linked before it; glibc drops a shared object's handlers at
 * dlclose). Not at first use: since glibc 2.36 (BZ 24595) a fork runs the
 * prepare handlers without its registration lock, so another thread can
 * register a handler and take its lock while a fork is under way; that
 * fork's child finds the lock held (test_parallel's fork test hung at
 * the first or second fork that way).
 *
 * They register through ab__atfork, which says so where pthread_atfork
 * refuses (it can only run out of memory): the library works on, but a
 * child forked while another thread holds that lock would hang. */

void ab__atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), const char *what) {
  const int e = pthread_atfork(prepare, parent, child);
  if (e != 0)
    AB_LOG(AB_LOG_ERROR,
           "fork handlers for %s not registered (pthread_atfork: %s): a process forked while another thread holds "
           "it may hang in the child",
           what, e == ENOMEM ? "out of memory" : "failed");
}

/* signals. A thread the library starts (its workers) or a driver starts
 * under its calls (PoCL starts one per core at the backends' start-up)
 * takes the mask of the thread that started it. The program's threads
 * are where its signals belong: one that blocks a signal in every thread
 * of its own and waits for it (sigwait, signalfd) would never see it
 * where one of ours took it; and where a driver's thread took it, LLVM's
 * handler in PoCL swallows SIGUSR1 (a probe, 2026-12-06: sigwait hung in
 * 2 of 6 runs).
 * So those threads start with every signal blocked but the ones a fault
 * raises in the faulting thread itself: blocked, the kernel kills the
 * process at such a fault without running any handler, and PoCL's
 * SIGFPE handler, which lets an integer division by zero in a kernel
 * run on as OpenCL requires, must run in its threads; so must the
 * program's crash handlers (Python's faulthandler, a sanitizer's) in
 * ours. SIGABRT stays open too, for abort's handlers. */
bool ab__fault_signal(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP || sig == SIGSYS ||
         sig == SIGABRT;
}

void ab__block_async_signals(sigset_t *old) {
  sigset_t set;
  sigfillset(&set);
  for (int sig = 1; sig < AB__STD_SIGNALS; sig++)
    if (ab__fault_signal(sig)) sigdelset(&set, sig);
  pthread_sigmask(SIG_SETMASK, &set, old);
}

void ab_shutdown(void) {
  ab__parallel_shutdown();
  ab__pool_shutdown();
  ab__registry_shutdown();
}
