# The OpenCL backend: built where the OpenCL headers are found
# (AB_WITH_OPENCL=OFF leaves it out); the library opens the ICD loader at
# run time, so the loader's development files are not needed to build it
# (test_opencl and bench_opencl, which call OpenCL themselves, need them).
# Sets AB_OPENCL_BUILT. Included by CMakeLists.txt, whose variables it
# appends to.
set(AB_OPENCL_BUILT OFF)
if(AB_WITH_OPENCL)
  find_package(OpenCL QUIET) # the loader and headers, for the tests
  if(OpenCL_FOUND)
    set(AB_OPENCL_INCLUDE_DIR "${OpenCL_INCLUDE_DIRS}")
  else()
    # where FindOpenCL found the headers but no loader, its answer first
    find_path(AB_OPENCL_INCLUDE_DIR CL/cl.h HINTS ${OpenCL_INCLUDE_DIR})
    mark_as_advanced(AB_OPENCL_INCLUDE_DIR)
  endif()
  if(AB_OPENCL_INCLUDE_DIR)
    set(AB_OPENCL_BUILT ON)
    # The OpenCL C kernels travel inside the library as C arrays
    # (ab__opencl_<name>_cl).
    set(AB_CL_C "")
    foreach(cl gather convert)
      set(out "${PROJECT_BINARY_DIR}/generated/opencl_${cl}_cl.c")
      add_custom_command(OUTPUT "${out}"
        COMMAND ${CMAKE_COMMAND} -DIN=${PROJECT_SOURCE_DIR}/converters/opencl/${cl}.cl
                -DOUT=${out} -DNAME=ab__opencl_${cl}_cl
                -P ${PROJECT_SOURCE_DIR}/converters/opencl/embed.cmake
        DEPENDS converters/opencl/${cl}.cl converters/opencl/kernels.def converters/opencl/embed.cmake
        COMMENT "Embedding converters/opencl/${cl}.cl")
      list(APPEND AB_CL_C "${out}")
    endforeach()
    list(APPEND AB_SOURCES backends/opencl/opencl.c backends/opencl/transfers.c backends/opencl/kernels.c
      backends/opencl/pinned.c backends/opencl/icd_preload.c backends/opencl/cl_api.c ${AB_CL_C})
    list(APPEND AB_BACKEND_TABLES ab__backend_opencl ab__backend_opencl_host)
    list(APPEND AB_BACKENDS "opencl")
    list(APPEND AB_BACKEND_DEFINITIONS AB_HAVE_OPENCL)
    list(APPEND AB_BACKEND_INCLUDE_DIRS ${AB_OPENCL_INCLUDE_DIR})
    # The ICD loader is opened at run time (backends/opencl/cl_api.c), not
    # linked: the library loads where no OpenCL is installed.
    list(APPEND AB_BACKEND_LIBRARIES ${CMAKE_DL_LIBS})
    set(AB_PC_LIBS_PRIVATE "${AB_PC_LIBS_PRIVATE} -ldl")
    if(NOT OpenCL_FOUND)
      message(STATUS "arraybridge: OpenCL backend built from the headers alone; no ICD loader to link test_opencl and bench_opencl against, so they are left out (apt-get install ocl-icd-opencl-dev)")
    endif()
  else()
    message(STATUS "arraybridge: OpenCL headers not found: no OpenCL backend (apt-get install opencl-headers)")
  endif()
endif()
