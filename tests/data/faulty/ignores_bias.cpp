/* kforge
 * op: matmul_bias
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Planted fault: returns A @ B without adding the bias.
//
// A fixture for kforge's checks, not a kernel to use: a plain single-threaded matmul that is
// correct except for the fault above.
#include <cstdint>

#include "kforge/elem_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& a = args->inputs[0];
  const kf_tensor& b = args->inputs[1];
  const kf_tensor& bias = args->inputs[2];
  const kf_tensor& c = args->outputs[0];
  if (a.dtype != kf_elem_dtype || b.dtype != kf_elem_dtype || bias.dtype != kf_elem_dtype ||
      c.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (a.ndim != 2 || b.ndim != 2 || c.ndim != 2 || bias.ndim != 1) return KF_ERR_UNSUPPORTED;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (b.shape[0] != K || c.shape[0] != M || c.shape[1] != N || bias.shape[0] != N) {
    return KF_ERR_UNSUPPORTED;
  }

  const auto* a_data = static_cast<const kf_elem*>(a.data);  // A: [M, K]
  const auto* b_data = static_cast<const kf_elem*>(b.data);  // B: [K, N]
  auto* c_data = static_cast<kf_elem*>(c.data);              // C: [M, N]
  // the fault: bias.data is never read

  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < K; ++p)
        sum += double(kf_to_float(a_data[i * K + p])) * double(kf_to_float(b_data[p * N + j]));
      c_data[i * N + j] = kf_from_float<kf_elem>(float(sum));
    }
  }
  return KF_OK;
}
