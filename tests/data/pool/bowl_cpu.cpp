/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f32
 * param: A = 0 in {0, 1, 2, 3, 4}
 * param: B = 0 in {0, 1, 2, 3, 4}
 */
// A test file for tunes on several devices: RMSNorm on the CPU with a bowl-shaped cost. Each
// call first waits 1 + 3 ((A - 2)^2 + (B - 3)^2) units of a busy loop, so the one fastest
// variant (A = 2, B = 3) is about three times as fast as its nearest neighbours, a margin that
// survives the noise of a two-core machine timing on both cores. The result does not depend on
// A or B.
//
// Tunables:
//   A, B  the bowl's coordinates.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

acc_t row_sum_of_squares(const kf_elem* x_row, int64_t N) {  // x_row: [N]
  acc_t partial[4] = {};
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) {
    for (int k = 0; k < 4; ++k) {
      const acc_t v = kf_to_float(x_row[j + k]);
      partial[k] += v * v;
    }
  }
  for (; j < N; ++j) {
    const acc_t v = kf_to_float(x_row[j]);
    partial[0] += v * v;
  }
  acc_t total = 0;
  for (int k = 0; k < 4; ++k) {
    total += partial[k];
  }
  return total;
}

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

  // Leading dimensions are rows: M = shape[0] for the [M, N] case.
  const int64_t N = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != N) return KF_ERR_UNSUPPORTED;
  if (N == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t M = kf_numel(&x) / N;

  const auto* x_data = static_cast<const kf_elem*>(x.data);       // x: [M, N]
  const auto* w_data = static_cast<const kf_elem*>(weight.data);  // weight: [N]
  auto* y_data = static_cast<kf_elem*>(y.data);                   // y: [M, N]
  const acc_t eps = acc_t(args->scalars[0]);

  constexpr int kUnits = 1 + 3 * ((A - 2) * (A - 2) + (B - 3) * (B - 3));
  for (volatile int spin = 0; spin < kUnits * 10000; ++spin) {
  }
  for (int64_t row = 0; row < M; ++row) {
    const kf_elem* x_row = x_data + row * N;
    kf_elem* y_row = y_data + row * N;
    const acc_t inv_rms = acc_t(1) / std::sqrt(row_sum_of_squares(x_row, N) / acc_t(N) + eps);
    for (int64_t j = 0; j < N; ++j) {
      const acc_t v = kf_to_float(x_row[j]);
      y_row[j] = kf_from_float<kf_elem>(float(v * inv_rms * acc_t(kf_to_float(w_data[j]))));
    }
  }
  return KF_OK;
}
