// SPDX-License-Identifier: Apache-2.0
// example_mllm_train's --check-parity (report.hpp's check_parity), compiled once for the communicators
// the example runs on: the single-rank reference is a train::system of its own.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/loopback.hpp>
#ifdef HETMESH_EXAMPLE_MPI
#include <hetmesh/comm/mpi.hpp>
#endif

#include "mllm_train/report.hpp"
#include "mllm_train/trainer.hpp"

namespace mllm {

template <class Comm>
int check_parity(Comm& world, const step_result& r, const config& mc, std::uint64_t seed, double tol) {
  std::vector<std::int64_t> ids, sizes;
  std::vector<float> ref;
  if (world.rank() == 0)
    hetmesh::comm::loopback::run(1, [&](hetmesh::comm::loopback::communicator& c) {
      hetmesh::train::system<hetmesh::seq::cp_thd, hetmesh::model::reference_attention,
                             hetmesh::comm::loopback::communicator>
          one({.cp = 1, .pad = true}, c);
      const auto plan = one.plan(*r.batch);
      multimodal_model<float> m(mc, seed, 1, std::vector<int>{0});
      (void)one.run(plan, *r.batch, m.llm, hetmesh::train::sgd<float>{0.0F},
                    hetmesh::train::bind_encoder(m.vision, r.data->input<float>(vision_index)),
                    hetmesh::train::bind_encoder(m.audio, r.data->input<float>(audio_index)));
      for (auto& t : m.tensors()) {
        ids.push_back(t.id);
        sizes.push_back(static_cast<std::int64_t>(t.grad.size()));
        ref.insert(ref.end(), t.grad.begin(), t.grad.end());
      }
    });
  std::int64_t n[2] = {static_cast<std::int64_t>(ids.size()), static_cast<std::int64_t>(ref.size())};
  hetmesh::comm::broadcast(world, std::span<std::int64_t>(n), 0);
  ids.resize(static_cast<std::size_t>(n[0]));
  sizes.resize(static_cast<std::size_t>(n[0]));
  ref.resize(static_cast<std::size_t>(n[1]));
  hetmesh::comm::broadcast(world, std::span<std::int64_t>(ids), 0);
  hetmesh::comm::broadcast(world, std::span<std::int64_t>(sizes), 0);
  hetmesh::comm::broadcast(world, std::span<float>(ref), 0);
  std::map<std::int64_t, std::pair<std::size_t, std::size_t>> at;  // id -> (offset, size)
  for (std::size_t i = 0, off = 0; i < ids.size(); off += static_cast<std::size_t>(sizes[i]), ++i)
    at[ids[i]] = {off, static_cast<std::size_t>(sizes[i])};
  double e[2] = {0, 0};  // max |g - ref|, max |ref|
  for (auto& t : r.model->tensors()) {
    const auto [off, size] = at.at(t.id);
    for (std::size_t i = 0; i < size; ++i) {
      e[0] = std::max(e[0], std::abs(static_cast<double>(t.grad[i]) - ref[off + i]));
      e[1] = std::max(e[1], std::abs(static_cast<double>(ref[off + i])));
    }
  }
  hetmesh::comm::all_reduce(world, std::span<double>(e), hetmesh::comm::reduce_op::max);
  const double rel = e[1] > 0 ? e[0] / e[1] : e[0];
  if (world.rank() == 0)
    std::printf(
        "parity at step %lld: largest gradient error %.3g of the largest gradient (tolerance %.0e): %s\n",
        static_cast<long long>(r.step), rel, tol, rel <= tol ? "ok" : "FAILED");
  return rel <= tol ? 0 : 1;
}

template int check_parity(hetmesh::comm::loopback::communicator&, const step_result&, const config&,
                          std::uint64_t, double);
#ifdef HETMESH_EXAMPLE_MPI
template int check_parity(hetmesh::comm::mpi::communicator&, const step_result&, const config&, std::uint64_t,
                          double);
#endif

}  // namespace mllm
