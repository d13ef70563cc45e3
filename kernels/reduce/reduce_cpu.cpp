/* kforge
 * op: reduce
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// Row sum on the CPU, one row at a time, single-threaded.
//
// Idea: each row is summed into UNROLL independent partial sums, so consecutive additions do
// not wait on each other and the compiler can keep them in separate (vector) registers; the
// partials are added in a fixed order, so the result is deterministic. Every dtype accumulates
// in double: the stability stage feeds rows whose first half is +a and second half -a, with
// partial sums that peak far above the fp16 range, and near-max values whose sums would lose
// the small terms in float. Only the final sum is rounded to the element type.
//
// Tunables:
//   UNROLL  independent partial sums per row.
#include <cstdint>

#include "kforge/elem_cpu.h"

namespace {

double row_sum(const kf_elem* x_row, int64_t N) {  // x_row: [N]
  double partial[UNROLL] = {};
  int64_t j = 0;
  for (; j + UNROLL <= N; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      partial[k] += double(kf_to_float(x_row[j + k]));
    }
  }
  for (; j < N; ++j) {
    partial[0] += double(kf_to_float(x_row[j]));
  }
  double total = 0;
  for (int k = 0; k < UNROLL; ++k) {
    total += partial[k];
  }
  return total;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 1 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) return KF_ERR_UNSUPPORTED;
  if (x.ndim < 1) return KF_ERR_UNSUPPORTED;

  // y has x's shape without the last dim: [M] for the [M, N] case.
  if (y.ndim != x.ndim - 1) return KF_ERR_UNSUPPORTED;
  for (int32_t d = 0; d < y.ndim; ++d) {
    if (y.shape[d] != x.shape[d]) return KF_ERR_UNSUPPORTED;
  }
  const int64_t M = kf_numel(&y);
  const int64_t N = x.shape[x.ndim - 1];  // an empty row sums to 0

  const auto* x_data = static_cast<const kf_elem*>(x.data);  // x: [M, N]
  auto* y_data = static_cast<kf_elem*>(y.data);              // y: [M]

  for (int64_t row = 0; row < M; ++row) {
    y_data[row] = kf_from_float<kf_elem>(float(row_sum(x_data + row * N, N)));
  }
  return KF_OK;
}
