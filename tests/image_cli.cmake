# ab_image's command line. Arguments: AB_IMAGE, WORK.
set(PROGRAM "${AB_IMAGE}")
include("${CMAKE_CURRENT_LIST_DIR}/cli_expect.cmake")

# OUT alone: a test card is drawn beside it and round-tripped
expect(0 "drew a test card into ${WORK}/a-input.png" --device cpu "${WORK}/a.png")
expect(0 ", 0 differ" --device cpu "${WORK}/a.png")
# IN OUT, with the option between them: IN is read, no card drawn (IN
# used to be taken only as the next-to-last argument, and was ignored)
expect(0 "wrote ${WORK}/b.png" "${WORK}/a-input.png" --device cpu "${WORK}/b.png")
string(FIND "${out}${err}" "drew" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "ab_image drew a card though IN was given:\n${out}${err}")
endif()
# OUT without .png: its whole name is the stem of the card's
expect(0 "drew a test card into ${WORK}/plain-input.png" --device cpu "${WORK}/plain")
# a third name or an unknown option is a usage error
expect(2 "usage" "${WORK}/a-input.png" "${WORK}/b.png" "${WORK}/c.png")
expect(2 "usage" --bogus "${WORK}/b.png")
expect(2 "usage")
expect(2 "usage" "")
# a device that does not parse is a usage error; one not there is refused
# before the card is drawn; a PNG that cannot be written is not "wrote"
expect(2 "--device" --device gpu "${WORK}/d.png")
expect(1 "opencl:7" --device opencl:7 "${WORK}/d.png")
expect(0 ", 0 differ" --device cpu:auto "${WORK}/auto.png") # auto is no device id to look up
if(EXISTS "${WORK}/d-input.png")
  message(FATAL_ERROR "ab_image drew a card for a device that is not there")
endif()
expect(1 "could not write ${WORK}/no-such-dir/e.png" "${WORK}/a-input.png" --device cpu "${WORK}/no-such-dir/e.png")
# A write that fails after the file was opened (a full device behind a
# link) says so and leaves the path alone: libpng's write-to-file removes
# whatever the path names, and ab_image once used it.
if(EXISTS /dev/full)
  file(CREATE_LINK /dev/full "${WORK}/full.png" SYMBOLIC)
  expect(1 "could not write ${WORK}/full.png" "${WORK}/a-input.png" --device cpu "${WORK}/full.png")
  if(NOT IS_SYMLINK "${WORK}/full.png")
    message(FATAL_ERROR "ab_image removed ${WORK}/full.png (a link to /dev/full) when its write failed")
  endif()
endif()
# Through a dangling link, a write that fails (a file size limit) removes
# the file it made at the link's target and keeps the link.
file(CREATE_LINK "${WORK}/made.png" "${WORK}/dangling.png" SYMBOLIC)
execute_process(COMMAND sh -c "ulimit -f 2; trap '' XFSZ; exec \"$0\" \"$@\"" "${PROGRAM}" "${WORK}/a-input.png"
                        --device cpu "${WORK}/dangling.png"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR EXISTS "${WORK}/made.png" OR NOT IS_SYMLINK "${WORK}/dangling.png")
  message(FATAL_ERROR "ab_image through a dangling link: exit ${rc}, left its target or lost the link\n${out}${err}")
endif()
message(STATUS "image_cli: all checks passed")
