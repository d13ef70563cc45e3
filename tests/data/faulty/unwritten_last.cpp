/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Planted fault: never writes the very last element of y (y[M-1][N-1]).
//
// A fixture for kforge's checks, not a kernel to use: a plain single-threaded RMSNorm that is
// correct except for the fault above.
#include <cmath>
#include <cstdint>

#include "kforge/elem_cpu.h"

namespace {

bool same_shape(const kf_tensor& a, const kf_tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int32_t i = 0; i < a.ndim; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  return true;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 1) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || weight.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim < 1 || !same_shape(x, y)) return KF_ERR_UNSUPPORTED;

  const int64_t N = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != N) return KF_ERR_UNSUPPORTED;
  if (N == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t M = kf_numel(&x) / N;

  const auto* x_data = static_cast<const kf_elem*>(x.data);       // x: [M, N]
  const auto* w_data = static_cast<const kf_elem*>(weight.data);  // weight: [N]
  auto* y_data = static_cast<kf_elem*>(y.data);                   // y: [M, N]
  const double eps = args->scalars[0];

  for (int64_t row = 0; row < M; ++row) {
    const kf_elem* x_row = x_data + row * N;
    kf_elem* y_row = y_data + row * N;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < N; ++j) {
      const double v = kf_to_float(x_row[j]);
      sum_sq += v * v;
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / double(N) + eps);
    // The bound skips the last element of the last row.
    const int64_t end = row == M - 1 ? N - 1 : N;
    for (int64_t j = 0; j < end; ++j) {
      const double v = kf_to_float(x_row[j]);
      y_row[j] = kf_from_float<kf_elem>(float(v * inv_rms * kf_to_float(w_data[j])));
    }
  }
  return KF_OK;
}
