# ab_image's command line. Arguments: AB_IMAGE, WORK.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

# Runs ab_image with ARGN; checks the exit code and that stdout+stderr
# contains `want`; leaves them in `out`.
function(expect code want)
  execute_process(COMMAND "${AB_IMAGE}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL code)
    message(FATAL_ERROR "ab_image ${ARGN}: exit ${rc}, want ${code}\n${o}${e}")
  endif()
  string(FIND "${o}${e}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "ab_image ${ARGN}: output lacks \"${want}\"\n${o}${e}")
  endif()
  set(out "${o}${e}" PARENT_SCOPE)
endfunction()

# OUT alone: a test card is drawn beside it and round-tripped
expect(0 "drew a test card into ${WORK}/a-input.png" --device cpu "${WORK}/a.png")
expect(0 "0 differ" --device cpu "${WORK}/a.png")
# IN OUT, with the option between them: IN is read, no card drawn (IN
# used to be taken only as the next-to-last argument, and was ignored)
expect(0 "wrote ${WORK}/b.png" "${WORK}/a-input.png" --device cpu "${WORK}/b.png")
string(FIND "${out}" "drew" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "ab_image drew a card though IN was given:\n${out}")
endif()
# OUT without .png: its whole name is the stem of the card's
expect(0 "drew a test card into ${WORK}/plain-input.png" --device cpu "${WORK}/plain")
# a third name or an unknown option is a usage error
expect(2 "usage" "${WORK}/a-input.png" "${WORK}/b.png" "${WORK}/c.png")
expect(2 "usage" --bogus "${WORK}/b.png")
expect(2 "usage")
expect(2 "usage" "")
message(STATUS "image_cli: all checks passed")
