/* kforge
 * op: reduce
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC_BYTES = 16 in {4, 8, 16}
 * param: UNROLL = 8 in {1, 2, 4, 8, 16}
 * param: ROWS_PER_BLOCK = 2 in {1, 2, 4, 8, 16, 32}
 * param: CLUSTER = 1 in {1, 2, 4, 8}
 * param: X_EVICT_FIRST = 1 in {0, 1}
 * param: MIN_BLOCKS = 1 in {1, 2, 4, 6, 8}
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: BLOCK_THREADS <= max_threads_per_block
 * require: BLOCK_THREADS * MIN_BLOCKS <= max_threads_per_sm
 * # Bytes a thread holds in flight: 16 x 16 take 64 registers, all that 1024 threads have.
 * require: UNROLL * VEC_BYTES <= 128 || BLOCK_THREADS <= 512
 * threads: BLOCK_THREADS
 * cluster: CLUSTER
 */
// Row sums, y[m] = sum_n x[m, n], with one group of whole warps per row, or per slice of a
// row when a cluster of blocks shares it.
//
// Idea: the op reads M * N elements once and writes M, so it is bound by reading x; the work
// per element is one add. A block of BLOCK_THREADS threads is split into ROWS_PER_BLOCK
// groups, and each group owns one row (with ROWS_PER_BLOCK = BLOCK_THREADS / 32, a warp per
// row, the combine needs no shared memory and no barrier). Each thread walks its share of the
// row in VEC_BYTES-byte packs, UNROLL of them issued before any is added so that UNROLL loads are
// in flight per thread (a warp keeps UNROLL * 512 bytes in flight with 16-byte packs), and keeps
// one fp32 partial sum per position in the pack (independent add chains). The rounds of UNROLL
// packs run without bounds checks; the last, partial round loads only the packs that exist, still
// all at once, so that short rows take one memory round trip, not one per pack. The thread's sum
// goes through a warp shuffle, and for groups of several warps one float per warp through
// shared memory and a second shuffle.
//
// CLUSTER > 1 splits each row into CLUSTER slices, one per block of a thread-block cluster:
// few long rows (1024 x 32768) then still fill the machine. Each block sums its slice as
// above and leaves its partial sum in shared memory; after a cluster barrier the cluster's
// first block reads the CLUSTER partials over distributed shared memory, in rank order, and
// writes y.
//
// x is read once: evict-first loads (__ldcs) keep it from pushing anything worth keeping out
// of L2.
//
// The order of every addition is fixed by the configuration and the shape, so results are
// bit-reproducible; there are no atomics. fp32 partial sums cannot overflow where fp16 ones
// would (a row of +a then -a).
//
// Rows need not start on a pack boundary (N = 4097, say): each row is split into a scalar
// head up to the first pack-aligned element, a body of packs and a scalar tail, so every
// shape and every element-aligned base runs the same kernel.
//
// Tunables (the defaults: a warp per row, 8 rows per 256-thread block, 16-byte loads, UNROLL
// 8; 63 registers in bf16, so 4 blocks or 32 warps per SM, each with 4 KB of loads in flight):
//   BLOCK_THREADS   threads per block.
//   VEC_BYTES       bytes per load (16: a full vector load).
//   UNROLL          loads a thread issues back to back, i.e. loads in flight per thread.
//   ROWS_PER_BLOCK  rows per block (per cluster when CLUSTER > 1); BLOCK_THREADS / 32 gives a
//                   warp per row.
//   CLUSTER         blocks that share each row (thread-block cluster size).
//   X_EVICT_FIRST   1: x loaded evict-first (__ldcs); 0: plain loads through the read-only
//                   path (__ldg).
//   MIN_BLOCKS      blocks per SM the registers must leave room for (the second argument of
//                   __launch_bounds__): more resident warps, but a tight register cap can make
//                   ptxas spill (the tuner drops spilling variants).
#include <cooperative_groups.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;
constexpr int kVec = VEC_BYTES / int(sizeof(kf_elem));  // elements per pack
// Index arithmetic below runs up to this far past the row's end in int.
constexpr int kIndexSlack = UNROLL * 1024 + 16;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(kVec >= 1, "a pack holds at least one element");
static_assert(kVec <= kGroupThreads, "a row's scalar head and tail take one pass of its group");
static_assert(CLUSTER >= 1 && UNROLL >= 1, "CLUSTER counts blocks, UNROLL counts loads");

using Pack = kf::ElemPack<kVec>;  // alignas(VEC_BYTES)

// *p: evict-first (__ldcs) with X_EVICT_FIRST, else through the read-only path (__ldg).
template <typename T>
__device__ __forceinline__ T load(const T* p) {
  return kf::load<X_EVICT_FIRST != 0>(p);
}

// partial[k] += pack element k.
__device__ __forceinline__ void add_pack(float (&partial)[kVec], const Pack& pack) {
  if constexpr (std::is_same_v<kf_elem, __nv_bfloat16> && kVec % 2 == 0) {
    // bf16 is the top half of an fp32: a pair of elements in one 32-bit word widens with a
    // shift and a mask.
    unsigned words[kVec / 2];
    memcpy(words, pack.v, sizeof(words));
#pragma unroll
    for (int w = 0; w < kVec / 2; ++w) {
      partial[2 * w] += __uint_as_float(words[w] << 16);
      partial[2 * w + 1] += __uint_as_float(words[w] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      partial[k] += kf_to_float(pack.v[k]);
    }
  }
}

__device__ __forceinline__ float warp_sum(float value) {
  // Butterfly: every lane adds the same pairs (a + b == b + a), so all lanes end with
  // bit-identical sums.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sum over the kWarpsPerGroup warps of this thread's group; every thread of the group gets the
// same value. With more than one warp per group it contains a __syncthreads(), so every thread
// of the block must call it.
__device__ __forceinline__ float group_sum(float value, int group) {
  value = warp_sum(value);
  if constexpr (kWarpsPerGroup > 1) {
    __shared__ float warp_sums[kWarps];
    const int lane = threadIdx.x % kWarpSize;
    if (lane == 0) warp_sums[threadIdx.x / kWarpSize] = value;
    __syncthreads();
    value = lane < kWarpsPerGroup ? warp_sums[group * kWarpsPerGroup + lane] : 0.0f;
    value = warp_sum(value);
  }
  return value;
}

// Sum of packs[first], packs[first + kGroupThreads], ... below `end`, UNROLL loads at a time.
__device__ __forceinline__ void sum_packs(float (&partial)[kVec], const Pack* __restrict__ packs,
                                          int first, int end) {
  constexpr int kRound = UNROLL * kGroupThreads;
  int p = first;
  // Whole rounds: all UNROLL loads first, then the adds. Kept rolled so that UNROLL, not the
  // compiler's own unrolling, decides the loads in flight and the registers they take.
#pragma unroll 1
  for (; p + (UNROLL - 1) * kGroupThreads < end; p += kRound) {
    Pack buffer[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      buffer[u] = load(packs + p + u * kGroupThreads);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      add_pack(partial, buffer[u]);
    }
  }
  // The last round, fewer than UNROLL packs: the ones that exist, still loaded together.
  if (p < end) {
    Pack buffer[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (p + u * kGroupThreads < end) buffer[u] = load(packs + p + u * kGroupThreads);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (p + u * kGroupThreads < end) add_pack(partial, buffer[u]);
    }
  }
}

#if CLUSTER > 1
#define KF_CLUSTER_DIMS __cluster_dims__(CLUSTER, 1, 1)
#else
#define KF_CLUSTER_DIMS
#endif

// Launch bounds: registers stay within what MIN_BLOCKS blocks of BLOCK_THREADS may hold
// (65536 / (MIN_BLOCKS * BLOCK_THREADS), at most 255), so every variant can launch that many
// blocks per SM; the explicit minimum keeps ptxas from choosing a lower register target of
// its own and spilling (see kernels/rmsnorm/rmsnorm_rowblock.cu).
//
// Block b (cluster b / CLUSTER, rank b % CLUSTER within it) sums slice `rank` of rows
// (b / CLUSTER) * ROWS_PER_BLOCK + group.
__global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS) KF_CLUSTER_DIMS
    reduce_rowblock(const kf_elem* __restrict__ x,  // x: [M, N]
                    kf_elem* __restrict__ y,        // y: [M]
                    int64_t M, int N) {
  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x / CLUSTER) * ROWS_PER_BLOCK + group;
  const int rank = int(blockIdx.x % CLUSTER);  // slice of the row this block sums
  // The last blocks can hold fewer than ROWS_PER_BLOCK rows; their idle groups still take part
  // in the barriers, so they cannot return early.
  const bool has_row = row < M;

  const kf_elem* x_row = x + row * N;  // x_row: [N]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` packs, [tail_start, N)
  // scalar. head and the tail are shorter than kVec <= kGroupThreads, so each thread reads at
  // most one element of each; the first slice takes both.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % VEC_BYTES);
  const int head = min(N, (VEC_BYTES - misalignment) % VEC_BYTES / int(sizeof(kf_elem)));
  const int packs = (N - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < N
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  // This block's slice of the packs: [slice_begin, slice_end).
  const int slice = (packs + CLUSTER - 1) / CLUSTER;
  const int slice_begin = min(packs, rank * slice);
  const int slice_end = min(packs, slice_begin + slice);

  float partial[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    partial[k] = 0.0f;
  }
  if (has_row) {
    sum_packs(partial, x_packs, slice_begin + thread_in_group, slice_end);
    if (rank == 0) {
      if (thread_in_group < head) partial[0] += kf_to_float(load(x_row + thread_in_group));
      if (tail_index < N) partial[0] += kf_to_float(load(x_row + tail_index));
    }
  }
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    sum += partial[k];
  }
  sum = group_sum(sum, group);

  if constexpr (CLUSTER == 1) {
    if (has_row && thread_in_group == 0) y[row] = kf_from_float<kf_elem>(sum);
  } else {
    // slice_sums[g]: this block's sum of its slice of its group g's row.
    __shared__ float slice_sums[ROWS_PER_BLOCK];
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    if (thread_in_group == 0) slice_sums[group] = sum;
    // Every block's slice sums are written (and visible cluster-wide) after this barrier.
    cluster.sync();
    if (rank == 0 && has_row && thread_in_group == 0) {
      float row_sum = 0.0f;
      for (int r = 0; r < CLUSTER; ++r) {
        row_sum += cluster.map_shared_rank(slice_sums, r)[group];
      }
      y[row] = kf_from_float<kf_elem>(row_sum);
    }
    // No block may exit, releasing its shared memory, while the first block still reads it.
    cluster.sync();
  }
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
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);
  if (N == 0) {
    // Empty sums are zero.
    return cudaMemsetAsync(y.data, 0, size_t(M) * sizeof(kf_elem), stream) == cudaSuccess
               ? KF_OK
               : KF_ERR_LAUNCH;
  }
  const int64_t blocks = (M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK * CLUSTER;
  if (N > INT32_MAX - kIndexSlack || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  reduce_rowblock<<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(
      static_cast<const kf_elem*>(x.data), static_cast<kf_elem*>(y.data), M, int(N));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
