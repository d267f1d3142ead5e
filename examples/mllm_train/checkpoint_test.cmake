# SPDX-License-Identifier: Apache-2.0
# example_mllm_train's checkpoint is crash-consistent and verified (checkpoint.hpp):
#  - a run resumed from a checkpoint after step 1 (steps 0 and 1 kept) and killed with SIGKILL right
#    before each file operation of the save after step 2 in turn (HETMESH_CKPT_KILL_AT=2:K for K = 1, 2, ...
#    until a run is not killed: the step directory, the rank files, the data position, the manifest,
#    'latest', the fsyncs, the pruning of step 0), resumed again, prints the losses of the uninterrupted
#    run from the step after the checkpoint `latest` names (2 or 3);
#  - a flipped byte, a truncated rank file, a missing manifest and a FIFO in place of a rank file are
#    refused before training, non-zero and naming the file (the NaN, Inf and counter checks are
#    tests/mllm/checkpoint.cpp's).
# Two loopback ranks, one stage: the smallest run. Run by CTest: cmake -DEXE=... -DWORK=dir -P checkpoint_test.cmake
cmake_minimum_required(VERSION 3.20)
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --data-dir "${WORK}/data" --ranks 2 --pp 1 --partition hdp --schedule 1f1b --encoder joint)
run_or_fail("uninterrupted run" "${EXE}" ${common} --steps 4 --report "${WORK}/full.json")
run_or_fail("run saving steps 0 and 1" "${EXE}" ${common} --steps 2 --checkpoint-dir "${WORK}/seed")

set(ckpt "${WORK}/ckpt")
set(k 1)
while(TRUE)
  file(REMOVE_RECURSE "${ckpt}")
  file(COPY "${WORK}/seed/" DESTINATION "${ckpt}")
  set(ENV{HETMESH_CKPT_KILL_AT} 2:${k})
  execute_process(COMMAND "${EXE}" ${common} --steps 3 --checkpoint-dir "${ckpt}" --resume
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  unset(ENV{HETMESH_CKPT_KILL_AT})
  if(rc EQUAL 0)
    break()  # K is past the save's last operation
  endif()
  if(NOT rc MATCHES "[Kk]illed|137")
    message(FATAL_ERROR "kill at operation ${k}: the run failed instead (${rc}): ${err}")
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
  math(EXPR k "${k} + 1")
  if(k GREATER 200)
    message(FATAL_ERROR "HETMESH_CKPT_KILL_AT=2:${k} still kills: the operations are not counted per save")
  endif()
endwhile()
if(k LESS 20)
  message(FATAL_ERROR "the save after step 2 has only ${k} file operations; expected the rank files, the data "
                      "position, the manifest, 'latest', the fsyncs and the pruning")
endif()

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
expect_refused(flipped_byte "rank-1.bin': checksum .*the file is corrupt"
               "printf '\\377' | dd of=rank-1.bin bs=1 seek=5000 count=1 conv=notrunc 2>/dev/null")
expect_refused(truncated "rank-0.bin' has 4096 bytes; the manifest says" "truncate -s 4096 rank-0.bin")
expect_refused(no_manifest "cannot open '.*manifest'" "rm manifest")
expect_refused(fifo "rank-0.bin' is not a regular file" "rm rank-0.bin && mkfifo rank-0.bin")

# A run without --resume into a directory holding a checkpoint is refused before it writes anything.
file(READ "${ckpt}/latest" before)
execute_process(COMMAND "${EXE}" ${common} --steps 4 --checkpoint-dir "${ckpt}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(READ "${ckpt}/latest" after)
if(rc EQUAL 0 OR NOT err MATCHES "already holds a checkpoint \\(step-00000002\\); pass --resume" OR
   out MATCHES "loss" OR NOT before STREQUAL after)
  message(FATAL_ERROR "a run without --resume into '${ckpt}': expected a refusal; got ${rc}: ${err}")
endif()
