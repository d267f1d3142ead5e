// SPDX-License-Identifier: Apache-2.0
// Ring attention merges the blocks' partial outputs through its memory policy: a model::memory_policy
// without the attention operations (no model::attention_memory) is refused at compile time with a message
// that says so. The control build passes model::host_memory and compiles.
#include <cstddef>
#include <span>
#include <vector>

#include <hetmesh/comm/loopback.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/ring_attention.hpp>

// Host memory with the memory operations only.
struct memory_only {
  static constexpr hetmesh::memory_space space = hetmesh::memory_space::host;
  template <class T>
  using buffer = hetmesh::model::host_memory::buffer<T>;
  template <class T>
  void copy(std::span<T> d, std::span<const T> s) const {
    host.copy(d, s);
  }
  template <class T>
  void copy_2d(std::span<T> d, std::size_t dp, std::span<const T> s, std::size_t sp, std::size_t w,
               std::size_t h) const {
    host.copy_2d(d, dp, s, sp, w, h);
  }
  template <class T>
  void fill(std::span<T> d, T v) const {
    host.fill(d, v);
  }
  template <class T>
  void add(std::span<T> d, std::span<const T> s) const {
    host.add(d, s);
  }
  template <class T>
  void upload(std::span<T> d, std::span<const T> s) const {
    host.upload(d, s);
  }
  template <class T>
  void download(std::span<T> d, std::span<const T> s) const {
    host.download(d, s);
  }
  void synchronize() const {}
  hetmesh::model::host_memory host;
};
static_assert(hetmesh::model::memory_policy<memory_only>);

int main() {
  hetmesh::comm::loopback::run(1, [](hetmesh::comm::loopback::communicator& c) {
    const auto s = hetmesh::seq::make_ring_schedule({0}, {{{0, 0, {0, 2}, 0}}});
    hetmesh::model::reference_attention k;
    std::vector<double> q(2), out(2), lse(2);
    const hetmesh::run::ring_attention_input<double> in{{1, 1, 1}, 1.0, q, q, q};
#ifdef HETMESH_COMPILE_FAIL_CONTROL
    hetmesh::model::host_memory mem;
#else
    memory_only mem;
#endif
    hetmesh::run::ring_attention_forward(c, s, k, in, std::span<double>(out), std::span<double>(lse), mem);
  });
}
