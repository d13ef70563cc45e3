/* kforge
 * op: reduce
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {1, 2, 4, 8}
 * param: UNROLL = 4 in {1, 2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8}
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 */
// Row sums, y[m] = sum_n x[m, n], with one group of whole warps per row.
//
// Idea: a block of BLOCK_THREADS threads is split into ROWS_PER_BLOCK groups, and each group
// owns one row. Each thread walks its share of the row in VEC-element vector loads, UNROLL
// of them issued before any is added so that several loads are in flight per thread, and
// keeps VEC fp32 partial sums (one per position in the vector: independent add chains). The
// thread's sum goes through a warp shuffle, one float per warp through shared memory and a
// second shuffle. The order of every addition is fixed by the configuration and the shape,
// so results are bit-reproducible. fp32 partial sums cannot overflow where fp16 ones would
// (a row of +a then -a).
//
// Rows need not start on a vector boundary (N = 4097, say): each row is split into a scalar
// head up to the first VEC-aligned element, a vector body and a scalar tail. When x is not
// vector-aligned, the whole row is read with scalar accesses.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   VEC             elements per vector load (VEC * elem_bytes <= 16).
//   UNROLL          vector loads a thread issues back to back.
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows from leaving most of a
//                   large block idle.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;
// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
constexpr int kMaxRegisters = 64;
// Index arithmetic below runs up to this far past the row's end in int.
constexpr int kIndexSlack = UNROLL * 1024 + 16;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");

// kVec consecutive elements, aligned so that one instruction loads all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};

__device__ __forceinline__ float warp_sum(float value) {
  // Butterfly: every lane adds the same pairs (a + b == b + a), so all lanes end with
  // bit-identical sums.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sum over the kWarpsPerGroup warps of this thread's group; every thread of the group gets the
// same value. Contains a __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ float group_sum(float value, int group) {
  __shared__ float warp_sums[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  value = warp_sum(value);
  if (lane == 0) warp_sums[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  value = lane < kWarpsPerGroup ? warp_sums[group * kWarpsPerGroup + lane] : 0.0f;
  return warp_sum(value);
}

// Packs of kVec elements; kVec == 1 is the scalar path, for a base that is not vector-aligned.
template <int kVec>
__global__ void __maxnreg__(kMaxRegisters)
    reduce_rowblock(const kf_elem* __restrict__ x,  // x: [M, N]
                    kf_elem* __restrict__ y,        // y: [M]
                    int64_t M, int N) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barrier in group_sum, so they cannot return early.
  const bool has_row = row < M;

  const kf_elem* x_row = x + row * N;  // x_row: [N]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, N)
  // scalar. head and the tail are shorter than kVec, so each thread reads at most one
  // element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(N, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (N - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < N
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]

  float partial[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    partial[k] = 0.0f;
  }
  if (has_row) {
    int p = thread_in_group;
    // Whole rounds of UNROLL packs: all loads first, then the adds.
    for (; p + (UNROLL - 1) * kGroupThreads < packs; p += UNROLL * kGroupThreads) {
      Pack buffer[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        buffer[u] = x_packs[p + u * kGroupThreads];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          partial[k] += kf_to_float(buffer[u].v[k]);
        }
      }
    }
    // The remaining packs, fewer than UNROLL per thread.
    for (; p < packs; p += kGroupThreads) {
      const Pack pack = x_packs[p];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        partial[k] += kf_to_float(pack.v[k]);
      }
    }
    if (thread_in_group < head) partial[0] += kf_to_float(x_row[thread_in_group]);
    if (tail_index < N) partial[0] += kf_to_float(x_row[tail_index]);
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    sum += partial[k];
  }
  sum = group_sum(sum, group);
  if (has_row && thread_in_group == 0) y[row] = kf_from_float<kf_elem>(sum);
}

bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
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
  if (x.ndim < 1) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: M = shape[0] for the [M, N] case; y has one element per row.
  const int64_t N = x.shape[x.ndim - 1];
  if (y.ndim != x.ndim - 1) return KF_ERR_UNSUPPORTED;
  for (int32_t i = 0; i < y.ndim; ++i) {
    if (y.shape[i] != x.shape[i]) return KF_ERR_UNSUPPORTED;
  }
  const int64_t M = kf_numel(&y);
  if (M == 0) return KF_OK;
  if (N == 0) {
    // Empty sums are zero.
    return cudaMemsetAsync(y.data, 0, size_t(M) * sizeof(kf_elem),
                           static_cast<cudaStream_t>(args->stream)) == cudaSuccess
               ? KF_OK
               : KF_ERR_LAUNCH;
  }
  const int64_t blocks = (M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  if (N > INT32_MAX - kIndexSlack || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  const dim3 grid(static_cast<unsigned>(blocks));
  if (is_aligned(x_data, sizeof(ElemPack<VEC>))) {
    reduce_rowblock<VEC><<<grid, BLOCK_THREADS, 0, stream>>>(x_data, y_data, M, int(N));
  } else {
    reduce_rowblock<1><<<grid, BLOCK_THREADS, 0, stream>>>(x_data, y_data, M, int(N));
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
