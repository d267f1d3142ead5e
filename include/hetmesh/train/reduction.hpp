// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: where train::system's buffers live. The memory policy it uses when none is named
// (default_memory), and the step's reductions through a policy: gradients summed over ranks in the
// policy's memory (the backend's all-reduce, or in rank order), the step's host-side stats summed through a
// device buffer when the communicator takes device memory, and device values read on the host.
#pragma once

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/communicator.hpp"
#include "../comm/emulated_device.hpp"
#include "../core/memory_space.hpp"
#include "../model/host_memory.hpp"

namespace hetmesh::train {

/// The memory policy train::system uses over communicator Comm when none is named: model::host_memory for a
/// host communicator, model::emulated_device_memory for comm::emulated_device, none (void) for other device
/// communicators, which name theirs (cuda::device_memory on the communicator's stream for NCCL).
template <class Comm>
struct default_memory {
  using type = void;  ///< none: a device communicator names its policy
};
/// Host communicators: host memory.
template <comm::host_communicator Comm>
struct default_memory<Comm> {
  using type = model::host_memory;  ///< the host policy
};
/// The emulated device: its memory policy.
template <class Host>
struct default_memory<comm::emulated_device<Host>> {
  using type = model::emulated_device_memory;  ///< the emulated device policy
};
/// default_memory<Comm>::type.
template <class Comm>
using default_memory_t = typename default_memory<Comm>::type;

/// x (memory of M) = the sum of x over c's ranks: the backend's all-reduce, or, when `in_rank_order`, an
/// all-gather into a buffer of M and then rank 0 + rank 1 + ... element by element through M (bitwise the
/// same on every backend and memory). Collective over c. Cost: one all-reduce, or one all-gather of c.size()
/// x x.size() elements and c.size() - 1 adds.
template <comm::communicator C, model::memory_policy M, class U>
void sum_over_ranks(C& c, const M& mem, std::span<U> x, bool in_rank_order) {
  if (!in_rank_order) {
    comm::all_reduce(c, x, comm::reduce_op::sum);
    return;
  }
  const std::size_t m = x.size(), n = static_cast<std::size_t>(c.size());
  typename M::template buffer<U> all;
  all.resize(m * n);
  comm::all_gather(c, std::span<const U>(x), all.span());
  const std::span<const U> every = std::as_const(all).span();
  mem.copy(x, every.first(m));
  for (std::size_t r = 1; r < n; ++r) mem.add(x, every.subspan(r * m, m));
}

/// x (host memory) = the sum of x over c's ranks (sum_over_ranks), through a buffer of M when M is device
/// memory (upload, sum, download; the communicator synchronised before the download). Collective over c.
template <comm::communicator C, model::memory_policy M, class U>
void sum_host_values_over_ranks(C& c, const M& mem, std::span<U> x, bool in_rank_order) {
  if constexpr (M::space == memory_space::host) {
    sum_over_ranks(c, mem, x, in_rank_order);
  } else {
    typename M::template buffer<U> d;
    d.resize(x.size());
    mem.upload(d.span(), std::span<const U>(x));
    sum_over_ranks(c, mem, d.span(), in_rank_order);
    if constexpr (requires { c.synchronize(); }) c.synchronize();
    mem.download(x, std::span<const U>(d.span()));
  }
}

/// `x` (memory of M) readable on the host: the span itself for host memory, else a downloaded copy (a
/// std::vector). Not collective.
template <model::memory_policy M, class U>
auto readable_on_host(const M& mem, std::span<const U> x) {
  if constexpr (M::space == memory_space::host) {
    return x;
  } else {
    std::vector<U> h(x.size());
    mem.download(std::span<U>(h), x);
    return h;
  }
}

/// Whether backbone stage S holds expert parameters apart from its dense ones (the optional members
/// `expert_parameters()` and `expert_gradients()`, ranges of spans like parameters() and gradients()):
/// train::system reduces them over the ranks holding the same experts (Megatron's expert data-parallel
/// group) instead of the pool, and steps them with the optimizer too.
template <class S>
concept has_expert_parameters = requires(S& s) {
  s.expert_parameters();
  s.expert_gradients();
};

}  // namespace hetmesh::train
