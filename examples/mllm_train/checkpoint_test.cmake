# SPDX-License-Identifier: Apache-2.0
# example_mllm_train's checkpoint (the library's: train/checkpoint.hpp, docs/checkpoint.md) is
# crash-consistent and verified:
#  - a run resumed from a checkpoint after step 1 (steps 0 and 1 kept) and killed with SIGKILL right
#    before each file operation of the save after step 2 in turn (the library's fault injection,
#    HETMESH_CKPT_KILL_AT=2:K for K = 1, 2, ... until a run is not killed: the shard files and their
#    indexes, the manifest, the renames, 'latest', the fsyncs, the pruning of step 0), resumed again,
#    prints the losses of the uninterrupted run, bit for bit, from the step after the checkpoint `latest`
#    names (2 or 3);
#  - a flipped byte, a truncated shard, a missing manifest, a FIFO in place of a shard and a stray file
#    are refused before training, non-zero and naming the file (the library's 37 damaged-checkpoint cases
#    are tests/train/checkpoint_store.cpp's).
# Two loopback ranks, one stage: the smallest run. Run by CTest: cmake -DEXE=... -DWORK=dir -P checkpoint_test.cmake
cmake_minimum_required(VERSION 3.20)
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --data-dir "${WORK}/data" --ranks 2 --pp 1 --partition hdp --schedule 1f1b --encoder joint)
run_or_fail("uninterrupted run" "${EXE}" ${common} --steps 4 --report "${WORK}/full.json")
run_or_fail("run saving steps 0 and 1" "${EXE}" ${common} --steps 2 --checkpoint-dir "${WORK}/seed")

set(ckpt "${WORK}/ckpt")
# The save after step 2's file operations, numbered as the fault injection counts them (HETMESH_CKPT_TRACE).
# The library's own test (tests/train/checkpoint_store.cpp) kills a save before every operation; here, end
# to end through the trainer, before the operations where what a resume finds changes: the first
# operation, every rename and the operation before it (an index, the manifest, the step directory,
# 'latest'), every directory fsync, and the first, a middle and the last write; then one past the last,
# which must not kill.
file(REMOVE_RECURSE "${ckpt}")
file(COPY "${WORK}/seed/" DESTINATION "${ckpt}")
set(ENV{HETMESH_CKPT_TRACE} 1)
execute_process(COMMAND "${EXE}" ${common} --steps 3 --checkpoint-dir "${ckpt}" --resume
                RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE trace)
unset(ENV{HETMESH_CKPT_TRACE})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the traced run failed (${rc}): ${trace}")
endif()
string(REGEX MATCHALL "checkpoint save of step 2: op [0-9]+: [a-z]+ [^ \n]+" ops "${trace}")
set(kills 1)
set(writes "")
set(renames 0)
set(dir_fsyncs 0)
foreach(op IN LISTS ops)
  string(REGEX REPLACE ".*op ([0-9]+): ([a-z]+) ([^ ]+)$" "\\1;\\2;\\3" parts "${op}")
  list(GET parts 0 n)
  list(GET parts 1 kind)
  list(GET parts 2 what)
  if(kind STREQUAL "write")
    list(APPEND writes ${n})
  elseif(kind STREQUAL "rename")
    math(EXPR before "${n} - 1")
    list(APPEND kills ${before} ${n})
    math(EXPR renames "${renames} + 1")
  elseif(kind STREQUAL "fsync" AND what STREQUAL "directory")
    list(APPEND kills ${n})
    math(EXPR dir_fsyncs "${dir_fsyncs} + 1")
  endif()
endforeach()
list(LENGTH ops total)
if(renames LESS 4 OR dir_fsyncs LESS 2)
  message(FATAL_ERROR "the save after step 2 has ${renames} renames and ${dir_fsyncs} directory fsyncs; expected "
                      "the indexes', the step directory's and 'latest''s renames, and the checkpoint directory's "
                      "fsyncs")
endif()
list(LENGTH writes nw)
math(EXPR middle "${nw} / 2")
list(GET writes 0 w0)
list(GET writes ${middle} w1)
list(GET writes -1 w2)
math(EXPR past "${total} + 1")
list(APPEND kills ${w0} ${w1} ${w2} ${past})
list(REMOVE_DUPLICATES kills)
list(SORT kills COMPARE NATURAL)
message(STATUS "the save after step 2: ${total} file operations; killing before ${kills}")

foreach(k IN LISTS kills)
  file(REMOVE_RECURSE "${ckpt}")
  file(COPY "${WORK}/seed/" DESTINATION "${ckpt}")
  set(ENV{HETMESH_CKPT_KILL_AT} 2:${k})
  execute_process(COMMAND "${EXE}" ${common} --steps 3 --checkpoint-dir "${ckpt}" --resume
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  unset(ENV{HETMESH_CKPT_KILL_AT})
  if(k EQUAL past)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "HETMESH_CKPT_KILL_AT=2:${k} is past the save's operations, yet the run failed (${rc})")
    endif()
    break()
  endif()
  if(NOT rc MATCHES "[Kk]illed|137")
    message(FATAL_ERROR "kill at operation ${k}: the run was not killed (${rc}): ${err}")
  endif()
  # Resume from whichever step 'latest' names (1 before it moved, 2 after) and train one step.
  file(READ "${ckpt}/latest" latest)
  string(REGEX REPLACE "^step-0*([0-9]+)\n$" "\\1" saved "${latest}")
  if(NOT (saved EQUAL 1 OR saved EQUAL 2))
    message(FATAL_ERROR "killed before operation ${k}, 'latest' holds '${latest}'; expected step 1 or 2")
  endif()
  math(EXPR next "${saved} + 1")
  math(EXPR steps "${saved} + 2")
  execute_process(COMMAND "${EXE}" ${common} --steps ${steps} --checkpoint-dir "${ckpt}" --resume
                          --report "${WORK}/resumed.json"
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "killed before operation ${k} of the save after step 2, the resume failed (${rc}): ${err}")
  endif()
  file(READ "${WORK}/resumed.json" resumed)
  string(JSON n LENGTH "${resumed}" loss)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "killed before operation ${k}, the resumed run reported ${n} steps; expected step ${next}")
  endif()
  message(STATUS "killed before operation ${k} of the save after step 2: resumed at step ${next}")
  expect_equal_losses("${WORK}/full.json" ${next} "${WORK}/resumed.json" 0 1 uninterrupted resumed)
endforeach()

# The last run was not killed: latest is step 2, complete. Each case damages a copy and resumes from it.
# expect_refused(<case> <regex of the error> <shell command run in the copy>)
function(expect_refused what pattern damage)
  set(dir "${WORK}/${what}")
  file(REMOVE_RECURSE "${dir}")
  file(COPY "${ckpt}/" DESTINATION "${dir}")
  execute_process(COMMAND sh -c "${damage}" WORKING_DIRECTORY "${dir}/step-00000002" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: could not damage the copy (${rc})")
  endif()
  execute_process(COMMAND "${EXE}" ${common} --steps 4 --checkpoint-dir "${dir}" --resume
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if(rc EQUAL 0 OR NOT err MATCHES "${pattern}" OR out MATCHES "loss")
    message(FATAL_ERROR "${what}: expected a refusal matching '${pattern}' before any step; got ${rc}: ${err}")
  endif()
  message(STATUS "${what}: refused: ${err}")
endfunction()
expect_refused(flipped_byte "shard-00000.bin': checksum [0-9a-f]+; expected [0-9a-f]+"
               "printf '\\377' | dd of=shard-00000.bin bs=1 seek=5000 count=1 conv=notrunc 2>/dev/null")
expect_refused(truncated "shard-00000.bin' has 4096 bytes; expected" "truncate -s 4096 shard-00000.bin")
expect_refused(no_manifest "manifest.json" "rm manifest.json")
expect_refused(fifo "shard-00001.bin.*(not a regular file|FIFO)" "rm shard-00001.bin && mkfifo shard-00001.bin")
expect_refused(stray_file "holds 'stray', which the manifest does not list" "touch stray")

# A run without --resume into a directory holding a checkpoint is refused before it writes anything.
file(READ "${ckpt}/latest" before)
execute_process(COMMAND "${EXE}" ${common} --steps 4 --checkpoint-dir "${ckpt}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${ckpt}/latest" after)
if(rc EQUAL 0 OR NOT err MATCHES "already holds a checkpoint \\(step-00000002\\); pass --resume" OR
   out MATCHES "loss" OR NOT before STREQUAL after)
  message(FATAL_ERROR "a run without --resume into '${ckpt}': expected a refusal; got ${rc}: ${err}")
endif()
