# SPDX-License-Identifier: Apache-2.0
# example_mllm_train with --zero 1 (Adam's moments sharded over each group's data-parallel ranks,
# train::zero1) prints the losses of the replicated run (--zero 0) bit for bit, in the 5-D layout (tp 2 x
# pp 2 x HDP pool 2, ep 2). Run by CTest: cmake -DEXE=... -DWORK=dir -P zero_test.cmake
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --steps 3 --data-dir "${WORK}/data" --tp 2 --ep 2 --partition hdp --schedule 1f1b --encoder joint)
run_or_fail("replicated run" "${EXE}" ${common} --zero 0 --report "${WORK}/replicated.json")
run_or_fail("ZeRO-1 run" "${EXE}" ${common} --zero 1 --report "${WORK}/zero1.json")
expect_equal_losses("${WORK}/replicated.json" 0 "${WORK}/zero1.json" 0 3 replicated zero1)
