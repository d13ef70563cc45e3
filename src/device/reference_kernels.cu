// Reference and baseline device code. Written for clarity over speed: these kernels help define
// what "correct" means for large problems, so each step is the textbook one, in fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "device/reference_kernels.h"
#include "kforge/float_convert.cuh"

namespace kforge {
namespace {

constexpr int kThreads = 256;

// One block per score row: max, exp and sum as plain block reductions, in fp32.
__global__ void masked_softmax_kernel(float* scores, int64_t s, float scale, bool causal) {
  __shared__ float reduce[kThreads];
  float* row = scores + blockIdx.x * s;
  const int64_t i = blockIdx.x % s;
  const int64_t keys = causal ? i + 1 : s;

  float local_max = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x)
    local_max = fmaxf(local_max, scale * row[j]);
  reduce[threadIdx.x] = local_max;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      reduce[threadIdx.x] = fmaxf(reduce[threadIdx.x], reduce[threadIdx.x + stride]);
    __syncthreads();
  }
  const float row_max = reduce[0];
  __syncthreads();

  float local_sum = 0.f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x)
    local_sum += expf(scale * row[j] - row_max);
  reduce[threadIdx.x] = local_sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) reduce[threadIdx.x] += reduce[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv_sum = 1.f / reduce[0];
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    row[j] = j < keys ? expf(scale * row[j] - row_max) * inv_sum : 0.f;
  }
}

__global__ void square_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] *= x[i];
  }
}

template <typename T>
__global__ void silu_mul_kernel(const T* gate, const T* up, T* h, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = kf_to_float(gate[i]);
    h[i] = kf_from_float<T>(g / (1.f + expf(-g)) * kf_to_float(up[i]));
  }
}

}  // namespace

void launch_masked_softmax(float* scores, int64_t rows, int64_t s, float scale, bool causal,
                           cudaStream_t stream) {
  masked_softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(scores, s, scale,
                                                                              causal);
}

void launch_square(float* x, int64_t n, cudaStream_t stream) {
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  square_kernel<<<blocks, kThreads, 0, stream>>>(x, n);
}

void launch_silu_mul(const void* gate, const void* up, void* h, int64_t n, kf_dtype dtype,
                     cudaStream_t stream) {
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  switch (dtype) {
    case KF_DTYPE_F16:
      silu_mul_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(gate),
                                                       static_cast<const __half*>(up),
                                                       static_cast<__half*>(h), n);
      break;
    case KF_DTYPE_BF16:
      silu_mul_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(gate),
                                                       static_cast<const __nv_bfloat16*>(up),
                                                       static_cast<__nv_bfloat16*>(h), n);
      break;
    default:
      silu_mul_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(gate),
                                                       static_cast<const float*>(up),
                                                       static_cast<float*>(h), n);
      break;
  }
}

}  // namespace kforge
