# Every GPU architecture this nvcc knows, from Turing (7.5) on, must be able
# to run the library's kernels: SASS of the same major version and an equal
# or lower minor (cubins run on later minors of their major), or PTX of an
# equal or lower architecture (which the driver compiles). Otherwise such a
# GPU silently sends its strided work through the host (review finding 11:
# sm_110 had neither).
#   cmake -DNVCC=... "-DARCHS=75;80-real;...;120" -P cuda_arch_check.cmake
execute_process(COMMAND ${NVCC} --list-gpu-arch OUTPUT_VARIABLE listed RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(STATUS "nvcc --list-gpu-arch failed (${rc}): an nvcc before CUDA 11; nothing to check")
  return()
endif()
string(REGEX MATCHALL "compute_[0-9]+" known "${listed}")
set(missing "")
foreach(k ${known})
  string(REGEX REPLACE "compute_" "" cc "${k}")
  if(cc LESS 75)
    continue()
  endif()
  math(EXPR major "${cc} / 10")
  set(ok FALSE)
  foreach(a ${ARCHS})
    string(REGEX REPLACE "-(real|virtual)$" "" n "${a}")
    math(EXPR amajor "${n} / 10")
    if(NOT a MATCHES "-real$" AND n LESS_EQUAL cc)
      set(ok TRUE) # PTX the driver can compile for it
    endif()
    if(NOT a MATCHES "-virtual$" AND amajor EQUAL major AND n LESS_EQUAL cc)
      set(ok TRUE) # SASS that runs on it
    endif()
  endforeach()
  if(NOT ok)
    list(APPEND missing ${cc})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "no SASS or PTX in \"${ARCHS}\" runs on compute capability ${missing} (nvcc knows: ${known})")
endif()
message(STATUS "every architecture nvcc knows from 7.5 on is covered by ${ARCHS}")
