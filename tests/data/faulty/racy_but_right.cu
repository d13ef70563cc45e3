/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Planted fault: the lanes of a warp write their partial sums to shared memory and lane 0 reads
// them back with no __syncwarp() between: a race that today's GPUs almost always win, so the
// results are right and every stage of the check passes. racecheck reports it
// (`kforge check --sanitize`).
//
// A fixture for kforge's checks, not a kernel to use.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kBlockThreads = 256;
constexpr int kWarps = kBlockThreads / 32;

__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_racy(const kf_elem* __restrict__ x,       // x: [M, N]
                 const kf_elem* __restrict__ weight,  // weight: [N]
                 kf_elem* __restrict__ y,             // y: [M, N]
                 int N, float eps) {
  __shared__ float lane_sums[kBlockThreads];
  __shared__ float warp_sums[kWarps];
  const kf_elem* x_row = x + int64_t(blockIdx.x) * N;
  kf_elem* y_row = y + int64_t(blockIdx.x) * N;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < N; j += kBlockThreads) {
    const float v = kf_to_float(x_row[j]);
    sum += v * v;
  }
  lane_sums[threadIdx.x] = sum;
  // Missing: __syncwarp();
  if (threadIdx.x % 32 == 0) {
    float warp_total = 0.0f;
    for (int lane = 0; lane < 32; ++lane)
      warp_total += lane_sums[threadIdx.x + lane];
    warp_sums[threadIdx.x / 32] = warp_total;
  }
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    total += warp_sums[w];
  const float inv_rms = rsqrtf(total / float(N) + eps);
  for (int j = threadIdx.x; j < N; j += kBlockThreads)
    y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  rmsnorm_racy<<<unsigned(kf_numel(&x) / n), kBlockThreads, 0,
                 static_cast<cudaStream_t>(args->stream)>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), int(n), float(args->scalars[0]));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
