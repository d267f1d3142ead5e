# SPDX-License-Identifier: Apache-2.0
# example_mllm_train with data-plane hosts (--hosts: the last ranks load the steps and send each trainer
# its routed share) prints the losses of the run without hosts, bit for bit: 4 trainers with the joint
# pipeline and one host; 8 trainers with a separate encoder pool and three hosts (one
# source each); with loss masks (--answer-only-loss), 4 trainers and one host, whose losses also differ
# from the unmasked run's (the hosts' metadata carries the masks: without them the trainers would count
# every target). Run by CTest: cmake -DEXE=... -DWORK=dir -P hosts_test.cmake
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --steps 3 --data-dir "${WORK}/data" --partition hdp --schedule 1f1b)
set(joint ${common} --ranks 4 --encoder joint)
set(separate ${common} --ranks 8 --encoder separate)
run_or_fail("joint, no hosts" "${EXE}" ${joint} --report "${WORK}/joint.json")
run_or_fail("joint, 1 host" "${EXE}" ${joint} --hosts 1 --report "${WORK}/joint-hosts.json")
run_or_fail("separate, no hosts" "${EXE}" ${separate} --report "${WORK}/separate.json")
run_or_fail("separate, 3 hosts" "${EXE}" ${separate} --hosts 3 --report "${WORK}/separate-hosts.json")
expect_equal_losses("${WORK}/joint.json" 0 "${WORK}/joint-hosts.json" 0 3 local hosts)
expect_equal_losses("${WORK}/separate.json" 0 "${WORK}/separate-hosts.json" 0 3 local hosts)
set(masked ${joint} --answer-only-loss --data-dir "${WORK}/masked-data")
run_or_fail("masked, no hosts" "${EXE}" ${masked} --report "${WORK}/masked.json")
run_or_fail("masked, 1 host" "${EXE}" ${masked} --hosts 1 --report "${WORK}/masked-hosts.json")
expect_equal_losses("${WORK}/masked.json" 0 "${WORK}/masked-hosts.json" 0 3 local hosts)
file(READ "${WORK}/joint.json" unmasked)
file(READ "${WORK}/masked.json" masked_report)
string(JSON x GET "${unmasked}" loss 0)
string(JSON y GET "${masked_report}" loss 0)
if(x STREQUAL y)
  message(FATAL_ERROR "step 0: the masked run's loss ${y} equals the unmasked run's: the masks did not reach the loss")
endif()
