# SPDX-License-Identifier: Apache-2.0
# example_mllm_train under mpirun -np 8 prints the losses of the loopback run of the same configuration,
# bit for bit, and so does it under mpirun -np 10 with 2 data-plane hosts (and loss masks). Run by CTest: cmake -DEXE=... -DWORK=dir -DMPIEXEC=mpirun -P mpi_test.cmake
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
set(common --steps 3 --data-dir "${WORK}/data" --partition hdp --schedule 1f1b --encoder joint)
run_or_fail("loopback run" "${EXE}" ${common} --report "${WORK}/loopback.json")
run_or_fail("mpirun -np 8 run" "${MPIEXEC}" -np 8 --oversubscribe "${EXE}" ${common} --backend mpi
            --report "${WORK}/mpi.json")
expect_equal_losses("${WORK}/loopback.json" 0 "${WORK}/mpi.json" 0 3 loopback mpi)
# The same 8 trainers fed by 2 data-plane host processes (--hosts 2: 10 processes), with loss masks
# (--answer-only-loss: the hosts send them in the step's metadata and with the text).
set(masked --steps 3 --data-dir "${WORK}/masked-data" --partition hdp --schedule 1f1b --encoder joint
           --answer-only-loss)
run_or_fail("masked loopback run" "${EXE}" ${masked} --report "${WORK}/masked.json")
run_or_fail("mpirun -np 10 run with 2 hosts" "${MPIEXEC}" -np 10 --oversubscribe "${EXE}" ${masked} --backend mpi
            --hosts 2 --report "${WORK}/mpi-hosts.json")
expect_equal_losses("${WORK}/masked.json" 0 "${WORK}/mpi-hosts.json" 0 3 loopback mpi-hosts)
# A launch mismatch (issue 37): --ranks plus --hosts other than the MPI world size exits 2 on every rank,
# naming both, and trains nothing.
execute_process(COMMAND "${MPIEXEC}" -np 2 --oversubscribe "${EXE}" --steps 1 --data-dir "${WORK}/data"
                        --backend mpi --ranks 4
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "--ranks 4 plus --hosts 0 is 4, but MPI started 2 processes")
  message(FATAL_ERROR "mpirun -np 2 with --ranks 4: exit ${rc}, expected non-zero and a line naming both;\n"
                      "${out}${err}")
endif()
