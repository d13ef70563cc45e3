// What every flash_attention kernel file reads off its arguments: the tensors, checked against
// the op's signature (docs/kernel-format.md), and the problem they describe.
#pragma once

#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace kf_attention {

struct Problem {
  const kf_elem* q;  // q: [batch * heads, seq_len, head_dim]
  const kf_elem* k;  // k: [batch * kv_heads, seq_len, head_dim]
  const kf_elem* v;  // v: like k
  kf_elem* o;        // o: like q
  int64_t heads;     // (batch, query head) pairs
  int64_t seq_len;
  int64_t head_dim;
  int64_t group;     // query heads per key/value head (grouped-query attention)
  float scale_log2;  // sm_scale * log2(e): scores in log2 units, for exp2f
  bool causal;
  cudaStream_t stream;
};

// KF_OK with `problem` filled; KF_ERR_UNSUPPORTED for arguments that are not the op's or a
// problem beyond `max_head_dim` or the launch limits.
inline int read_problem(const kf_args* args, int64_t max_head_dim, Problem* problem) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 2) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& q = args->inputs[0];   // q: [batch, heads, seq_len, head_dim]
  const kf_tensor& k = args->inputs[1];   // k: [batch, kv_heads, seq_len, head_dim]
  const kf_tensor& v = args->inputs[2];   // v: like k
  const kf_tensor& o = args->outputs[0];  // o: like q
  if (q.dtype != kf_elem_dtype || k.dtype != kf_elem_dtype || v.dtype != kf_elem_dtype ||
      o.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  // K and V may have fewer heads than Q (grouped-query attention), each shared by `group`.
  if (q.ndim != 4 || k.ndim != 4 || !kf_same_shape(&q, &o) || !kf_same_shape(&k, &v) ||
      k.shape[0] != q.shape[0] || k.shape[2] != q.shape[2] || k.shape[3] != q.shape[3] ||
      k.shape[1] <= 0 || q.shape[1] % k.shape[1] != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  problem->group = q.shape[1] / k.shape[1];
  problem->heads = q.shape[0] * q.shape[1];
  problem->seq_len = q.shape[2];
  problem->head_dim = q.shape[3];
  if (problem->head_dim < 1 || problem->head_dim > max_head_dim) return KF_ERR_UNSUPPORTED;
  // int row indices with room for a block past the end; grid.y is limited to 65535.
  if (problem->seq_len > INT32_MAX / 2 || problem->heads > 65535) return KF_ERR_UNSUPPORTED;
  problem->scale_log2 = static_cast<float>(args->scalars[0] * 1.4426950408889634);  // * log2(e)
  problem->causal = args->scalars[1] != 0.0;
  problem->q = static_cast<const kf_elem*>(q.data);
  problem->k = static_cast<const kf_elem*>(k.data);
  problem->v = static_cast<const kf_elem*>(v.data);
  problem->o = static_cast<kf_elem*>(o.data);
  problem->stream = static_cast<cudaStream_t>(args->stream);
  return KF_OK;
}

// Launches `kernel` on `p.stream` over blocks of `block_rows` query rows of every head, its
// dynamic shared memory opted in above 48 KB (a host-side attribute, no sync). Every attention
// kernel here takes the same parameters.
template <typename Kernel>
int launch(Kernel kernel, const Problem& p, int block_rows, int threads, int smem_bytes,
           bool packed) {
  if (smem_bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) !=
          cudaSuccess) {
    return KF_ERR_LAUNCH;
  }
  const dim3 grid(static_cast<unsigned>((p.seq_len + block_rows - 1) / block_rows),
                  static_cast<unsigned>(p.heads));
  kernel<<<grid, threads, smem_bytes, p.stream>>>(p.q, p.k, p.v, p.o, int(p.seq_len),
                                                  int(p.head_dim), int(p.group), p.scale_log2,
                                                  p.causal, packed);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

}  // namespace kf_attention
