# SPDX-License-Identifier: Apache-2.0
# cmake -DSOURCE_DIR=.. -DBINARY_DIR=.. -DPREFIX=.. -DGENERATOR=.. -DCXX_COMPILER=.. [-DCUDA_COMPILER=..]
#       -DWITH_MPI=ON|OFF -DWITH_NCCL=ON|OFF -P configure_only_install.cmake
# Configures hetmesh into a fresh BINARY_DIR with its defaults (tools, tests, examples on), then runs
# `cmake --install` into a fresh PREFIX without building anything: what a user who only wants the
# headers and the package does. Checks the install holds the package, the headers and the licence.
foreach(var IN ITEMS SOURCE_DIR BINARY_DIR PREFIX GENERATOR CXX_COMPILER WITH_MPI WITH_NCCL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "configure_only_install.cmake: ${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${BINARY_DIR}" "${PREFIX}")
set(options -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
            "-DHETMESH_WITH_MPI=${WITH_MPI}" "-DHETMESH_WITH_NCCL=${WITH_NCCL}")
if(CUDA_COMPILER)
  list(APPEND options "-DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}")
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configure_only_install.cmake: ${what} failed (${rc})")
  endif()
endfunction()
run(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}" ${options})
run(install "${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${PREFIX}")

foreach(file IN ITEMS include/hetmesh/hetmesh.hpp share/cmake/hetmesh/hetmeshConfig.cmake
                      share/cmake/hetmesh/hetmeshConfigVersion.cmake share/cmake/hetmesh/hetmeshTargets.cmake
                      share/doc/hetmesh/LICENSE)
  if(NOT EXISTS "${PREFIX}/${file}")
    message(FATAL_ERROR "configure_only_install.cmake: ${PREFIX}/${file} was not installed")
  endif()
endforeach()
foreach(comp IN ITEMS mpi nccl)
  string(TOUPPER "${comp}" COMP)
  if(WITH_${COMP} AND NOT EXISTS "${PREFIX}/share/cmake/hetmesh/hetmesh_${comp}Targets.cmake")
    message(FATAL_ERROR "configure_only_install.cmake: the ${comp} component's targets were not installed")
  endif()
endforeach()
message(STATUS "configure_only_install.cmake: installed ${BINARY_DIR} (configured, not built) into ${PREFIX}")
