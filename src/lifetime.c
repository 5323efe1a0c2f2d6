/* ab_shutdown: the library's parts stopped in the order that keeps each
 * one's users alive: the worker threads (which may be converting), the
 * pools (which give their cached blocks back to the backends), then the
 * backends. Here rather than in any one part, so that none of them has to
 * know the others (the registry does not depend on the pools). */
#include "core.h"
#include "parallel.h"
#include "pool.h"

void ab_shutdown(void) {
  ab__parallel_shutdown();
  ab__pool_shutdown();
  ab__registry_shutdown();
}
