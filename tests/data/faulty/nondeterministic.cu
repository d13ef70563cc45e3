/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Planted fault: float atomicAdd of partial sums makes the summation order, and so y's bits, vary.
//
// A fixture for kforge's checks, not a kernel to use: a plain RMSNorm with one block per row
// that is correct except for the fault above.
//
// Each row's sum of x^2 is split over kBlocksPerRow blocks; every warp atomically adds its
// partial sum to a per-row float, in whatever order the warps finish. Float addition is not
// associative, so the last bits of the sum, and through them some elements of y, change
// between runs while staying within tolerance. A second kernel normalizes. The per-row sums
// live in a stream-ordered allocation made and freed on every call.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kBlockThreads = 256;
constexpr int kBlocksPerRow = 8;

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Adds each warp's partial sum of x^2 into row_sum_sq[row]; kBlocksPerRow blocks per row.
__global__ void __launch_bounds__(kBlockThreads)
    accumulate_row_sum_sq(const kf_elem* __restrict__ x,   // x: [M, N]
                          float* __restrict__ row_sum_sq,  // row_sum_sq: [M], zeroed
                          int N) {
  const int64_t row = blockIdx.x / kBlocksPerRow;
  const int part = blockIdx.x % kBlocksPerRow;
  const int chunk = (N + kBlocksPerRow - 1) / kBlocksPerRow;
  const int begin = part * chunk;
  const int end = min(N, begin + chunk);
  const kf_elem* x_row = x + row * N;
  float sum_sq = 0.0f;
  for (int j = begin + int(threadIdx.x); j < end; j += kBlockThreads) {
    const float v = kf_to_float(x_row[j]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  sum_sq = warp_sum(sum_sq);
  if (threadIdx.x % 32 == 0) atomicAdd(&row_sum_sq[row], sum_sq);
}

__global__ void __launch_bounds__(kBlockThreads)
    normalize_rows(const kf_elem* __restrict__ x,         // x: [M, N]
                   const kf_elem* __restrict__ weight,    // weight: [N]
                   const float* __restrict__ row_sum_sq,  // row_sum_sq: [M]
                   kf_elem* __restrict__ y,               // y: [M, N]
                   int N, float eps) {
  const int64_t row = blockIdx.x;
  const kf_elem* x_row = x + row * N;
  kf_elem* y_row = y + row * N;
  const float inv_rms = rsqrtf(row_sum_sq[row] / float(N) + eps);
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
  if (N > INT32_MAX || M * kBlocksPerRow > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  float* row_sum_sq = nullptr;  // row_sum_sq: [M]
  if (cudaMallocAsync(&row_sum_sq, size_t(M) * sizeof(float), stream) != cudaSuccess) {
    cudaGetLastError();  // clear the error so that it does not surface at a later call
    return KF_ERR_OUT_OF_MEMORY;
  }
  cudaMemsetAsync(row_sum_sq, 0, size_t(M) * sizeof(float), stream);
  accumulate_row_sum_sq<<<unsigned(M * kBlocksPerRow), kBlockThreads, 0, stream>>>(
      x_data, row_sum_sq, int(N));
  normalize_rows<<<unsigned(M), kBlockThreads, 0, stream>>>(x_data, w_data, row_sum_sq, y_data,
                                                            int(N), eps);
  cudaFreeAsync(row_sum_sq, stream);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
