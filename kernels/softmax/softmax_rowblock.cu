/* kforge
 * op: softmax
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
// Softmax over the last dim with one group of whole warps per row, in two passes.
//
// Idea: pass 1 reads the row once and keeps, per thread, a running maximum m and the sum
// s = sum(exp(x - m)) ("online" softmax: when m grows, s is rescaled by exp(m_old - m_new)).
// The (m, s) pairs are merged across the warp with shuffles and across the group's warps
// through shared memory. Pass 2 re-reads the row (mostly from L2) and writes
// y = exp(x - m) / s. Everything is accumulated in fp32.
//
// Rows need not be aligned (cols = 50257 is common): each row is split into a scalar head
// up to the first VEC-aligned element, a body of VEC-element vector accesses and a scalar
// tail. That needs x and y to be equally misaligned, which holds whenever both bases are
// VEC-aligned; when they are not, the whole row is read with scalar accesses.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   VEC             elements per vector load/store (VEC * elem_bytes <= 16).
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows (cols ~ 128) from
//                   leaving most of a large block idle.
#include <cfloat>
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
constexpr int kPackBytes = int(sizeof(ElemPack));

// Running max and sum of exp(x - max) over the elements seen so far. The empty state uses
// -FLT_MAX rather than -inf so that exp(max_a - max_b) never sees (-inf) - (-inf) = NaN.
struct MaxSum {
  float max = -FLT_MAX;
  float sum = 0.0f;
};

__device__ __forceinline__ void add_element(MaxSum& acc, float v) {
  if (v > acc.max) {
    acc.sum *= expf(acc.max - v);
    acc.max = v;
  }
  acc.sum += expf(v - acc.max);
}

template <int kCount>
__device__ __forceinline__ void add_elements(MaxSum& acc, const float (&v)[kCount]) {
  // One rescale per pack instead of one per element.
  float pack_max = v[0];
#pragma unroll
  for (int k = 1; k < kCount; ++k)
    pack_max = fmaxf(pack_max, v[k]);
  if (pack_max > acc.max) {
    acc.sum *= expf(acc.max - pack_max);
    acc.max = pack_max;
  }
#pragma unroll
  for (int k = 0; k < kCount; ++k)
    acc.sum += expf(v[k] - acc.max);
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  MaxSum out;
  out.max = fmaxf(a.max, b.max);
  out.sum = a.sum * expf(a.max - out.max) + b.sum * expf(b.max - out.max);
  return out;
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum acc) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    MaxSum other;
    other.max = __shfl_xor_sync(0xffffffffu, acc.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, acc.sum, offset);
    acc = merge(acc, other);
  }
  return acc;
}

template <bool kVectorized>
__global__ void __launch_bounds__(BLOCK_THREADS)
    softmax_rowblock(const kf_elem* __restrict__ x,  // x: [rows, cols]
                     kf_elem* __restrict__ y,        // y: [rows, cols]
                     int64_t rows, int cols) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barrier below, so they cannot return early.
  const bool has_row = row < rows;

  const kf_elem* x_row = x + row * cols;  // x_row: [cols]
  kf_elem* y_row = y + row * cols;        // y_row: [cols]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, cols)
  // scalar. Without vectorization the whole row is the tail.
  int head = 0;
  int packs = 0;
  if constexpr (kVectorized) {
    const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
    head = min(cols, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
    packs = (cols - head) / VEC;
  }
  const int tail_start = head + packs * VEC;
  const ElemPack* x_packs = reinterpret_cast<const ElemPack*>(x_row + head);  // [packs]
  ElemPack* y_packs = reinterpret_cast<ElemPack*>(y_row + head);              // [packs]

  // Pass 1: max and sum of exp over the row.
  MaxSum acc;
  if (has_row) {
    for (int j = thread_in_group; j < head; j += kGroupThreads) {
      add_element(acc, kf_to_float(x_row[j]));
    }
    for (int p = thread_in_group; p < packs; p += kGroupThreads) {
      const ElemPack pack = x_packs[p];
      float v[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        v[k] = kf_to_float(pack.v[k]);
      add_elements(acc, v);
    }
    for (int j = tail_start + thread_in_group; j < cols; j += kGroupThreads) {
      add_element(acc, kf_to_float(x_row[j]));
    }
  }

  acc = warp_merge(acc);
  if (threadIdx.x % kWarpSize == 0) {
    warp_max[threadIdx.x / kWarpSize] = acc.max;
    warp_sum[threadIdx.x / kWarpSize] = acc.sum;
  }
  __syncthreads();
  if (!has_row) return;

  // Every thread merges its group's warps in the same order, so all agree on the result.
  MaxSum row_acc;
#pragma unroll
  for (int w = 0; w < kWarpsPerGroup; ++w) {
    MaxSum part;
    part.max = warp_max[group * kWarpsPerGroup + w];
    part.sum = warp_sum[group * kWarpsPerGroup + w];
    row_acc = merge(row_acc, part);
  }
  // The row's maximum contributes exp(0) = 1, so the sum is at least 1.
  const float row_max = row_acc.max;
  const float inv_sum = 1.0f / row_acc.sum;

  // Pass 2: y = exp(x - max) / sum.
  for (int j = thread_in_group; j < head; j += kGroupThreads) {
    y_row[j] = kf_from_float<kf_elem>(expf(kf_to_float(x_row[j]) - row_max) * inv_sum);
  }
  for (int p = thread_in_group; p < packs; p += kGroupThreads) {
    const ElemPack xp = x_packs[p];
    ElemPack yp;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      yp.v[k] = kf_from_float<kf_elem>(expf(kf_to_float(xp.v[k]) - row_max) * inv_sum);
    }
    y_packs[p] = yp;
  }
  for (int j = tail_start + thread_in_group; j < cols; j += kGroupThreads) {
    y_row[j] = kf_from_float<kf_elem>(expf(kf_to_float(x_row[j]) - row_max) * inv_sum);
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
  if (args->num_inputs != 1 || args->num_outputs != 1 || args->num_scalars != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) return KF_ERR_UNSUPPORTED;
  if (x.ndim < 1 || !same_shape(x, y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: rows = shape[0] for the [rows, cols] case.
  const int64_t cols = x.shape[x.ndim - 1];
  if (cols == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t rows = kf_numel(&x) / cols;
  const int64_t blocks = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  if (cols > INT32_MAX || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  // Equal misalignment of x and y keeps every row's vector body aligned in both.
  const bool vectorized = VEC > 1 && reinterpret_cast<uintptr_t>(x_data) % kPackBytes == 0 &&
                          reinterpret_cast<uintptr_t>(y_data) % kPackBytes == 0;
  if (vectorized) {
    softmax_rowblock<true>
        <<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(x_data, y_data, rows, int(cols));
  } else {
    softmax_rowblock<false>
        <<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(x_data, y_data, rows, int(cols));
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
