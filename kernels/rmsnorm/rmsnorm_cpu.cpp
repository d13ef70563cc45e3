/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// RMSNorm on the CPU, one row at a time, single-threaded.
//
// Idea: pass 1 sums x^2 over the row into UNROLL independent partial sums, so consecutive
// additions do not wait on each other and the compiler can keep them in separate (vector)
// registers; the partials are added in a fixed order, so the result is deterministic.
// Pass 2 writes y = x * (1 / sqrt(mean + eps)) * weight. fp16 and bf16 accumulate in float;
// fp32 accumulates in double, since float rounding over a long row can approach the fp32
// tolerance.
//
// Tunables:
//   UNROLL  independent partial sums of x^2 per row.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

acc_t row_sum_of_squares(const kf_elem* x_row, int64_t N) {  // x_row: [N]
  acc_t partial[UNROLL] = {};
  int64_t j = 0;
  for (; j + UNROLL <= N; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      const acc_t v = kf_to_float(x_row[j + k]);
      partial[k] += v * v;
    }
  }
  for (; j < N; ++j) {
    const acc_t v = kf_to_float(x_row[j]);
    partial[0] += v * v;
  }
  acc_t total = 0;
  for (int k = 0; k < UNROLL; ++k) {
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
