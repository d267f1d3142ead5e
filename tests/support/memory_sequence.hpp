// A fixed sequence of memory-policy operations over host inputs, its results downloaded to host: run with
// two policies (host and emulated device on CPU, host and CUDA on a GPU), the results must agree.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace test_support {

/// Inputs: x, y of rows x dim; la, lb of rows (log-sum-exps, some -inf). Runs merge_attention, add,
/// attention_delta, fill, copy_2d and copy, and returns every buffer, concatenated.
template <class M, class T>
std::vector<T> run_memory_sequence(M& m, std::span<const T> x, std::span<const T> y, std::span<const T> la,
                                   std::span<const T> lb, std::size_t dim) {
  const std::size_t rows = la.size(), n = rows * dim;
  typename M::template buffer<T> a, b, l1, l2, d, c, e;
  a.resize(x.size()), b.resize(y.size()), c.resize(n), e.resize(n);
  l1.resize(la.size()), l2.resize(lb.size()), d.resize(rows);
  m.upload(a.span(), x);
  m.upload(b.span(), y);
  m.upload(l1.span(), la);
  m.upload(l2.span(), lb);
  m.merge_attention(a.span(), l1.span(), std::span<const T>(b.span()), std::span<const T>(l2.span()), dim);
  m.add(b.span(), std::span<const T>(a.span()));
  m.attention_delta(std::span<const T>(a.span()), std::span<const T>(b.span()), d.span(), dim);
  m.fill(c.span(), T(0.5));
  m.copy_2d(c.span(), dim, std::span<const T>(b.span()), dim, dim / 2, rows);  // left half of each row
  m.copy(e.span(), std::span<const T>(c.span()));
  m.synchronize();
  std::vector<T> out(4 * n + 2 * rows);
  std::size_t at = 0;
  for (auto* buf : {&a, &b, &c, &e, &l1, &d}) {
    m.download(std::span<T>(out).subspan(at, buf->size()), std::span<const T>(buf->span()));
    at += buf->size();
  }
  return out;
}

}  // namespace test_support
