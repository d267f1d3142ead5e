# SPDX-License-Identifier: Apache-2.0
# Helpers of the example's CTest scripts (mpi_test.cmake, resume_test.cmake, hosts_test.cmake), run with cmake -P.

# run_or_fail(<what> <command> [args...]): runs the command; a non-zero exit fails the test, naming <what>.
function(run_or_fail what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed: ${rc}")
  endif()
endfunction()

# expect_equal_losses(<a.json> <a's first step> <b.json> <b's first step> <steps> <a's name> <b's name>):
# the `loss` entries of two --report files agree bit for bit (as printed) over <steps> consecutive steps.
function(expect_equal_losses a_file a_first b_file b_first steps a_name b_name)
  file(READ "${a_file}" a)
  file(READ "${b_file}" b)
  math(EXPR last "${steps} - 1")
  foreach(i RANGE 0 ${last})
    math(EXPR ia "${a_first} + ${i}")
    math(EXPR ib "${b_first} + ${i}")
    string(JSON x GET "${a}" loss ${ia})
    string(JSON y GET "${b}" loss ${ib})
    if(NOT x STREQUAL y)
      message(FATAL_ERROR "step ${ia}: ${b_name} loss ${y}, ${a_name} ${x}")
    endif()
    message(STATUS "step ${ia}: loss ${x}, ${a_name} and ${b_name}")
  endforeach()
endfunction()
