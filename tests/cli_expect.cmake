# For the command-line checks (abtool_cli.cmake, image_cli.cmake): included
# with PROGRAM set to the program under test and WORK to a scratch folder,
# which it empties.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
get_filename_component(PROGRAM_NAME "${PROGRAM}" NAME)

# Runs PROGRAM with ARGN; checks the exit code and that stdout+stderr
# contains `want`; leaves them in `out` and `err`.
function(expect code want)
  execute_process(COMMAND "${PROGRAM}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL code)
    message(FATAL_ERROR "${PROGRAM_NAME} ${ARGN}: exit ${rc}, want ${code}\n${out}${err}")
  endif()
  string(FIND "${out}${err}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${PROGRAM_NAME} ${ARGN}: output lacks \"${want}\"\n${out}${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()
