# SPDX-License-Identifier: Apache-2.0
# example_mllm_train resumed under another layout: an uninterrupted 5-step run at layout A; a run at A
# checkpointing every step, killed with SIGKILL right after step 1; a resume at layout B (tp, pp, pool or
# ZeRO differ: train::restore reshards on load) for steps 2..4. The resumed losses equal the uninterrupted
# run's within 1e-6 relative (the layouts reduce in other orders, so not bit for bit). LAYOUT_A and
# LAYOUT_B are the layouts' flags, space-separated.
# Run by CTest: cmake -DEXE=... -DWORK=dir "-DLAYOUT_A=--tp 2 --pp 2" "-DLAYOUT_B=--pp 1" -P relayout_test.cmake
include("${CMAKE_CURRENT_LIST_DIR}/test_common.cmake")
file(REMOVE_RECURSE "${WORK}")
separate_arguments(a UNIX_COMMAND "${LAYOUT_A}")
separate_arguments(b UNIX_COMMAND "${LAYOUT_B}")
set(common --steps 5 --data-dir "${WORK}/data")  # the example's defaults: --partition hdp --schedule 1f1b --encoder joint
run_or_fail("uninterrupted run at ${LAYOUT_A}" "${EXE}" ${common} ${a} --report "${WORK}/full.json")
execute_process(COMMAND "${EXE}" ${common} ${a} --checkpoint-dir "${WORK}/ckpt" --kill-after 1
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc MATCHES "[Kk]illed|137")
  message(FATAL_ERROR "the run at ${LAYOUT_A} meant to be killed after step 1 ended otherwise: ${rc}")
endif()
file(READ "${WORK}/ckpt/step-00000001/manifest.json" manifest)
string(JSON layout GET "${manifest}" layout)
if(NOT layout MATCHES "^tp [0-9]+ pp [0-9]+ pool [0-9]+ ep [0-9]+ zero [01] ")
  message(FATAL_ERROR "the manifest's layout is '${layout}'; expected the layout of ${LAYOUT_A}")
endif()
message(STATUS "saved under: ${layout}")
run_or_fail("resumed run at ${LAYOUT_B}" "${EXE}" ${common} ${b} --checkpoint-dir "${WORK}/ckpt" --resume
            --report "${WORK}/resumed.json")

# fixed15(<out> <x>): a loss printed as a plain decimal (no exponent) as an integer of 1e-15 units.
function(fixed15 out x)
  if(NOT x MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "loss '${x}': expected a plain positive decimal")
  endif()
  set(whole "${CMAKE_MATCH_1}")
  string(SUBSTRING "${CMAKE_MATCH_3}000000000000000" 0 15 frac)
  string(REGEX REPLACE "^0+([0-9])" "\\1" frac "${frac}")  # no octal reading of leading zeros
  math(EXPR v "${whole} * 1000000000000000 + ${frac}")
  set(${out} ${v} PARENT_SCOPE)
endfunction()

file(READ "${WORK}/full.json" full)
file(READ "${WORK}/resumed.json" resumed)
string(JSON n LENGTH "${resumed}" loss)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "the resumed run reported ${n} steps; expected steps 2, 3 and 4")
endif()
foreach(i RANGE 0 2)
  math(EXPR step "${i} + 2")
  string(JSON x GET "${full}" loss ${step})
  string(JSON y GET "${resumed}" loss ${i})
  fixed15(xi "${x}")
  fixed15(yi "${y}")
  math(EXPR diff "${xi} - ${yi}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  math(EXPR bound "${xi} / 1000000")
  if(diff GREATER bound)
    message(FATAL_ERROR "step ${step}: resumed at ${LAYOUT_B} loss ${y}, uninterrupted at ${LAYOUT_A} ${x}: "
                        "differs by more than 1e-6 relative")
  endif()
  message(STATUS "step ${step}: loss ${x} uninterrupted, ${y} resumed (|diff| ${diff}e-15)")
endforeach()
