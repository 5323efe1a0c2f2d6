# The OpenCL backend's tests (included by tests/CMakeLists.txt): the
# conformance suite on PoCL's two CPU devices (POCL_DEVICES; make test also
# exports AB_TEST_EXPECT_OPENCL=2, which makes a missing device a failure
# where a plain ctest skips), and
# tests/test_opencl.c, what is specific to OpenCL.
if(AB_OPENCL_BUILT)
  ab_conformance(opencl kDLOpenCL arraybridge_static "POCL_DEVICES=pthread pthread")
  # Staged through pinned memory, as on a discrete GPU, in small ring chunks.
  ab_conformance_variant(opencl pinned
    "POCL_DEVICES=pthread pthread;AB_OPENCL_PINNED=1;AB_STAGING_MIN=1;AB_STAGING_CHUNK=64KiB")
  # The transfer fault sweep the same way: the ring's failing transfers,
  # fences and drains on OpenCL. (Outside test_opencl the sanitizer tier
  # has no OpenCL ICD, see above: there it checks the host routes again.)
  if(NOT AB_SANITIZE)
    add_test(NAME fault_pinned COMMAND test_fault --jobs=1 --short-filename)
    set_tests_properties(fault_pinned PROPERTIES ENVIRONMENT
      "POCL_DEVICES=pthread pthread;AB_OPENCL_PINNED=1;AB_STAGING_MIN=1;AB_STAGING_CHUNK=64KiB")
  endif()
endif()
# The randomized soak (tests/stress/soak.c) through the second PoCL device,
# with every conversion the route allows run by the device's kernels
# (AB_CONVERT_PLACE=device; seed 3 has 26 of its 60 cases converted there,
# 4 of them float32 into float16 or bfloat16, and fails two of them on the
# kernel that stored NaNs through vstore_half: the seed must be chosen
# again whenever the soak's draws change). A missing device skips it in a plain
# ctest and fails it under make test (AB_TEST_EXPECT_OPENCL), as does a
# run in which the device converted nothing. Not in the sanitizer tier,
# which has no OpenCL ICD (see above).
if(AB_OPENCL_BUILT AND NOT AB_SANITIZE)
  add_test(NAME stress_soak_opencl COMMAND stress_soak 3 60 6)
  set_tests_properties(stress_soak_opencl PROPERTIES SKIP_RETURN_CODE 77 ENVIRONMENT
    "POCL_DEVICES=pthread pthread;SOAK_DEVICE=opencl:1;AB_CONVERT_PLACE=device;SOAK_EXPECT_ON_DEVICE=1")
endif()
# test_opencl calls OpenCL itself: it needs the ICD loader to link
# (tests/CMakeLists.txt leaves it out where the backend was built from the
# headers alone).
if(AB_OPENCL_BUILT AND OpenCL_FOUND)
  target_compile_definitions(test_opencl PRIVATE AB_HAVE_OPENCL CL_TARGET_OPENCL_VERSION=120)
  target_link_libraries(test_opencl PRIVATE OpenCL::OpenCL)
  # No ICD loader at all, as on a machine with no OpenCL installed.
  add_test(NAME opencl_no_loader COMMAND test_opencl --jobs=1 --short-filename
    --filter opencl/no_loader_means_zero_devices_and_says_which)
  set_tests_properties(opencl_no_loader PROPERTIES ENVIRONMENT
    "AB_OPENCL_LIBRARY=${CMAKE_CURRENT_BINARY_DIR}/no-such-dir/libOpenCL.so.1;AB_TEST_EXPECT_NO_LOADER=1")
  # The same OpenCL tests with no ICD at all: zero devices, clear errors.
  add_test(NAME opencl_absent COMMAND test_opencl --jobs=1 --short-filename)
  set_tests_properties(opencl_absent PROPERTIES ENVIRONMENT
    "OCL_ICD_VENDORS=${CMAKE_CURRENT_BINARY_DIR}/no-icd;AB_TEST_EXPECT_NO_OPENCL=1;AB_TEST_EXPECT_OPENCL=0")
  # And with every transfer staged through pinned memory, as on a discrete
  # GPU (PoCL's CPU devices do not stage by default), in ring chunks small
  # enough that the tests' tensors span several.
  add_test(NAME opencl_pinned COMMAND test_opencl --jobs=1 --short-filename)
  set_tests_properties(opencl_pinned PROPERTIES ENVIRONMENT
    "POCL_DEVICES=pthread pthread;AB_OPENCL_PINNED=1;AB_STAGING_MIN=1;AB_STAGING_CHUNK=64KiB")
endif()
