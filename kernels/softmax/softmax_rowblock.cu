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
// The (m, s) pairs are merged across the warp with shuffles, then across the group's warps
// through shared memory and a second shuffle. Pass 2 re-reads the row (mostly from L2) and
// writes y = exp(x - m) / s. Everything is accumulated in fp32.
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
// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
// (__launch_bounds__ would also guarantee that, but then ptxas squeezes some variants into 32
// registers and spills.)
constexpr int kMaxRegisters = 64;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");

// kVec consecutive elements, aligned so that one instruction loads or stores all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};

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
  for (int k = 1; k < kCount; ++k) {
    pack_max = fmaxf(pack_max, v[k]);
  }
  if (pack_max > acc.max) {
    acc.sum *= expf(acc.max - pack_max);
    acc.max = pack_max;
  }
#pragma unroll
  for (int k = 0; k < kCount; ++k) {
    acc.sum += expf(v[k] - acc.max);
  }
}

// Merges the (max, sum) pairs of a warp's lanes: the warp's max, then each lane rescales its
// sum to it (one exp per lane) and the sums are added. The butterfly adds the same pairs in
// every lane (a + b == b + a), so all lanes end with bit-identical results.
__device__ __forceinline__ MaxSum warp_merge(MaxSum acc) {
  float max = acc.max;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  }
  float sum = acc.sum * expf(acc.max - max);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return MaxSum{max, sum};
}

// Merges over the kWarpsPerGroup warps of this thread's group; every thread of the group gets
// the same result. Contains a __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ MaxSum group_merge(MaxSum acc, int group) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  acc = warp_merge(acc);
  if (lane == 0) {
    warp_max[threadIdx.x / kWarpSize] = acc.max;
    warp_sum[threadIdx.x / kWarpSize] = acc.sum;
  }
  __syncthreads();
  MaxSum part;  // lanes past the group's warp count hold the empty state
  if (lane < kWarpsPerGroup) {
    part.max = warp_max[group * kWarpsPerGroup + lane];
    part.sum = warp_sum[group * kWarpsPerGroup + lane];
  }
  return warp_merge(part);
}

// Packs of kVec elements; kVec == 1 is the scalar path, for bases that are not vector-aligned.
template <int kVec>
__global__ void __maxnreg__(kMaxRegisters)
    softmax_rowblock(const kf_elem* __restrict__ x,  // x: [rows, cols]
                     kf_elem* __restrict__ y,        // y: [rows, cols]
                     int64_t rows, int cols) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barrier in group_merge, so they cannot return early.
  const bool has_row = row < rows;

  const kf_elem* x_row = x + row * cols;  // x_row: [cols]
  kf_elem* y_row = y + row * cols;        // y_row: [cols]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, cols)
  // scalar. head and the tail are shorter than kVec, so each thread handles at most one
  // element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(cols, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (cols - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < cols
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + head);              // [packs]

  // Pass 1: max and sum of exp over the row.
  MaxSum acc;
  if (has_row) {
    for (int p = thread_in_group; p < packs; p += kGroupThreads) {
      const Pack pack = x_packs[p];
      float v[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[k] = kf_to_float(pack.v[k]);
      }
      add_elements(acc, v);
    }
    if (thread_in_group < head) add_element(acc, kf_to_float(x_row[thread_in_group]));
    if (tail_index < cols) add_element(acc, kf_to_float(x_row[tail_index]));
  }

  const MaxSum row_acc = group_merge(acc, group);
  if (!has_row) return;

  // The row's maximum contributes exp(0) = 1, so the sum is at least 1.
  const float row_max = row_acc.max;
  const float inv_sum = 1.0f / row_acc.sum;

  // Pass 2: y = exp(x - max) / sum.
  for (int p = thread_in_group; p < packs; p += kGroupThreads) {
    const Pack xp = x_packs[p];
    Pack yp;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      yp.v[k] = kf_from_float<kf_elem>(expf(kf_to_float(xp.v[k]) - row_max) * inv_sum);
    }
    y_packs[p] = yp;
  }
  if (thread_in_group < head) {
    const int j = thread_in_group;
    y_row[j] = kf_from_float<kf_elem>(expf(kf_to_float(x_row[j]) - row_max) * inv_sum);
  }
  if (tail_index < cols) {
    const int j = tail_index;
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

  // Equal misalignment of x and y keeps every row's vector body aligned in both; it holds
  // when both bases are aligned.
  constexpr uintptr_t kPackBytes = sizeof(ElemPack<VEC>);
  const bool vectorized = reinterpret_cast<uintptr_t>(x_data) % kPackBytes == 0 &&
                          reinterpret_cast<uintptr_t>(y_data) % kPackBytes == 0;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (vectorized) {
    softmax_rowblock<VEC><<<grid, BLOCK_THREADS, 0, stream>>>(x_data, y_data, rows, int(cols));
  } else {
    softmax_rowblock<1><<<grid, BLOCK_THREADS, 0, stream>>>(x_data, y_data, rows, int(cols));
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
