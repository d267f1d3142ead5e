# SPDX-License-Identifier: Apache-2.0
# example_mllm_train with data-plane hosts (--hosts: the last ranks load the steps and send each trainer
# its routed share) prints the losses of the run without hosts, bit for bit: 4 trainers with the joint
# pipeline and one host; 8 trainers with a separate encoder pool and three hosts (one
# source each). Run by CTest: cmake -DEXE=... -DWORK=dir -P hosts_test.cmake
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
