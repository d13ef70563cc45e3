/* kforge
 * op: layernorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// LayerNorm on the CPU, one row at a time, single-threaded.
//
// Idea: two passes over a row before the write. Pass 1 sums x for the mean; pass 2 sums
// (x - mean)^2 for the biased variance. Computing the variance around the mean, rather than as
// E[x^2] - E[x]^2, matters for near-constant rows: there the two terms of the difference agree
// in almost every digit and their difference is mostly rounding error, while (x - mean)^2 keeps
// the small deviations exact. Both sums use UNROLL independent partial sums (added in a fixed
// order, so the result is deterministic) and accumulate in double for every dtype. Pass 3
// writes y = (x - mean) * inv_std * weight + bias, rounded once to the element type.
//
// Tunables:
//   UNROLL  independent partial sums per row in the mean and variance passes.
#include <cmath>
#include <cstdint>

#include "kforge/elem_cpu.h"

namespace {

double row_mean(const kf_elem* x_row, int64_t dim) {  // x_row: [dim]
  double partial[UNROLL] = {};
  int64_t j = 0;
  for (; j + UNROLL <= dim; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      partial[k] += double(kf_to_float(x_row[j + k]));
    }
  }
  for (; j < dim; ++j) {
    partial[0] += double(kf_to_float(x_row[j]));
  }
  double total = 0;
  for (int k = 0; k < UNROLL; ++k) {
    total += partial[k];
  }
  return total / double(dim);
}

// Biased variance: mean of (x - mean)^2 over the row.
double row_variance(const kf_elem* x_row, double mean, int64_t dim) {  // x_row: [dim]
  double partial[UNROLL] = {};
  int64_t j = 0;
  for (; j + UNROLL <= dim; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      const double centered = double(kf_to_float(x_row[j + k])) - mean;
      partial[k] += centered * centered;
    }
  }
  for (; j < dim; ++j) {
    const double centered = double(kf_to_float(x_row[j])) - mean;
    partial[0] += centered * centered;
  }
  double total = 0;
  for (int k = 0; k < UNROLL; ++k) {
    total += partial[k];
  }
  return total / double(dim);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 1) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const kf_tensor& bias = args->inputs[2];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || weight.dtype != kf_elem_dtype || bias.dtype != kf_elem_dtype ||
      y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: batch = shape[0] for the [batch, dim] case.
  const int64_t dim = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != dim || kf_numel(&bias) != dim) return KF_ERR_UNSUPPORTED;
  if (dim == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t batch = kf_numel(&x) / dim;

  const auto* x_data = static_cast<const kf_elem*>(x.data);       // x: [batch, dim]
  const auto* w_data = static_cast<const kf_elem*>(weight.data);  // weight: [dim]
  const auto* b_data = static_cast<const kf_elem*>(bias.data);    // bias: [dim]
  auto* y_data = static_cast<kf_elem*>(y.data);                   // y: [batch, dim]
  const double eps = args->scalars[0];

  for (int64_t row = 0; row < batch; ++row) {
    const kf_elem* x_row = x_data + row * dim;
    kf_elem* y_row = y_data + row * dim;
    const double mean = row_mean(x_row, dim);
    const double inv_std = 1.0 / std::sqrt(row_variance(x_row, mean, dim) + eps);
    for (int64_t j = 0; j < dim; ++j) {
      const double normalized = (double(kf_to_float(x_row[j])) - mean) * inv_std;
      const double scaled =
          normalized * double(kf_to_float(w_data[j])) + double(kf_to_float(b_data[j]));
      y_row[j] = kf_from_float<kf_elem>(float(scaled));
    }
  }
  return KF_OK;
}
