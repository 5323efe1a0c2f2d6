# abtool info run with every pthread_atfork refused (the preloaded shim
# tests/stress/atfork_refused.c): it must still work, and say for each of
# the library's five sets of fork handlers that they were not registered.
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_PRELOAD=${SHIM} ${ABTOOL} info
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "abtool info with pthread_atfork refused exited ${rc}:\n${out}\n${err}")
endif()
foreach(what "the device registry's start-up lock" "the staging settings' lock" "the host worker threads' locks"
        "the transpose trials' lock" "the pools' locks")
  string(FIND "${err}" "fork handlers for ${what} not registered (pthread_atfork: out of memory)" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "no message for ${what}; stderr was:\n${err}")
  endif()
endforeach()
string(FIND "${out}" "cpu:0" at)
if(at EQUAL -1)
  message(FATAL_ERROR "abtool info printed no cpu:0 with pthread_atfork refused:\n${out}")
endif()
