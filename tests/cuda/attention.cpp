// cuda::device_reference_attention against model::reference_attention (CTest label gpu; the main in
// gather.cpp exits 77 without a device): random blocks cut from packed sequences whose documents split them,
// self and cross blocks, causal and full, MHA, GQA and MQA, rows that see no key, empty blocks; forward out
// and lse, then backward dq, dk, dv accumulated onto non-zero gradients from a shifted (merged) lse.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/random.hpp>
#include <hetmesh/cuda/attention.hpp>
#include <hetmesh/cuda/buffer.hpp>
#include <hetmesh/cuda/check.hpp>
#include <hetmesh/model/reference_attention.hpp>

namespace {
using hetmesh::cuda::device_buffer;
using hetmesh::seq::block_mask;
// cuda::device_reference_attention's members are templates on the block and output types (cuda/ cannot name
// model/), so its outputs are passed as typed objects, not braced lists.
template <class T>
using attn_fwd = hetmesh::model::attention_forward_out<T>;
template <class T>
using attn_bwd = hetmesh::model::attention_backward_io<T>;

struct attn_case {
  std::int64_t nq = 0, nk = 0;
  int q_heads = 1, kv_heads = 1, head_dim = 1;
  bool self = false;  // the keys are the queries' own tokens (a diagonal block)
};

struct attn_coverage {
  std::size_t empty_rows = 0;    // forward rows with lse = -inf, in blocks with queries and keys
  std::size_t visible_rows = 0;  // forward rows with a finite lse
};

// Uploads host data to a new device buffer (stream-ordered on s).
template <class T>
device_buffer<T> attn_upload(const std::vector<T>& host, cudaStream_t s) {
  device_buffer<T> d(host.size());
  d.copy_from(std::span<const T>(host), s);
  return d;
}

template <class T>
std::vector<T> attn_download(const device_buffer<T>& d, cudaStream_t s) {
  std::vector<T> host(d.size());
  d.copy_to(std::span<T>(host), s);
  hetmesh::cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize", "attention test");
  return host;
}

template <class T>
void attn_require_close(const std::vector<T>& got, const std::vector<T>& want, double tol, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i]);
    if (std::isinf(want[i])) {
      REQUIRE(got[i] == want[i]);
      continue;
    }
    REQUIRE(std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])) <=
            tol * (1 + std::abs(static_cast<double>(want[i]))));
  }
}

template <class T>
void attn_compare(hetmesh::cuda::device_reference_attention& kernel, const attn_case& c, block_mask mask,
                  std::uint64_t seed, double tol, attn_coverage& cov) {
  INFO("nq " << c.nq << " nk " << c.nk << " q_heads " << c.q_heads << " kv_heads " << c.kv_heads
             << " head_dim " << c.head_dim << (c.self ? " self" : " cross")
             << (mask == block_mask::causal ? " causal" : " full") << " seed " << seed << " bytes "
             << sizeof(T));
  hetmesh::rng gen(seed);
  const auto draw = [&](std::int64_t n) {
    return static_cast<std::int64_t>(gen.unit() * static_cast<double>(n));
  };
  // A packed sequence with random document lengths (so documents split the blocks cut from it).
  const std::int64_t total = c.nq + c.nk + 16, longest = c.nq + c.nk > 12 ? (c.nq + c.nk) / 3 : 4;
  std::vector<std::int64_t> doc(static_cast<std::size_t>(total)), pos(doc.size());
  for (std::int64_t t = 0, d = 0; t < total; ++d)
    for (std::int64_t len = 1 + draw(longest), p = 0; p < len && t < total; ++p, ++t)
      doc[static_cast<std::size_t>(t)] = d * 7 + 3, pos[static_cast<std::size_t>(t)] = p;
  const std::int64_t q0 = draw(total - c.nq + 1), k0 = c.self ? q0 : draw(total - c.nk + 1);
  const auto cut = [](const std::vector<std::int64_t>& v, std::int64_t from, std::int64_t n) {
    return std::vector<std::int64_t>(v.begin() + from, v.begin() + from + n);
  };
  const auto q_doc = cut(doc, q0, c.nq), q_pos = cut(pos, q0, c.nq);
  const auto k_doc = cut(doc, k0, c.nk), k_pos = cut(pos, k0, c.nk);

  const auto nq = static_cast<std::size_t>(c.nq), nk = static_cast<std::size_t>(c.nk);
  const auto hq = static_cast<std::size_t>(c.q_heads), hk = static_cast<std::size_t>(c.kv_heads),
             dim = static_cast<std::size_t>(c.head_dim);
  const auto random = [&](std::size_t n) {
    std::vector<T> v(n);
    for (auto& e : v) e = static_cast<T>(gen.unit() * 2 - 1);
    return v;
  };
  const auto q = random(nq * hq * dim), k = random(nk * hk * dim), v = random(nk * hk * dim),
             dout = random(nq * hq * dim), dq0 = random(nq * hq * dim), dk0 = random(nk * hk * dim),
             dv0 = random(nk * hk * dim);
  const T scale = static_cast<T>(1 / std::sqrt(static_cast<double>(dim)));
  const hetmesh::model::attention_shape shape{c.q_heads, c.kv_heads, c.head_dim};
  const hetmesh::model::attention_block<T> host_block{shape, q,     k,     v,    q_doc,
                                                      q_pos, k_doc, k_pos, mask, scale};

  // Forward on the CPU and on the device.
  hetmesh::model::reference_attention cpu;
  std::vector<T> out(q.size()), lse(nq * hq);
  cpu.forward(host_block, {out, lse});
  const cudaStream_t s = kernel.stream;
  const auto d_q = attn_upload(q, s), d_k = attn_upload(k, s), d_v = attn_upload(v, s);
  const hetmesh::model::attention_block<T> dev_block{shape, d_q.span(), d_k.span(), d_v.span(), q_doc,
                                                     q_pos, k_doc,      k_pos,      mask,       scale};
  device_buffer<T> d_out(out.size()), d_lse(lse.size());
  kernel.forward(dev_block, attn_fwd<T>{d_out.span(), d_lse.span()});
  const auto got_out = attn_download(d_out, s), got_lse = attn_download(d_lse, s);
  attn_require_close(got_lse, lse, tol, "lse");
  attn_require_close(got_out, out, tol, "out");
  for (std::size_t r = 0; r < lse.size(); ++r) {
    if (!std::isinf(lse[r])) {
      ++cov.visible_rows;
      continue;
    }
    if (nk != 0) ++cov.empty_rows;
    for (std::size_t e = 0; e < dim; ++e) REQUIRE(got_out[r * dim + e] == T(0));  // the empty row's out
  }
  // Deterministic: the same block again gives bitwise the same results.
  kernel.forward(dev_block, attn_fwd<T>{d_out.span(), d_lse.span()});
  CHECK(attn_download(d_out, s) == got_out);
  CHECK(attn_download(d_lse, s) == got_lse);

  // Backward from a merged lse (the block's own, shifted up on some rows, as other blocks would) and
  // delta = rowsum(dout * out), onto non-zero gradients.
  std::vector<T> merged = lse, delta(lse.size());
  for (std::size_t r = 0; r < merged.size(); ++r) {
    if (!std::isinf(merged[r]) && r % 3 == 1) merged[r] += static_cast<T>(gen.unit());
    T d = 0;
    for (std::size_t e = 0; e < dim; ++e) d += dout[r * dim + e] * out[r * dim + e];
    delta[r] = d;
  }
  std::vector<T> dq = dq0, dk = dk0, dv = dv0;
  cpu.backward(host_block, {dout, merged, delta, dq, dk, dv});
  const auto d_dout = attn_upload(dout, s), d_merged = attn_upload(merged, s),
             d_delta = attn_upload(delta, s);
  auto d_dq = attn_upload(dq0, s), d_dk = attn_upload(dk0, s), d_dv = attn_upload(dv0, s);
  kernel.backward(dev_block, attn_bwd<T>{d_dout.span(), d_merged.span(), d_delta.span(), d_dq.span(),
                                         d_dk.span(), d_dv.span()});
  attn_require_close(attn_download(d_dq, s), dq, tol, "dq");
  attn_require_close(attn_download(d_dk, s), dk, tol, "dk");
  attn_require_close(attn_download(d_dv, s), dv, tol, "dv");
}

template <class T>
void attn_compare_all(double tol) {
  const attn_case cases[] = {
      {1, 1, 1, 1, 1, true},    {16, 16, 2, 2, 8, true},     {33, 47, 4, 2, 33, false},
      {64, 64, 8, 1, 64, true}, {48, 40, 6, 3, 16, false},   {40, 0, 2, 1, 4, false},
      {0, 10, 2, 1, 4, false},  {100, 80, 3, 3, 130, false}, {200, 200, 4, 4, 32, true},
      {7, 300, 2, 2, 5, false},
  };
  cudaStream_t stream = nullptr;
  hetmesh::cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate", "attention test");
  {
    // One object for every case: its metadata scratch grows and is reused.
    hetmesh::cuda::device_reference_attention kernel(stream);
    attn_coverage cov;
    std::uint64_t seed = 1;
    for (const auto& c : cases)
      for (const auto mask : {block_mask::causal, block_mask::full})
        for (int rep = 0; rep < 3; ++rep) attn_compare<T>(kernel, c, mask, seed++, tol, cov);
    CHECK(cov.empty_rows > 0);                 // the suite covers rows that see no key ...
    CHECK(cov.visible_rows > cov.empty_rows);  // ... and mostly rows that do
  }
  hetmesh::cuda::check(cudaStreamDestroy(stream), "cudaStreamDestroy", "attention test");
}
}  // namespace

TEST_CASE("cuda::device_reference_attention computes what model::reference_attention computes") {
  SUBCASE("double") { attn_compare_all<double>(1e-12); }
  SUBCASE("float") { attn_compare_all<float>(1e-5); }
}

TEST_CASE("cuda::device_reference_attention rejects sizes that do not match and block_mask::none") {
  const std::vector<std::int64_t> doc{0, 0, 0}, pos{0, 1, 2};
  device_buffer<float> q(3 * 2 * 4), k(3 * 4), v(3 * 4), out(3 * 2 * 4), lse(3 * 2), small(5);
  const hetmesh::model::attention_shape shape{2, 1, 4};
  hetmesh::model::attention_block<float> b{shape, q.span(), k.span(), v.span(),           doc,
                                           pos,   doc,      pos,      block_mask::causal, 0.5f};
  hetmesh::cuda::device_reference_attention kernel;
  CHECK_THROWS_AS(kernel.forward(b, attn_fwd<float>{out.span(), small.span()}), hetmesh::invalid_argument);
  CHECK_THROWS_AS(kernel.backward(b, attn_bwd<float>{out.span(), lse.span(), lse.span(), out.span(), k.span(),
                                                     small.span()}),
                  hetmesh::invalid_argument);
  auto bad = b;
  bad.v = small.span();
  CHECK_THROWS_AS(kernel.forward(bad, attn_fwd<float>{out.span(), lse.span()}), hetmesh::invalid_argument);
  bad = b;
  bad.shape.kv_heads = 3;
  CHECK_THROWS_AS(kernel.forward(bad, attn_fwd<float>{out.span(), lse.span()}), hetmesh::invalid_argument);
  bad = b;
  bad.mask = block_mask::none;
  CHECK_THROWS_AS(kernel.forward(bad, attn_fwd<float>{out.span(), lse.span()}), hetmesh::invalid_argument);
  kernel.forward(b, attn_fwd<float>{out.span(), lse.span()});  // the good block still runs
  hetmesh::cuda::check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize", "attention test");
}
