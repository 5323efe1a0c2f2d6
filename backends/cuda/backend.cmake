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
    set(AB_CONFIG_FIND_CUDA "find_dependency(CUDAToolkit)")
    # The device kernels (converters/cuda) need nvcc as well; without it
    # strided device tensors go through the host.
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # Real code for Turing to Blackwell (CUDA 13 dropped older ones), and
      # PTX of the newest for GPUs after it. Override with
      # -DCMAKE_CUDA_ARCHITECTURES=... (e.g. "native" on the GPU machine).
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;86-real;89-real;90-real;100-real;120")
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
