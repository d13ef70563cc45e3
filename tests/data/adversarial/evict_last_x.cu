/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: X_EVICT_LAST = 1 in {0, 1}
 */
// Adversarial: reads x with an L2 evict_last policy. Normal writes do not evict such lines, so a
// flush of twice the L2 leaves x there for the next sample, and a problem that fits in L2 reads
// it from there every time (on an H100, a 16 MB buffer loaded that way was read in 8.96 us after
// the flush, against 11.65 cold). kforge demotes the lines of a call's buffers before the flush,
// so this kernel must time like the same kernel with plain loads (X_EVICT_LAST=0): the GPU test
// L2Policy.EvictLastGainsNothing times both.
// expect: check=OK bench=OK tune=any
#include <cstdint>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"

constexpr int kThreads = 256;

__device__ __forceinline__ float load_x(const kf_elem* p, uint64_t policy) {
  if constexpr (X_EVICT_LAST != 0) {
    return kf_to_float(kf::load_with_policy<kf::L2Residency::keep>(p, policy));
  } else {
    return kf_to_float(*p);
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
  __shared__ float partial[kThreads / 32];
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const float v = load_x(x_row + j, policy);
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w)
    total += partial[w];
  const float inv_rms = rsqrtf(total / float(n) + eps);
  for (int j = threadIdx.x; j < n; j += kThreads)
    y_row[j] = kf_from_float<kf_elem>(load_x(x_row + j, policy) * inv_rms * kf_to_float(weight[j]));
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
