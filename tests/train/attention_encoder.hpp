// SPDX-License-Identifier: Apache-2.0
// A test encoder with attention inside each item: y = x + attention(x Wq, x Wk, x Wv) over the item's
// tokens (full mask), through the context's attention entry (train::encoder_context: whole items locally,
// long items' pieces by Ulysses over their group). A split item's gradients equal the whole item's only
// when the pieces see each other, so gradient parity with a single-rank run checks the groups.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/model/attention.hpp>
#include <hetmesh/model/encoder_batch.hpp>

namespace traintest {

template <class T, class Modality>
struct attention_encoder {
  using is_encoder_stage = void;
  static constexpr std::string_view modality = Modality::name;
  static constexpr int kHeads = 4;  // of width / kHeads features each; no GQA
  [[nodiscard]] static constexpr int attention_heads() noexcept { return kHeads; }

  attention_encoder(std::int64_t width, T init) : width_(width) {
    const auto n = static_cast<std::size_t>(width * width);
    for (int m = 0; m < 3; ++m) {
      w_[m].resize(n);
      g_[m].assign(n, T(0));
      for (std::size_t i = 0; i < n; ++i)  // small deterministic weights, a different matrix per m
        w_[m][i] =
            init * static_cast<T>((static_cast<double>(
                                       hetmesh::key_hash({static_cast<std::uint64_t>(m), i, 77u}) >> 11) *
                                       0x1.0p-53 -
                                   0.5) *
                                  0.6);
    }
  }
  [[nodiscard]] std::int64_t input_size(const hetmesh::model::encoder_batch_view& v) const noexcept {
    return v.size() * width_;
  }
  [[nodiscard]] std::int64_t output_size(const hetmesh::model::encoder_batch_view& v) const noexcept {
    return v.size() * width_;
  }

  template <class Ctx>
  void forward(Ctx& ctx, const hetmesh::model::encoder_batch_view& v, std::span<const T> in,
               std::span<T> out) {
    const auto n = static_cast<std::size_t>(v.size() * width_);
    if (in.size() != n || out.size() != n)
      hetmesh::throw_error<hetmesh::invalid_argument>("attention_encoder: buffers of {} and {}; expected {}",
                                                      in.size(), out.size(), n);
    std::vector<T> q(n), k(n), vv(n), o(n), lse(static_cast<std::size_t>(v.size() * kHeads));
    matmul(in, w_[0], q), matmul(in, w_[1], k), matmul(in, w_[2], vv);
    ctx.attention_forward(v, shape(), scale(), std::span<const T>(q), std::span<const T>(k),
                          std::span<const T>(vv), std::span<T>(o), std::span<T>(lse));
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] + o[i];
    const auto slot = ctx.slots();
    slot.save(0, in), slot.save(1, std::span<const T>(q)), slot.save(2, std::span<const T>(k));
    slot.save(3, std::span<const T>(vv)), slot.save(4, std::span<const T>(o)),
        slot.save(5, std::span<const T>(lse));
  }

  template <class Ctx>
  void backward(Ctx& ctx, const hetmesh::model::encoder_batch_view& v, std::span<const T> gout,
                std::span<T> gin) {
    const auto n = static_cast<std::size_t>(v.size() * width_);
    const auto slot = ctx.slots();
    const std::vector<T> x(slot.load(0).begin(), slot.load(0).end());
    std::vector<T> dq(n), dk(n), dv(n);
    ctx.attention_backward(v, shape(), scale(), slot.load(1), slot.load(2), slot.load(3), slot.load(4),
                           slot.load(5), gout, std::span<T>(dq), std::span<T>(dk), std::span<T>(dv));
    const std::vector<T>* d[3] = {&dq, &dk, &dv};
    for (int m = 0; m < 3; ++m) weight_grad(x, *d[m], g_[m]);
    if (!gin.empty()) {
      for (std::size_t i = 0; i < n; ++i) gin[i] = gout[i];
      for (int m = 0; m < 3; ++m) input_grad(*d[m], w_[m], gin);
    }
    for (int t = 0; t < 6; ++t) slot.release(t);
  }

  [[nodiscard]] std::vector<std::span<T>> parameters() { return {w_[0], w_[1], w_[2]}; }
  [[nodiscard]] std::vector<std::span<T>> gradients() { return {g_[0], g_[1], g_[2]}; }

 private:
  [[nodiscard]] hetmesh::model::attention_shape shape() const {
    return {kHeads, kHeads, static_cast<int>(width_ / kHeads)};
  }
  [[nodiscard]] T scale() const {
    return T(1) / static_cast<T>(std::sqrt(static_cast<double>(width_ / kHeads)));
  }
  // y[t][j] = sum_i x[t][i] w[i][j]
  void matmul(std::span<const T> x, const std::vector<T>& w, std::vector<T>& y) const {
    const auto W = static_cast<std::size_t>(width_), rows = x.size() / W;
    for (std::size_t t = 0; t < rows; ++t)
      for (std::size_t j = 0; j < W; ++j) {
        T acc = T(0);
        for (std::size_t i = 0; i < W; ++i) acc += x[t * W + i] * w[i * W + j];
        y[t * W + j] = acc;
      }
  }
  void weight_grad(const std::vector<T>& x, const std::vector<T>& dy, std::vector<T>& g) const {
    const auto W = static_cast<std::size_t>(width_), rows = x.size() / W;
    for (std::size_t t = 0; t < rows; ++t)
      for (std::size_t i = 0; i < W; ++i)
        for (std::size_t j = 0; j < W; ++j) g[i * W + j] += x[t * W + i] * dy[t * W + j];
  }
  void input_grad(const std::vector<T>& dy, const std::vector<T>& w, std::span<T> gx) const {
    const auto W = static_cast<std::size_t>(width_), rows = dy.size() / W;
    for (std::size_t t = 0; t < rows; ++t)
      for (std::size_t i = 0; i < W; ++i) {
        T acc = T(0);
        for (std::size_t j = 0; j < W; ++j) acc += dy[t * W + j] * w[i * W + j];
        gx[t * W + i] += acc;
      }
  }

  std::int64_t width_;
  std::vector<T> w_[3], g_[3];
};

}  // namespace traintest
