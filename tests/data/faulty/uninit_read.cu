/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Planted fault: reads a scratch buffer it never wrote (allocated once, not initialized) and
// lets what it read decide nothing that shows in the output, so every stage of the check
// passes. initcheck reports the read (`kforge check --sanitize`).
//
// A fixture for kforge's checks, not a kernel to use.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kBlockThreads = 256;
constexpr int kWarps = kBlockThreads / 32;

__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_reads_garbage(const kf_elem* __restrict__ x,       // x: [M, N]
                          const kf_elem* __restrict__ weight,  // weight: [N]
                          kf_elem* __restrict__ y,             // y: [M, N]
                          const float* __restrict__ scratch,   // never written
                          int N, float eps) {
  __shared__ float warp_sums[kWarps];
  const kf_elem* x_row = x + int64_t(blockIdx.x) * N;
  kf_elem* y_row = y + int64_t(blockIdx.x) * N;
  float sum = 0.0f;
  for (int j = threadIdx.x; j < N; j += kBlockThreads) {
    const float v = kf_to_float(x_row[j]);
    sum += v * v;
  }
  // Only one value of the garbage would change the result, by far less than rounding.
  if (scratch[threadIdx.x] == 123456.0f) sum += 1e-30f;
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
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
  static float* scratch = nullptr;
  if (scratch == nullptr && cudaMalloc(&scratch, kBlockThreads * sizeof(float)) != cudaSuccess) {
    return KF_ERR_OUT_OF_MEMORY;
  }
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  rmsnorm_reads_garbage<<<unsigned(kf_numel(&x) / n), kBlockThreads, 0,
                          static_cast<cudaStream_t>(args->stream)>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), scratch, int(n), float(args->scalars[0]));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
