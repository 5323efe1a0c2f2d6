# abtool end to end. Arguments: ABTOOL, DATA (tests/data/npy), WORK.
set(PROGRAM "${ABTOOL}")
include("${CMAKE_CURRENT_LIST_DIR}/cli_expect.cmake")

# Fails with `what` unless files `got` and `want` end in the same `bytes`
# bytes (their data: .npy headers may differ in spacing).
function(same_data got want bytes what)
  file(READ "${got}" g HEX)
  file(READ "${want}" w HEX)
  math(EXPR n "2 * ${bytes}")
  string(LENGTH "${g}" lg)
  string(LENGTH "${w}" lw)
  math(EXPR og "${lg} - ${n}")
  math(EXPR ow "${lw} - ${n}")
  string(SUBSTRING "${g}" ${og} ${n} got_data)
  string(SUBSTRING "${w}" ${ow} ${n} want_data)
  if(NOT got_data STREQUAL want_data)
    message(FATAL_ERROR "${what}:\n got  ${got_data}\n want ${want_data}")
  endif()
endfunction()

expect(0 "cpu: 1 device" info)
# the host kernels and threads it runs with (the kernel choice, explained)
expect(0 "threads; stores 1-16B: " info)
expect(0 "\"type\": \"cpu\", \"count\": 1" info --json)
expect(0 "\"cuda_peer_access\": [" info --json)
# a pool's limit is shown with its value
set(ENV{AB_MEMORY_LIMIT} "cpu=1GiB")
expect(0 "reserved (limited to 1073741824)" info)
unset(ENV{AB_MEMORY_LIMIT})
expect(0 "from row to column" bandwidth --sizes 4K --reps 1 --devices cpu)
expect(0 "usage: abtool convert" convert --help)
expect(0 "1. convert on the host: uint8 -> float32, scaled" convert "${DATA}/u8_2x3x4.npy" --to cpu --dtype float32
       --scale 2 --explain --out "${WORK}/explained.npy")
# A report that cannot be written (a full disk) is exit 3, not success.
if(EXISTS /dev/full)
  foreach(args "info" "info;--json" "bandwidth;--sizes;4K;--reps;1;--devices;cpu" "help")
    execute_process(COMMAND "${ABTOOL}" ${args} RESULT_VARIABLE rc OUTPUT_FILE /dev/full ERROR_VARIABLE err)
    if(NOT rc EQUAL 3 OR NOT err MATCHES "No space left on device")
      message(FATAL_ERROR "abtool ${args} > /dev/full: exit ${rc}, want 3 and the reason\n${err}")
    endif()
  endforeach()
endif()
expect(2 "unknown command" frobnicate)
# help names one command at most, and says so rather than succeed
expect(0 "usage: abtool convert" help convert)
expect(0 "usage: abtool info" --help info)
expect(2 "not \"--bogus\"" help --bogus)
expect(2 "not \"x\"" help info x)
expect(2 "required" convert "${DATA}/u8_2x3x4.npy")
expect(2 "unknown device type" convert "${DATA}/u8_2x3x4.npy" --to gpu --out "${WORK}/x.npy")
expect(3 "'<U2' is not supported" convert "${DATA}/str_u2.npy" --to cpu --out "${WORK}/x.npy")
# Big-endian data is read in its order (0, 1, 2 as float32; the uint8
# result has no byte order, so the bytes are the same on every host).
expect(0 "" convert "${DATA}/be_f4.npy" --to cpu --dtype uint8 --out "${WORK}/be.npy")
file(READ "${WORK}/be.npy" be_hex HEX)
if(NOT be_hex MATCHES "0a000102$")
  message(FATAL_ERROR "abtool convert of big-endian 0, 1, 2 to uint8 wrote ${be_hex}")
endif()
expect(3 "cannot read" convert "${WORK}/missing.npy" --to cpu --out "${WORK}/x.npy")
# Numbers and axes are read whole: atof would have taken "abc" as 0.
expect(2 "--scale needs a finite number" convert "${DATA}/u8_2x3x4.npy" --to cpu --scale abc --out "${WORK}/x.npy")
expect(2 "--offset needs a finite number" convert "${DATA}/u8_2x3x4.npy" --to cpu --offset 1junk --out "${WORK}/x.npy")
expect(2 "--scale needs a finite number" convert "${DATA}/u8_2x3x4.npy" --to cpu --scale inf --out "${WORK}/x.npy")
expect(2 "--scale needs a finite number" convert "${DATA}/u8_2x3x4.npy" --to cpu --scale 1e999 --out "${WORK}/x.npy")
# ... and written as --permute's numbers are: no blanks, '+' or hex
foreach(bad " 2" "+2" "0x10" "-" ".")
  expect(2 "--scale needs a finite number" convert "${DATA}/u8_2x3x4.npy" --to cpu --scale "${bad}" --out "${WORK}/x.npy")
endforeach()
expect(0 "" convert "${DATA}/u8_2x3x4.npy" --to cpu --scale -.5 --offset 1e3 --out "${WORK}/x.npy")
expect(2 "the array is 0-d" convert "${DATA}/f64_scalar.npy" --to cpu --permute 0 --out "${WORK}/x.npy")
expect(0 "" convert "${DATA}/u8_2x3x4.npy" --to cpu --dtype float64 --scale 1e-310 --out "${WORK}/tiny.npy")
expect(2 "is not an order of the 3 axes" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute 0,0,1 --out "${WORK}/x.npy")
expect(2 "is not an order of the 3 axes" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute 0,1 --out "${WORK}/x.npy")
expect(2 "is not an order of the 3 axes" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute 0,1,3 --out "${WORK}/x.npy")
# An order is read whole too: empty entries, blanks and signs (strtok and
# strtol skip them) and a list cut short by abtool's buffer were taken.
expect(2 "has an empty entry" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute 1,,0,2 --out "${WORK}/x.npy")
expect(2 "is not an order of the 3 axes" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute "1, 0,2" --out "${WORK}/x.npy")
expect(2 "is not an order of the 3 axes" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute 1,+0,2 --out "${WORK}/x.npy")
string(REPEAT "0" 300 zeros)
expect(2 "is longer than 255 characters" convert "${DATA}/u8_2x3x4.npy" --to cpu --permute "1,2,${zeros}3"
       --out "${WORK}/x.npy")
# An option given last without its value is named so.
expect(2 "--out needs a value" convert "${DATA}/u8_2x3x4.npy" --to cpu --out)
expect(2 "--sizes needs a value" bandwidth --devices cpu --sizes)
expect(2 "--reps must be 1..1000" bandwidth --reps 5x --sizes 4K --devices cpu)
expect(2 "--reps must be 1..1000" bandwidth --reps " 5" --sizes 4K --devices cpu)
expect(2 "bad size" bandwidth --sizes -4K --devices cpu)
# ... with the reason (strerror: abtool sets no locale)
expect(3 "cannot create ${WORK}/no-such-dir/x.npy: No such file or directory" convert "${DATA}/u8_2x3x4.npy"
       --to cpu --out "${WORK}/no-such-dir/x.npy")
expect(3 "cannot create ${WORK}: Is a directory" convert "${DATA}/u8_2x3x4.npy" --to cpu --out "${WORK}")
expect(1 "does not exist" convert "${DATA}/u8_2x3x4.npy" --to cpu:5 --out "${WORK}/x.npy")

# The conversion NumPy did for us: (a.transpose(2,0,1).astype(float32) * 0.5 + 1)
expect(0 "" convert "${DATA}/u8_2x3x4.npy" --to cpu --dtype float32 --permute 2,0,1 --scale 0.5 --offset 1
       --out "${WORK}/got.npy")
# the data: the last 96 bytes (24 floats)
same_data("${WORK}/got.npy" "${DATA}/expect_u8_permuted_scaled.npy" 96 "abtool convert differs from NumPy")
# A Fortran-order file comes back C-ordered with the same values:
# np.linspace(0, 11/3, 12, dtype=float32).reshape(3, 4), in C order.
expect(0 "" convert "${DATA}/f32_fortran_3x4.npy" --to cpu --out "${WORK}/f.npy")
# written little-endian on every host, and labelled so
file(READ "${WORK}/f.npy" f_text OFFSET 10 LIMIT 60) # past the preamble and its NUL
string(FIND "${f_text}" "'descr': '<f4'" f_descr)
if(f_descr EQUAL -1)
  message(FATAL_ERROR "abtool's float32 .npy is not labelled '<f4': ${f_text}")
endif()
file(READ "${WORK}/f.npy" f_hex HEX)
string(LENGTH "${f_hex}" f_len)
math(EXPR f_at "${f_len} - 96")
string(SUBSTRING "${f_hex}" ${f_at} 96 f_data)
if(NOT f_data STREQUAL "00000000abaaaa3eabaa2a3f0000803fabaaaa3f5555d53f0000004055551540abaa2a400000404055555540abaa6a40")
  message(FATAL_ERROR "abtool convert of a Fortran-order file: data ${f_data}")
endif()
# OUT may be IN: replaced once the new file is whole, nothing left beside it
file(COPY_FILE "${DATA}/u8_2x3x4.npy" "${WORK}/inplace.npy")
expect(0 "" convert "${WORK}/inplace.npy" --to cpu --dtype float32 --permute 2,0,1 --scale 0.5 --offset 1
       --out "${WORK}/inplace.npy")
same_data("${WORK}/inplace.npy" "${DATA}/expect_u8_permuted_scaled.npy" 96 "abtool convert IN --out IN")
file(GLOB leftovers "${WORK}/inplace.npy?*")
if(leftovers)
  message(FATAL_ERROR "abtool convert left ${leftovers}")
endif()
# A write that fails for want of room (here a file size limit of 4 blocks:
# 2 KiB in dash's units, 4 in bash's) leaves an existing OUT, the input
# itself (1128 bytes, its float64 result 8128), as it was: once it was
# truncated, then cut short; written in place without reserving its room
# first, its start would be the new header and data. No new file is left.
file(COPY_FILE "${DATA}/u8_1000.npy" "${WORK}/keep.npy")
foreach(out keep.npy fresh.npy)
  execute_process(COMMAND sh -c "ulimit -f 4; trap '' XFSZ; exec \"$0\" \"$@\"" "${ABTOOL}" convert
                          "${WORK}/keep.npy" --to cpu --dtype float64 --out "${WORK}/${out}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out_text ERROR_VARIABLE err_text)
  if(NOT rc EQUAL 3 OR NOT err_text MATCHES "writing .*${out} failed: ")
    message(FATAL_ERROR "abtool convert under a file size limit: exit ${rc}\n${out_text}${err_text}")
  endif()
endforeach()
file(READ "${WORK}/keep.npy" kept HEX)
file(READ "${DATA}/u8_1000.npy" orig HEX)
file(GLOB leftovers "${WORK}/keep.npy?*" "${WORK}/fresh.npy*")
if(NOT kept STREQUAL orig OR leftovers)
  message(FATAL_ERROR "a failed write changed keep.npy or left ${leftovers}")
endif()
# A stream that is no .npy file is refused at its first bytes, not read
# to the end (/dev/zero has none)
if(EXISTS /dev/zero)
  expect(3 "not a .npy file" convert /dev/zero --to cpu --out "${WORK}/x.npy")
  # A .npy file followed by /dev/zero on stdin: refused with exit 3 and
  # `want` in the message, not read until memory runs out.
  function(endless_stream npy want)
    execute_process(COMMAND cat "${npy}" /dev/zero
      COMMAND "${ABTOOL}" convert /dev/stdin --to cpu --out "${WORK}/endless.npy"
      RESULTS_VARIABLE rcs OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
    list(GET rcs 1 rc)
    string(FIND "${err}" "${want}" at)
    if(NOT rc EQUAL 3 OR at EQUAL -1)
      message(FATAL_ERROR "abtool convert of ${npy} then /dev/zero: exit ${rcs}\n${out}${err}")
    endif()
  endfunction()
  # a stream that goes on past its data is read no further than its
  # header says it ends (it was read until memory ran out), nor past a
  # whole header it refuses (a string dtype)
  endless_stream("${DATA}/u8_2x3x4.npy" "need 24 data bytes, the file has")
  endless_stream("${DATA}/str_u2.npy" "not supported")
endif()
# A write that fails through a dangling symbolic link (the same file size
# limit) removes the file it made at the link's target, which was left
# there, empty, and keeps the link.
file(CREATE_LINK "${WORK}/target-made.npy" "${WORK}/dangling.npy" SYMBOLIC)
execute_process(COMMAND sh -c "ulimit -f 4; trap '' XFSZ; exec \"$0\" \"$@\"" "${ABTOOL}" convert
                        "${DATA}/u8_1000.npy" --to cpu --dtype float64 --out "${WORK}/dangling.npy"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 3 OR EXISTS "${WORK}/target-made.npy" OR NOT IS_SYMLINK "${WORK}/dangling.npy")
  message(FATAL_ERROR "a failed write through a dangling link: exit ${rc}, left its target or lost the link\n${out}${err}")
endif()
# To the host with nothing to change: the result is a view of the file's
# bytes, which must still be there when it is written (the ASan tier
# reported a use-after-free here; elsewhere the bytes could be another
# allocation's). The data is the input's last 24 bytes.
expect(0 "" convert "${DATA}/u8_2x3x4.npy" --to cpu --out "${WORK}/same.npy")
same_data("${WORK}/same.npy" "${DATA}/u8_2x3x4.npy" 24 "abtool convert --to cpu changed the data")
# What the command line can refuse up front is refused before any work.
expect(2 "a .npy file cannot hold it" convert "${DATA}/u8_2x3x4.npy" --to cpu --dtype bfloat16 --out "${WORK}/x.npy")
string(REPEAT ",1K" 400 long_tail)
expect(2 "names no size" bandwidth --sizes ,)
expect(2 "names no device" bandwidth --devices ,)
expect(2 "more than 16 sizes" bandwidth --sizes 1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K,1K)
expect(2 "not auto" bandwidth --devices cpu:auto)
# An empty entry is a mistake, as in AB_MEMORY_LIMIT (strtok skipped it)
expect(2 "has an empty entry" bandwidth --sizes 4K,,8K)
expect(2 "has an empty entry" bandwidth --devices cpu,,cpu)
expect(2 "longer than" bandwidth --sizes 1K${long_tail})
# Sizes in AB_MEMORY_LIMIT's units: KB is 1000 bytes, and "4k" is no size
expect(0 "1000 bytes:" bandwidth --sizes 1KB --reps 1 --devices cpu)
expect(0 "2048 bytes:" bandwidth --sizes 2KiB --reps 1 --devices cpu)
expect(2 "bad size" bandwidth --sizes 4k --devices cpu)
expect(2 "bad size" bandwidth --sizes 4096iB --devices cpu)
# A device that cannot hold a tensor (staging memory; where OpenCL is not
# built, absent) is the library's refusal, before the table starts
expect(1 "opencl_host:0" bandwidth --sizes 4K --reps 1 --devices cpu,opencl_host:0)
string(FIND "${out}${err}" "from row to column" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "abtool bandwidth printed a table before refusing opencl_host:0\n${out}${err}")
endif()
# float8 names parse, and no .npy holds them
expect(2 "a .npy file cannot hold it" convert "${DATA}/u8_2x3x4.npy" --to cpu --dtype float8_e4m3fn --out "${WORK}/x.npy")
message(STATUS "abtool_cli: all checks passed")
