# SPDX-License-Identifier: Apache-2.0
# example_mllm_train's outputs fail loudly (issue 37): --report onto a device or a folder and --out onto a
# file are refused before the run (exit 2, each within 5 s); an --out file that cannot be written (a folder
# in its place) ends the run non-zero naming the path, and an earlier --report file of the same name is left
# as it was. Run by CTest: cmake -DEXE=... -DWORK=dir -P outputs_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/a-folder" "${WORK}/out/timeline_measured.svg")
file(WRITE "${WORK}/report.json" "earlier report")
function(expect_refused what expect_rc pattern)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND "${EXE}" --steps 2 --data-dir "${WORK}/data" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  string(TIMESTAMP t1 "%s")
  math(EXPR took "${t1} - ${t0}")
  if(NOT rc EQUAL ${expect_rc} OR NOT "${err}" MATCHES "${pattern}")
    message(FATAL_ERROR "${what}: exit ${rc}, expected ${expect_rc} and a line matching '${pattern}':\n${out}${err}")
  endif()
  if(expect_rc EQUAL 2 AND took GREATER 5)
    message(FATAL_ERROR "${what}: refused after ${took} s; expected before the run (within 5 s)")
  endif()
  message(STATUS "${what}: exit ${rc} in ${took} s")
endfunction()
expect_refused("--report onto /dev/full" 2 "--report '/dev/full': it is a character device" --report /dev/full)
expect_refused("--report onto a folder" 2 "it is a directory" --report "${WORK}/a-folder")
expect_refused("--out onto a file" 2 "--out '.*report.json' exists and is not a directory"
               --out "${WORK}/report.json")
expect_refused("--out with a folder where a file goes" 3 "timeline_measured.svg': it is a directory"
               --out "${WORK}/out" --report "${WORK}/report.json")
file(READ "${WORK}/report.json" kept)
if(NOT kept STREQUAL "earlier report")
  message(FATAL_ERROR "the earlier --report file changed after a failed run: '${kept}'")
endif()
