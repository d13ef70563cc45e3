/* kforge
 * op: flash_attention
 * backend: cpu
 * dtypes: f16, bf16
 * param: QUERY_BLOCK = 8 in {1, 2, 4, 8, 16}
 * param: UNROLL = 4 in {1, 2, 4, 8}
 */
// Attention O = softmax(sm_scale * Q K^T [causal mask]) V on the CPU, single-threaded.
//
// Idea: for each (batch, head), K and V are converted to double once (each key row is then
// used by every query; with grouped-query attention, once for the group of query heads that
// shares them: query head h of a batch reads key/value head h / (heads / kv_heads)). Queries are
// taken QUERY_BLOCK at a time, and each key or value row is applied to every query of the block
// while it is hot in cache. Per query row i:
//   1. scores s_j = sm_scale * (q_i . k_j) for the keys it sees (j <= i when causal, else all);
//   2. the row max m over those scores;
//   3. p_j = exp(s_j - m) and their sum l (at least 1: the max contributes exp(0));
//   4. O_i = (sum_j p_j v_j) / l, rounded once to the element type.
// Subtracting the max keeps exp() in range for huge or very negative scores. Everything is in
// double: near-max inputs give scores around 1e28 in bf16, where float dot products would be
// off by far more than the gap between the top scores. Dot products use UNROLL independent
// partial sums, added in a fixed order, so results are deterministic.
//
// Tunables:
//   QUERY_BLOCK  query rows that share each pass over the key and value rows.
//   UNROLL       independent partial sums per q . k dot product.
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

#include "kforge/elem_cpu.h"

namespace {

int64_t min_i64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

void rows_to_double(const kf_elem* rows, int64_t n, double* out) {  // rows, out: [n]
  for (int64_t i = 0; i < n; ++i) {
    out[i] = kf_to_float(rows[i]);
  }
}

double dot(const double* u, const double* v, int64_t n) {  // u, v: [n]
  double partial[UNROLL] = {};
  int64_t i = 0;
  for (; i + UNROLL <= n; i += UNROLL) {
    for (int k = 0; k < UNROLL; ++k) {
      partial[k] += u[i + k] * v[i + k];
    }
  }
  for (; i < n; ++i) {
    partial[0] += u[i] * v[i];
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
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 2) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& q = args->inputs[0];
  const kf_tensor& k = args->inputs[1];
  const kf_tensor& v = args->inputs[2];
  const kf_tensor& o = args->outputs[0];
  if (q.dtype != kf_elem_dtype || k.dtype != kf_elem_dtype || v.dtype != kf_elem_dtype ||
      o.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  // K and V may have fewer heads (grouped-query attention), each shared by `group` query heads.
  if (q.ndim != 4 || k.ndim != 4 || !kf_same_shape(&q, &o) || !kf_same_shape(&k, &v) ||
      k.shape[0] != q.shape[0] || k.shape[2] != q.shape[2] || k.shape[3] != q.shape[3] ||
      k.shape[1] <= 0 || q.shape[1] % k.shape[1] != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const int64_t heads = q.shape[1];
  const int64_t group = heads / k.shape[1];
  const int64_t batch_heads = q.shape[0] * heads;
  const int64_t seq_len = q.shape[2];
  const int64_t head_dim = q.shape[3];
  const double sm_scale = args->scalars[0];
  const bool causal = args->scalars[1] != 0;
  if (kf_numel(&q) == 0) return KF_OK;

  // All four: [batch, heads, seq_len, head_dim]; one head is a [seq_len, head_dim] slab.
  const auto* q_data = static_cast<const kf_elem*>(q.data);
  const auto* k_data = static_cast<const kf_elem*>(k.data);
  const auto* v_data = static_cast<const kf_elem*>(v.data);
  auto* o_data = static_cast<kf_elem*>(o.data);

  // Scratch in double, kept between calls so that only larger problems allocate:
  //   k_head, v_head: [seq_len, head_dim], q_block, o_block: [QUERY_BLOCK, head_dim],
  //   p_block: [QUERY_BLOCK, seq_len] (scores, then exp(score - max)).
  thread_local std::vector<double> k_head, v_head, q_block, o_block, p_block;
  try {
    k_head.resize(size_t(seq_len * head_dim));
    v_head.resize(size_t(seq_len * head_dim));
    q_block.resize(size_t(QUERY_BLOCK * head_dim));
    o_block.resize(size_t(QUERY_BLOCK * head_dim));
    p_block.resize(size_t(QUERY_BLOCK * seq_len));
  } catch (const std::bad_alloc&) {
    return KF_ERR_OUT_OF_MEMORY;
  }

  for (int64_t head = 0; head < batch_heads; ++head) {
    const int64_t head_offset = head * seq_len * head_dim;
    // The query heads of a group are consecutive: convert their K and V once, at the first.
    const int64_t kv_offset = head / group * seq_len * head_dim;
    if (head % group == 0) {
      rows_to_double(k_data + kv_offset, seq_len * head_dim, k_head.data());
      rows_to_double(v_data + kv_offset, seq_len * head_dim, v_head.data());
    }

    for (int64_t i0 = 0; i0 < seq_len; i0 += QUERY_BLOCK) {
      const int64_t query_count = min_i64(QUERY_BLOCK, seq_len - i0);
      rows_to_double(q_data + head_offset + i0 * head_dim, query_count * head_dim, q_block.data());
      // Query i0 + r sees keys [0, key_end(r)); the block as a whole sees [0, block_key_end).
      auto key_end = [&](int64_t r) { return causal ? i0 + r + 1 : seq_len; };
      const int64_t block_key_end = key_end(query_count - 1);

      // 1. Scores, one key row at a time across the block.
      for (int64_t j = 0; j < block_key_end; ++j) {
        const double* k_row = k_head.data() + j * head_dim;
        for (int64_t r = 0; r < query_count; ++r) {
          if (j >= key_end(r)) continue;
          p_block[size_t(r * seq_len + j)] =
              sm_scale * dot(q_block.data() + r * head_dim, k_row, head_dim);
        }
      }

      // 2, 3. Row max, then p = exp(score - max) in place and its sum.
      double row_sum[QUERY_BLOCK];
      for (int64_t r = 0; r < query_count; ++r) {
        double* p_row = p_block.data() + r * seq_len;
        double max = p_row[0];
        for (int64_t j = 1; j < key_end(r); ++j) {
          max = p_row[j] > max ? p_row[j] : max;
        }
        double sum = 0;
        for (int64_t j = 0; j < key_end(r); ++j) {
          p_row[j] = std::exp(p_row[j] - max);
          sum += p_row[j];
        }
        row_sum[r] = sum;
      }

      // 4. Weighted sum of value rows, one value row at a time across the block, then
      // normalize.
      for (int64_t idx = 0; idx < query_count * head_dim; ++idx) {
        o_block[size_t(idx)] = 0;
      }
      for (int64_t j = 0; j < block_key_end; ++j) {
        const double* v_row = v_head.data() + j * head_dim;
        for (int64_t r = 0; r < query_count; ++r) {
          if (j >= key_end(r)) continue;
          const double p = p_block[size_t(r * seq_len + j)];
          double* o_row = o_block.data() + r * head_dim;
          for (int64_t t = 0; t < head_dim; ++t) {
            o_row[t] += p * v_row[t];
          }
        }
      }
      for (int64_t r = 0; r < query_count; ++r) {
        const double inv_sum = 1.0 / row_sum[r];
        const double* o_row = o_block.data() + r * head_dim;
        kf_elem* out_row = o_data + head_offset + (i0 + r) * head_dim;
        for (int64_t t = 0; t < head_dim; ++t) {
          out_row[t] = kf_from_float<kf_elem>(float(o_row[t] * inv_sum));
        }
      }
    }
  }
  return KF_OK;
}
