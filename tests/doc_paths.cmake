# Every file or folder of the repository that the docs name exists, so that
# a rename or a results file never named leaves no dead pointer behind.
# Argument: ROOT, the repository. A path counts where it starts with one of
# the repository's top folders after a space, a quote, a bracket or `../`
# (a link out of docs/); `*` in it is a glob that must match something.
# Not the repository's: design.md's worked example of a new backend (hip),
# the installed tree (include/arraybridge/third_party) and built programs
# (bench/bench_*, named as in the build folder).
set(not_ours "^(backends/hip|converters/hip|include/arraybridge/third_party|bench/bench_[a-z]+$)")
file(GLOB docs "${ROOT}/docs/*.md")
list(APPEND docs "${ROOT}/README.md" "${ROOT}/python/README.md")
set(missing "")
foreach(doc ${docs})
  file(READ "${doc}" text)
  # neither may reach CMake's lists: `;` splits an item, brackets quote one
  string(REGEX REPLACE "[][;]" " " text "${text}")
  string(REPLACE "../" " " text "${text}")
  string(REGEX MATCHALL "(^|[^A-Za-z0-9_./<>*-])(bench|tests|src|backends|converters|tools|examples|docs|python|include|cmake)/[A-Za-z0-9_./*-]*[A-Za-z0-9_*]"
         found "${text}")
  foreach(hit ${found})
    string(REGEX REPLACE "^[^a-z]" "" path "${hit}")
    if(path MATCHES "${not_ours}")
      continue()
    endif()
    file(GLOB there "${ROOT}/${path}")
    if(NOT there AND NOT IS_DIRECTORY "${ROOT}/${path}")
      file(RELATIVE_PATH where "${ROOT}" "${doc}")
      list(APPEND missing "${where}: ${path}")
    endif()
  endforeach()
endforeach()
if(missing)
  list(REMOVE_DUPLICATES missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "paths the docs name that the repository does not have:\n  ${missing}")
endif()
message(STATUS "every repository path the docs name exists")
