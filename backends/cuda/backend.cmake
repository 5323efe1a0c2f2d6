# The CUDA backend: built when the CUDA toolkit (cudart_static) is found
# (AB_WITH_CUDA=OFF leaves it out); its device kernels (converters/cuda)
# when nvcc is there too. Included by CMakeLists.txt, whose variables it
# appends to.
if(AB_WITH_CUDA)
  # Where the machine has no toolkit of its own, the one tools/setup-deps.sh
  # unpacks from NVIDIA's PyPI wheels into .deps/cuda: used only when no
  # other is named (CUDAToolkit_ROOT, CUDACXX) or found (nvcc on PATH or in
  # /usr/local/cuda).
  set(_ab_wheel_cuda "${PROJECT_SOURCE_DIR}/.deps/cuda/nvidia/cu13")
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND NOT DEFINED ENV{CUDACXX}
     AND NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS "${_ab_wheel_cuda}/bin/nvcc")
    find_program(_ab_system_nvcc nvcc PATHS /usr/local/cuda/bin NO_CACHE)
    if(NOT _ab_system_nvcc)
      message(STATUS "arraybridge: using the CUDA toolkit in ${_ab_wheel_cuda} (tools/setup-deps.sh, from PyPI)")
      set(CUDAToolkit_ROOT "${_ab_wheel_cuda}")
      set(CMAKE_CUDA_COMPILER "${_ab_wheel_cuda}/bin/nvcc" CACHE FILEPATH "nvcc from .deps/cuda")
    endif()
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND TARGET CUDA::cudart_static)
    # cudart is linked statically: the library then loads on machines with
    # no toolkit and no driver (it finds libcuda.so at run time, or reports
    # zero devices).
    set(AB_HAVE_CUDA ON)
    list(APPEND AB_SOURCES backends/cuda/cuda.c)
    list(APPEND AB_BACKEND_TABLES ab__backend_cuda ab__backend_cuda_host ab__backend_cuda_managed)
    list(APPEND AB_BACKENDS "cuda ${CUDAToolkit_VERSION}")
    list(APPEND AB_BACKEND_DEFINITIONS AB_HAVE_CUDA)
    list(APPEND AB_BACKEND_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
    list(APPEND AB_BACKEND_LIBRARIES CUDA::cudart_static)
    # cudart's symbols stay inside libarraybridge.so.
    list(APPEND AB_BACKEND_LINK_OPTIONS "LINKER:--exclude-libs,libcudart_static.a")
    set(AB_PC_LIBS_PRIVATE "${AB_PC_LIBS_PRIVATE} -L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt")
    set(AB_CONFIG_FIND_CUDA "find_package(CUDAToolkit QUIET)")
    # The device kernels (converters/cuda) need nvcc as well; without it
    # strided device tensors go through the host.
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # Real code for every architecture from Turing on that this nvcc
      # knows (CUDA 13 dropped older ones; an older nvcc lacks the newest,
      # and naming one it does not know fails the build), PTX of the newest
      # for the GPUs after it, and PTX of Turing's, which the driver can
      # compile for any later GPU: one whose major version no SASS here
      # serves (Jetson Thor, sm_110, beside compute_120's PTX, which needs
      # 12.0) still runs the kernels instead of sending its strided work
      # through the host. Override with -DCMAKE_CUDA_ARCHITECTURES=... or
      # the CUDAARCHS environment variable (e.g. "native" on a GPU machine).
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
        execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-arch OUTPUT_VARIABLE _ab_nvcc_archs
                        RESULT_VARIABLE _ab_rc ERROR_QUIET)
        set(_ab_archs "")
        foreach(_ab_a 75 80 86 89 90 100 110 120)
          if(_ab_rc EQUAL 0 AND _ab_nvcc_archs MATCHES "compute_${_ab_a}[^0-9]")
            list(APPEND _ab_archs ${_ab_a})
          endif()
        endforeach()
        if(NOT _ab_archs)
          set(_ab_archs 75 80 86 89 90) # an nvcc without --list-gpu-arch (before CUDA 11.0)
        endif()
        list(GET _ab_archs -1 _ab_newest)
        set(CMAKE_CUDA_ARCHITECTURES "")
        foreach(_ab_a ${_ab_archs})
          if(_ab_a EQUAL 75 OR _ab_a EQUAL _ab_newest)
            list(APPEND CMAKE_CUDA_ARCHITECTURES ${_ab_a}) # SASS and PTX
          else()
            list(APPEND CMAKE_CUDA_ARCHITECTURES ${_ab_a}-real)
          endif()
        endforeach()
      endif()
      enable_language(CUDA)
      # Programs linking the static library stay C programs (linked by the C
      # compiler, sanitizer flags and all), not nvcc-linked ones.
      set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES OFF)
      set(CMAKE_CUDA_STANDARD 17)
      set(AB_HAVE_CUDA_KERNELS ON)
      list(APPEND AB_BACKEND_DEFINITIONS AB_HAVE_CUDA_KERNELS)
      list(APPEND AB_SOURCES converters/cuda/gather.cu converters/cuda/convert.cu)
      list(APPEND AB_BACKENDS "cuda kernels for ${CMAKE_CUDA_ARCHITECTURES}")
    else()
      message(STATUS "arraybridge: nvcc not found: CUDA without device kernels")
    endif()
  else()
    # Loud: the CUDA backend and every test of it against simcuda vanish.
    message(WARNING "arraybridge: CUDA toolkit not found: NO CUDA BACKEND in this build, and none of its tests "
                    "(not even against the simulated runtime). tools/setup-deps.sh (make build, make test) fetches "
                    "one from PyPI into .deps/cuda unless AB_CUDA_TOOLKIT=none or the fetch failed; or install "
                    "one and configure again, or pass -DAB_WITH_CUDA=OFF to say so.")
  endif()
endif()
