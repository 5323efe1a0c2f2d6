# The library without OpenCL installed: it names no OpenCL ICD loader
# among the libraries it needs (it opens one at run time), and where none
# can be opened (AB_OPENCL_LIBRARY naming a file that is not there) it
# loads all the same, lists no OpenCL device and says why, and the host
# converts. Arguments: ABTOOL, LIB (libarraybridge.so), READELF, DATA
# (tests/data/npy), WORK.
foreach(bin "${LIB}" "${ABTOOL}")
  execute_process(COMMAND "${READELF}" -d "${bin}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf -d ${bin}: exit ${rc}\n${err}")
  endif()
  if(out MATCHES "NEEDED[^\n]*libOpenCL")
    message(FATAL_ERROR "${bin} needs the OpenCL ICD loader at load time:\n${out}")
  endif()
  if(NOT out MATCHES "NEEDED")
    message(FATAL_ERROR "readelf -d ${bin} lists no NEEDED library at all: not the output expected\n${out}")
  endif()
endforeach()

set(ENV{AB_OPENCL_LIBRARY} "${WORK}/no-such-dir/libOpenCL.so.1")
execute_process(COMMAND "${ABTOOL}" info RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "abtool info without an OpenCL loader: exit ${rc}\n${out}${err}")
endif()
foreach(want "cpu: 1 device" "opencl: 0 devices" "no OpenCL: the ICD loader could not be opened"
        "no-such-dir/libOpenCL.so.1: ")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "abtool info without an OpenCL loader does not say \"${want}\":\n${out}${err}")
  endif()
endforeach()
file(MAKE_DIRECTORY "${WORK}")
file(REMOVE "${WORK}/no-opencl.npy")
execute_process(COMMAND "${ABTOOL}" convert "${DATA}/u8_2x3x4.npy" --to cpu --dtype float32 --out "${WORK}/no-opencl.npy"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK}/no-opencl.npy")
  message(FATAL_ERROR "abtool convert on the host without an OpenCL loader: exit ${rc}\n${out}${err}")
endif()
message(STATUS "no_opencl: nothing links the loader; without one the host works and OpenCL says why")
