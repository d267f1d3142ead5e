// SPDX-License-Identifier: Apache-2.0
// example_torch_train's plain loop: the same model (model.hpp) trained in one process, one document after
// another, with ordinary autograd (loss.backward()) and torch::optim::Adam. No hetmesh here but the batches
// it reads: the step batches and the encoders' feature rows of the data plane's step source, the very
// batches the distributed run gets. Which targets count is written out here again (a next token in the
// document, not an encoder placeholder, kept by the loss mask), not taken from the library.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <hetmesh/model/document.hpp>

#include "mllm_train/data.hpp"
#include "torch_train/model.hpp"

namespace torch_train {

/// softmax(scale q k^T) v of one sequence, q [n][h][d], k and v [n][hk][d] (query head i reads KV head
/// i / (h / hk)); causal: query t sees keys 0..t. Local, plain torch ops.
inline torch::Tensor local_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     bool causal) {
  const auto n = q.size(0), group = q.size(1) / k.size(1);
  const auto kk = k.repeat_interleave(group, 1), vv = v.repeat_interleave(group, 1);
  auto s = torch::einsum("qhd,khd->hqk", {q, kk}) / std::sqrt(static_cast<double>(q.size(2)));
  if (causal)
    s = s.masked_fill(torch::ones({n, n}, q.options().dtype(torch::kBool)).triu(1),
                      -std::numeric_limits<double>::infinity());
  return torch::einsum("hqk,khd->qhd", {torch::softmax(s, -1), vv});
}

/// Whether the target of token `pos` of `d` counts: the next token exists, is no placeholder of an
/// encoder item, and the loss mask (if any) keeps it.
inline bool counts(const hetmesh::model::document& d, std::int64_t pos) {
  const auto next = pos + 1;
  if (next >= d.length()) return false;
  if (!d.loss_mask.empty() && d.loss_mask[static_cast<std::size_t>(pos)] == 0) return false;
  for (const auto& it : d.items)
    if (next >= it.position && next < it.position + it.tokens) return false;
  return true;
}

/// The step's loss: over every document, the summed cross-entropy of its counting targets, divided by
/// the step's counting targets. The items' rows replace their placeholder tokens.
inline torch::Tensor step_loss(multimodal& m, const hetmesh::model::step_batch& batch,
                               const mllm::step_source& data, torch::Dtype dtype) {
  const auto opts = torch::TensorOptions().dtype(dtype);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  std::int64_t step_targets = 0;
  auto total = torch::zeros({}, opts);
  const auto causal = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return local_attention(q, k, v, true);
  };
  const auto whole = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return local_attention(q, k, v, false);
  };
  for (const auto& d : batch.documents) {
    const auto n = d.length();
    const auto tokens = torch::tensor(d.tokens, i64);
    auto x = m->backbone->embed(tokens);
    std::vector<torch::Tensor> parts;  // the embedding's rows, with each item's encoded rows in its place
    std::int64_t at = 0;
    for (const auto& it : d.items) {
      const auto rows = data.item_features(it.encoder, it.id);
      const auto features = torch::from_blob(const_cast<float*>(rows.data()),
                                             {it.tokens, data.width(it.encoder)}, torch::kFloat32)
                                .to(dtype);
      auto& enc = it.encoder == mllm::vision_index ? m->vision : m->audio;
      parts.push_back(x.narrow(0, at, it.position - at));
      parts.push_back(enc(features, whole));
      at = it.position + it.tokens;
    }
    parts.push_back(x.narrow(0, at, n - at));
    x = torch::cat(parts, 0);
    x = m->backbone->run_blocks(0, 1, x, torch::arange(n, i64), causal);
    std::vector<std::int64_t> targets(static_cast<std::size_t>(n), 0);
    std::vector<double> weights(static_cast<std::size_t>(n), 0.0);
    for (std::int64_t t = 0; t < n; ++t)
      if (counts(d, t)) {
        targets[static_cast<std::size_t>(t)] = d.tokens[static_cast<std::size_t>(t + 1)];
        weights[static_cast<std::size_t>(t)] = 1.0;
        ++step_targets;
      }
    total =
        total + m->backbone->token_losses(x, torch::tensor(targets, i64), torch::tensor(weights, opts)).sum();
  }
  return total / static_cast<double>(step_targets);
}

/// What the plain loop measured: each step's loss, and step 0's gradient of every parameter by name.
struct reference_run {
  std::vector<double> losses;                      ///< per step
  std::map<std::string, torch::Tensor> gradients;  ///< step 0, by the parameter's name in the whole model
};

/// `steps` steps of the plain loop over the batches of `data` (a fresh step source, at step 0): forward,
/// loss.backward(), torch::optim::Adam with learning rate `lr`.
inline reference_run train_reference(const shape& s, std::uint64_t seed, torch::Dtype dtype,
                                     mllm::step_source& data, int steps, double lr) {
  multimodal m(s);
  init_parameters(*m, seed, dtype);
  torch::optim::Adam adam(m->parameters(), torch::optim::AdamOptions(lr).betas({0.9, 0.999}).eps(1e-8));
  reference_run out;
  for (int step = 0; step < steps; ++step) {
    const auto batch = data.next();
    adam.zero_grad();
    const auto loss = step_loss(m, batch, data, dtype);
    loss.backward();
    out.losses.push_back(loss.item<double>());
    if (step == 0)
      for (const auto& p : m->named_parameters())  // a parameter no document reached has no gradient yet
        out.gradients[p.key()] =
            p.value().grad().defined() ? p.value().grad().clone() : torch::zeros_like(p.value());
    adam.step();
  }
  return out;
}

}  // namespace torch_train
