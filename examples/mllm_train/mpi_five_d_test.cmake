# SPDX-License-Identifier: Apache-2.0
# example_mllm_train in the 5-D layout (tp 2 x pp 2 x HDP pool 2, ep 2 inside the pool, ZeRO-1) under
# mpirun -np 8 prints the losses of the loopback run of the same layout, bit for bit. Run by CTest:
# cmake -DEXE=... -DWORK=dir -DMPIEXEC=mpirun -P mpi_five_d_test.cmake
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --steps 3 --data-dir "${WORK}/data" --tp 2 --ep 2 --zero 1 --partition hdp --schedule 1f1b
           --encoder joint)
run_or_fail("loopback run" "${EXE}" ${common} --report "${WORK}/loopback.json")
run_or_fail("mpirun -np 8 run" "${MPIEXEC}" -np 8 --oversubscribe "${EXE}" ${common} --backend mpi
            --report "${WORK}/mpi.json")
expect_equal_losses("${WORK}/loopback.json" 0 "${WORK}/mpi.json" 0 3 loopback mpi)
