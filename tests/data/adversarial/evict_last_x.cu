/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: X_EVICT_LAST = 1 in {0, 1}
 */
// Adversarial: reads x with an L2 evict_last policy. Normal writes do not evict such lines (not
// the redraw of the inputs, not a flush of twice the L2), so a problem that fits in L2 reads x
// from there in every timed sample. Before kforge demoted the lines of a call's buffers ahead of
// the flush, `kforge bench` on an H100 timed it at 4096x1024 in 8.93 us against 11.42 with plain
// loads (X_EVICT_LAST=0); with the demotion, 11.58 against 11.87. The GPU test
// L2Policy.EvictLastGainsNothing times both.
// expect: check=OK bench=OK tune=any
#include <cstdint>

#include "honest_rmsnorm.cuh"
#include "kforge/elem_access.cuh"

constexpr int kThreads = kHonestThreads;
constexpr int kVec = 16 / sizeof(kf_elem);
using Pack = kf::ElemPack<kVec>;

// *p, with the policy or without it. Rows whose length is a multiple of kVec are read in 16-byte
// packs (bandwidth-bound, so where x is read from shows in the time), others element by element.
template <typename T>
__device__ __forceinline__ T load_x(const T* p, uint64_t policy) {
  if constexpr (X_EVICT_LAST != 0) {
    return kf::load_with_policy<kf::L2Residency::keep>(p, policy);
  } else {
    return kf::load_bits(p);
  }
}

// One row per block; x is read twice (sum of squares, then the scaled output), both times with
// the policy.
__global__ void __launch_bounds__(kThreads)
    rows_kernel(const kf_elem* __restrict__ x, const kf_elem* __restrict__ weight,
                kf_elem* __restrict__ y, int n, float eps) {
  const uint64_t policy = kf::l2_policy<kf::L2Residency::keep>();
  const kf_elem* x_row = x + int64_t(blockIdx.x) * n;
  kf_elem* y_row = y + int64_t(blockIdx.x) * n;
  const bool packed = n % kVec == 0;
  const auto* x_packs = reinterpret_cast<const Pack*>(x_row);
  const int items = packed ? n / kVec : n;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < items; j += kThreads) {
    if (packed) {
      const Pack p = load_x(x_packs + j, policy);
      for (int e = 0; e < kVec; ++e)
        sum = fmaf(kf_to_float(p.v[e]), kf_to_float(p.v[e]), sum);
    } else {
      const float v = kf_to_float(load_x(x_row + j, policy));
      sum = fmaf(v, v, sum);
    }
  }
  const float total = honest_block_sum(sum);
  const float inv_rms = rsqrtf(total / float(n) + eps);
  for (int j = threadIdx.x; j < items; j += kThreads) {
    if (packed) {
      const Pack p = load_x(x_packs + j, policy);
      const Pack w = kf::load_bits(reinterpret_cast<const Pack*>(weight) + j);
      Pack out;
      for (int e = 0; e < kVec; ++e)
        out.v[e] = kf_from_float<kf_elem>(kf_to_float(p.v[e]) * inv_rms * kf_to_float(w.v[e]));
      kf::store_bits(reinterpret_cast<Pack*>(y_row) + j, out);
    } else {
      const float v = kf_to_float(load_x(x_row + j, policy));
      y_row[j] = kf_from_float<kf_elem>(v * inv_rms * kf_to_float(weight[j]));
    }
  }
}

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  rows_kernel<<<unsigned(kf_numel(&x) / n), kThreads, 0, static_cast<cudaStream_t>(args->stream)>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), int(n), float(args->scalars[0]));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
