/* kforge
 * op: softmax
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// Softmax over the last dim on the CPU, one row at a time, single-threaded.
//
// Idea: three passes over a row. Pass 1 finds the row max with UNROLL independent running
// maxima; pass 2 computes e = exp(x - max) once per element into a scratch row and sums it
// with UNROLL independent partial sums (added in a fixed order, so the result is
// deterministic); pass 3 writes y = e / sum. Subtracting the max keeps exp() in range for any
// input, very negative rows included, and the max element contributes exp(0) = 1, so the sum
// is never below 1. fp16 and bf16 accumulate in float; fp32 in double.
//
// Tunables:
//   UNROLL  independent running maxima / partial sums per row.
#include <cmath>
#include <cstdint>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

acc_t row_max(const kf_elem* x_row, int64_t cols) {  // x_row: [cols]
  acc_t partial[UNROLL];
  for (int k = 0; k < UNROLL; ++k) {
    partial[k] = -std::numeric_limits<acc_t>::infinity();
  }
  int64_t j = 0;
  for (; j + UNROLL <= cols; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      const acc_t v = kf_to_float(x_row[j + k]);
      partial[k] = v > partial[k] ? v : partial[k];
    }
  }
  for (; j < cols; ++j) {
    const acc_t v = kf_to_float(x_row[j]);
    partial[0] = v > partial[0] ? v : partial[0];
  }
  acc_t result = partial[0];
  for (int k = 1; k < UNROLL; ++k) {
    result = partial[k] > result ? partial[k] : result;
  }
  return result;
}

// Writes exp(x - max) to exp_row and returns its sum.
acc_t exp_and_sum(const kf_elem* x_row, acc_t max, acc_t* exp_row, int64_t cols) {
  acc_t partial[UNROLL] = {};
  int64_t j = 0;
  for (; j + UNROLL <= cols; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      const acc_t e = std::exp(acc_t(kf_to_float(x_row[j + k])) - max);
      exp_row[j + k] = e;
      partial[k] += e;
    }
  }
  for (; j < cols; ++j) {
    const acc_t e = std::exp(acc_t(kf_to_float(x_row[j])) - max);
    exp_row[j] = e;
    partial[0] += e;
  }
  acc_t total = 0;
  for (int k = 0; k < UNROLL; ++k) {
    total += partial[k];
  }
  return total;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 1 || args->num_outputs != 1 || args->num_scalars != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) return KF_ERR_UNSUPPORTED;
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: rows = shape[0] for the [rows, cols] case.
  const int64_t cols = x.shape[x.ndim - 1];
  if (cols == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t rows = kf_numel(&x) / cols;

  const auto* x_data = static_cast<const kf_elem*>(x.data);  // x: [rows, cols]
  auto* y_data = static_cast<kf_elem*>(y.data);              // y: [rows, cols]

  // exp_row: [cols], kept between calls so that only a longer row allocates.
  thread_local std::vector<acc_t> exp_row;
  try {
    if (exp_row.size() < size_t(cols)) exp_row.resize(size_t(cols));
  } catch (const std::bad_alloc&) {
    return KF_ERR_OUT_OF_MEMORY;
  }

  for (int64_t row = 0; row < rows; ++row) {
    const kf_elem* x_row = x_data + row * cols;
    kf_elem* y_row = y_data + row * cols;
    const acc_t max = row_max(x_row, cols);
    const acc_t inv_sum = acc_t(1) / exp_and_sum(x_row, max, exp_row.data(), cols);
    for (int64_t j = 0; j < cols; ++j) {
      y_row[j] = kf_from_float<kf_elem>(float(exp_row[j] * inv_sum));
    }
  }
  return KF_OK;
}
