# SPDX-License-Identifier: Apache-2.0
# Helpers for hetmesh's own tests, examples, benchmarks and tools (not installed).

# Strict warnings for our own targets only; never on the library's INTERFACE. -Werror only with
# HETMESH_WERROR (ON in every preset and in CI; OFF by default, so that a user's compiler, newer or
# older than the ones CI runs, cannot fail their build over a new diagnostic).
function(hetmesh_strict_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${HETMESH_WERROR}>>:-Werror>)
endfunction()

# Unity build (HETMESH_UNITY_BUILD) for our own targets: a test binary's sources instantiate largely the
# same library templates (planners, collectives, fmt, doctest's expression templates), and at -O3 their
# code generation, not the parse, is most of a translation unit's cost; one translation unit per binary
# generates each instantiation once. Sources that must stay separate take SKIP_UNITY_BUILD_INCLUSION.
function(hetmesh_unity_build target)
  if(HETMESH_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_MODE BATCH UNITY_BUILD_BATCH_SIZE 0)
  endif()
endfunction()

# hetmesh_src_library(OUT LEVEL): the name (in OUT) of a static library holding the library's compiled part
# (tools/common/hetmesh_src.cpp: <hetmesh/src.hpp>) at HETMESH_ASSERTION_LEVEL LEVEL, created on first use.
# A target that links it builds with HETMESH_SEPARATE_COMPILATION=1 and that level (PUBLIC definitions: every
# translation unit of a program must agree on both, config.hpp), so the HETMESH_COMPILED functions are
# compiled once per level rather than in every test binary: a test binary's translation unit compiles in
# about half the time and memory (docs/compile-time.md).
function(hetmesh_src_library out level)
  set(name hetmesh_src_l${level})
  if(NOT TARGET ${name})
    # Not in `all` by itself: built when a binary of `all` links it (a build that leaves the heavy tests
    # out, the asan preset, never compiles the level-3 copy).
    add_library(${name} STATIC EXCLUDE_FROM_ALL "${PROJECT_SOURCE_DIR}/tools/common/hetmesh_src.cpp")
    set_target_properties(${name} PROPERTIES UNITY_BUILD OFF)
    target_compile_definitions(${name} PUBLIC HETMESH_SEPARATE_COMPILATION=1 HETMESH_ASSERTION_LEVEL=${level})
    target_link_libraries(${name} PUBLIC hetmesh::hetmesh)
    hetmesh_strict_warnings(${name})
  endif()
  set(${out} ${name} PARENT_SCOPE)
endfunction()

# hetmesh_link_compiled_part(TARGET ...): each TARGET builds over hetmesh_src_library at the default
# assertion level (the tools and benchmarks: their planners are compiled once, in that library).
function(hetmesh_link_compiled_part)
  hetmesh_src_library(src 1)
  foreach(target IN LISTS ARGN)
    target_link_libraries(${target} PRIVATE ${src})
  endforeach()
endfunction()

# hetmesh_tools_common: the tools' own headers (tools/common/hetmesh_tools: names -> policies, i.e.
# schedule and balancer names, and args.hpp, the one command-line parser of every tool, example and
# benchmark). The library chooses policies by type; tools, and the tests and benchmarks that loop over
# policies by name, link this to map names to them; every program with a command line links it for
# <hetmesh_tools/args.hpp>. Not installed.
if(NOT TARGET hetmesh_tools_common)
  add_library(hetmesh_tools_common INTERFACE)
  target_include_directories(hetmesh_tools_common INTERFACE "${PROJECT_SOURCE_DIR}/tools/common")
  target_link_libraries(hetmesh_tools_common INTERFACE hetmesh::hetmesh)
endif()

# Adds every direct subdirectory of DIR that holds a CMakeLists.txt, in sorted order, so each room
# owns its own CMakeLists.txt and nobody edits a shared list.
function(hetmesh_add_subdirectories dir)
  file(GLOB children RELATIVE "${CMAKE_CURRENT_SOURCE_DIR}/${dir}" "${CMAKE_CURRENT_SOURCE_DIR}/${dir}/*")
  list(SORT children)
  foreach(child IN LISTS children)
    if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/${dir}/${child}/CMakeLists.txt")
      add_subdirectory("${dir}/${child}")
    endif()
  endforeach()
endfunction()

# hetmesh_example(NAME SOURCES ... [LIBS ...]): an example; with the tests on, CTest also runs it
# (label example): examples compile and run in CI.
function(hetmesh_example name)
  hetmesh_executable(${name} ${ARGN})
  if(HETMESH_BUILD_TESTS)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS example TIMEOUT 120)
  endif()
endfunction()

# hetmesh_executable(NAME SOURCES ... [LIBS ...]): an example, benchmark or tool with strict warnings.
function(hetmesh_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE hetmesh::hetmesh ${ARG_LIBS})
  hetmesh_strict_warnings(${name})
  hetmesh_unity_build(${name})
endfunction()

# hetmesh_use_workloads(TARGET): TARGET reads the vendored workload data (tests/data/workloads). It gets
# the folder's absolute path as HETMESH_WORKLOADS_DIR and the project root as HETMESH_SOURCE_DIR (to
# write paths relative to it), so no test or benchmark looks for data outside the checkout.
function(hetmesh_use_workloads target)
  target_compile_definitions(${target} PRIVATE
    HETMESH_WORKLOADS_DIR="${PROJECT_SOURCE_DIR}/tests/data/workloads"
    HETMESH_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endfunction()
