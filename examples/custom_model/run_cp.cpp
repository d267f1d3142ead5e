// SPDX-License-Identifier: Apache-2.0
// example_custom_model --layout cp: static zigzag context parallelism (runs.hpp).
#include "custom_model/layouts.hpp"
#include "custom_model/runs.hpp"

namespace custom {

int run_cp(loopback_comm& world, const options& o) { return run_layout(world, o, kCp, no_pipeline{}); }

}  // namespace custom
