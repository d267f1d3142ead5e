// SPDX-License-Identifier: Apache-2.0
// Ring attention test bodies, one per rank, for any host communicator: loopback threads in test_run and
// mpirun processes in test_run_mpi (8 ranks each). Every input value is a pure function of (seed,
// field, document, position, head, dim), so each rank builds its own tokens and, independently, the
// single-rank reference of every document it holds (full causal attention of the whole document in
// double, on the same values rounded to T). Errors are max |got - ref| and max |ref| per quantity,
// reduced (max) over the world, so every rank sees the same verdict; rows are counted (sum) so that
// every real token is checked exactly once. With `device`, each rank also runs the same rings over
// comm::emulated_device and model::emulated_device_memory (the device path on CPUs) and counts the
// elements that differ from the host run, bit for bit, and the kernel calls that got a host tensor.
#pragma once

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <hetmesh/balance/bytescale.hpp>
#include <hetmesh/comm/collectives.hpp>
#include <hetmesh/comm/emulated_device.hpp>
#include <hetmesh/core/memory_space.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/host_memory.hpp>
#include <hetmesh/model/reference_attention.hpp>
#include <hetmesh/run/ring_attention.hpp>
#include <hetmesh/seq/attention_merge.hpp>
#include <hetmesh/seq/ring.hpp>

namespace ringtest {

using namespace hetmesh;

constexpr int kHeads = 4, kKvHeads = 2, kDim = 8;  // GQA: two query heads per KV head
inline constexpr model::attention_shape kShape{kHeads, kKvHeads, kDim};

enum field : std::uint64_t { fq = 1, fk = 2, fv = 3, fdout = 4, fpad = 5 };

/// A verifiable value in [-1, 1): a pure function of its keys (never a run of zeros).
inline double value(std::uint64_t seed, field f, std::int64_t doc, std::int64_t pos, int head, int e) {
  const auto k = key_hash({seed, f, static_cast<std::uint64_t>(doc), static_cast<std::uint64_t>(pos),
                           static_cast<std::uint64_t>(head), static_cast<std::uint64_t>(e)});
  return static_cast<double>(k >> 11) * 0x1.0p-52 - 1.0;
}

/// The value of (field, doc, pos, head, e) as the ring sees it: rounded to T. Tokens past the
/// document's length are padding (THD pads each document at its end): their own values, and a zero
/// output gradient (they carry no loss, as TransformerEngine's label -100).
template <class T>
T input(std::uint64_t seed, field f, std::int64_t doc, std::int64_t pos, std::int64_t len, int head, int e) {
  if (pos < len) return static_cast<T>(value(seed, f, doc, pos, head, e));
  if (f == fdout) return T(0);
  return static_cast<T>(value(seed ^ 0x9e3779b97f4a7c15ULL, f, doc, pos, head, e));
}

/// Single-rank full causal attention of one whole document, in double, on the T-rounded inputs.
struct doc_ref {
  std::vector<double> out, lse, dq, dk, dv;
};

template <class T>
doc_ref reference(std::uint64_t seed, std::int64_t doc, std::int64_t len) {
  const auto n = static_cast<std::size_t>(len);
  std::vector<double> q(n * kHeads * kDim), k(n * kKvHeads * kDim), v(k.size()), dout(q.size());
  for (std::int64_t t = 0; t < len; ++t) {
    for (int h = 0; h < kHeads; ++h)
      for (int e = 0; e < kDim; ++e) {
        const auto i = static_cast<std::size_t>((t * kHeads + h) * kDim + e);
        q[i] = static_cast<double>(input<T>(seed, fq, doc, t, len, h, e));
        dout[i] = static_cast<double>(input<T>(seed, fdout, doc, t, len, h, e));
      }
    for (int h = 0; h < kKvHeads; ++h)
      for (int e = 0; e < kDim; ++e) {
        const auto i = static_cast<std::size_t>((t * kKvHeads + h) * kDim + e);
        k[i] = static_cast<double>(input<T>(seed, fk, doc, t, len, h, e));
        v[i] = static_cast<double>(input<T>(seed, fv, doc, t, len, h, e));
      }
  }
  std::vector<std::int64_t> docs(n, doc), pos(n);
  for (std::size_t t = 0; t < n; ++t) pos[t] = static_cast<std::int64_t>(t);
  model::attention_block<double> b{
      kShape, q, k, v, docs, pos, docs, pos, seq::block_mask::causal, 1.0 / std::sqrt(double(kDim))};
  doc_ref r;
  r.out.resize(q.size());
  r.lse.resize(n * kHeads);
  model::reference_attention kernel;
  kernel.forward(b, {r.out, r.lse});
  std::vector<double> delta(r.lse.size());
  seq::attention_delta(std::span<const double>(r.out), std::span<const double>(dout),
                       std::span<double>(delta), std::size_t{kDim});
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(k.size(), 0.0);
  kernel.backward(b, {dout, r.lse, delta, r.dq, r.dk, r.dv});
  return r;
}

/// A kernel that checks what the library hands it, then calls the reference kernel: never a block
/// with mask none; a block marked full has every same-document key at or before every query; every
/// block has at least one visible (query, key) pair (no wasted call). Counts calls.
struct checking_kernel {
  model::reference_attention inner;
  std::int64_t forward_calls = 0, backward_calls = 0, bad_blocks = 0;

  template <class T>
  void check(const model::attention_block<T>& b) {
    bool any = false, bad = b.mask == seq::block_mask::none;
    for (std::size_t i = 0; i < b.q_doc.size(); ++i)
      for (std::size_t j = 0; j < b.k_doc.size(); ++j) {
        if (b.q_doc[i] != b.k_doc[j]) continue;
        if (b.k_pos[j] <= b.q_pos[i])
          any = true;
        else if (b.mask == seq::block_mask::full)
          bad = true;  // a full block would let this query see a later key
      }
    if (bad || !any) ++bad_blocks;
  }
  template <class T>
  void forward(const model::attention_block<T>& b, model::attention_forward_out<T> o) {
    check(b);
    ++forward_calls;
    inner.forward(b, o);
  }
  template <class T>
  void backward(const model::attention_block<T>& b, model::attention_backward_io<T> io) {
    check(b);
    ++backward_calls;
    inner.backward(b, io);
  }
};
static_assert(model::attention_kernel<checking_kernel, double>);
static_assert(model::attention_kernel<checking_kernel, float>);

/// The kernel of the device path: checks that every tensor of a call is an emulated device pointer and
/// the per-token metadata host memory (counting the calls that break either), maps the tensors back to
/// host memory (emulated::to_host, which refuses a host pointer) and runs checking_kernel on them.
struct emulated_device_kernel {
  checking_kernel inner;
  std::int64_t misplaced = 0;  ///< calls with a host tensor or device metadata

  template <class T>
  static bool on_device(std::span<T> s) {
    return s.empty() || emulated::is_device_pointer(s.data());
  }
  template <class T>
  static bool on_host(std::span<T> s) {
    return s.empty() || !emulated::is_device_pointer(s.data());
  }
  template <class T>
  static std::span<T> host(std::span<T> s) {
    return emulated::to_host(s, "emulated_device_kernel");
  }
  template <class T>
  bool check(const model::attention_block<T>& b) {
    return on_device(b.q) && on_device(b.k) && on_device(b.v) && on_host(b.q_doc) && on_host(b.q_pos) &&
           on_host(b.k_doc) && on_host(b.k_pos);
  }
  template <class T>
  static model::attention_block<T> host_block(const model::attention_block<T>& b) {
    auto h = b;
    h.q = host(b.q);
    h.k = host(b.k);
    h.v = host(b.v);
    return h;
  }
  template <class T>
  void forward(const model::attention_block<T>& b, model::attention_forward_out<T> o) {
    if (!check(b) || !on_device(o.out) || !on_device(o.lse)) ++misplaced;
    inner.forward(host_block(b), model::attention_forward_out<T>{host(o.out), host(o.lse)});
  }
  template <class T>
  void backward(const model::attention_block<T>& b, model::attention_backward_io<T> io) {
    if (!check(b) || !on_device(io.dout) || !on_device(io.lse) || !on_device(io.delta) || !on_device(io.dq) ||
        !on_device(io.dk) || !on_device(io.dv))
      ++misplaced;
    inner.backward(host_block(b), model::attention_backward_io<T>{host(io.dout), host(io.lse), host(io.delta),
                                                                  host(io.dq), host(io.dk), host(io.dv)});
  }
};
static_assert(model::attention_kernel<emulated_device_kernel, double>);
static_assert(model::attention_kernel<emulated_device_kernel, float>);

/// Max errors and reference magnitudes per quantity, and rows checked, reduced over the world.
struct verdict {
  double num[5] = {0, 0, 0, 0, 0};  ///< max |got - ref|: out, lse, dq, dk, dv
  double den[5] = {0, 0, 0, 0, 0};  ///< max |ref|
  std::int64_t rows = 0;            ///< real tokens checked (sum over ranks)
  std::int64_t bad_calls = 0;       ///< kernel calls on wrong blocks, or call counts off the schedule
  std::int64_t rings = 0;           ///< rings of more than one rank run (sum over ranks of ring positions)
  // The device path (run_rings with device = true), summed over ranks:
  std::int64_t device_ranks = 0;      ///< ranks that ran it
  std::int64_t device_diffs = 0;      ///< elements of out, lse, dq, dk, dv not bitwise equal to the host run
  std::int64_t device_elements = 0;   ///< elements compared
  std::int64_t device_misplaced = 0;  ///< kernel calls with a host tensor or device metadata
  std::int64_t device_bad = 0;        ///< kernel calls on wrong blocks, or call counts off the schedule

  double rel(int i) const { return den[i] > 0 ? num[i] / den[i] : num[i]; }
  double worst() const {
    double w = 0;
    for (int i = 0; i < 5; ++i) w = std::max(w, rel(i));
    return w;
  }
  /// Bitwise equal errors: the same results, up to the (vanishing) chance of equal maxima by accident.
  bool same_as(const verdict& o) const {
    for (int i = 0; i < 5; ++i)
      if (num[i] != o.num[i] || den[i] != o.den[i]) return false;
    return rows == o.rows && bad_calls == o.bad_calls;
  }
  std::string describe() const {
    return fmt::format(
        "rel err out {:.3g}, lse {:.3g}, dq {:.3g}, dk {:.3g}, dv {:.3g}; {} rows, {} bad calls", rel(0),
        rel(1), rel(2), rel(3), rel(4), rows, bad_calls);
  }
};

/// Checks a verdict: worst relative error within `tol`, `rows` rows checked, no kernel call off the
/// schedule; prints it with `what`.
inline void check_verdict(const verdict& v, double tol, std::int64_t rows, const char* what) {
  const std::string msg = std::string(what) + ": " + v.describe();
  MESSAGE(msg);
  CHECK(v.worst() <= tol);
  CHECK(v.rows == rows);
  CHECK(v.bad_calls == 0);
}

/// Checks the device run of a verdict: `ranks` ranks ran it, every element compared equals the host
/// run's bit for bit, and every kernel call got device tensors and host metadata, on the right blocks.
inline void check_device(const verdict& v, std::int64_t ranks, const char* what) {
  const std::string msg = fmt::format(
      "{}: device path on {} ranks, {} elements compared, {} differ; {} kernel "
      "calls with misplaced memory",
      what, v.device_ranks, v.device_elements, v.device_diffs, v.device_misplaced);
  MESSAGE(msg);
  CHECK(v.device_ranks == ranks);
  CHECK(v.device_elements > 0);
  CHECK(v.device_diffs == 0);
  CHECK(v.device_misplaced == 0);
  CHECK(v.device_bad == 0);
}

/// One ring position's buffers.
template <class T>
struct position_io {
  std::vector<T> q, k, v, dout, out, lse, dq, dk, dv;
  run::ring_token_meta meta;
};

/// Builds the inputs of position p of `s`; `lengths` maps a chunk's doc to its real length.
template <class T>
position_io<T> make_io(const seq::ring_schedule& s, int p,
                       const std::map<std::int64_t, std::int64_t>& lengths, std::uint64_t seed) {
  position_io<T> io;
  io.meta = run::ring_meta(s, p);
  const auto n = io.meta.doc.size();
  io.q.resize(n * kHeads * kDim);
  io.dout.resize(io.q.size());
  io.k.resize(n * kKvHeads * kDim);
  io.v.resize(io.k.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto doc = io.meta.doc[i], pos = io.meta.pos[i], len = lengths.at(doc);
    for (int h = 0; h < kHeads; ++h)
      for (int e = 0; e < kDim; ++e) {
        io.q[(i * kHeads + h) * kDim + e] = input<T>(seed, fq, doc, pos, len, h, e);
        io.dout[(i * kHeads + h) * kDim + e] = input<T>(seed, fdout, doc, pos, len, h, e);
      }
    for (int h = 0; h < kKvHeads; ++h)
      for (int e = 0; e < kDim; ++e) {
        io.k[(i * kKvHeads + h) * kDim + e] = input<T>(seed, fk, doc, pos, len, h, e);
        io.v[(i * kKvHeads + h) * kDim + e] = input<T>(seed, fv, doc, pos, len, h, e);
      }
  }
  io.out.resize(io.q.size());
  io.lse.resize(n * kHeads);
  io.dq.resize(io.q.size());
  io.dk.resize(io.k.size());
  io.dv.resize(io.k.size());
  return io;
}

template <class T>
run::ring_attention_input<T> input_of(const position_io<T>& io) {
  return {kShape, static_cast<T>(1.0 / std::sqrt(double(kDim))), io.q, io.k, io.v};
}

/// Compares a position's results with the references of its documents (real tokens only).
template <class T>
void compare(const position_io<T>& io, const std::map<std::int64_t, std::int64_t>& lengths,
             std::uint64_t seed, std::map<std::int64_t, doc_ref>& refs, verdict& v) {
  auto upd = [&](int qi, double got, double ref) {
    v.num[qi] = std::max(v.num[qi], std::abs(got - ref));
    v.den[qi] = std::max(v.den[qi], std::abs(ref));
  };
  for (std::size_t i = 0; i < io.meta.doc.size(); ++i) {
    const auto doc = io.meta.doc[i], pos = io.meta.pos[i], len = lengths.at(doc);
    if (pos >= len) continue;
    auto it = refs.find(doc);
    if (it == refs.end()) it = refs.emplace(doc, reference<T>(seed, doc, len)).first;
    const auto& r = it->second;
    const auto t = static_cast<std::size_t>(pos);
    for (std::size_t j = 0; j < std::size_t{kHeads}; ++j) {
      upd(1, static_cast<double>(io.lse[i * kHeads + j]), r.lse[t * kHeads + j]);
      for (std::size_t e = 0; e < std::size_t{kDim}; ++e) {
        upd(0, static_cast<double>(io.out[(i * kHeads + j) * kDim + e]), r.out[(t * kHeads + j) * kDim + e]);
        upd(2, static_cast<double>(io.dq[(i * kHeads + j) * kDim + e]), r.dq[(t * kHeads + j) * kDim + e]);
      }
    }
    for (std::size_t j = 0; j < std::size_t{kKvHeads}; ++j)
      for (std::size_t e = 0; e < std::size_t{kDim}; ++e) {
        upd(3, static_cast<double>(io.dk[(i * kKvHeads + j) * kDim + e]),
            r.dk[(t * kKvHeads + j) * kDim + e]);
        upd(4, static_cast<double>(io.dv[(i * kKvHeads + j) * kDim + e]),
            r.dv[(t * kKvHeads + j) * kDim + e]);
      }
    ++v.rows;
  }
}

/// Pairs position p of `s` computes: the kernel calls forward (and backward) must make.
inline std::int64_t pairs_of(const seq::ring_schedule& s, int p) {
  std::int64_t n = 0;
  for (const auto& st : s.steps[static_cast<std::size_t>(p)]) n += static_cast<std::int64_t>(st.pairs.size());
  return n;
}

/// Reduces a rank's verdict over the world: max errors, summed counts.
template <class C>
verdict reduce(C& world, verdict v) {
  comm::all_reduce(world, std::span<double>(v.num), comm::reduce_op::max);
  comm::all_reduce(world, std::span<double>(v.den), comm::reduce_op::max);
  std::int64_t counts[8] = {v.rows,
                            v.bad_calls,
                            v.rings,
                            v.device_ranks,
                            v.device_diffs,
                            v.device_elements,
                            v.device_misplaced,
                            v.device_bad};
  comm::all_reduce(world, std::span<std::int64_t>(counts), comm::reduce_op::sum);
  v.rows = counts[0];
  v.bad_calls = counts[1];
  v.rings = counts[2];
  v.device_ranks = counts[3];
  v.device_diffs = counts[4];
  v.device_elements = counts[5];
  v.device_misplaced = counts[6];
  v.device_bad = counts[7];
  return v;
}

/// Elements of `a` and `b` (equal sizes) whose bits differ.
template <class T>
std::int64_t bit_diffs(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return static_cast<std::int64_t>(std::max(a.size(), b.size()));
  std::int64_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0 ? 1 : 0;
  return n;
}

/// Runs the rings `mine` (this rank's positions of them, in the common order) again on the device path:
/// comm::emulated_device over a split of `world` and model::emulated_device_memory, with every tensor
/// uploaded to emulated device buffers and the results downloaded; counts into `v` the elements that
/// differ from the host run `host`, the kernel calls with misplaced memory and calls off the schedule.
/// Collective over `world`.
template <class T, class C>
void device_run(C& world, const std::vector<const seq::ring_schedule*>& mine, const std::vector<int>& pos,
                const std::vector<position_io<T>>& host, bool overlap, verdict& v) {
  auto sub = comm::split(world, 0, world.rank());
  comm::emulated_device<decltype(sub)> dev(std::move(sub));
  model::emulated_device_memory mem;
  using buffer = model::emulated_device_memory::buffer<T>;
  enum slot : std::size_t { sq, sk, sv, sdout, sout, slse, sdq, sdk, sdv, slots };
  std::vector<std::array<buffer, slots>> b(mine.size());
  std::vector<run::ring_forward_task<T>> fw;
  std::vector<run::ring_backward_task<T>> bw;
  auto up = [&](buffer& d, const std::vector<T>& h) {
    d.resize(h.size());
    mem.upload(d.span(), std::span<const T>(h));
  };
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const auto& io = host[i];
    auto& d = b[i];
    up(d[sq], io.q);
    up(d[sk], io.k);
    up(d[sv], io.v);
    up(d[sdout], io.dout);
    for (auto [s, n] :
         {std::pair{sout, io.out.size()}, std::pair{slse, io.lse.size()}, std::pair{sdq, io.dq.size()},
          std::pair{sdk, io.dk.size()}, std::pair{sdv, io.dv.size()}})
      d[s].resize(n);
    const run::ring_attention_input<T> in{kShape, static_cast<T>(1.0 / std::sqrt(double(kDim))),
                                          std::span<const T>(d[sq].span()), std::span<const T>(d[sk].span()),
                                          std::span<const T>(d[sv].span())};
    fw.push_back({mine[i], in, d[sout].span(), d[slse].span()});
    bw.push_back({mine[i], in, std::span<const T>(d[sout].span()), std::span<const T>(d[slse].span()),
                  std::span<const T>(d[sdout].span()), d[sdq].span(), d[sdk].span(), d[sdv].span()});
  }
  emulated_device_kernel kernel;
  const run::ring_attention_options opt{.overlap = overlap};
  run::ring_attention_forward_all(dev, fw, kernel, mem, opt);
  run::ring_attention_backward_all(dev, bw, kernel, mem, opt);
  std::int64_t expected = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto down = [&](buffer& d) {
      std::vector<T> h(d.size());
      mem.download(std::span<T>(h), std::span<const T>(d.span()));
      return h;
    };
    const auto& io = host[i];
    auto& d = b[i];
    v.device_diffs += bit_diffs(down(d[sout]), io.out) + bit_diffs(down(d[slse]), io.lse) +
                      bit_diffs(down(d[sdq]), io.dq) + bit_diffs(down(d[sdk]), io.dk) +
                      bit_diffs(down(d[sdv]), io.dv);
    v.device_elements +=
        static_cast<std::int64_t>(io.out.size() + io.lse.size() + io.dq.size() + io.dk.size() + io.dv.size());
    expected += pairs_of(*mine[i], pos[i]);
  }
  v.device_ranks = 1;
  v.device_misplaced = kernel.misplaced;
  v.device_bad = kernel.inner.bad_blocks + (kernel.inner.forward_calls != expected) +
                 (kernel.inner.backward_calls != expected);
}

/// Runs a sequence of rings (in the given order, the same on every rank) forward then backward with
/// the multi-ring entry, on the ranks of `world` that belong to them, and checks every position held
/// here against the single-rank reference; with `device`, also on the device path (device_run), compared
/// bit for bit with the host run. Collective over `world`.
template <class T, class C>
verdict run_rings(C& world, const std::vector<const seq::ring_schedule*>& rings,
                  const std::map<std::int64_t, std::int64_t>& lengths, std::uint64_t seed, bool overlap,
                  bool device = false) {
  std::vector<position_io<T>> ios;
  std::vector<const seq::ring_schedule*> mine;
  std::vector<int> pos;
  for (const auto* s : rings) {
    const int p = run::ring_position(*s, world.rank());
    if (p < 0) continue;
    mine.push_back(s);
    pos.push_back(p);
  }
  ios.reserve(mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) ios.push_back(make_io<T>(*mine[i], pos[i], lengths, seed));
  std::vector<run::ring_forward_task<T>> fw;
  std::vector<run::ring_backward_task<T>> bw;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto& io = ios[i];
    fw.push_back({mine[i], input_of(io), io.out, io.lse});
    bw.push_back({mine[i], input_of(io), io.out, io.lse, io.dout, io.dq, io.dk, io.dv});
  }
  checking_kernel kernel;
  const run::ring_attention_options opt{.overlap = overlap};
  run::ring_attention_forward_all(world, fw, kernel, opt);
  run::ring_attention_backward_all(world, bw, kernel, opt);
  verdict v;
  std::map<std::int64_t, doc_ref> refs;
  std::int64_t expected = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    compare(ios[i], lengths, seed, refs, v);
    expected += pairs_of(*mine[i], pos[i]);
    if (mine[i]->size() > 1) ++v.rings;
  }
  v.bad_calls = kernel.bad_blocks + (kernel.forward_calls != expected) + (kernel.backward_calls != expected);
  if (device) device_run<T>(world, mine, pos, ios, overlap, v);
  return reduce(world, v);
}

/// One CP ring over `ring` (ranks of world): the partition's shards at its positions.
template <class T, class C>
verdict run_partition(C& world, const seq::cp_partition& part, std::vector<int> ring,
                      std::span<const std::int64_t> lengths, std::uint64_t seed, bool overlap,
                      bool device = false) {
  const auto s = seq::ring_for(part, std::move(ring));
  std::map<std::int64_t, std::int64_t> lens;
  for (std::size_t d = 0; d < lengths.size(); ++d) lens[static_cast<std::int64_t>(d)] = lengths[d];
  return run_rings<T>(world, {&s}, lens, seed, overlap, device);
}

/// Zigzag CP (Megatron-LM's split) of one 96-token sequence over all 8 ranks, in a shuffled ring order.
template <class T, class C>
verdict zigzag_body(C& world, bool overlap = false, bool device = false) {
  const std::int64_t len[1] = {96};
  return run_partition<T>(world, seq::partition_zigzag(96, 8), {3, 0, 5, 1, 7, 2, 6, 4}, len, 11, overlap,
                          device);
}

/// THD-packed documents (TransformerEngine's per-document split, padded to multiples of 2cp) over a
/// ring of 4 of the 8 ranks: the other ranks hold nothing and take no part.
template <class T, class C>
verdict thd_body(C& world, bool overlap = false, bool device = false) {
  const std::int64_t lens[6] = {7, 11, 5, 20, 1, 30};
  return run_partition<T>(world, seq::partition_thd(lens, 4, true), {6, 1, 4, 3}, lens, 23, overlap, device);
}

/// A ring of one rank (rank 5 of the 8; the others take no part): THD-packed documents held whole, so the
/// call only runs the kernel and the merges, without communication.
template <class T, class C>
verdict single_body(C& world, bool overlap = false, bool device = false) {
  const std::int64_t lens[4] = {9, 3, 17, 6};
  return run_partition<T>(world, seq::partition_thd(lens, 1, true), {5}, lens, 31, overlap, device);
}

/// Who places the HDP items: seq::plan_hdp's two placements, or balance's ByteScale planner (Alg. 2).
enum class planner { waves, least_loaded, bytescale };

/// A seeded random batch and its HDP plan over the pool of 8.
struct hdp_case {
  std::vector<seq::seq_desc> seqs;
  seq::hdp_plan plan;
  std::map<std::int64_t, std::int64_t> lengths;
};

inline hdp_case make_hdp_case(std::uint64_t seed, planner who) {
  hdp_case h;
  rng g(seed);
  for (std::int64_t i = 0; i < 14; ++i) {
    const auto len = static_cast<std::int64_t>(g.uniform(1, 110));
    h.seqs.push_back({100 + i, len});
    h.lengths[100 + i] = len;
  }
  const seq::hdp_policy policy{.capacity = 24,
                               .placement = who == planner::least_loaded
                                                ? seq::hdp_placement_kind::least_loaded
                                                : seq::hdp_placement_kind::waves};
  h.plan = who == planner::bytescale ? balance::plan_bytescale(h.seqs, policy, 8, balance::step_model{})
                                     : seq::plan_hdp(h.seqs, policy, 8);
  return h;
}

/// HDP rings (several rings of different sizes at once, and packs) on one parent communicator: each
/// rank runs its micro-batches in plan order with the multi-ring entry.
template <class T, class C>
verdict hdp_body(C& world, std::uint64_t seed, planner who, bool overlap = false, bool device = false) {
  const auto h = make_hdp_case(seed, who);
  std::vector<seq::ring_schedule> scheds;
  const auto& mbs = h.plan.per_rank[static_cast<std::size_t>(world.rank())];
  scheds.reserve(mbs.size());
  for (const auto& mb : mbs) scheds.push_back(seq::ring_for(h.plan, mb.item));
  std::vector<const seq::ring_schedule*> rings;
  for (const auto& s : scheds) rings.push_back(&s);
  return run_rings<T>(world, rings, h.lengths, 1000 + seed, overlap, device);
}

}  // namespace ringtest
