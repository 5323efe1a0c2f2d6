# Turns a text file into a C array: cmake -DIN=... -DOUT=... -DNAME=... -P embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* Generated from ${IN}; do not edit. */\n#include <stddef.h>\nconst char ${NAME}[] = {${body}0x00};\nconst size_t ${NAME}_len = sizeof ${NAME} - 1;\n")
