# The CUDA backend's tests (included by tests/CMakeLists.txt): the
# conformance suite and tests/test_cuda.c against the CUDA runtime (they
# skip without a GPU, saying why), and both again against simcuda, the
# simulated runtime (tests/simcuda), on two simulated GPUs.
if(AB_HAVE_CUDA)
  target_compile_definitions(test_cuda PRIVATE AB_HAVE_CUDA $<$<BOOL:${AB_HAVE_CUDA_KERNELS}>:AB_HAVE_CUDA_KERNELS>)
  target_include_directories(test_cuda PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(test_cuda PRIVATE CUDA::cudart_static)
  ab_conformance(cuda kDLCUDA arraybridge_static "")
  target_include_directories(test_conformance_cuda PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
endif()
if(TARGET arraybridge_simcuda)
  # The same tests against simcuda, a simulated CUDA runtime (the library
  # arraybridge_simcuda, tests/simcuda/CMakeLists.txt). It runs the backend
  # and the core's CUDA routes here, without a GPU; it proves nothing about
  # a GPU, which the test_cuda run on one does.
  add_executable(test_cuda_sim test_cuda.c support.c)
  target_include_directories(test_cuda_sim PRIVATE "${PROJECT_SOURCE_DIR}/src" "${PROJECT_SOURCE_DIR}"
    "${CMAKE_CURRENT_SOURCE_DIR}" ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_options(test_cuda_sim PRIVATE -Wall -Wextra)
  target_compile_definitions(test_cuda_sim PRIVATE _POSIX_C_SOURCE=200809L AB_HAVE_CUDA AB_TEST_SIMCUDA)
  target_link_libraries(test_cuda_sim PRIVATE arraybridge_simcuda PkgConfig::CRITERION)
  # Two GPUs with peer access; then two without it, with every pageable
  # transfer through the staging ring in chunks the tests' tensors span.
  set(sim_env "AB_SIMCUDA_DEVICES=2;AB_TEST_EXPECT_CUDA=2")
  if(AB_SANITIZE)
    list(APPEND sim_env "OCL_ICD_VENDORS=${CMAKE_CURRENT_BINARY_DIR}/no-icd") # see above
  else()
    list(APPEND sim_env "POCL_DEVICES=pthread pthread")
  endif()
  add_test(NAME cuda_sim COMMAND test_cuda_sim --jobs=1 --short-filename)
  set_tests_properties(cuda_sim PROPERTIES ENVIRONMENT "${sim_env}")
  add_test(NAME cuda_sim_staged COMMAND test_cuda_sim --jobs=1 --short-filename)
  set_tests_properties(cuda_sim_staged PROPERTIES ENVIRONMENT
    "${sim_env};AB_SIMCUDA_PEER=none;AB_STAGING_MIN=1;AB_STAGING_CHUNK=64KiB")
  ab_conformance(cuda_sim kDLCUDA arraybridge_simcuda "${sim_env}")
  ab_conformance_variant(cuda_sim staged
    "${sim_env};AB_SIMCUDA_PEER=none;AB_STAGING_MIN=1;AB_STAGING_CHUNK=64KiB")
endif()
