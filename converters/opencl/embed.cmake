# Turns an OpenCL C file into a C array: cmake -DIN=... -DOUT=... -DNAME=... -P embed.cmake
# A line `#include "name"` is replaced by the file of that name next to IN
# (the OpenCL compiler sees one self-contained source).
file(READ "${IN}" text)
get_filename_component(dir "${IN}" DIRECTORY)
string(REGEX MATCHALL "#include \"[^\"]+\"" includes "${text}")
foreach(inc ${includes})
  string(REGEX REPLACE "#include \"([^\"]+)\"" "\\1" name "${inc}")
  file(READ "${dir}/${name}" body)
  string(REPLACE "${inc}" "${body}" text "${text}")
endforeach()
string(HEX "${text}" hex)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* Generated from ${IN}; do not edit. */\n#include <stddef.h>\nconst char ${NAME}[] = {${body}0x00};\nconst size_t ${NAME}_len = sizeof ${NAME} - 1;\n")
