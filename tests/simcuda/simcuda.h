/* simcuda's own calls, for the tests built against it (test_cuda_sim). */
#ifndef AB_SIMCUDA_H
#define AB_SIMCUDA_H

#include <driver_types.h>
#include <stdbool.h>

/* From now on, the n-th call into the runtime (counting every call but the
 * error queries and the release calls) fails with `error`, as a real
 * runtime call would: returned, and kept for cudaGetLastError. A wait
 * (cudaStreamSynchronize, cudaEventSynchronize) fails after waiting, as an
 * error of the work it waited for would. n = 0 disarms. Resets the count
 * that simcuda_failures() reports. These errors are not sticky. */
void simcuda_fail_nth(long n, cudaError_t error);

/* The next call of the runtime function `name` ("cudaMalloc", a string
 * that lives as long as the arming) fails with `error`, once; the
 * simcuda_fail_nth count is not touched. Resets simcuda_failures(). */
void simcuda_fail_call(const char *name, cudaError_t error);

/* How many calls failed since the last simcuda_fail_nth: 0 or 1. */
long simcuda_failures(void);

/* How many calls simcuda_fail_nth has counted since it was armed (the
 * failed one among them): a failure at n equal to this was the last call
 * the library made. */
long simcuda_calls(void);

/* The name of the call that failed ("" when none did). */
const char *simcuda_failed_call(void);

/* From now on the process has hit a sticky error (cudaErrorIllegalAddress
 * and its kin): every runtime call that does work returns it, and
 * cudaGetLastError returns it without clearing it, for the rest of the
 * process, as the runtime documents. */
void simcuda_poison(cudaError_t error);

/* Copies made by cudaMemcpyPeer and cudaMemcpyPeerAsync since the process
 * started: direct (the destination device had been given access to the
 * source's memory with cudaDeviceEnablePeerAccess) and staged through the
 * host (it had not: legal, slower). */
void simcuda_peer_copies(long *direct, long *staged);

/* Primary contexts created since the process started (cudaSetDevice and
 * the calls that work on the current device create the device's, once),
 * and the cudaMemGetInfo calls; whether device `dev` has its context. */
void simcuda_contexts(long *made, long *meminfo_calls);
bool simcuda_context_active(int dev);

#endif
