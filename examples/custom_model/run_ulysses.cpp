// SPDX-License-Identifier: Apache-2.0
// example_custom_model --layout ulysses: Ulysses sequence parallelism (runs.hpp).
#include "custom_model/layouts.hpp"
#include "custom_model/runs.hpp"

namespace custom {

int run_ulysses(loopback_comm& world, const options& o) {
  return run_layout(world, o, ulysses_layout(), no_pipeline{});
}

}  // namespace custom
