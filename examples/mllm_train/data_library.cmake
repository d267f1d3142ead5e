# SPDX-License-Identifier: Apache-2.0
# mllm_train_data: the mllm_train example's data (data.hpp; the bodies in data.cpp, compiled once) and the
# library's compiled part (hetmesh_src_library at the default assertion level: every program that links
# this builds with HETMESH_SEPARATE_COMPILATION=1, so the planners are compiled once, not in each
# translation unit), shared
# by example_mllm_train, example_mllm_train_gpu and tests/mllm. Included by whichever of them CMake reads
# first (tests come before examples, and a preset may build tests without examples).
if(NOT TARGET mllm_train_data)
  add_library(mllm_train_data STATIC "${CMAKE_CURRENT_LIST_DIR}/data.cpp")
  set_target_properties(mllm_train_data PROPERTIES UNITY_BUILD OFF)
  hetmesh_src_library(mllm_train_src 1)
  target_link_libraries(mllm_train_data PUBLIC ${mllm_train_src} hetmesh_tools_common)  # options.hpp: the one parser
  target_include_directories(mllm_train_data PUBLIC "${PROJECT_SOURCE_DIR}/examples")
  hetmesh_strict_warnings(mllm_train_data)
endif()
