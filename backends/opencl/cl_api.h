/* The OpenCL API as the backend calls it: through pointers that
 * ab__cl_load fills from the ICD loader (libOpenCL.so.1, or
 * AB_OPENCL_LIBRARY) at the backend's start, not through a link to it,
 * so that the library loads, and its host and CUDA halves work, on a
 * machine with no OpenCL installed. Included by opencl.h after
 * <CL/cl.h>: every call below names the pointer instead. */
#ifndef AB_BACKENDS_OPENCL_CL_API_H
#define AB_BACKENDS_OPENCL_CL_API_H

#include "arraybridge/arraybridge.h"

/* Every OpenCL function the backend calls. */
#define AB_CL_FUNCTIONS(X)                                                                                           \
  X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo) X(clCreateContext)                   \
  X(clReleaseContext) X(clGetContextInfo) X(clCreateCommandQueue) X(clRetainCommandQueue) X(clReleaseCommandQueue)   \
  X(clGetCommandQueueInfo) X(clCreateBuffer) X(clReleaseMemObject) X(clGetMemObjectInfo)                             \
  X(clCreateProgramWithSource) X(clBuildProgram) X(clGetProgramBuildInfo) X(clReleaseProgram) X(clCreateKernel)      \
  X(clReleaseKernel) X(clSetKernelArg) X(clEnqueueNDRangeKernel) X(clEnqueueReadBuffer) X(clEnqueueWriteBuffer)      \
  X(clEnqueueReadBufferRect) X(clEnqueueWriteBufferRect) X(clEnqueueCopyBuffer) X(clEnqueueMapBuffer)              \
  X(clEnqueueUnmapMemObject) X(clEnqueueMarkerWithWaitList) X(clWaitForEvents) X(clGetEventInfo) X(clReleaseEvent)   \
  X(clFlush) X(clFinish)

#define AB_CL_POINTER_(f) __typeof__(&f) f;
struct ab__cl_api {
  AB_CL_FUNCTIONS(AB_CL_POINTER_)
};
#undef AB_CL_POINTER_
extern struct ab__cl_api ab__cl;

/* Opens the ICD loader and finds every function above, once per process
 * (thread-safe); AB_OK, or AB_ERR_NO_DEVICE saying what was missing (the
 * same answer at every later call: a library installed afterwards is
 * not looked for again). */
ab_status ab__cl_load(void);

#ifndef AB_CL_API_LOADER /* cl_api.c fills the pointers by these names */
#define clGetPlatformIDs (ab__cl.clGetPlatformIDs)
#define clGetPlatformInfo (ab__cl.clGetPlatformInfo)
#define clGetDeviceIDs (ab__cl.clGetDeviceIDs)
#define clGetDeviceInfo (ab__cl.clGetDeviceInfo)
#define clCreateContext (ab__cl.clCreateContext)
#define clReleaseContext (ab__cl.clReleaseContext)
#define clGetContextInfo (ab__cl.clGetContextInfo)
#define clCreateCommandQueue (ab__cl.clCreateCommandQueue)
#define clRetainCommandQueue (ab__cl.clRetainCommandQueue)
#define clReleaseCommandQueue (ab__cl.clReleaseCommandQueue)
#define clGetCommandQueueInfo (ab__cl.clGetCommandQueueInfo)
#define clCreateBuffer (ab__cl.clCreateBuffer)
#define clReleaseMemObject (ab__cl.clReleaseMemObject)
#define clGetMemObjectInfo (ab__cl.clGetMemObjectInfo)
#define clCreateProgramWithSource (ab__cl.clCreateProgramWithSource)
#define clBuildProgram (ab__cl.clBuildProgram)
#define clGetProgramBuildInfo (ab__cl.clGetProgramBuildInfo)
#define clReleaseProgram (ab__cl.clReleaseProgram)
#define clCreateKernel (ab__cl.clCreateKernel)
#define clReleaseKernel (ab__cl.clReleaseKernel)
#define clSetKernelArg (ab__cl.clSetKernelArg)
#define clEnqueueNDRangeKernel (ab__cl.clEnqueueNDRangeKernel)
#define clEnqueueReadBuffer (ab__cl.clEnqueueReadBuffer)
#define clEnqueueWriteBuffer (ab__cl.clEnqueueWriteBuffer)
#define clEnqueueReadBufferRect (ab__cl.clEnqueueReadBufferRect)
#define clEnqueueWriteBufferRect (ab__cl.clEnqueueWriteBufferRect)
#define clEnqueueCopyBuffer (ab__cl.clEnqueueCopyBuffer)
#define clEnqueueMapBuffer (ab__cl.clEnqueueMapBuffer)
#define clEnqueueUnmapMemObject (ab__cl.clEnqueueUnmapMemObject)
#define clEnqueueMarkerWithWaitList (ab__cl.clEnqueueMarkerWithWaitList)
#define clWaitForEvents (ab__cl.clWaitForEvents)
#define clGetEventInfo (ab__cl.clGetEventInfo)
#define clReleaseEvent (ab__cl.clReleaseEvent)
#define clFlush (ab__cl.clFlush)
#define clFinish (ab__cl.clFinish)
#endif

#endif
