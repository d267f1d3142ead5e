// SPDX-License-Identifier: Apache-2.0
// The GPU variant's model (model.hpp): forward and backward of the encoders and the LLM over one packed
// micro-batch, each layer a GEMM (cuBLAS on the device) or a kernel body of kernels.cuh.
#include "mllm_train_gpu/model.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mllm_train_gpu/kernels.cuh"

namespace mllm_gpu {

using detail::buffer;
using detail::exec;
using detail::for_each;
using detail::gemm;
using i64 = std::int64_t;

int cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void check_micro_batch(const sizes& s, const micro_batch& mb) {
  const auto n = static_cast<std::size_t>(mb.size());
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("mllm_gpu::micro_batch: " + what);
  };
  if (mb.targets.size() != n || mb.weights.size() != n || mb.doc_start.size() != n ||
      mb.position.size() != n || mb.enc_row.size() != n)
    fail("per-token arrays of different sizes; expected " + std::to_string(n) + " entries each");
  const std::size_t rows = mb.vision.size() / static_cast<std::size_t>(s.patch) +
                           mb.audio.size() / static_cast<std::size_t>(s.frame);
  if (mb.vision.size() % static_cast<std::size_t>(s.patch) != 0 ||
      mb.audio.size() % static_cast<std::size_t>(s.frame) != 0 || mb.enc_token.size() != rows)
    fail("encoder rows: " + std::to_string(mb.enc_token.size()) + " landings for " + std::to_string(rows) +
         " rows; expected one landing per row and whole rows");
  for (std::size_t t = 0; t < n; ++t) {
    if (mb.tokens[t] < 0 || mb.tokens[t] >= s.vocab || mb.targets[t] >= s.vocab)
      fail("token " + std::to_string(t) + " has id " + std::to_string(mb.tokens[t]) + " or target " +
           std::to_string(mb.targets[t]) + "; expected ids in [0, " + std::to_string(s.vocab) + ")");
    if (mb.doc_start[t] < 0 || static_cast<std::size_t>(mb.doc_start[t]) > t || mb.position[t] < 0)
      fail("token " + std::to_string(t) + ": document start " + std::to_string(mb.doc_start[t]) +
           "; expected a start at or before the token");
    if (mb.enc_row[t] >= 0 && (static_cast<std::size_t>(mb.enc_row[t]) >= rows ||
                               mb.enc_token[static_cast<std::size_t>(mb.enc_row[t])] != static_cast<int>(t)))
      fail("token " + std::to_string(t) + " names encoder row " + std::to_string(mb.enc_row[t]) +
           " whose landing is elsewhere");
  }
}

/// The layers' kernels over one backend (extended lambdas must live in a class nvcc can name from the
/// outside: not in model<T>'s private impl).
template <class T>
struct ops {
  sizes s;
  exec x;

  // --- layers --------------------------------------------------------------------------------------
  void rmsnorm(const T* xs, const T* gain, T* y, T* rstd, i64 n, i64 w) const {
    const T eps = static_cast<T>(s.norm_eps);
    for_each(x, n, [=] __host__ __device__(i64 i) {
      T acc = 0;
      for (i64 c = 0; c < w; ++c) acc += xs[i * w + c] * xs[i * w + c];
      const T r = T(1) / sqrt(acc / static_cast<T>(w) + eps);
      rstd[i] = r;
      for (i64 c = 0; c < w; ++c) y[i * w + c] = xs[i * w + c] * r * gain[c];
    });
  }
  // dx += input gradient, dgain += gain gradient.
  void rmsnorm_backward(const T* xs, const T* gain, const T* rstd, const T* dy, T* dx, T* dgain, i64 n,
                        i64 w) const {
    for_each(x, n, [=] __host__ __device__(i64 i) {
      const T r = rstd[i];
      T dot = 0;
      for (i64 c = 0; c < w; ++c) dot += gain[c] * dy[i * w + c] * xs[i * w + c] * r;
      dot /= static_cast<T>(w);
      for (i64 c = 0; c < w; ++c) dx[i * w + c] += r * (gain[c] * dy[i * w + c] - xs[i * w + c] * r * dot);
    });
    for_each(x, w, [=] __host__ __device__(i64 c) {
      T acc = 0;
      for (i64 i = 0; i < n; ++i) acc += dy[i * w + c] * xs[i * w + c] * rstd[i];
      dgain[c] += acc;
    });
  }
  void silu(const T* u, T* a, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) { a[i] = u[i] / (T(1) + exp(-u[i])); });
  }
  // da (in place) *= silu'(u)
  void silu_backward(const T* u, T* da, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) {
      const T sg = T(1) / (T(1) + exp(-u[i]));
      da[i] *= sg * (T(1) + u[i] * (T(1) - sg));
    });
  }
  // Rotates (or, with sign -1, rotates back: the backward) q and k by the tokens' positions.
  void rope(T* q, T* k, const std::int32_t* pos, i64 n, T sign) const {
    const i64 D = s.width, H = s.heads, hd = D / H, half = hd / 2;
    const T log_base = static_cast<T>(std::log(s.rope_base));
    for_each(x, n * H * half, [=] __host__ __device__(i64 idx) {
      const i64 t = idx / (H * half), h = (idx / half) % H, i = idx % half;
      const T theta = static_cast<T>(pos[t]) * exp(-static_cast<T>(2 * i) / static_cast<T>(hd) * log_base);
      const T c = cos(theta), sn = sign * sin(theta);
      T* both[2] = {q, k};
      for (T* X : both) {
        T* e = X + t * D + h * hd + 2 * i;
        const T a = e[0], b = e[1];
        e[0] = a * c - b * sn;
        e[1] = a * sn + b * c;
      }
    });
  }
  void attention(const T* q, const T* k, const T* v, const std::int32_t* dstart, T* o, T* lse, i64 n) const {
    const i64 D = s.width, H = s.heads, hd = D / H;
    const T scale = T(1) / static_cast<T>(std::sqrt(static_cast<double>(hd)));
    for_each(x, n * H, [=] __host__ __device__(i64 idx) {
      const i64 t = idx / H, h = idx % H;
      const T* qt = q + t * D + h * hd;
      T mx = T(-1e30);
      for (i64 j = dstart[t]; j <= t; ++j) {
        T dot = 0;
        for (i64 c = 0; c < hd; ++c) dot += qt[c] * k[j * D + h * hd + c];
        mx = dot * scale > mx ? dot * scale : mx;
      }
      T* ot = o + t * D + h * hd;
      for (i64 c = 0; c < hd; ++c) ot[c] = 0;
      T l = 0;
      for (i64 j = dstart[t]; j <= t; ++j) {
        T dot = 0;
        for (i64 c = 0; c < hd; ++c) dot += qt[c] * k[j * D + h * hd + c];
        const T pj = exp(dot * scale - mx);
        l += pj;
        for (i64 c = 0; c < hd; ++c) ot[c] += pj * v[j * D + h * hd + c];
      }
      for (i64 c = 0; c < hd; ++c) ot[c] /= l;
      lse[t * H + h] = mx + log(l);
    });
  }
  void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                          const std::int32_t* dstart, T* dq, T* dk, T* dv, T* delta, i64 n) const {
    const i64 D = s.width, H = s.heads, hd = D / H;
    const T scale = T(1) / static_cast<T>(std::sqrt(static_cast<double>(hd)));
    for_each(x, n * H, [=] __host__ __device__(i64 idx) {
      const i64 t = idx / H, h = idx % H;
      T acc = 0;
      for (i64 c = 0; c < hd; ++c) acc += dout[t * D + h * hd + c] * o[t * D + h * hd + c];
      delta[idx] = acc;
    });
    for_each(x, n * H, [=] __host__ __device__(i64 idx) {  // dq: a query row against its keys
      const i64 t = idx / H, h = idx % H;
      const T* qt = q + t * D + h * hd;
      const T* gt = dout + t * D + h * hd;
      for (i64 j = dstart[t]; j <= t; ++j) {
        T dot = 0, dp = 0;
        for (i64 c = 0; c < hd; ++c) {
          dot += qt[c] * k[j * D + h * hd + c];
          dp += gt[c] * v[j * D + h * hd + c];
        }
        const T ds = exp(dot * scale - lse[idx]) * (dp - delta[idx]) * scale;
        for (i64 c = 0; c < hd; ++c) dq[t * D + h * hd + c] += ds * k[j * D + h * hd + c];
      }
    });
    for_each(x, n * H, [=] __host__ __device__(i64 idx) {  // dk, dv: a key row against its queries
      const i64 j = idx / H, h = idx % H;
      const T* kj = k + j * D + h * hd;
      const T* vj = v + j * D + h * hd;
      for (i64 t = j; t < n && dstart[t] == dstart[j]; ++t) {
        const T* gt = dout + t * D + h * hd;
        T dot = 0, dp = 0;
        for (i64 c = 0; c < hd; ++c) {
          dot += q[t * D + h * hd + c] * kj[c];
          dp += gt[c] * vj[c];
        }
        const T pr = exp(dot * scale - lse[t * H + h]);
        const T ds = pr * (dp - delta[t * H + h]) * scale;
        for (i64 c = 0; c < hd; ++c) {
          dv[j * D + h * hd + c] += pr * gt[c];
          dk[j * D + h * hd + c] += ds * q[t * D + h * hd + c];
        }
      }
    });
  }
  void add_into(T* y, const T* a, i64 n) const {
    for_each(x, n, [=] __host__ __device__(i64 i) { y[i] += a[i]; });
  }
};

template <class T>
struct model<T>::impl : ops<T> {
  using ops<T>::s;
  using ops<T>::x;
  using ops<T>::silu;
  using ops<T>::silu_backward;

  struct encoder_w {
    i64 in = 0, w1 = 0, w2 = 0, proj = 0;
  };
  struct block_w {
    i64 g1 = 0, wq = 0, wk = 0, wv = 0, wo = 0, g2 = 0, w1 = 0, w2 = 0;
  };
  struct encoder_acts {
    i64 rows = 0;
    buffer<T> x, u1, a1, u2, a2;
  };
  struct block_acts {
    buffer<T> xin, rstd1, h, q, k, v, o, lse, x1, rstd2, h2, u, a;
  };

  std::vector<tensor> ts;
  i64 emb = 0, gf = 0, wout = 0;
  encoder_w enc[2];
  std::vector<block_w> blk;
  buffer<T> p, g, m1, m2;

  std::vector<i64> fan_in;  // per tensor: its input width (init scale 1/sqrt), 0 for a gain (init 1)

  i64 add(const std::string& name, i64 size, i64 fan) {
    const i64 off = ts.empty() ? 0 : ts.back().offset + ts.back().size;
    ts.push_back({name, off, size});
    fan_in.push_back(fan);
    return off;
  }
  T* P(i64 off) const { return p.data() + off; }
  T* G(i64 off) const { return g.data() + off; }

  // --- the encoders ---------------------------------------------------------------------------------
  encoder_acts encode(int e, const std::vector<float>& feats, T* out) const {
    const encoder_w& w = enc[e];
    const i64 E = s.enc_width;
    encoder_acts a;
    a.rows = static_cast<i64>(feats.size()) / w.in;
    const i64 r = a.rows;
    a.x = buffer<T>(x, r * w.in);
    const std::vector<T> host(feats.begin(), feats.end());
    a.x.upload(host.data());
    a.u1 = buffer<T>(x, r * E), a.a1 = buffer<T>(x, r * E), a.u2 = buffer<T>(x, r * E),
    a.a2 = buffer<T>(x, r * E);
    gemm(x, false, false, r, E, w.in, a.x.data(), P(w.w1), T(0), a.u1.data());
    silu(a.u1.data(), a.a1.data(), r * E);
    gemm(x, false, false, r, E, E, a.a1.data(), P(w.w2), T(0), a.u2.data());
    silu(a.u2.data(), a.a2.data(), r * E);
    gemm(x, false, false, r, s.width, E, a.a2.data(), P(w.proj), T(0), out);
    return a;
  }
  void encode_backward(int e, encoder_acts& a, const T* dout) const {
    const encoder_w& w = enc[e];
    const i64 E = s.enc_width, r = a.rows, D = s.width;
    if (r == 0) return;
    buffer<T> d2(x, r * E), d1(x, r * E);
    gemm(x, true, false, E, D, r, a.a2.data(), dout, T(1), G(w.proj));
    gemm(x, false, true, r, E, D, dout, P(w.proj), T(0), d2.data());
    silu_backward(a.u2.data(), d2.data(), r * E);
    gemm(x, true, false, E, E, r, a.a1.data(), d2.data(), T(1), G(w.w2));
    gemm(x, false, true, r, E, E, d2.data(), P(w.w2), T(0), d1.data());
    silu_backward(a.u1.data(), d1.data(), r * E);
    gemm(x, true, false, w.in, E, r, a.x.data(), d1.data(), T(1), G(w.w1));
  }
};

template <class T>
model<T>::model(const sizes& s, std::uint64_t seed, backend b, int device) : p_(std::make_unique<impl>()) {
  impl& m = *p_;
  m.s = s;
  if (s.width % s.heads != 0 || (s.width / s.heads) % 2 != 0)
    throw std::invalid_argument("mllm_gpu::model: width " + std::to_string(s.width) + " over " +
                                std::to_string(s.heads) + " heads; expected an even head dim");
  if (b == backend::cuda) {
    detail::cuda_check(cudaSetDevice(device), "cudaSetDevice");
    m.x.cuda = true;
    detail::cuda_check(cudaStreamCreateWithFlags(&m.x.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    detail::blas_check(cublasCreate(&m.x.blas), "cublasCreate");
    detail::blas_check(cublasSetStream(m.x.blas, m.x.stream), "cublasSetStream");
  }
  const i64 D = s.width, E = s.enc_width, F = s.mlp, V = s.vocab;
  m.emb = m.add("emb", V * D, 1);
  const char* names[2] = {"vision", "audio"};
  const i64 ins[2] = {s.patch, s.frame};
  for (int e = 0; e < 2; ++e) {
    m.enc[e].in = ins[e];
    m.enc[e].w1 = m.add(std::string(names[e]) + ".w1", ins[e] * E, ins[e]);
    m.enc[e].w2 = m.add(std::string(names[e]) + ".w2", E * E, E);
    m.enc[e].proj = m.add(std::string(names[e]) + ".proj", E * D, E);
  }
  for (i64 l = 0; l < s.blocks; ++l) {
    const std::string b_ = "block" + std::to_string(l) + ".";
    typename impl::block_w w;
    w.g1 = m.add(b_ + "g1", D, 0), w.wq = m.add(b_ + "wq", D * D, D), w.wk = m.add(b_ + "wk", D * D, D);
    w.wv = m.add(b_ + "wv", D * D, D), w.wo = m.add(b_ + "wo", D * D, D), w.g2 = m.add(b_ + "g2", D, 0);
    w.w1 = m.add(b_ + "w1", D * F, D), w.w2 = m.add(b_ + "w2", F * D, F);
    m.blk.push_back(w);
  }
  m.gf = m.add("gf", D, 0);
  m.wout = m.add("wout", D * V, D);
  const i64 total = m.ts.back().offset + m.ts.back().size;
  // Seeded uniform values, a pure function of (seed, index): equal on every backend and element type.
  std::vector<T> host(static_cast<std::size_t>(total));
  for (std::size_t ti = 0; ti < m.ts.size(); ++ti) {
    const tensor& t = m.ts[ti];
    const bool gain = m.fan_in[ti] == 0;
    const double scale = gain ? 0.0 : 1.0 / std::sqrt(static_cast<double>(m.fan_in[ti]));
    for (i64 i = 0; i < t.size; ++i) {
      std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(t.offset + i) + 1;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
      host[static_cast<std::size_t>(t.offset + i)] = gain ? T(1) : static_cast<T>((2 * u - 1) * scale);
    }
  }
  m.p = buffer<T>(m.x, total), m.g = buffer<T>(m.x, total), m.m1 = buffer<T>(m.x, total);
  m.m2 = buffer<T>(m.x, total);
  m.p.upload(host.data());
  synchronize();
}

template <class T>
model<T>::~model() {
  if (!p_) return;
  const exec x = p_->x;
  if (x.cuda) cudaStreamSynchronize(x.stream);
  p_.reset();  // buffers free on the stream first
  if (x.cuda) {
    cudaStreamSynchronize(x.stream);
    cublasDestroy(x.blas);
    cudaStreamDestroy(x.stream);
  }
}
template <class T>
model<T>::model(model&&) noexcept = default;
template <class T>
model<T>& model<T>::operator=(model&&) noexcept = default;

template <class T>
std::pair<double, double> model<T>::forward_backward(const micro_batch& mb) {
  impl& m = *p_;
  const sizes& s = m.s;
  check_micro_batch(s, mb);
  const exec& x = m.x;
  const i64 n = mb.size(), D = s.width, H = s.heads, F = s.mlp, V = s.vocab;
  if (n == 0) return {0.0, 0.0};
  const auto ints = [&](const std::vector<std::int32_t>& h) {
    buffer<std::int32_t> b(x, static_cast<i64>(h.size()));
    b.upload(h.data());
    return b;
  };
  auto tok = ints(mb.tokens), tgt = ints(mb.targets), dstart = ints(mb.doc_start), pos = ints(mb.position),
       erow = ints(mb.enc_row), etok = ints(mb.enc_token);
  buffer<T> w(x, n);
  {
    const std::vector<T> hw(mb.weights.begin(), mb.weights.end());
    w.upload(hw.data());
  }
  const i64 rows = static_cast<i64>(mb.enc_token.size());
  const i64 vrows = static_cast<i64>(mb.vision.size()) / s.patch;
  buffer<T> encout(x, rows * D);
  typename impl::encoder_acts ea[2] = {m.encode(0, mb.vision, encout.data()),
                                       m.encode(1, mb.audio, encout.data() + vrows * D)};

  // Embedding, with the encoders' rows at their landings.
  buffer<T> x0(x, n * D);
  {
    T* xo = x0.data();
    const T* emb = m.P(m.emb);
    const T* eo = encout.data();
    const std::int32_t* tk = tok.data();
    const std::int32_t* er = erow.data();
    for_each(x, n * D, [=] __host__ __device__(i64 i) {
      const i64 t = i / D, c = i % D;
      xo[i] = er[t] >= 0 ? eo[static_cast<i64>(er[t]) * D + c] : emb[static_cast<i64>(tk[t]) * D + c];
    });
  }

  // Blocks.
  std::vector<typename impl::block_acts> acts(m.blk.size());
  buffer<T>* cur = &x0;
  buffer<T> xs_out;
  for (std::size_t l = 0; l < m.blk.size(); ++l) {
    const auto& bw = m.blk[l];
    auto& a = acts[l];
    a.xin = std::move(*cur);
    a.rstd1 = buffer<T>(x, n), a.h = buffer<T>(x, n * D), a.q = buffer<T>(x, n * D),
    a.k = buffer<T>(x, n * D);
    a.v = buffer<T>(x, n * D), a.o = buffer<T>(x, n * D), a.lse = buffer<T>(x, n * H),
    a.x1 = buffer<T>(x, n * D);
    a.rstd2 = buffer<T>(x, n), a.h2 = buffer<T>(x, n * D), a.u = buffer<T>(x, n * F),
    a.a = buffer<T>(x, n * F);
    m.rmsnorm(a.xin.data(), m.P(bw.g1), a.h.data(), a.rstd1.data(), n, D);
    gemm(x, false, false, n, D, D, a.h.data(), m.P(bw.wq), T(0), a.q.data());
    gemm(x, false, false, n, D, D, a.h.data(), m.P(bw.wk), T(0), a.k.data());
    gemm(x, false, false, n, D, D, a.h.data(), m.P(bw.wv), T(0), a.v.data());
    m.rope(a.q.data(), a.k.data(), pos.data(), n, T(1));
    m.attention(a.q.data(), a.k.data(), a.v.data(), dstart.data(), a.o.data(), a.lse.data(), n);
    gemm(x, false, false, n, D, D, a.o.data(), m.P(bw.wo), T(0), a.x1.data());
    m.add_into(a.x1.data(), a.xin.data(), n * D);
    m.rmsnorm(a.x1.data(), m.P(bw.g2), a.h2.data(), a.rstd2.data(), n, D);
    gemm(x, false, false, n, F, D, a.h2.data(), m.P(bw.w1), T(0), a.u.data());
    m.silu(a.u.data(), a.a.data(), n * F);
    xs_out = buffer<T>(x, n * D);
    gemm(x, false, false, n, D, F, a.a.data(), m.P(bw.w2), T(0), xs_out.data());
    m.add_into(xs_out.data(), a.x1.data(), n * D);
    cur = &xs_out;
  }
  buffer<T> xl = std::move(*cur);

  // Head and loss: per token w (lse - logit[target]) and its gradient.
  buffer<T> rstdf(x, n), hf(x, n * D), logits(x, n * V), dlogits(x, n * V), loss(x, n);
  m.rmsnorm(xl.data(), m.P(m.gf), hf.data(), rstdf.data(), n, D);
  gemm(x, false, false, n, V, D, hf.data(), m.P(m.wout), T(0), logits.data());
  {
    const T* lg = logits.data();
    T* dl = dlogits.data();
    T* ls = loss.data();
    const T* wt = w.data();
    const std::int32_t* tg = tgt.data();
    for_each(x, n, [=] __host__ __device__(i64 t) {
      if (tg[t] < 0 || wt[t] == T(0)) {
        ls[t] = 0;
        return;
      }
      const T* row = lg + t * V;
      T mx = row[0];
      for (i64 j = 1; j < V; ++j) mx = row[j] > mx ? row[j] : mx;
      T se = 0;
      for (i64 j = 0; j < V; ++j) se += exp(row[j] - mx);
      const T lse = mx + log(se);
      ls[t] = wt[t] * (lse - row[tg[t]]);
      for (i64 j = 0; j < V; ++j) dl[t * V + j] = wt[t] * (exp(row[j] - lse) - (j == tg[t] ? T(1) : T(0)));
    });
  }

  // Backward: head.
  buffer<T> dhf(x, n * D), dx(x, n * D);
  gemm(x, true, false, D, V, n, hf.data(), dlogits.data(), T(1), m.G(m.wout));
  gemm(x, false, true, n, D, V, dlogits.data(), m.P(m.wout), T(0), dhf.data());
  m.rmsnorm_backward(xl.data(), m.P(m.gf), rstdf.data(), dhf.data(), dx.data(), m.G(m.gf), n, D);

  // Blocks, last first; dx is the gradient of the block's output, then of its input.
  for (std::size_t li = m.blk.size(); li-- > 0;) {
    const auto& bw = m.blk[li];
    auto& a = acts[li];
    buffer<T> da(x, n * F), dh(x, n * D), dq(x, n * D), dk(x, n * D), dv(x, n * D), dout(x, n * D),
        delta(x, n * H);
    gemm(x, false, true, n, F, D, dx.data(), m.P(bw.w2), T(0), da.data());
    gemm(x, true, false, F, D, n, a.a.data(), dx.data(), T(1), m.G(bw.w2));
    m.silu_backward(a.u.data(), da.data(), n * F);
    gemm(x, false, true, n, D, F, da.data(), m.P(bw.w1), T(0), dh.data());
    gemm(x, true, false, D, F, n, a.h2.data(), da.data(), T(1), m.G(bw.w1));
    m.rmsnorm_backward(a.x1.data(), m.P(bw.g2), a.rstd2.data(), dh.data(), dx.data(), m.G(bw.g2), n, D);
    gemm(x, false, true, n, D, D, dx.data(), m.P(bw.wo), T(0), dout.data());
    gemm(x, true, false, D, D, n, a.o.data(), dx.data(), T(1), m.G(bw.wo));
    m.attention_backward(a.q.data(), a.k.data(), a.v.data(), a.o.data(), a.lse.data(), dout.data(),
                         dstart.data(), dq.data(), dk.data(), dv.data(), delta.data(), n);
    m.rope(dq.data(), dk.data(), pos.data(), n, T(-1));
    gemm(x, true, false, D, D, n, a.h.data(), dq.data(), T(1), m.G(bw.wq));
    gemm(x, true, false, D, D, n, a.h.data(), dk.data(), T(1), m.G(bw.wk));
    gemm(x, true, false, D, D, n, a.h.data(), dv.data(), T(1), m.G(bw.wv));
    gemm(x, false, true, n, D, D, dq.data(), m.P(bw.wq), T(0), dh.data());
    gemm(x, false, true, n, D, D, dk.data(), m.P(bw.wk), T(1), dh.data());
    gemm(x, false, true, n, D, D, dv.data(), m.P(bw.wv), T(1), dh.data());
    m.rmsnorm_backward(a.xin.data(), m.P(bw.g1), a.rstd1.data(), dh.data(), dx.data(), m.G(bw.g1), n, D);
  }

  // Embedding and the encoders' rows.
  {
    const T* d0 = dx.data();
    T* ge = m.G(m.emb);
    const std::int32_t* tk = tok.data();
    const std::int32_t* er = erow.data();
    for_each(x, V * D, [=] __host__ __device__(i64 i) {
      const i64 vtok = i / D, c = i % D;
      T acc = 0;
      for (i64 t = 0; t < n; ++t)
        if (tk[t] == vtok && er[t] < 0) acc += d0[t * D + c];
      ge[i] += acc;
    });
  }
  buffer<T> dencout(x, rows * D);
  {
    const T* d0 = dx.data();
    T* de = dencout.data();
    const std::int32_t* et = etok.data();
    for_each(x, rows * D, [=] __host__ __device__(i64 i) {
      const i64 k = i / D, c = i % D;
      de[i] = d0[static_cast<i64>(et[k]) * D + c];
    });
  }
  m.encode_backward(0, ea[0], dencout.data());
  m.encode_backward(1, ea[1], dencout.data() + vrows * D);

  std::vector<T> hl(static_cast<std::size_t>(n));
  loss.download(hl.data());  // synchronises
  double sum = 0, wsum = 0;
  for (i64 t = 0; t < n; ++t) sum += static_cast<double>(hl[static_cast<std::size_t>(t)]);
  for (i64 t = 0; t < n; ++t)
    if (mb.targets[static_cast<std::size_t>(t)] >= 0) wsum += mb.weights[static_cast<std::size_t>(t)];
  return {sum, wsum};
}

template <class T>
std::span<T> model<T>::parameters() {
  return {p_->p.data(), static_cast<std::size_t>(p_->p.size())};
}
template <class T>
std::span<T> model<T>::gradients() {
  return {p_->g.data(), static_cast<std::size_t>(p_->g.size())};
}
template <class T>
void model<T>::zero_grad() {
  p_->g.zero();
}
template <class T>
void model<T>::scale_gradients(double factor) {
  T* g = p_->g.data();
  const T f = static_cast<T>(factor);
  for_each(p_->x, p_->g.size(), [=] __host__ __device__(i64 i) { g[i] *= f; });
}
template <class T>
void model<T>::adam(double lr, int step, double beta1, double beta2, double eps) {
  T *p = p_->p.data(), *g = p_->g.data(), *m1 = p_->m1.data(), *m2 = p_->m2.data();
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), e = static_cast<T>(eps);
  const T c1 = static_cast<T>(1 - std::pow(beta1, step)), c2 = static_cast<T>(1 - std::pow(beta2, step));
  const T l = static_cast<T>(lr);
  for_each(p_->x, p_->p.size(), [=] __host__ __device__(i64 i) {
    m1[i] = b1 * m1[i] + (T(1) - b1) * g[i];
    m2[i] = b2 * m2[i] + (T(1) - b2) * g[i] * g[i];
    p[i] -= l * (m1[i] / c1) / (sqrt(m2[i] / c2) + e);
  });
}
template <class T>
std::vector<T> model<T>::download(std::span<const T> b) const {
  std::vector<T> out(b.size());
  if (p_->x.cuda) {
    detail::cuda_check(
        cudaMemcpyAsync(out.data(), b.data(), b.size_bytes(), cudaMemcpyDeviceToHost, p_->x.stream),
        "cudaMemcpyAsync");
    detail::cuda_check(cudaStreamSynchronize(p_->x.stream), "cudaStreamSynchronize");
  } else {
    std::copy(b.begin(), b.end(), out.begin());
  }
  return out;
}
template <class T>
void model<T>::set_parameter(std::int64_t index, T value) {
  if (p_->x.cuda)
    detail::cuda_check(
        cudaMemcpyAsync(p_->p.data() + index, &value, sizeof(T), cudaMemcpyHostToDevice, p_->x.stream),
        "cudaMemcpyAsync");
  else
    p_->p.data()[index] = value;
  synchronize();
}
template <class T>
const std::vector<typename model<T>::tensor>& model<T>::tensors() const {
  return p_->ts;
}
template <class T>
void* model<T>::stream() const {
  return p_->x.cuda ? static_cast<void*>(p_->x.stream) : nullptr;
}
template <class T>
void model<T>::synchronize() {
  if (p_->x.cuda) detail::cuda_check(cudaStreamSynchronize(p_->x.stream), "cudaStreamSynchronize");
}

template class model<float>;
template class model<double>;

}  // namespace mllm_gpu
