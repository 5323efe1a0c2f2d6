# Installs the build tree into a scratch prefix, then configures, builds and
# runs tests/consumer against it with find_package(arraybridge), once with
# the shared and once with the static library; then main.c by hand with
# pkg-config's flags, and main.cpp the same way with a C++ compiler.
# Arguments: BUILD_DIR, SOURCE_DIR, WORK_DIR, CMAKE_C_COMPILER, LIBDIR.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# The installed tree must carry its own DLPack >= 1.0 header.
if(NOT EXISTS "${prefix}/include/arraybridge/third_party/dlpack/dlpack.h")
  message(FATAL_ERROR "installed tree lacks include/arraybridge/third_party/dlpack/dlpack.h")
endif()
# The shared library carries its backends: a program linking it needs
# neither the OpenCL headers nor the CUDA toolkit (find_package must not
# ask for them); the static one does.
set(without_backend_packages -DCMAKE_DISABLE_FIND_PACKAGE_OpenCL=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
foreach(kind shared static)
  set(b "${WORK_DIR}/build-${kind}")
  set(extra "")
  if(kind STREQUAL "shared")
    set(extra ${without_backend_packages})
  endif()
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${b}" "-DCMAKE_PREFIX_PATH=${prefix}"
      "-DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}" "-DCONSUMER_LINK=${kind}" ${extra})
  run(${CMAKE_COMMAND} --build "${b}")
  run("${b}/consumer")
endforeach()

# The same program built by hand with pkg-config's flags.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} "${prefix}/${LIBDIR}/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs arraybridge
  OUTPUT_VARIABLE pcflags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs arraybridge failed")
endif()
separate_arguments(pcflags UNIX_COMMAND "${pcflags}")
# C99 with -pedantic -Werror: what the guide says the header compiles as.
run(${CMAKE_C_COMPILER} -std=c99 -Wall -Wextra -pedantic -Werror "${SOURCE_DIR}/main.c" -o "${WORK_DIR}/consumer-pc" ${pcflags}
    "-Wl,-rpath,${prefix}/${LIBDIR}")
run("${WORK_DIR}/consumer-pc")

# And from C++ (main.cpp), with the C++ compiler of the C compiler's kind
# (gcc -> g++, clang-15 -> clang++-15, aarch64-linux-gnu-gcc ->
# aarch64-linux-gnu-g++): where there is none, the check says so and is
# left out.
get_filename_component(cc_name "${CMAKE_C_COMPILER}" NAME)
get_filename_component(cc_dir "${CMAKE_C_COMPILER}" DIRECTORY)
string(REGEX REPLACE "gcc(-[0-9]+|)$" "g++\\1" cxx_name "${cc_name}")
string(REGEX REPLACE "^clang(-[0-9]+|)$" "clang++\\1" cxx_name "${cxx_name}")
string(REGEX REPLACE "^cc$" "c++" cxx_name "${cxx_name}")
find_program(CXX_COMPILER NAMES "${cxx_name}" PATHS "${cc_dir}" NO_DEFAULT_PATH NO_CACHE)
if(cxx_name STREQUAL cc_name OR NOT CXX_COMPILER)
  message(STATUS "no C++ compiler beside ${CMAKE_C_COMPILER} (looked for ${cxx_name}): the C++ check did not run")
else()
  run(${CXX_COMPILER} -std=c++11 -Wall -Wextra -pedantic -Wshadow -Wold-style-cast -Werror "${SOURCE_DIR}/main.cpp"
      -o "${WORK_DIR}/consumer-cxx"
      ${pcflags} "-Wl,-rpath,${prefix}/${LIBDIR}")
  run("${WORK_DIR}/consumer-cxx")
endif()

# Only ab_ symbols may be exported from the shared library.
find_program(NM nm REQUIRED)
execute_process(COMMAND ${NM} -D --defined-only "${prefix}/${LIBDIR}/libarraybridge.so"
  OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
string(REGEX MATCHALL "[^\n]+" lines "${syms}")
set(bad "")
set(count 0)
foreach(line ${lines})
  string(REGEX REPLACE "^.* " "" name "${line}")
  # ab_ names only, and _init and _fini, which musl's crti.o exports from every shared library
  if(name MATCHES "^ab_[a-z]")
    math(EXPR count "${count} + 1")
  elseif(NOT name MATCHES "^_(init|fini)$")
    list(APPEND bad "${name}")
  endif()
endforeach()
if(bad OR count EQUAL 0)
  message(FATAL_ERROR "libarraybridge.so exports non-ab_ symbols (or none): ${bad}")
endif()
message(STATUS "libarraybridge.so exports ${count} symbols, all ab_*")
