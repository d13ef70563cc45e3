// The honest rmsnorm every CUDA adversarial kernel builds on: one block per row, sums in fp32.
// Each adversarial kernel computes the right answer this way whenever it does compute.
#ifndef KFORGE_TESTS_HONEST_RMSNORM_CUH_
#define KFORGE_TESTS_HONEST_RMSNORM_CUH_

#include <cstdint>

#include "kforge/elem_cuda.cuh"

constexpr int kHonestThreads = 256;

// The sum of every thread's `value` over a block of kHonestThreads threads, in every thread.
__device__ __forceinline__ float honest_block_sum(float value) {
  __shared__ float partial[kHonestThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kHonestThreads / 32; ++w)
    total += partial[w];
  return total;
}

// One row of y by one block of kHonestThreads threads.
__device__ __forceinline__ void honest_rmsnorm_row(const kf_elem* __restrict__ x_row,   // [N]
                                                   const kf_elem* __restrict__ weight,  // [N]
                                                   kf_elem* __restrict__ y_row,         // [N]
                                                   int N, float eps) {
  float sum = 0.0f;
  for (int j = threadIdx.x; j < N; j += kHonestThreads) {
    const float v = kf_to_float(x_row[j]);
    sum += v * v;
  }
  const float total = honest_block_sum(sum);
  const float inv_rms = rsqrtf(total / float(N) + eps);
  for (int j = threadIdx.x; j < N; j += kHonestThreads) {
    y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
  }
}

__global__ void __launch_bounds__(kHonestThreads)
    honest_rmsnorm_rows(const kf_elem* __restrict__ x,       // x: [M, N]
                        const kf_elem* __restrict__ weight,  // weight: [N]
                        kf_elem* __restrict__ y,             // y: [M, N]
                        int N, float eps) {
  honest_rmsnorm_row(x + int64_t(blockIdx.x) * N, weight, y + int64_t(blockIdx.x) * N, N, eps);
}

// Launches the honest kernel for the op's tensors on `stream`; returns a kf_status.
static inline int honest_rmsnorm_on(const kf_args* args, cudaStream_t stream) {
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t m = kf_numel(&x) / n;
  honest_rmsnorm_rows<<<unsigned(m), kHonestThreads, 0, stream>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), int(n), float(args->scalars[0]));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

static inline int honest_rmsnorm(const kf_args* args) {
  return honest_rmsnorm_on(args, static_cast<cudaStream_t>(args->stream));
}

#endif  // KFORGE_TESTS_HONEST_RMSNORM_CUH_
