// SPDX-License-Identifier: Apache-2.0
// hetmesh::seq: the load-balancing auxiliary loss of a mixture-of-experts router (Switch Transformer, GShard;
// the form Megatron-LM's switch_load_balancing_loss_func computes): coeff x E x sum_e f_e P_e, f_e the
// fraction of the routed choices that went to expert e and P_e the mean router probability of e, both over
// the whole group (T tokens, k choices each). A rank that holds a part of the tokens computes its share,
// coeff E / (k T^2) x sum_e (sum of its probabilities of e) x N_e with N_e the group's choices of e: the
// shares sum to the loss over the group, and each rank's gradient needs only its own probabilities. The
// group's counts come from the runtime (run::moe_aux_loss sums them over a communicator). Pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "../core/error.hpp"

namespace hetmesh::seq {

/// A rank's share of the auxiliary loss and its gradient (moe_aux_loss).
struct moe_aux_loss_value {
  double loss = 0.0;         ///< this rank's share; the shares of the group sum to the loss
  std::vector<double> grad;  ///< [experts]: d loss / d probs[t][e], the same for every local token t

  friend bool operator==(const moe_aux_loss_value&, const moe_aux_loss_value&) = default;
};

/// The share of a rank whose router gave `probs` [tokens][experts] (row-major; every expert's probability,
/// not only the top k), with `group_counts` [experts] the choices of each expert summed over the group
/// (before any capacity drop, as Megatron-LM counts them) and `group_tokens` the group's tokens. The loss is
/// linear in probs, so the gradient is one constant per expert: coeff E N_e / (k T^2); the caller adds it
/// to every row of its probs' gradient. Errors (invalid_argument): probs not a whole number of rows,
/// group_tokens < 1 while counts are given, top_k < 1, negative counts. Pure; O(tokens experts).
template <class T>
[[nodiscard]] moe_aux_loss_value moe_aux_loss(std::span<const T> probs,
                                              std::span<const std::int64_t> group_counts,
                                              std::int64_t group_tokens, int top_k, double coeff) {
  const auto ne = group_counts.size();
  if (ne == 0 || probs.size() % ne != 0 || top_k < 1 || group_tokens < 1)
    throw_error<invalid_argument>(
        "seq::moe_aux_loss: {} probabilities for {} experts, top_k {}, {} group tokens; expected whole rows "
        "of one probability per expert, top_k >= 1 and group tokens >= 1",
        probs.size(), ne, top_k, group_tokens);
  moe_aux_loss_value out;
  out.grad.resize(ne);
  const double t = static_cast<double>(group_tokens);
  const double scale = coeff * static_cast<double>(ne) / (static_cast<double>(top_k) * t * t);
  for (std::size_t e = 0; e < ne; ++e) {
    if (group_counts[e] < 0)
      throw_error<invalid_argument>("seq::moe_aux_loss: expert {} has {} choices; expected >= 0", e,
                                    group_counts[e]);
    out.grad[e] = scale * static_cast<double>(group_counts[e]);
  }
  std::vector<double> column(ne, 0.0);
  for (std::size_t i = 0; i < probs.size(); ++i) column[i % ne] += static_cast<double>(probs[i]);
  for (std::size_t e = 0; e < ne; ++e) out.loss += out.grad[e] * column[e];
  return out;
}

}  // namespace hetmesh::seq
