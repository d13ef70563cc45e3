/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Planted fault: never finishes: every thread spins on a global flag that nothing sets.
//
// A fixture for kforge's checks, not a kernel to use: a plain RMSNorm with one block per row
// that is correct except for the fault above.
//
// The flag is read through a volatile pointer, so each iteration reloads it from memory
// and the loop cannot be removed.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kBlockThreads = 256;
constexpr int kWarps = kBlockThreads / 32;

__device__ int g_release_flag = 0;  // nothing ever writes 1 here

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sum over the block; every thread returns the same total.
__device__ float block_sum(float value) {
  __shared__ float warp_sums[kWarps];
  value = warp_sum(value);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    total += warp_sums[w];
  }
  return total;
}

__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_one_block_per_row(const kf_elem* __restrict__ x,       // x: [M, N]
                              const kf_elem* __restrict__ weight,  // weight: [N]
                              kf_elem* __restrict__ y,             // y: [M, N]
                              int N, float eps) {
  const int64_t row = blockIdx.x;
  const kf_elem* x_row = x + row * N;
  kf_elem* y_row = y + row * N;
  while (*static_cast<volatile int*>(&g_release_flag) == 0) {
  }
  float sum_sq = 0.0f;
  for (int j = threadIdx.x; j < N; j += kBlockThreads) {
    const float v = kf_to_float(x_row[j]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / float(N) + eps);
  for (int j = threadIdx.x; j < N; j += kBlockThreads) {
    y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
  }
}

bool same_shape(const kf_tensor& a, const kf_tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int32_t i = 0; i < a.ndim; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  return true;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 1) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || weight.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim < 1 || !same_shape(x, y)) return KF_ERR_UNSUPPORTED;

  const int64_t N = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != N) return KF_ERR_UNSUPPORTED;
  if (N == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t M = kf_numel(&x) / N;
  if (N > INT32_MAX || M > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  rmsnorm_one_block_per_row<<<unsigned(M), kBlockThreads, 0, stream>>>(x_data, w_data, y_data,
                                                                       int(N), eps);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
