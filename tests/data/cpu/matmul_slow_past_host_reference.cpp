/* kforge
 * op: matmul
 * backend: cpu
 * dtypes: f32
 */
// A fixture for kforge's checks, not a kernel to use: C = A @ B, correct (i-k-j, double
// accumulation), except that a problem of more than 4e9 FLOPs (past the host reference's limit,
// so nothing on the CPU backend could compare its output) spins until the worker is killed, as
// a CPU kernel at 4096^3 outlasts any reasonable time limit. The check must not run such cases
// on the CPU backend: it has nothing to compare them with.
//
// The flag is volatile, so each read is an observable side effect and the loop cannot be
// removed or assumed to terminate.
#include <cstdint>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {
volatile bool never_set = false;
}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 2 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& a = args->inputs[0];
  const kf_tensor& b = args->inputs[1];
  const kf_tensor& c = args->outputs[0];
  if (a.ndim != 2 || b.ndim != 2 || c.ndim != 2) return KF_ERR_UNSUPPORTED;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (b.shape[0] != K || c.shape[0] != M || c.shape[1] != N) return KF_ERR_UNSUPPORTED;
  if (2.0 * double(M) * double(N) * double(K) > 4e9) {
    while (!never_set) {
    }
  }
  const auto* a_data = static_cast<const kf_elem*>(a.data);  // A: [M, K]
  const auto* b_data = static_cast<const kf_elem*>(b.data);  // B: [K, N]
  auto* c_data = static_cast<kf_elem*>(c.data);              // C: [M, N]
  std::vector<double> row(static_cast<size_t>(N));
  for (int64_t i = 0; i < M; ++i) {
    for (double& v : row)
      v = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double a_ik = kf_to_float(a_data[i * K + k]);
      const kf_elem* b_row = b_data + k * N;
      for (int64_t j = 0; j < N; ++j)
        row[static_cast<size_t>(j)] += a_ik * kf_to_float(b_row[j]);
    }
    for (int64_t j = 0; j < N; ++j)
      c_data[i * N + j] = kf_from_float<kf_elem>(static_cast<float>(row[static_cast<size_t>(j)]));
  }
  return KF_OK;
}
