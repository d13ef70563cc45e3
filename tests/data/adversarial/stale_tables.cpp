/* kforge
 * op: rotary_embedding
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: converts RoPE's cos and sin tables once and keeps the converted copy for as long
// as it is called with the same table addresses and shape. kforge does not redraw the tables
// between timed samples (they are a rotation's), so every plain sample is right and skips the
// conversion; a trap copies a few (cos, sin) entries of both tables from other positions, and
// this kernel still rotates those pairs by their old angles. The check's trap catches it only
// when its tensors land where the call before it had them (the allocator decides).
//
// expect: check=OK|WRONG bench=WRONG tune=loses
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

struct ConvertedTables {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t entries = 0;
  std::vector<acc_t> cos_values, sin_values;  // [seq_len, half_dim]
};

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& cos = args->inputs[1];
  const kf_tensor& sin = args->inputs[2];
  const int64_t seq_len = x.shape[2], head_dim = x.shape[3], half_dim = head_dim / 2;
  const int64_t rows = kf_numel(&x) / (head_dim > 0 ? head_dim : 1);
  const int64_t entries = kf_numel(&cos);
  static ConvertedTables kept;
  if (kept.cos != cos.data || kept.sin != sin.data || kept.entries != entries) {
    try {
      kept.cos_values.resize(size_t(entries));
      kept.sin_values.resize(size_t(entries));
    } catch (const std::bad_alloc&) {
      return KF_ERR_OUT_OF_MEMORY;
    }
    const auto* c = static_cast<const kf_elem*>(cos.data);  // cos: [seq_len, half_dim]
    const auto* s = static_cast<const kf_elem*>(sin.data);  // sin: [seq_len, half_dim]
    for (int64_t i = 0; i < entries; ++i) {
      kept.cos_values[size_t(i)] = kf_to_float(c[i]);
      kept.sin_values[size_t(i)] = kf_to_float(s[i]);
    }
    kept.cos = cos.data;
    kept.sin = sin.data;
    kept.entries = entries;
  }
  const auto* xd = static_cast<const kf_elem*>(x.data);     // x: [batch, heads, seq_len, D]
  auto* yd = static_cast<kf_elem*>(args->outputs[0].data);  // y: like x
  for (int64_t row = 0; row < rows; ++row) {
    const acc_t* c = kept.cos_values.data() + (row % seq_len) * half_dim;
    const acc_t* s = kept.sin_values.data() + (row % seq_len) * half_dim;
    for (int64_t i = 0; i < half_dim; ++i) {
      const acc_t a = kf_to_float(xd[row * head_dim + 2 * i]);
      const acc_t b = kf_to_float(xd[row * head_dim + 2 * i + 1]);
      yd[row * head_dim + 2 * i] = kf_from_float<kf_elem>(float(a * c[i] - b * s[i]));
      yd[row * head_dim + 2 * i + 1] = kf_from_float<kf_elem>(float(a * s[i] + b * c[i]));
    }
  }
  return KF_OK;
}
