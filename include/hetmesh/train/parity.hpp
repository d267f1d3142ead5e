// SPDX-License-Identifier: Apache-2.0
// hetmesh::train: check_parity, the library's gradient-parity check. It runs one step of the user's
// distributed train::system and one step of the library's 1-rank reference (a single rank, one pipeline
// stage, no sequence split) on the same batch from the same initial model, and compares the gradients
// tensor by tensor (by the model's global tensor ids, whatever the pipeline split) and the losses. This is
// what a user writes first when a layout is new (a sequence split, a pipeline, a token mixer): a run whose
// loss goes down can still be wrong by a few percent. Rank 0 computes the reference on a 1-rank loopback
// world of its own and broadcasts it, so the check runs on any host communicator (loopback, MPI).
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <ranges>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "../comm/collectives.hpp"
#include "../comm/loopback.hpp"
#include "../core/error.hpp"
#include "../core/format.hpp"
#include "../model/micro_batch.hpp"
#include "../run/agreement.hpp"
#include "../seq/partition.hpp"
#include "system.hpp"
#include "tensor_shard.hpp"

namespace hetmesh::train {

/// One tensor of a model as check_parity reads it (and as a trainer checkpoints it): its global id, its
/// value and its gradient, and which block of the full tensor they are when a layer splits it over ranks.
/// A model's tensors() may return these, or any records with `id` and `grad` (and optionally `shard`).
template <class T>
struct model_tensor {
  std::int64_t id = 0;      ///< the tensor's global id: the same tensor has the same id under any split
  std::span<T> value;       ///< the parameter (this rank's block of it)
  std::span<T> grad;        ///< its gradient
  tensor_shard shard = {};  ///< which block of the full tensor (default: the whole tensor)
};

/// A record of tensors(): `r.id` converts to std::int64_t, `r.grad` is a contiguous sized range (the
/// tensor's gradient, in host memory).
template <class R>
concept tensor_record = requires(R& r) {
  { r.id } -> std::convertible_to<std::int64_t>;
  requires std::ranges::contiguous_range<decltype((r.grad))>;
  requires std::ranges::sized_range<decltype((r.grad))>;
};

namespace detail {
template <class M>
concept has_backbone_member = requires(M& m) {
  { m.backbone() } -> std::same_as<std::remove_cvref_t<decltype(m.backbone())>&>;
};
template <class M>
concept has_encoders_member = requires(M& m) {
  m.encoders();
};
template <class R>
tensor_shard shard_of(const R& r) {
  if constexpr (requires { r.shard; })
    return tensor_shard{r.shard};
  else
    return {};
}
/// The user's model for `split`: make(split) when the factory takes a train::model_split, else
/// make(split.stages, split.local).
template <class Make>
decltype(auto) make_model(Make& make, const model_split& split) {
  if constexpr (std::is_invocable_v<Make&, const model_split&>)
    return make(split);
  else
    return make(split.stages, std::span<const int>(split.local));
}
template <class Make>
using made_model_t =
    std::remove_cvref_t<decltype(make_model(std::declval<Make&>(), std::declval<const model_split&>()))>;
template <class Tuple>
struct tuple_of_refs : std::false_type {};
template <class... E>
struct tuple_of_refs<std::tuple<E&...>> : std::true_type {};

/// The backbone stage of model `m`: m.backbone(), or m itself.
template <class M>
decltype(auto) parity_backbone(M& m) {
  if constexpr (has_backbone_member<M>)
    return (m.backbone());
  else
    return (m);
}
/// The encoder stages of model `m`: m.encoders() (a std::tuple of references), or none.
template <class M>
auto parity_encoders(M& m) {
  if constexpr (has_encoders_member<M>)
    return m.encoders();
  else
    return std::tuple<>{};
}
template <class M>
using parity_encoders_t = decltype(parity_encoders(std::declval<M&>()));
template <class M>
using parity_backbone_t = std::remove_cvref_t<decltype(parity_backbone(std::declval<M&>()))>;
}  // namespace detail

/// What check_parity asks of the user's model M (built by the user's factory, once per run):
///  1. `m.tensors()` -> a range of train::tensor_record (e.g. std::vector<train::model_tensor<T>>): every
///     tensor of the model's backbone stages and encoders as (global id, gradient), in host memory. A
///     tensor keeps its id under any pipeline split, so the distributed model of stages {1} and the
///     reference model of every stage name the same tensor alike (ids unique within a model);
///  2. the backbone stage train::system::run runs: `m.backbone()` returning a reference to it, or M itself
///     (a model that is one stage), with `parameters()` and `gradients()`;
///  3. optional: `m.encoders()` -> a std::tuple of references to its encoder stages in encoder-index order
///     (e.g. `std::tie(vision, audio)`), one per encoder input passed to check_parity. Absent: no encoders.
template <class M>
concept parity_model = requires(M& m) {
  { m.tensors() } -> std::ranges::input_range;
  requires tensor_record<std::remove_cvref_t<std::ranges::range_reference_t<decltype(m.tensors())>>>;
  detail::parity_backbone(m).parameters();
  detail::parity_backbone(m).gradients();
}
&&detail::tuple_of_refs<detail::parity_encoders_t<M>>::value;

/// Checks parity_model<M> requirement by requirement, with a message naming the one that fails.
template <class M>
consteval bool check_parity_model() {
  static_assert(
      requires(M & m) {
        { m.tensors() } -> std::ranges::input_range;
      },
      "train::parity_model requirement 1: the model needs `tensors()` returning a range of (id, value, grad) "
      "records, e.g. std::vector<train::model_tensor<T>>: check_parity reads every gradient by its global "
      "tensor id, whatever the pipeline split");
  if constexpr (requires(M & m) { m.tensors(); })
    static_assert(
        tensor_record<
            std::remove_cvref_t<std::ranges::range_reference_t<decltype(std::declval<M&>().tensors())>>>,
        "train::parity_model requirement 1: each record of tensors() needs `id` (an integer naming "
        "the tensor alike under any split) and `grad` (a contiguous range: its gradient)");
  static_assert(
      requires(M & m) {
        detail::parity_backbone(m).parameters();
        detail::parity_backbone(m).gradients();
      },
      "train::parity_model requirement 2: the model needs `backbone()` returning a reference to its backbone "
      "stage, or must be the stage itself (parameters() and gradients())");
  static_assert(detail::tuple_of_refs<detail::parity_encoders_t<M>>::value,
                "train::parity_model requirement 3: `encoders()` must return a std::tuple of references to "
                "the encoder stages, e.g. `return std::tie(vision, audio);`");
  return true;
}

/// check_parity's tolerances, as values.
struct parity_tolerance {
  double gradient = 2e-5;  ///< largest |g - g_ref| over every element, over the largest |g_ref|
  double loss = 1e-5;      ///< |loss - loss_ref| over |loss_ref|
  friend bool operator==(const parity_tolerance&, const parity_tolerance&) = default;
};

/// What check_parity found; the same on every rank of the world (stats: this rank's).
struct parity_result {
  double abs_error = 0;       ///< largest |g - g_ref| over every element of every tensor (NaN: infinity)
  double max_gradient = 0;    ///< largest |g_ref|
  double rel_error = 0;       ///< abs_error / max_gradient (abs_error when every g_ref is 0)
  std::int64_t tensor = 0;    ///< the id of the tensor where abs_error occurs (when rank >= 0)
  std::int64_t element = -1;  ///< the element of that tensor (-1: no error)
  int rank = -1;              ///< the lowest world rank holding it (-1: no error, abs_error == 0)
  double loss = 0;            ///< the distributed step's loss
  double reference_loss = 0;  ///< the 1-rank step's loss
  double loss_error = 0;      ///< |loss - reference_loss|
  double loss_rel_error = 0;  ///< loss_error / |reference_loss| (loss_error when it is 0)
  std::int64_t targets = 0;   ///< the distributed step's target count
  std::int64_t reference_targets = 0;  ///< the 1-rank step's
  std::int64_t tokens = 0;             ///< the distributed step's real tokens
  std::int64_t reference_tokens = 0;   ///< the 1-rank step's
  std::int64_t tensors = 0;            ///< tensors compared: every tensor of the reference model
  int optimizer_calls = 0;     ///< this rank's optimizer hook calls in the distributed step (1 + encoders)
  step_stats stats;            ///< this rank's stats of the distributed step
  parity_tolerance tolerance;  ///< the tolerances `passed` was judged against
  bool passed = false;         ///< rel_error <= tolerance.gradient, loss_rel_error <= tolerance.loss, and the
                               ///< targets and tokens equal the reference's
  /// passed.
  explicit operator bool() const noexcept { return passed; }
};

namespace detail {

/// The 1-rank reference on every rank: tensors by id (offsets into grads), gradients as double, counts.
struct parity_reference {
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> offsets;  // ids.size() + 1
  std::vector<double> grads;
  double loss = 0;
  std::int64_t targets = 0, tokens = 0;
};

/// An optimizer hook that leaves the parameters where they are (a zero learning rate) and counts calls.
struct parity_hook {
  int* calls = nullptr;
  template <class P, class G>
  void operator()(P&&, G&&) const {
    ++*calls;
  }
};

template <class S>
struct system_kernel;
template <class P, class K, comm::communicator C, class B, pipeline::schedule_family S, class Pl, class M>
struct system_kernel<system<P, K, C, B, S, Pl, M>> {
  using type = K;
};

/// One step of `sys` over `batch` with model `m` and the encoders' inputs; the hook counts into `calls`.
template <class Sys, class Plan, class M, class... Inputs>
step_stats parity_step(Sys& sys, const Plan& plan, const model::step_batch& batch, M& m, int& calls,
                       const Inputs&... inputs) {
  auto&& stage = parity_backbone(m);
  return std::apply(
      [&](auto&... enc) {
        return sys.run(plan, batch, stage, parity_hook{&calls}, bind_encoder(enc, inputs)...);
      },
      parity_encoders(m));
}

/// Rank 0's 1-rank run (a loopback world of its own: static THD with cp = 1, pp = 1, the system's kernel
/// type), broadcast to every rank of `world`. Collective over `world`.
template <class Kernel, class Comm, class Make, class... Inputs>
parity_reference reference_run(Comm& world, const model::step_batch& batch, Make& make,
                               const Inputs&... inputs) {
  parity_reference ref;
  std::exception_ptr failure;
  if (world.rank() == 0) {
    try {
      comm::loopback::run(1, [&](comm::loopback::communicator& c) {
        system<seq::cp_thd, Kernel, comm::loopback::communicator> one(seq::cp_thd{.cp = 1, .pad = true}, c);
        const auto plan = one.plan(batch);
        auto m = make_model(make, model_split{1, {0}, 0, 1, 0, 1});
        int calls = 0;
        const auto st = parity_step(one, plan, batch, m, calls, inputs...);
        ref.loss = st.loss;
        ref.targets = st.targets;
        ref.tokens = st.tokens;
        ref.offsets.push_back(0);
        for (auto&& t : m.tensors()) {
          ref.ids.push_back(static_cast<std::int64_t>(t.id));
          for (const auto& g : t.grad) ref.grads.push_back(static_cast<double>(g));
          ref.offsets.push_back(static_cast<std::int64_t>(ref.grads.size()));
        }
      });
    } catch (...) {
      failure = std::current_exception();
    }
  }
  run::agree_on_failure(world, failure, "train::check_parity (the 1-rank reference on rank 0)");
  std::int64_t n[2] = {static_cast<std::int64_t>(ref.ids.size()),
                       static_cast<std::int64_t>(ref.grads.size())};
  comm::broadcast(world, std::span<std::int64_t>(n), 0);
  ref.ids.resize(static_cast<std::size_t>(n[0]));
  ref.offsets.resize(static_cast<std::size_t>(n[0] + 1));
  ref.grads.resize(static_cast<std::size_t>(n[1]));
  double loss = ref.loss;
  std::int64_t counts[2] = {ref.targets, ref.tokens};
  comm::broadcast(world, std::span<std::int64_t>(ref.ids), 0);
  comm::broadcast(world, std::span<std::int64_t>(ref.offsets), 0);
  comm::broadcast(world, std::span<double>(ref.grads), 0);
  comm::broadcast(world, std::span<double>(&loss, 1), 0);
  comm::broadcast(world, std::span<std::int64_t>(counts), 0);
  ref.loss = loss;
  ref.targets = counts[0];
  ref.tokens = counts[1];
  return ref;
}

/// This rank's largest error against `ref` over the tensors of `m`: (error, id, element of the full tensor),
/// marking the reference elements it compared in `seen` (one per element of ref.grads). Throws
/// invalid_argument for a tensor the reference lacks or whose size (or block) does not fit.
template <class M>
std::tuple<double, std::int64_t, std::int64_t> local_error(M& m, const parity_reference& ref,
                                                           std::vector<std::int64_t>& seen) {
  std::map<std::int64_t, std::size_t> index;
  for (std::size_t k = 0; k < ref.ids.size(); ++k) index[ref.ids[k]] = k;
  double worst = 0;
  std::int64_t id = -1, element = -1;
  for (auto&& t : m.tensors()) {
    const auto tid = static_cast<std::int64_t>(t.id);
    const auto it = index.find(tid);
    if (it == index.end())
      throw_error<invalid_argument>(
          "train::check_parity: tensor {} of this rank's model is not among the 1-rank reference model's {} "
          "tensors; expected the factory to give every tensor the same id under any pipeline split",
          tid, ref.ids.size());
    const std::size_t k = it->second;
    const auto off = static_cast<std::size_t>(ref.offsets[k]);
    const auto size = static_cast<std::int64_t>(ref.offsets[k + 1]) - static_cast<std::int64_t>(off);
    const auto sh = shard_of(t);
    const auto local = static_cast<std::int64_t>(std::ranges::size(t.grad));
    const bool whole = sh.rows == 0 && local == size;
    const bool block = sh.rows > 0 && sh.full_size() == size && sh.parts >= 1 && sh.part >= 0 &&
                       sh.part < sh.parts && (sh.axis == 0 ? sh.rows : sh.cols) % sh.parts == 0 &&
                       local * sh.parts == size;
    if (!whole && !block)
      throw_error<invalid_argument>(
          "train::check_parity: tensor {} has {} gradient elements on this rank{} and {} in the 1-rank "
          "reference; expected the same tensor under any split, or a block of it (model_tensor::shard)",
          tid, local,
          sh.rows > 0
              ? hetmesh::format(" as block {} of {} of a {} x {} tensor", sh.part, sh.parts, sh.rows, sh.cols)
              : std::string(),
          size);
    const auto* g = std::ranges::data(t.grad);
    for (std::int64_t i = 0; i < local; ++i) {
      const auto j = sh.global(i);
      seen[off + static_cast<std::size_t>(j)] = 1;
      double e = std::abs(static_cast<double>(g[i]) - ref.grads[off + static_cast<std::size_t>(j)]);
      if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
      if (e > worst) {
        worst = e;
        id = tid;
        element = j;
      }
    }
  }
  return {worst, id, element};
}

/// The verdict over `world` from this rank's comparison. Collective.
template <class Comm>
parity_result reduce_verdict(Comm& world, const parity_reference& ref,
                             std::tuple<double, std::int64_t, std::int64_t> mine,
                             std::vector<std::int64_t>& seen, const step_stats& st, int calls,
                             const parity_tolerance& tol) {
  parity_result r;
  const auto [worst, id, element] = mine;
  r.abs_error = worst;
  comm::all_reduce(world, std::span<double>(&r.abs_error, 1), comm::reduce_op::max);
  constexpr auto none = std::numeric_limits<std::int64_t>::min();
  const bool holds = r.abs_error > 0 && worst == r.abs_error;
  std::int64_t who = holds ? -static_cast<std::int64_t>(world.rank()) : none;
  comm::all_reduce(world, std::span<std::int64_t>(&who, 1), comm::reduce_op::max);
  std::int64_t at[2] = {none, none};
  if (who != none && -who == world.rank()) at[0] = id, at[1] = element;
  comm::all_reduce(world, std::span<std::int64_t>(at), comm::reduce_op::max);
  if (who != none) r.rank = static_cast<int>(-who), r.tensor = at[0], r.element = at[1];
  comm::all_reduce(world, std::span<std::int64_t>(seen), comm::reduce_op::max);
  for (std::size_t k = 0; k < ref.ids.size(); ++k)
    for (auto e = ref.offsets[k]; e < ref.offsets[k + 1]; ++e)
      if (seen[static_cast<std::size_t>(e)] == 0)
        throw_error<invalid_argument>(
            "train::check_parity: element {} of tensor {} of the 1-rank reference model is held by no rank "
            "of "
            "the distributed run; expected the factory's models for the ranks' stages (and tp blocks) to "
            "hold "
            "every tensor",
            e - ref.offsets[k], ref.ids[k]);
  for (double g : ref.grads) r.max_gradient = std::max(r.max_gradient, std::abs(g));
  r.rel_error = r.max_gradient > 0 ? r.abs_error / r.max_gradient : r.abs_error;
  r.loss = st.loss;
  r.reference_loss = ref.loss;
  r.loss_error = std::abs(st.loss - ref.loss);
  if (std::isnan(r.loss_error)) r.loss_error = std::numeric_limits<double>::infinity();
  r.loss_rel_error = ref.loss != 0 ? r.loss_error / std::abs(ref.loss) : r.loss_error;
  r.targets = st.targets;
  r.reference_targets = ref.targets;
  r.tokens = st.tokens;
  r.reference_tokens = ref.tokens;
  r.tensors = static_cast<std::int64_t>(ref.ids.size());
  r.optimizer_calls = calls;
  r.stats = st;
  r.tolerance = tol;
  r.passed = r.rel_error <= tol.gradient && r.loss_rel_error <= tol.loss &&
             r.targets == r.reference_targets && r.tokens == r.reference_tokens;
  return r;
}

}  // namespace detail

/// Gradient parity of `sys` with the library's 1-rank reference on `batch`: PyTorch's "compare with a
/// single-GPU run" as one call. `make` builds the user's model (a train::parity_model) from the same initial
/// parameters every time: `make(split)` with a train::model_split (stages of the pipeline, the stages this
/// rank holds, its tp and ep places: a tensor-parallel model builds its blocks), or `make(stages, local)`
/// (a std::span<const int>). `inputs` are the encoders' input callables, one per encoder of the model's
/// encoders(), in encoder-index order (as bind_encoder takes them). In order: rank 0 builds the model of
/// model_split{1, {0}, 0, 1, 0, 1} and runs one step of it on a 1-rank loopback world of its own
/// (train::system<seq::cp_thd{.cp = 1}, the same kernel type, default-constructed, pp = 1, default
/// options), then broadcasts its gradients, loss and counts; every rank builds the model of sys.split()
/// and runs one step of sys.plan(batch, its encoders...) over `batch`, with an optimizer hook that leaves
/// the parameters in place; every rank compares its model's tensors with the reference's by id, a block of
/// a split tensor (model_tensor::shard) with its elements of the full tensor. Collective over sys.world(),
/// which must be a host communicator. Returns the same verdict on every rank (see parity_result;
/// printable); failing tolerances is a result, not an error. Errors (invalid_argument, on every rank): a
/// tensor the reference lacks or of another size (or an impossible block), a reference element no rank
/// holds; the runs' own errors (the reference's on every rank, via run::agree_on_failure). Cost: one
/// distributed step, one 1-rank step of the whole batch on rank 0 (the others wait for it: the world's
/// collective timeout must cover it), a broadcast of the model's gradients and a max-reduce of one integer
/// per gradient element.
template <class System, class Make, class... Inputs>
[[nodiscard]] parity_result check_parity(System& sys, const model::step_batch& batch, Make&& make,
                                         const parity_tolerance& tolerance = {}, const Inputs&... inputs) {
  static_assert(
      std::is_invocable_v<Make&, int, std::span<const int>> || std::is_invocable_v<Make&, const model_split&>,
      "train::check_parity: the factory must be callable as make(int stages, std::span<const int> "
      "local), returning the model of `stages` pipeline stages holding stages `local`, or as "
      "make(const train::model_split&) (stages, local stages, tp and ep places)");
  using M = detail::made_model_t<Make>;
  static_assert(check_parity_model<M>());
  static_assert(std::tuple_size_v<detail::parity_encoders_t<M>> == sizeof...(Inputs),
                "train::check_parity: pass one encoder input callable per encoder of the model's encoders(), "
                "in encoder-index order");
  using Comm = std::remove_cvref_t<decltype(sys.world())>;
  static_assert(comm::host_communicator<Comm>,
                "train::check_parity compares gradients in host memory: the system's world must be a host "
                "communicator (loopback, MPI)");
  using Kernel = typename detail::system_kernel<System>::type;
  auto& world = sys.world();
  const auto ref = detail::reference_run<Kernel>(world, batch, make, inputs...);
  // The model first (its stages are known before any plan), so the plan reads its encoders' heads.
  auto m = detail::make_model(make, sys.split());
  const auto plan = std::apply(
      [&](auto&... e) {
        if constexpr (sizeof...(e) == 0)
          return sys.plan(batch);
        else
          return sys.plan(batch, e...);
      },
      detail::parity_encoders(m));
  int calls = 0;
  const auto st = detail::parity_step(sys, plan, batch, m, calls, inputs...);
  std::vector<std::int64_t> seen(ref.grads.size(), 0);
  std::tuple<double, std::int64_t, std::int64_t> mine{0.0, -1, -1};
  std::exception_ptr failure;
  try {
    mine = detail::local_error(m, ref, seen);
  } catch (...) {
    failure = std::current_exception();
  }
  run::agree_on_failure(world, failure, "train::check_parity (comparing this rank's tensors)");
  return detail::reduce_verdict(world, ref, mine, seen, st, calls, tolerance);
}

}  // namespace hetmesh::train

template <>
struct fmt::formatter<hetmesh::train::parity_result> : hetmesh::empty_spec_formatter {
  template <class FormatContext>
  auto format(const hetmesh::train::parity_result& r, FormatContext& ctx) const -> decltype(ctx.out()) {
    auto out = hetmesh::format_to(
        ctx.out(),
        "parity {}: gradient error {:.3g} of the largest gradient {:.3g} (tolerance "
        "{:.0e}; absolute {:.3g}",
        r.passed ? "ok" : "FAILED", r.rel_error, r.max_gradient, r.tolerance.gradient, r.abs_error);
    if (r.rank >= 0)
      out = hetmesh::format_to(out, " at tensor {} element {} on rank {}", r.tensor, r.element, r.rank);
    return hetmesh::format_to(
        out,
        "); loss {:.9g} vs {:.9g} (difference {:.3g}, relative {:.3g}; tolerance {:.0e}); "
        "targets {}/{}, tokens {}/{}, {} tensors",
        r.loss, r.reference_loss, r.loss_error, r.loss_rel_error, r.tolerance.loss, r.targets,
        r.reference_targets, r.tokens, r.reference_tokens, r.tensors);
  }
};
