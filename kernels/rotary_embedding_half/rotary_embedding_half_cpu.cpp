/* kforge
 * op: rotary_embedding_half
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: POSITION_BLOCK = 64 in {1, 16, 64, 256}
 */
// Rotary position embedding, rotate-half pairs (x[i], x[i + head_dim/2]) as in HF LLaMA, on the
// CPU, single-threaded.
//
// Idea: the cos/sin tables are shared by every (batch, head), so they are converted to acc_t
// once per block of POSITION_BLOCK positions into a small scratch table, and then every
// (batch, head) rotates its rows for those positions, which lie next to each other in x. A
// larger block converts the table less often per row of x but makes the scratch table (and the
// stretch of x touched per head) larger. Each pair (a, b) = (x[i], x[i + half_dim]) at position s
// becomes (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i], rounded once to the element
// type. fp16 and bf16 compute in float, where the products of two 11-bit (or 8-bit) mantissas
// are exact. fp32 computes in double: with near-max inputs a cos and b sin can nearly cancel,
// and their float rounding errors (relative to |a|) would swamp the small result.
//
// Tunables:
//   POSITION_BLOCK  positions whose cos/sin rows are converted once and applied together.
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {

using acc_t = std::conditional_t<kf_elem_dtype == KF_DTYPE_F32, double, float>;

// Converts rows [first, first + count) of a [seq_len, half_dim] table to acc_t.
void table_block_to_acc(const kf_elem* table, int64_t first, int64_t count, int64_t half_dim,
                        acc_t* out) {  // out: [count, half_dim]
  const kf_elem* block = table + first * half_dim;
  for (int64_t i = 0; i < count * half_dim; ++i) {
    out[i] = kf_to_float(block[i]);
  }
}

// Rotates one row of head_dim = 2 * half_dim elements by the angles of one position: the
// first half holds the a of each pair, the second half the b.
void rotate_row_half(const kf_elem* x_row, const acc_t* cos_row, const acc_t* sin_row,
                     int64_t half_dim, kf_elem* y_row) {  // x_row, y_row: [head_dim]
  // x_first, x_second, y_first, y_second: [half_dim]
  const kf_elem* x_first = x_row;
  const kf_elem* x_second = x_row + half_dim;
  kf_elem* y_first = y_row;
  kf_elem* y_second = y_row + half_dim;
  for (int64_t i = 0; i < half_dim; ++i) {
    const acc_t a = kf_to_float(x_first[i]);
    const acc_t b = kf_to_float(x_second[i]);
    y_first[i] = kf_from_float<kf_elem>(float(a * cos_row[i] - b * sin_row[i]));
    y_second[i] = kf_from_float<kf_elem>(float(a * sin_row[i] + b * cos_row[i]));
  }
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1) return KF_ERR_UNSUPPORTED;
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& cos = args->inputs[1];
  const kf_tensor& sin = args->inputs[2];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || cos.dtype != kf_elem_dtype || sin.dtype != kf_elem_dtype ||
      y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim != 4 || y.ndim != 4 || cos.ndim != 2 || sin.ndim != 2) return KF_ERR_UNSUPPORTED;
  for (int32_t d = 0; d < 4; ++d) {
    if (y.shape[d] != x.shape[d]) return KF_ERR_UNSUPPORTED;
  }
  const int64_t batch_heads = x.shape[0] * x.shape[1];
  const int64_t seq_len = x.shape[2];
  const int64_t head_dim = x.shape[3];
  const int64_t half_dim = head_dim / 2;
  if (head_dim % 2 != 0) return KF_ERR_UNSUPPORTED;
  if (cos.shape[0] != seq_len || cos.shape[1] != half_dim || sin.shape[0] != seq_len ||
      sin.shape[1] != half_dim) {
    return KF_ERR_UNSUPPORTED;
  }
  if (kf_numel(&x) == 0) return KF_OK;

  const auto* x_data = static_cast<const kf_elem*>(x.data);  // x: [batch, heads, seq_len, head_dim]
  const auto* cos_data = static_cast<const kf_elem*>(cos.data);  // cos: [seq_len, half_dim]
  const auto* sin_data = static_cast<const kf_elem*>(sin.data);  // sin: [seq_len, half_dim]
  auto* y_data = static_cast<kf_elem*>(y.data);  // y: [batch, heads, seq_len, head_dim]

  // cos_block, sin_block: [POSITION_BLOCK, half_dim] acc_t, kept between calls.
  thread_local std::vector<acc_t> cos_block, sin_block;
  try {
    const size_t block_size = size_t(POSITION_BLOCK * half_dim);
    if (cos_block.size() < block_size) cos_block.resize(block_size);
    if (sin_block.size() < block_size) sin_block.resize(block_size);
  } catch (const std::bad_alloc&) {
    return KF_ERR_OUT_OF_MEMORY;
  }

  for (int64_t first = 0; first < seq_len; first += POSITION_BLOCK) {
    const int64_t count = seq_len - first < POSITION_BLOCK ? seq_len - first : POSITION_BLOCK;
    table_block_to_acc(cos_data, first, count, half_dim, cos_block.data());
    table_block_to_acc(sin_data, first, count, half_dim, sin_block.data());
    for (int64_t bh = 0; bh < batch_heads; ++bh) {
      for (int64_t p = 0; p < count; ++p) {
        const int64_t row = bh * seq_len + first + p;
        rotate_row_half(x_data + row * head_dim, cos_block.data() + p * half_dim,
                        sin_block.data() + p * half_dim, half_dim, y_data + row * head_dim);
      }
    }
  }
  return KF_OK;
}
