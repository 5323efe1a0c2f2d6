# The conversion kernels give the host's bits only if nvcc keeps every
# float operation as written: two roundings for y = x * a + b, subnormals
# kept. This compiles converters/cuda/convert.cu to PTX for ARCH and fails
# on anything that could change a result: an fma or mad (contraction), a
# mul with no rounding mode (ptxas may contract it with an add), flushing
# subnormals (.ftz) or approximate operations (.approx, div.full).
#   cmake -DNVCC=... -DARCH=sm_90 -DSRC=convert.cu -DINCLUDES="a;b" -DCUDA_FLAGS="..." -DOUT=x.ptx -P ptx_check.cmake
# The build's own CUDA flags first (a --use_fast_math or -ftz=true there
# would change the shipped kernels, and must fail here too).
separate_arguments(build_flags UNIX_COMMAND "${CUDA_FLAGS}")
set(flags ${build_flags} -ptx -arch=${ARCH} -std=c++17)
foreach(dir ${INCLUDES})
  list(APPEND flags -I${dir})
endforeach()
execute_process(COMMAND ${NVCC} ${flags} ${SRC} -o ${OUT} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvcc -ptx failed (${rc}): ${err}")
endif()
file(STRINGS ${OUT} lines)
set(bad 0)
set(float_ops 0)
foreach(line IN LISTS lines)
  if(line MATCHES "(fma\\.|mad\\.[a-z.]*f(16|32|64)|\\.ftz|\\.approx|div\\.full|mul\\.f(16|32|64))")
    message(SEND_ERROR "${ARCH}: ${line}")
    math(EXPR bad "${bad} + 1")
  endif()
  if(line MATCHES "(mul|add)\\.rn\\.f(32|64)")
    math(EXPR float_ops "${float_ops} + 1")
  endif()
endforeach()
if(bad GREATER 0)
  message(FATAL_ERROR "${bad} PTX instructions in ${SRC} could round differently from the host")
endif()
# The check means something only if the affine map's operations are there.
if(float_ops LESS 4)
  message(FATAL_ERROR "expected the affine map's mul.rn/add.rn (f32 and f64) in the PTX, found ${float_ops}")
endif()
message(STATUS "${ARCH}: ${float_ops} rounded float operations, no contraction, no ftz, nothing approximate")
