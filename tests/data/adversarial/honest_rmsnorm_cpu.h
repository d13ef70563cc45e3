// The honest rmsnorm every CPU adversarial kernel builds on: each of them computes the right
// answer this way whenever it does compute, and cheats around it.
#ifndef KFORGE_TESTS_HONEST_RMSNORM_CPU_H_
#define KFORGE_TESTS_HONEST_RMSNORM_CPU_H_

#include <cmath>
#include <cstdint>

#include "kforge/elem_cpu.h"

// y = x / sqrt(mean(x^2) + eps) * weight over rows [row_begin, row_end); returns a kf_status.
static inline int honest_rmsnorm_rows(const kf_args* args, int64_t row_begin, int64_t row_end) {
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  const auto* xd = static_cast<const kf_elem*>(x.data);                // x: [M, N]
  const auto* wd = static_cast<const kf_elem*>(args->inputs[1].data);  // weight: [N]
  auto* yd = static_cast<kf_elem*>(args->outputs[0].data);             // y: [M, N]
  const double eps = args->scalars[0];
  for (int64_t r = row_begin; r < row_end; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double v = kf_to_float(xd[r * n + j]);
      sum += v * v;
    }
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(n) + eps);
    for (int64_t j = 0; j < n; ++j) {
      const double v = kf_to_float(xd[r * n + j]) * inv * kf_to_float(wd[j]);
      yd[r * n + j] = kf_from_float<kf_elem>(static_cast<float>(v));
    }
  }
  return KF_OK;
}

static inline int64_t rmsnorm_rows(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  return n == 0 ? 0 : kf_numel(&x) / n;
}

static inline int honest_rmsnorm(const kf_args* args) {
  return honest_rmsnorm_rows(args, 0, rmsnorm_rows(args));
}

#endif  // KFORGE_TESTS_HONEST_RMSNORM_CPU_H_
