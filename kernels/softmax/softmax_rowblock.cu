/* kforge
 * op: softmax
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8, 16, 32, 64}
 * param: ROW_PACKS = 0 in {0, 1, 2, 4, 8, 16}
 * param: UNROLL = 2 in {1, 2, 4}
 * param: CACHE_HINTS = 0 in {0, 1}
 * param: MIN_BLOCKS = 1 in {1, 2, 4, 6, 8}
 * # A row's group: whole warps, or 4 to 16 lanes of one warp (narrow rows).
 * require: BLOCK_THREADS >= 4 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0 || 32 % (BLOCK_THREADS / ROWS_PER_BLOCK) == 0
 * require: VEC <= BLOCK_THREADS / ROWS_PER_BLOCK
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 * require: BLOCK_THREADS * MIN_BLOCKS <= max_threads_per_sm
 * require: ROW_PACKS == 0 || UNROLL == 1
 * # With known cols, keep only the smallest ROW_PACKS whose registers hold the row.
 * prune: ROW_PACKS == 0 || ROW_PACKS * VEC * (BLOCK_THREADS / ROWS_PER_BLOCK) >= cols
 * prune: ROW_PACKS <= 1 || ROW_PACKS / 2 * VEC * (BLOCK_THREADS / ROWS_PER_BLOCK) < cols
 * threads: BLOCK_THREADS
 */
// Softmax over the last dim with one group of threads per row: y = exp(x - max) / sum.
//
// Idea: a block of BLOCK_THREADS threads is split into ROWS_PER_BLOCK groups, and each group
// owns one row: whole warps, or for narrow rows (cols ~ 128) 4 to 16 lanes of a warp, so that a
// warp works on several rows at once and reduces each with fewer shuffles. Everything is
// accumulated in fp32. The kernel is bound by memory traffic, so the tunables are about how x is
// read:
//
//   two-pass (ROW_PACKS = 0): pass 1 reads the row once and keeps, per thread, a running
//     maximum m and the sum s = sum(exp(x - m)) ("online" softmax: when m grows, s is rescaled
//     by exp(m_old - m_new)). The (m, s) pairs are merged across the warp with shuffles, then
//     across the group's warps through shared memory and a second shuffle. Pass 2 re-reads the
//     row (mostly from L2) and writes y = exp(x - m) / s.
//   single-read (ROW_PACKS = k > 0): each thread keeps its share of the row in registers, up to
//     k packs of VEC elements, so x leaves memory once. From registers: the row max (one group
//     reduction), then the sum of exp(x - max) (a second one), then y. No rescaling is needed
//     since the max is known before any exp. The row must fit (cols <= k * VEC * group
//     threads) and the bases must be vector-aligned; when they are not, the host launches the
//     two-pass kernel instead, so every variant is correct at every size.
//
// Rows need not be aligned (cols = 50257 is common): each row is split into a scalar head
// up to the first VEC-aligned element, a body of VEC-element vector accesses and a scalar
// tail. That needs x and y to be equally misaligned, which holds whenever both bases are
// VEC-aligned; when they are not, the whole row is read with scalar accesses (two-pass).
//
// Every exp is kf::exp_nonpositive (its argument is x - max <= 0): one FMUL and one MUFU op
// where expf takes about eight instructions; the two-pass read takes two exps per element.
//
// The result is deterministic: each thread combines its elements in a fixed order and the
// reductions combine fixed partners; no atomics.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   VEC             elements per vector load/store (VEC * elem_bytes <= 16). The default, 4,
//                   is the widest every dtype allows (8 f32 elements would be 32 bytes).
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows (cols ~ 128) from
//                   leaving most of a large block idle. Groups smaller than a warp (BLOCK_THREADS
//                   / ROWS_PER_BLOCK < 32) reduce with shuffles over their own lanes only.
//   ROW_PACKS       0: two-pass. k > 0: single-read, each thread holding up to k packs of x in
//                   registers. Larger k fits longer rows but costs registers (and occupancy);
//                   with known cols only the smallest k that fits is kept.
//                   A launch that cannot use single-read runs two-pass with UNROLL = 1.
//   UNROLL          two-pass only: packs each thread loads before using any of them, i.e. loads
//                   in flight per thread. More hides more latency at the cost of registers.
//                   The default, 2, timed best with the other defaults at 8192^2 bf16 on an
//                   H200 (96.0 us against 102.3 us for UNROLL = 1).
//   CACHE_HINTS     1: streaming cache hints. y is stored evict-first (__stcs), since nothing
//                   reads it back here; the last read of x (pass 2, or the only read in
//                   single-read mode) is marked as last use (__ldcs). Pass 1 reads normally so
//                   the row stays in L2 for pass 2. Keeps L2 for data that is reused.
//   MIN_BLOCKS      blocks per SM the registers must leave room for (the second argument of
//                   __launch_bounds__): more resident blocks keep more loads in flight per SM,
//                   too many make ptxas spill (the tuner drops spilling variants).
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/fast_exp.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;      // 0: a group is part of a warp
// Lanes a shuffle reduction spans: a sub-warp group's own lanes (an aligned run of
// kGroupThreads lanes, so xor partners below kGroupThreads stay in the group), else the warp.
constexpr int kShuffleLanes = kGroupThreads < kWarpSize ? kGroupThreads : kWarpSize;
constexpr bool kStreamingHints = CACHE_HINTS != 0;

static_assert(kGroupThreads % kWarpSize == 0 || kWarpSize % kGroupThreads == 0,
              "a row is owned by whole warps or by an aligned part of one warp");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");
static_assert(ROW_PACKS >= 0 && UNROLL >= 1, "ROW_PACKS counts packs, UNROLL counts loads");

using kf::ElemPack;
using kf::exp_nonpositive;
using kf::load;
using kf::store;

// Calls use(p, packs[p]) for this thread's packs p = first, first + kGroupThreads, ... < count,
// in that order. The loads go out kBatch at a time before any of them is used, so kBatch loads
// per thread are in flight while `use` carries its dependency (a running max and sum) from pack to
// pack. Both loops stay rolled (unroll 1) so that kBatch, not the compiler's own unrolling, decides
// the loads in flight and the registers they take. The remainder, fewer than kBatch packs,
// goes one at a time.
template <int kBatch, bool kLastUse, typename Pack, typename Use>
__device__ __forceinline__ void for_each_pack(const Pack* packs, int count, int first, Use use) {
  int p = first;
#pragma unroll 1
  for (; p + (kBatch - 1) * kGroupThreads < count; p += kBatch * kGroupThreads) {
    Pack batch[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      batch[b] = load<kLastUse>(packs + p + b * kGroupThreads);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      use(p + b * kGroupThreads, batch[b]);
    }
  }
#pragma unroll 1
  for (; p < count; p += kGroupThreads) {
    use(p, load<kLastUse>(packs + p));
  }
}

// ---- Two-pass: online (max, sum) ----

// Running max and sum of exp(x - max) over the elements seen so far. The empty state uses
// -FLT_MAX rather than -inf so that exp(max_a - max_b) never sees (-inf) - (-inf) = NaN.
struct MaxSum {
  float max = -FLT_MAX;
  float sum = 0.0f;
};

__device__ __forceinline__ void add_element(MaxSum& acc, float v) {
  if (v > acc.max) {
    acc.sum *= exp_nonpositive(acc.max - v);
    acc.max = v;
  }
  acc.sum += exp_nonpositive(v - acc.max);
}

template <int kVec>
__device__ __forceinline__ void add_pack(MaxSum& acc, const ElemPack<kVec>& pack) {
  float v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    v[k] = kf_to_float(pack.v[k]);
  }
  // One rescale per pack instead of one per element.
  float pack_max = v[0];
#pragma unroll
  for (int k = 1; k < kVec; ++k) {
    pack_max = fmaxf(pack_max, v[k]);
  }
  if (pack_max > acc.max) {
    acc.sum *= exp_nonpositive(acc.max - pack_max);
    acc.max = pack_max;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    acc.sum += exp_nonpositive(v[k] - acc.max);
  }
}

// Merges the (max, sum) pairs of kLanes aligned lanes: their max, then each lane rescales its
// sum to it (one exp per lane) and the sums are added. The butterfly adds the same pairs in
// every lane (a + b == b + a), so all lanes end with bit-identical results.
template <int kLanes>
__device__ __forceinline__ MaxSum warp_merge(MaxSum acc) {
  float max = acc.max;
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  }
  float sum = acc.sum * exp_nonpositive(acc.max - max);
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return MaxSum{max, sum};
}

// Merges over this thread's group; every thread of the group gets the same result. Unless a
// group is at most one warp (then shuffles suffice), it contains a
// __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ MaxSum group_merge(MaxSum acc, int group) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  acc = warp_merge<kShuffleLanes>(acc);
  if constexpr (kWarpsPerGroup <= 1) return acc;  // a row within one warp needs no barrier
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
  return warp_merge<kWarpSize>(part);
}

// ---- Single-read: max, then sum ----

// Max over the group, every thread of the group gets it. fmaxf is exact and commutative, so
// all lanes agree. Like group_merge, it contains a __syncthreads() unless a group is at most
// one warp,
// so every thread of the block must call it. Its
// shared array is its own, so it needs no barrier against group_sum's.
__device__ __forceinline__ float group_max(float value, int group) {
  __shared__ float warp_max[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = kShuffleLanes / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  if constexpr (kWarpsPerGroup <= 1) return value;
  if (lane == 0) warp_max[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  value = lane < kWarpsPerGroup ? warp_max[group * kWarpsPerGroup + lane] : -FLT_MAX;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sum over the group, as group_max. The butterfly adds the same pairs in every lane
// (a + b == b + a), so all lanes end with bit-identical sums.
__device__ __forceinline__ float group_sum(float value, int group) {
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = kShuffleLanes / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if constexpr (kWarpsPerGroup <= 1) return value;
  if (lane == 0) warp_sum[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  value = lane < kWarpsPerGroup ? warp_sum[group * kWarpsPerGroup + lane] : 0.0f;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// ---- Output ----

template <int kVec>
__device__ __forceinline__ ElemPack<kVec> softmax_pack(const ElemPack<kVec>& xp, float row_max,
                                                       float inv_sum) {
  ElemPack<kVec> yp;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    yp.v[k] = kf_from_float<kf_elem>(exp_nonpositive(kf_to_float(xp.v[k]) - row_max) * inv_sum);
  }
  return yp;
}

__device__ __forceinline__ kf_elem softmax_element(float x, float row_max, float inv_sum) {
  return kf_from_float<kf_elem>(exp_nonpositive(x - row_max) * inv_sum);
}

// Launch bounds: registers stay within what MIN_BLOCKS blocks of BLOCK_THREADS may hold
// (65536 / (MIN_BLOCKS * BLOCK_THREADS), at most 255), so every variant can launch that many
// blocks per SM. The minimum must be explicit: given the thread count alone, ptxas picks a
// register target of its own and spills a few bytes in variants that would fit (at 1024
// threads, say, 32 registers and a spill where 64 are allowed), and the tuner drops spilling
// variants. With it, only variants that really need more registers than allowed spill.
//
// kVec: elements per pack; 1 is the scalar path, for bases that are not vector-aligned.
// kRowPacks: 0 for two-pass; k > 0 for single-read, launched only when every row fits, i.e.
// its vector body has at most k * kGroupThreads packs.
template <int kVec, int kRowPacks>
__global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)
    softmax_rowblock(const kf_elem* __restrict__ x,  // x: [rows, cols]
                     kf_elem* __restrict__ y,        // y: [rows, cols]
                     int64_t rows, int cols) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barriers of the group reductions, so they cannot return early.
  const bool has_row = row < rows;

  const kf_elem* x_row = x + row * cols;  // x_row: [cols]
  kf_elem* y_row = y + row * cols;        // y_row: [cols]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, cols)
  // scalar. head and the tail are shorter than kVec <= kGroupThreads, so each thread handles
  // at most one element of each: its head element is thread_in_group, its tail element
  // tail_index.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(cols, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (cols - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;
  const bool has_head = has_row && thread_in_group < head;
  const bool has_tail = has_row && tail_index < cols;
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + head);              // [packs]

  if constexpr (kRowPacks > 0) {
    // Single read. This thread's packs are p = thread_in_group + i * kGroupThreads for
    // i < kRowPacks (the host guarantees packs <= kRowPacks * kGroupThreads). The loops over i
    // unroll fully, so xs[] lives in registers and all loads are in flight at once. exp is
    // computed twice per element (for the sum, then for y) rather than kept as fp32, which
    // would double the registers held for 16-bit dtypes.
    Pack xs[kRowPacks];  // xs[i]: pack thread_in_group + i * kGroupThreads of the row
    float x_head = 0.0f;
    float x_tail = 0.0f;
    if (has_row) {
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        const int p = thread_in_group + i * kGroupThreads;
        if (p < packs) xs[i] = load<kStreamingHints>(x_packs + p);
      }
    }
    if (has_head) x_head = kf_to_float(load<kStreamingHints>(x_row + thread_in_group));
    if (has_tail) x_tail = kf_to_float(load<kStreamingHints>(x_row + tail_index));

    float local_max = -FLT_MAX;
    if (has_row) {
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        if (thread_in_group + i * kGroupThreads < packs) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            local_max = fmaxf(local_max, kf_to_float(xs[i].v[k]));
          }
        }
      }
    }
    if (has_head) local_max = fmaxf(local_max, x_head);
    if (has_tail) local_max = fmaxf(local_max, x_tail);
    const float row_max = group_max(local_max, group);

    float local_sum = 0.0f;
    if (has_row) {
#pragma unroll
      for (int i = 0; i < kRowPacks; ++i) {
        if (thread_in_group + i * kGroupThreads < packs) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            local_sum += exp_nonpositive(kf_to_float(xs[i].v[k]) - row_max);
          }
        }
      }
    }
    if (has_head) local_sum += exp_nonpositive(x_head - row_max);
    if (has_tail) local_sum += exp_nonpositive(x_tail - row_max);
    const float row_sum = group_sum(local_sum, group);
    if (!has_row) return;

    // The row's maximum contributes exp(0) = 1, so the sum is at least 1.
    const float inv_sum = 1.0f / row_sum;
#pragma unroll
    for (int i = 0; i < kRowPacks; ++i) {
      const int p = thread_in_group + i * kGroupThreads;
      if (p < packs) store<kStreamingHints>(y_packs + p, softmax_pack(xs[i], row_max, inv_sum));
    }
    if (has_head) {
      store<kStreamingHints>(y_row + thread_in_group, softmax_element(x_head, row_max, inv_sum));
    }
    if (has_tail) {
      store<kStreamingHints>(y_row + tail_index, softmax_element(x_tail, row_max, inv_sum));
    }
  } else {
    // Pass 1: max and sum of exp over the row. No last-use hint: the row stays in L2 for pass 2.
    MaxSum acc;
    if (has_row) {
      for_each_pack<UNROLL, false>(x_packs, packs, thread_in_group,
                                   [&](int, const Pack& xp) { add_pack(acc, xp); });
    }
    if (has_head) add_element(acc, kf_to_float(load<false>(x_row + thread_in_group)));
    if (has_tail) add_element(acc, kf_to_float(load<false>(x_row + tail_index)));
    const MaxSum row_acc = group_merge(acc, group);
    if (!has_row) return;

    // The row's maximum contributes exp(0) = 1, so the sum is at least 1.
    const float row_max = row_acc.max;
    const float inv_sum = 1.0f / row_acc.sum;

    // Pass 2: y = exp(x - max) / sum; the last read of x.
    for_each_pack<UNROLL, kStreamingHints>(
        x_packs, packs, thread_in_group, [&](int p, const Pack& xp) {
          store<kStreamingHints>(y_packs + p, softmax_pack(xp, row_max, inv_sum));
        });
    if (has_head) {
      const int j = thread_in_group;
      const float v = kf_to_float(load<kStreamingHints>(x_row + j));
      store<kStreamingHints>(y_row + j, softmax_element(v, row_max, inv_sum));
    }
    if (has_tail) {
      const int j = tail_index;
      const float v = kf_to_float(load<kStreamingHints>(x_row + j));
      store<kStreamingHints>(y_row + j, softmax_element(v, row_max, inv_sum));
    }
  }
}

template <int kVec, int kRowPacks>
void launch(dim3 grid, cudaStream_t stream, const kf_elem* x, kf_elem* y, int64_t rows, int cols) {
  softmax_rowblock<kVec, kRowPacks><<<grid, BLOCK_THREADS, 0, stream>>>(x, y, rows, cols);
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
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

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
  // A row's vector body has at most cols / VEC packs, so cols <= ROW_PACKS * VEC *
  // kGroupThreads means every row fits in registers.
  const bool single_read =
      ROW_PACKS > 0 && vectorized && cols <= int64_t(ROW_PACKS) * VEC * kGroupThreads;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (single_read) {
    launch<VEC, ROW_PACKS>(grid, stream, x_data, y_data, rows, int(cols));
  } else if (vectorized) {
    launch<VEC, 0>(grid, stream, x_data, y_data, rows, int(cols));
  } else {
    launch<1, 0>(grid, stream, x_data, y_data, rows, int(cols));
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
