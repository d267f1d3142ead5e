# SPDX-License-Identifier: Apache-2.0
# example_mllm_train under mpirun -np 8 prints the losses of the loopback run of the same configuration,
# bit for bit. Run by CTest: cmake -DEXE=... -DWORK=dir -DMPIEXEC=mpirun -P mpi_test.cmake
file(REMOVE_RECURSE "${WORK}")
set(common --steps 3 --data-dir "${WORK}/data" --partition hdp --schedule 1f1b --encoder joint)
execute_process(COMMAND "${EXE}" ${common} --report "${WORK}/loopback.json" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "loopback run failed: ${rc}")
endif()
execute_process(COMMAND "${MPIEXEC}" -np 8 --oversubscribe "${EXE}" ${common} --backend mpi
                        --report "${WORK}/mpi.json" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "mpirun -np 8 run failed: ${rc}")
endif()
file(READ "${WORK}/loopback.json" a)
file(READ "${WORK}/mpi.json" b)
foreach(i RANGE 0 2)
  string(JSON x GET "${a}" loss ${i})
  string(JSON y GET "${b}" loss ${i})
  if(NOT x STREQUAL y)
    message(FATAL_ERROR "step ${i}: mpi loss ${y}, loopback ${x}")
  endif()
  message(STATUS "step ${i}: loss ${x} on both backends")
endforeach()
