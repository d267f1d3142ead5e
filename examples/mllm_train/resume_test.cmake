# SPDX-License-Identifier: Apache-2.0
# example_mllm_train killed with SIGKILL right after step 2's checkpoint, then resumed: steps 3 and 4 print
# the losses of an uninterrupted run, bit for bit (the same layout); then the same with the asynchronous
# writer every 2 steps. Run by CTest: cmake -DEXE=... -DWORK=dir -P resume_test.cmake
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --steps 5 --data-dir "${WORK}/data" --partition hdp --schedule 1f1b --encoder joint)
run_or_fail("uninterrupted run" "${EXE}" ${common} --report "${WORK}/full.json")
execute_process(COMMAND "${EXE}" ${common} --checkpoint-dir "${WORK}/ckpt" --kill-after 2 RESULT_VARIABLE rc)
if(rc EQUAL 0)
  message(FATAL_ERROR "the run meant to be killed after step 2 exited normally")
endif()
run_or_fail("resumed run" "${EXE}" ${common} --checkpoint-dir "${WORK}/ckpt" --resume
            --report "${WORK}/resumed.json")
file(READ "${WORK}/resumed.json" resumed)
string(JSON n LENGTH "${resumed}" loss)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "the resumed run reported ${n} steps; expected steps 3 and 4")
endif()
expect_equal_losses("${WORK}/full.json" 3 "${WORK}/resumed.json" 0 2 uninterrupted resumed)

# The asynchronous writer (--async-checkpoint, train::checkpoint_writer) every 2 steps: saves after steps 1
# and 3 only; killed after step 3 (its save committed first), the resume runs step 4 bit for bit.
execute_process(COMMAND "${EXE}" ${common} --checkpoint-dir "${WORK}/async" --async-checkpoint --checkpoint-every 2
                        --kill-after 3 RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "the asynchronous run meant to be killed after step 3 exited normally")
endif()
file(READ "${WORK}/async/latest" latest)
if(NOT latest STREQUAL "step-00000003\n" OR EXISTS "${WORK}/async/step-00000002")
  message(FATAL_ERROR "--checkpoint-every 2 killed after step 3: 'latest' holds '${latest}'; expected step 3, "
                      "and no checkpoint of step 2")
endif()
run_or_fail("resumed asynchronous run" "${EXE}" ${common} --checkpoint-dir "${WORK}/async" --resume --async-checkpoint
            --report "${WORK}/resumed_async.json")
expect_equal_losses("${WORK}/full.json" 4 "${WORK}/resumed_async.json" 0 1 uninterrupted "resumed (async)")
