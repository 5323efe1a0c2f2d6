# The host backend's tests (included by tests/CMakeLists.txt): the
# conformance suite on cpu:0, without an OpenCL driver in the process.
ab_conformance(cpu kDLCPU arraybridge_static
  "OCL_ICD_VENDORS=${CMAKE_CURRENT_BINARY_DIR}/no-icd")
