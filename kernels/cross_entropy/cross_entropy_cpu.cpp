/* kforge
 * op: cross_entropy
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// Mean cross-entropy loss on the CPU, one row at a time, single-threaded.
//
// Idea: for each row whose target is not IGNORE_INDEX, two passes over the logits: pass 1
// finds the row max, pass 2 sums exp(logit - max). Then row loss = max + log(sum) -
// logits[target]. Subtracting the max keeps exp() in range for any logits (near-max and very
// negative rows included), and the max itself contributes exp(0) = 1, so log(sum) is finite.
// Both passes use UNROLL independent maxima / partial sums, combined in a fixed order, so the
// result is deterministic. Everything accumulates in double; the mean over counted rows is
// rounded once to the element type. As PyTorch's ignore_index, ignored rows count neither in
// the sum nor in the divisor, and a batch with every row ignored gives NaN (0 / 0).
//
// Tunables:
//   UNROLL  independent running maxima / partial sums of exp per row.
#include <cmath>
#include <cstdint>
#include <limits>

#include "kforge/elem_cpu.h"

namespace {

constexpr int64_t IGNORE_INDEX = -100;

double row_max(const kf_elem* logits_row, int64_t vocab) {  // logits_row: [vocab]
  double partial[UNROLL];
  for (int k = 0; k < UNROLL; ++k) {
    partial[k] = -std::numeric_limits<double>::infinity();
  }
  int64_t j = 0;
  for (; j + UNROLL <= vocab; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      const double v = kf_to_float(logits_row[j + k]);
      partial[k] = v > partial[k] ? v : partial[k];
    }
  }
  for (; j < vocab; ++j) {
    const double v = kf_to_float(logits_row[j]);
    partial[0] = v > partial[0] ? v : partial[0];
  }
  double result = partial[0];
  for (int k = 1; k < UNROLL; ++k) {
    result = partial[k] > result ? partial[k] : result;
  }
  return result;
}

// Sum of exp(logit - max) over the row; at least 1 because the max element contributes exp(0).
double row_sum_exp(const kf_elem* logits_row, double max, int64_t vocab) {  // logits_row: [vocab]
  double partial[UNROLL] = {};
  int64_t j = 0;
  for (; j + UNROLL <= vocab; j += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      partial[k] += std::exp(double(kf_to_float(logits_row[j + k])) - max);
    }
  }
  for (; j < vocab; ++j) {
    partial[0] += std::exp(double(kf_to_float(logits_row[j])) - max);
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
  if (args->num_inputs != 2 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& logits = args->inputs[0];
  const kf_tensor& targets = args->inputs[1];
  const kf_tensor& loss = args->outputs[0];
  if (logits.dtype != kf_elem_dtype || targets.dtype != KF_DTYPE_I64 ||
      loss.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (logits.ndim != 2 || targets.ndim != 1 || kf_numel(&loss) != 1) return KF_ERR_UNSUPPORTED;
  const int64_t batch = logits.shape[0];
  const int64_t vocab = logits.shape[1];
  if (targets.shape[0] != batch) return KF_ERR_UNSUPPORTED;

  const auto* logits_data = static_cast<const kf_elem*>(logits.data);   // logits: [batch, vocab]
  const auto* target_data = static_cast<const int64_t*>(targets.data);  // targets: [batch] i64
  auto* loss_data = static_cast<kf_elem*>(loss.data);                   // loss: [] (1 element)

  // A target outside [0, vocab) that is not IGNORE_INDEX has no logit to read: refuse the
  // whole batch rather than read past the row.
  for (int64_t row = 0; row < batch; ++row) {
    const int64_t target = target_data[row];
    if (target != IGNORE_INDEX && (target < 0 || target >= vocab)) return KF_ERR_UNSUPPORTED;
  }

  double loss_sum = 0;
  int64_t counted_rows = 0;
  for (int64_t row = 0; row < batch; ++row) {
    const int64_t target = target_data[row];
    if (target == IGNORE_INDEX) continue;
    const kf_elem* logits_row = logits_data + row * vocab;
    const double max = row_max(logits_row, vocab);
    const double log_sum_exp = max + std::log(row_sum_exp(logits_row, max, vocab));
    loss_sum += log_sum_exp - double(kf_to_float(logits_row[target]));
    ++counted_rows;
  }
  const double mean_loss =
      counted_rows > 0 ? loss_sum / double(counted_rows) : std::numeric_limits<double>::quiet_NaN();
  loss_data[0] = kf_from_float<kf_elem>(float(mean_loss));
  return KF_OK;
}
