# SPDX-License-Identifier: Apache-2.0
# Runs by `cmake -P` from a compile-fail test (see hetmesh_add_compile_fail_test in tests/CMakeLists.txt).
# Compiles SOURCE with -fsyntax-only; the test passes only when that compile fails AND its output matches
# EXPECT (the message a concept or static_assert gives the user). The control build of the source (with
# -DHETMESH_COMPILE_FAIL_CONTROL, which must succeed, so that the failure is the one the test is about and not
# a typo in the test) is compiled with the other sources of its group by compile_fail_control.cmake.
# With PCH (a header the group's control test precompiled), it force-includes that header (-include) when
# its .gch exists: the failure must still be the source's own, with its message.
# Inputs: CXX, SOURCE, EXPECT, INCLUDES and DEFINES ('|'-separated), PCH (optional).
include("${CMAKE_CURRENT_LIST_DIR}/compile_flags.cmake")
list(APPEND args -fsyntax-only)

if(PCH AND EXISTS "${PCH}.gch")
  list(APPEND args -include "${PCH}")
endif()
execute_process(COMMAND "${CXX}" ${args} "${SOURCE}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "compile-fail: ${SOURCE} compiled, but it must fail with a message matching '${EXPECT}'")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "compile-fail: ${SOURCE} failed, but its output does not match '${EXPECT}':\n${out}")
endif()
message(STATUS "compile-fail: ${SOURCE} fails as expected ('${EXPECT}')")
