/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {1, 2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8}
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 */
// RMSNorm with one group of whole warps per row.
//
// Idea: a block of BLOCK_THREADS threads is split into ROWS_PER_BLOCK groups, and each group
// owns one row. The group reads its row once to sum x^2 in fp32 (per-thread partial sums, a
// warp shuffle, then one float per warp in shared memory), and a second time to write
// y = x * rsqrt(mean + eps) * weight. The second read usually hits L2 because the row was
// just read.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   VEC             elements per vector load/store (VEC * elem_bytes <= 16). The vector path
//                   is taken only when N % VEC == 0 and x, y, weight are VEC-aligned, so
//                   every row start is aligned; otherwise the kernel uses scalar accesses.
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows (N ~ 128) from leaving
//                   most of a large block idle.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");

// VEC consecutive elements, aligned so that one instruction loads or stores all of them.
struct alignas(VEC * sizeof(kf_elem)) ElemPack {
  kf_elem v[VEC];
};

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

template <bool kVectorized>
__global__ void __launch_bounds__(BLOCK_THREADS)
    rmsnorm_rowblock(const kf_elem* __restrict__ x,       // x: [M, N]
                     const kf_elem* __restrict__ weight,  // weight: [N]
                     kf_elem* __restrict__ y,             // y: [M, N]
                     int64_t M, int N, float eps) {
  __shared__ float warp_sums[kWarps];  // sum of x^2 over each warp's share of its row

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barrier below, so they cannot return early.
  const bool has_row = row < M;

  const kf_elem* x_row = x + row * N;  // x_row: [N]
  kf_elem* y_row = y + row * N;        // y_row: [N]

  float sum_sq = 0.0f;
  if (has_row) {
    if constexpr (kVectorized) {
      const ElemPack* x_packs = reinterpret_cast<const ElemPack*>(x_row);  // [N / VEC]
      for (int p = thread_in_group; p < N / VEC; p += kGroupThreads) {
        const ElemPack pack = x_packs[p];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float v = kf_to_float(pack.v[k]);
          sum_sq = fmaf(v, v, sum_sq);
        }
      }
    } else {
      for (int j = thread_in_group; j < N; j += kGroupThreads) {
        const float v = kf_to_float(x_row[j]);
        sum_sq = fmaf(v, v, sum_sq);
      }
    }
  }

  sum_sq = warp_sum(sum_sq);
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = sum_sq;
  __syncthreads();
  if (!has_row) return;

  // Every thread adds its group's warp sums in the same order, so all agree on the result.
  float row_sum_sq = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsPerGroup; ++w)
    row_sum_sq += warp_sums[group * kWarpsPerGroup + w];
  const float inv_rms = rsqrtf(row_sum_sq / float(N) + eps);

  if constexpr (kVectorized) {
    const ElemPack* x_packs = reinterpret_cast<const ElemPack*>(x_row);
    const ElemPack* w_packs = reinterpret_cast<const ElemPack*>(weight);
    ElemPack* y_packs = reinterpret_cast<ElemPack*>(y_row);
    for (int p = thread_in_group; p < N / VEC; p += kGroupThreads) {
      const ElemPack xp = x_packs[p];
      const ElemPack wp = w_packs[p];
      ElemPack yp;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        yp.v[k] = kf_from_float<kf_elem>(kf_to_float(xp.v[k]) * inv_rms * kf_to_float(wp.v[k]));
      }
      y_packs[p] = yp;
    }
  } else {
    for (int j = thread_in_group; j < N; j += kGroupThreads) {
      y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
    }
  }
}

bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
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

  // Leading dimensions are rows: M = shape[0] for the [M, N] case.
  const int64_t N = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != N) return KF_ERR_UNSUPPORTED;
  if (N == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t M = kf_numel(&x) / N;
  const int64_t blocks = (M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  if (N > INT32_MAX || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  constexpr size_t kPackBytes = sizeof(ElemPack);
  const bool vectorized = N % VEC == 0 && is_aligned(x_data, kPackBytes) &&
                          is_aligned(w_data, kPackBytes) && is_aligned(y_data, kPackBytes);
  if (vectorized) {
    rmsnorm_rowblock<true>
        <<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(x_data, w_data, y_data, M, int(N), eps);
  } else {
    rmsnorm_rowblock<false>
        <<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(x_data, w_data, y_data, M, int(N), eps);
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
