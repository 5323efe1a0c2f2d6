# More OpenCL devices than arraybridge takes (ids 0..127, AB__MAX_IDS) and
# than one bandwidth table takes (64): PoCL's CPU driver as 130 and 70
# devices. Each cut is said, not silent (a probe's finding: past 64 both
# were cut without a word). Arguments: ABTOOL, WORK.
set(PROGRAM "${ABTOOL}")
include("${CMAKE_CURRENT_LIST_DIR}/cli_expect.cmake")

string(REPEAT "pthread " 130 many)
set(ENV{POCL_DEVICES} "${many}")
execute_process(COMMAND "${ABTOOL}" info RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT out MATCHES "opencl: [0-9]+ device" AND "$ENV{AB_TEST_EXPECT_OPENCL}" STREQUAL "")
  message("SKIP: no OpenCL devices here (PoCL not installed?), and AB_TEST_EXPECT_OPENCL is unset")
  return()
endif()
expect(0 "opencl: 128 devices" info)
expect(0 "has 130 devices; arraybridge takes 128 of them" info)
expect(1 "opencl:128 does not exist: 128 opencl devices (ids 0..127)" bandwidth --devices opencl:127,opencl:128)

string(REPEAT "pthread " 70 many)
set(ENV{POCL_DEVICES} "${many}")
expect(0 "71 devices present; the table takes the first 64 (to opencl:62)" bandwidth --sizes 1 --reps 1)
