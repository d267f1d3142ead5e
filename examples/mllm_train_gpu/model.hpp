// SPDX-License-Identifier: Apache-2.0
// The GPU variant's model, as a user of hetmesh writes it, behind a plain C++ interface (no CUDA types:
// main.cpp is compiled by the host compiler, model.cu by nvcc). Two encoders (vision over image patches,
// audio over frames; two SiLU layers and a projection each) land their rows in the LLM sequence; the LLM
// is `blocks` causal transformer blocks (RMSNorm, attention with per-document RoPE positions, SiLU MLP)
// and a cross-entropy head. Every layer runs on either backend: `cuda` (cuBLAS GEMMs, the example's own
// kernels, stream-ordered on one device) or `host` (the same kernels' bodies in plain loops), so the
// CPU checks the math (finite differences in double) and the GPU run compares itself with it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mllm_gpu {

/// The model's sizes.
struct sizes {
  std::int64_t vocab = 64;      ///< token ids in [0, vocab)
  std::int64_t width = 64;      ///< LLM width D
  std::int64_t heads = 4;       ///< attention heads (head_dim = width / heads, even)
  std::int64_t mlp = 128;       ///< MLP hidden width
  std::int64_t blocks = 2;      ///< transformer blocks
  std::int64_t patch = 16;      ///< vision: floats per image token
  std::int64_t frame = 16;      ///< audio: floats per frame
  std::int64_t enc_width = 32;  ///< encoders' width
  double rope_base = 10000.0;   ///< RoPE frequency base
  double norm_eps = 1e-6;       ///< RMSNorm epsilon
};

/// One micro-batch: packed documents, one row per token, and the encoder rows that land in it.
struct micro_batch {
  std::vector<std::int32_t> tokens;     ///< token id per token (placeholders too)
  std::vector<std::int32_t> targets;    ///< next-token target, or -1 where the loss does not count
  std::vector<float> weights;           ///< loss weight per token (0 where targets is -1)
  std::vector<std::int32_t> doc_start;  ///< per token, the index of its document's first token
  std::vector<std::int32_t> position;   ///< per token, its position in its document (RoPE)
  std::vector<std::int32_t> enc_row;    ///< per token, -1 (text) or the encoder row k that lands there
  std::vector<std::int32_t> enc_token;  ///< per encoder row k, its token (vision rows first, then audio)
  std::vector<float> vision;            ///< vision rows, patch floats each
  std::vector<float> audio;             ///< audio rows, frame floats each
  [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
};

/// Where the model computes.
enum class backend { host, cuda };

/// Throws std::invalid_argument naming the first inconsistent field of `mb` for `s`.
void check_micro_batch(const sizes& s, const micro_batch& mb);

/// One rank's replica of the model in element type T (float to train; double for the finite-difference
/// check). Parameters, gradients and Adam moments are flat buffers in the backend's memory.
template <class T>
class model {
 public:
  /// A named slice of the flat parameter buffer.
  struct tensor {
    std::string name;
    std::int64_t offset = 0, size = 0;
  };

  /// Parameters drawn from `seed` (the same on every backend and element type), on `device` for cuda.
  model(const sizes& s, std::uint64_t seed, backend b, int device = 0);
  ~model();
  model(model&&) noexcept;
  model& operator=(model&&) noexcept;

  /// Adds the gradient of sum_t weights[t] * CE_t over `mb` to gradients(); returns (that sum, sum of
  /// the weights). Synchronises (the loss is read back).
  std::pair<double, double> forward_backward(const micro_batch& mb);
  /// The flat parameters and gradients (device memory on cuda: pass them to NCCL as they are).
  [[nodiscard]] std::span<T> parameters();
  [[nodiscard]] std::span<T> gradients();
  void zero_grad();
  void scale_gradients(double factor);
  /// One Adam step (step counts from 1).
  void adam(double lr, int step, double beta1 = 0.9, double beta2 = 0.95, double eps = 1e-8);
  [[nodiscard]] std::vector<T> download(std::span<const T> buffer) const;
  void set_parameter(std::int64_t index, T value);
  [[nodiscard]] const std::vector<tensor>& tensors() const;
  /// The cudaStream_t (as void*) the model's work is ordered on; nullptr on host.
  [[nodiscard]] void* stream() const;
  void synchronize();

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

extern template class model<float>;
extern template class model<double>;

/// Whether a CUDA device is visible (false where the runtime finds none).
[[nodiscard]] int cuda_devices();

}  // namespace mllm_gpu
