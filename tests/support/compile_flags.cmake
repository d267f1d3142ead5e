# SPDX-License-Identifier: Apache-2.0
# Included by compile_fail.cmake and compile_fail_control.cmake (both run by `cmake -P`): sets `args` to
# -std=c++20 and the -I / -D flags of INCLUDES and DEFINES ('|'-separated lists, empty entries skipped).
string(REPLACE "|" ";" includes "${INCLUDES}")
string(REPLACE "|" ";" defines "${DEFINES}")
set(args -std=c++20)
foreach(dir IN LISTS includes)
  if(dir)
    list(APPEND args "-I${dir}")
  endif()
endforeach()
foreach(def IN LISTS defines)
  if(def)
    list(APPEND args "-D${def}")
  endif()
endforeach()
