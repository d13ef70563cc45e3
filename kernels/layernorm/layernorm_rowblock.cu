/* kforge
 * op: layernorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 128 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {1, 2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8, 16, 32}
 * param: ROW_PACKS = 8 in {0, 1, 2, 4, 5, 8, 10, 16}
 * param: MIN_BLOCKS = 8 in {1, 2, 4, 6, 8}
 * param: X_EVICT_FIRST = 0 in {0, 1}
 * param: EARLY_PARAMS = 0 in {0, 1}
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 * require: BLOCK_THREADS * MIN_BLOCKS <= max_threads_per_sm
 * require: ROW_PACKS == 0 || VEC > 1
 * # MIN_BLOCKS bounds the single-read kernel only.
 * require: ROW_PACKS > 0 || MIN_BLOCKS == 1
 * require: ROW_PACKS > 0 || X_EVICT_FIRST == 0
 * require: ROW_PACKS > 0 || EARLY_PARAMS == 0
 * # With a known dim, keep only the smallest ROW_PACKS whose registers hold the row.
 * prune: ROW_PACKS == 0 || ROW_PACKS * VEC * (BLOCK_THREADS / ROWS_PER_BLOCK) >= dim
 * prune: ROW_PACKS <= 1 || ROW_PACKS / 2 * VEC * (BLOCK_THREADS / ROWS_PER_BLOCK) < dim
 * threads: BLOCK_THREADS
 */
// LayerNorm with one group of whole warps per row; mean and variance by Chan's parallel
// merge of (count, mean, M2) on shifted data.
//
// Idea: a block of BLOCK_THREADS threads is split into ROWS_PER_BLOCK groups, and each group
// owns one row. Pass 1 reads the row once. Every value is first shifted by the row's first
// element K (d = x - K, exact when x and K are within a factor of two, as in near-constant
// rows), so a row of |x| ~ 100 with variance ~ 1e-4 is summed as values of ~ 1e-2 and
// x - mean keeps its low bits. Each VEC-element pack gets its own mean and M2 = sum (d - mean)^2
// from registers (two passes over the pack), and packs are merged into the thread's running
// (count, mean, M2) with Chan's formula; the threads' triples are merged the same way by warp
// shuffles, then across the group's warps through shared memory. No sum of squares is ever
// subtracted from a squared sum. Pass 2 re-reads the row (mostly from L2) and writes
// y = (d - mean_d) * rsqrt(M2 / dim + eps) * weight + bias. Everything is in fp32.
//
// x and y move in VEC-element vector accesses. A row need not start on a vector boundary
// (dim = 4097, say): it is split into a scalar head up to the first aligned element, a vector
// body and a scalar tail. Weight and bias are read in vectors only when every row starts
// aligned (dim % VEC == 0); otherwise element by element, which is cheap since they stay in
// cache. When the x and y bases are not both vector-aligned, the whole row is read with
// scalar accesses.
//
// Single read (ROW_PACKS = k > 0): each thread keeps its share of the row in registers, up to
// k packs of VEC elements, all loaded at once, so x leaves memory once and every load is in
// flight together. The statistics are then exact two-pass sums from registers on the shifted
// values: the mean of d (one group reduction), then sum (d - mean)^2 (a second one); no Chan
// merges, which cost a division per pack. The row must fit (dim <= k * VEC * group threads)
// and the bases must be vector-aligned; otherwise the host launches the two-pass kernel, so
// every variant is correct at every size.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   VEC             elements per vector load/store (VEC * elem_bytes <= 16).
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows (dim ~ 128) from leaving
//                   most of a large block idle.
//   ROW_PACKS       0: two passes over global memory (Chan merges). k > 0: single read with
//                   up to k packs per thread in registers; larger k fits longer rows but costs
//                   registers. With a known dim, only the smallest k that fits is kept. 5 and
//                   10 fit rows such as 5120 = 5 * 8 * 128 exactly (no idle packs).
//   MIN_BLOCKS      single-read: blocks per SM the registers must leave room for (the second
//                   argument of __launch_bounds__): more resident blocks keep more loads in flight
//                   per SM, too many make ptxas spill (the tuner drops spilling variants).
//   X_EVICT_FIRST   single-read: 1 loads x with an L2 evict_first policy. The row is read
//                   once, so its lines are the ones to give up first; meant to let x's clean
//                   lines be replaced rather than an earlier kernel's dirty ones. On an H100
//                   it changed little either way (-1% to +2% at three sizes).
//   EARLY_PARAMS    single-read: 1 loads this thread's weight and bias with x, before the
//                   row's reductions, so that their latency overlaps the reductions instead of
//                   following them; costs registers. On short rows (32x128) the kernel is one
//                   chain of latencies, and loads issued after the reductions lengthen it.
#include <cstdint>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;
// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
constexpr int kMaxRegisters = 64;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");

using kf::ElemPack;  // kVec elements, moved by one instruction

// Count, mean and sum of squared deviations from the mean of some of a row's shifted values.
// Counts are exact in fp32 up to 2^24 elements per row (the host checks dim).
struct Moments {
  float count = 0.0f;
  float mean = 0.0f;
  float m2 = 0.0f;
};

// Chan et al.'s merge of two disjoint sets' moments. Written so that merge(a, b) and
// merge(b, a) round identically (only commutative operations on symmetric terms, and the _rn
// intrinsics keep the compiler from contracting n_a * mean_a + n_b * mean_b into an fma,
// which would not be): the butterfly in warp_merge then leaves bit-identical results in
// every lane.
__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  if (b.count == 0.0f) return a;
  if (a.count == 0.0f) return b;
  const float count = __fadd_rn(a.count, b.count);
  const float inv_count = __fdividef(1.0f, count);
  const float weighted = __fadd_rn(__fmul_rn(a.count, a.mean), __fmul_rn(b.count, b.mean));
  const float delta = __fsub_rn(b.mean, a.mean);  // the sign cancels in delta^2
  const float between =
      __fmul_rn(__fmul_rn(delta, delta), __fmul_rn(__fmul_rn(a.count, b.count), inv_count));
  return Moments{count, __fmul_rn(weighted, inv_count), __fadd_rn(__fadd_rn(a.m2, b.m2), between)};
}

// Moments of kCount values held in registers: the mean first, then the squared deviations
// from it (an exact two-pass over the pack).
template <int kCount>
__device__ __forceinline__ Moments pack_moments(const float (&d)[kCount]) {
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kCount; ++k) {
    sum += d[k];
  }
  const float mean = sum / float(kCount);
  float m2 = 0.0f;
#pragma unroll
  for (int k = 0; k < kCount; ++k) {
    const float dev = d[k] - mean;
    m2 = fmaf(dev, dev, m2);
  }
  return Moments{float(kCount), mean, m2};
}

__device__ __forceinline__ Moments warp_merge(Moments m) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    Moments other;
    other.count = __shfl_xor_sync(0xffffffffu, m.count, offset);
    other.mean = __shfl_xor_sync(0xffffffffu, m.mean, offset);
    other.m2 = __shfl_xor_sync(0xffffffffu, m.m2, offset);
    m = merge(m, other);
  }
  return m;
}

// Merges over the kWarpsPerGroup warps of this thread's group; every thread of the group gets
// the same result. Contains a __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ Moments group_merge(Moments m, int group) {
  __shared__ float warp_count[kWarps];
  __shared__ float warp_mean[kWarps];
  __shared__ float warp_m2[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  m = warp_merge(m);
  if (lane == 0) {
    warp_count[threadIdx.x / kWarpSize] = m.count;
    warp_mean[threadIdx.x / kWarpSize] = m.mean;
    warp_m2[threadIdx.x / kWarpSize] = m.m2;
  }
  __syncthreads();
  Moments part;  // lanes past the group's warp count hold the empty set
  if (lane < kWarpsPerGroup) {
    const int w = group * kWarpsPerGroup + lane;
    part = Moments{warp_count[w], warp_mean[w], warp_m2[w]};
  }
  return warp_merge(part);
}

__device__ __forceinline__ float normalize(float d, float mean, float inv_std, float w, float b) {
  return fmaf((d - mean) * inv_std, w, b);
}

// Weight and bias of pack p of a row (the row's elements head + p * kVec on), as floats: one
// vector access each when the packs line up with weight's (kParamsInPacks, head == 0), element
// by element otherwise.
template <int kVec, bool kParamsInPacks>
__device__ __forceinline__ void load_params(const kf_elem* __restrict__ weight,  // weight: [dim]
                                            const kf_elem* __restrict__ bias,    // bias: [dim]
                                            int head, int p, float (&w)[kVec], float (&b)[kVec]) {
  using Pack = ElemPack<kVec>;
  if constexpr (kParamsInPacks) {
    const Pack wp = reinterpret_cast<const Pack*>(weight)[p];
    const Pack bp = reinterpret_cast<const Pack*>(bias)[p];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      w[k] = kf_to_float(wp.v[k]);
      b[k] = kf_to_float(bp.v[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      w[k] = kf_to_float(weight[head + p * kVec + k]);
      b[k] = kf_to_float(bias[head + p * kVec + k]);
    }
  }
}

// Packs of kVec elements; kVec == 1 is the scalar path, for bases that are not vector-aligned.
// kParamsInPacks: every row starts on a pack boundary (dim % kVec == 0, aligned bases), so
// weight and bias packs line up with x packs; otherwise they are read element by element.
template <int kVec, bool kParamsInPacks>
__global__ void __maxnreg__(kMaxRegisters)
    layernorm_rowblock(const kf_elem* __restrict__ x,       // x: [batch, dim]
                       const kf_elem* __restrict__ weight,  // weight: [dim]
                       const kf_elem* __restrict__ bias,    // bias: [dim]
                       kf_elem* __restrict__ y,             // y: [batch, dim]
                       int64_t batch, int dim, float eps) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barrier in group_merge, so they cannot return early.
  const bool has_row = row < batch;

  const kf_elem* x_row = x + row * dim;  // x_row: [dim]
  kf_elem* y_row = y + row * dim;        // y_row: [dim]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, dim)
  // scalar. x and y rows are equally misaligned (the host checks both bases), so one split
  // serves both. head and the tail are shorter than kVec, so each thread handles at most one
  // element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(dim, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (dim - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < dim
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + head);              // [packs]

  // The shift: any element of the row works; the first is at hand for every thread (one
  // broadcast load per warp).
  const float shift = has_row ? kf_to_float(x_row[0]) : 0.0f;

  // Pass 1: moments of d = x - shift over the row.
  Moments acc;
  if (has_row) {
    for (int p = thread_in_group; p < packs; p += kGroupThreads) {
      const Pack pack = x_packs[p];
      float d[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        d[k] = kf_to_float(pack.v[k]) - shift;
      }
      acc = merge(acc, pack_moments(d));
    }
    if (thread_in_group < head) {
      acc = merge(acc, Moments{1.0f, kf_to_float(x_row[thread_in_group]) - shift, 0.0f});
    }
    if (tail_index < dim) {
      acc = merge(acc, Moments{1.0f, kf_to_float(x_row[tail_index]) - shift, 0.0f});
    }
  }
  const Moments row_moments = group_merge(acc, group);
  if (!has_row) return;
  const float mean = row_moments.mean;  // of d, not of x
  const float inv_std = rsqrtf(row_moments.m2 / float(dim) + eps);

  // Pass 2: y = (d - mean) * inv_std * weight + bias. Two packs in flight per thread: x,
  // weight and bias packs of four unrolled iterations would not fit in kMaxRegisters.
#pragma unroll 2
  for (int p = thread_in_group; p < packs; p += kGroupThreads) {
    const Pack xp = x_packs[p];
    float w[kVec], b[kVec];
    load_params<kVec, kParamsInPacks>(weight, bias, head, p, w, b);
    Pack yp;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      yp.v[k] = kf_from_float<kf_elem>(
          normalize(kf_to_float(xp.v[k]) - shift, mean, inv_std, w[k], b[k]));
    }
    y_packs[p] = yp;
  }
  if (thread_in_group < head) {
    const int j = thread_in_group;
    y_row[j] = kf_from_float<kf_elem>(normalize(kf_to_float(x_row[j]) - shift, mean, inv_std,
                                                kf_to_float(weight[j]), kf_to_float(bias[j])));
  }
  if (tail_index < dim) {
    const int j = tail_index;
    y_row[j] = kf_from_float<kf_elem>(normalize(kf_to_float(x_row[j]) - shift, mean, inv_std,
                                                kf_to_float(weight[j]), kf_to_float(bias[j])));
  }
}

// Sum over the kWarpsPerGroup warps of this thread's group; every thread of the group gets the
// same value. `slots` is this call's own shared array (one float per warp), so two calls need
// no barrier between them. Contains a __syncthreads(): every thread of the block must call it.
__device__ __forceinline__ float group_sum(float value, int group, float (&slots)[kWarps]) {
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (lane == 0) slots[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  value = lane < kWarpsPerGroup ? slots[group * kWarpsPerGroup + lane] : 0.0f;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// The single-read kernel: the row in registers, exact two-pass statistics from them. Launched
// only with vector-aligned bases and rows of at most kRowPacks * kGroupThreads packs.
// kFullRows: every row is exactly kRowPacks * kGroupThreads packs with no scalar head or tail
// (dim == ROW_PACKS * VEC * group threads, aligned), so no per-pack bounds tests are needed:
// fewer instructions per element, which is what this kernel is bound by when rows are short.
// Each element is converted and shifted once, into d[]; the passes work on those floats.
// Launch bounds instead of kMaxRegisters: the packs must stay in registers, and MIN_BLOCKS
// says how many blocks per SM the registers must allow.
template <int kVec, bool kParamsInPacks, int kRowPacks, bool kFullRows>
__global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)
    layernorm_rowblock_single(const kf_elem* __restrict__ x,       // x: [batch, dim]
                              const kf_elem* __restrict__ weight,  // weight: [dim]
                              const kf_elem* __restrict__ bias,    // bias: [dim]
                              kf_elem* __restrict__ y,             // y: [batch, dim]
                              int64_t batch, int dim, float eps) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));
  __shared__ float mean_slots[kWarps];
  __shared__ float m2_slots[kWarps];

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  const bool has_row = row < batch;      // idle groups still join both barriers
  const kf_elem* x_row = x + row * dim;  // x_row: [dim]
  kf_elem* y_row = y + row * dim;        // y_row: [dim]

  // The same head / packs / tail split as the two-pass kernel (head and tail are empty for
  // full rows).
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head =
      kFullRows ? 0 : min(dim, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = kFullRows ? kRowPacks * kGroupThreads : (dim - head) / kVec;
  const int tail_index = head + packs * kVec + thread_in_group;
  const bool has_head = !kFullRows && has_row && thread_in_group < head;
  const bool has_tail = !kFullRows && has_row && tail_index < dim;
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + head);              // [packs]
  // Pack i of this thread exists (always, for full rows).
  const auto owns = [&](int i) {
    return kFullRows ? has_row : has_row && thread_in_group + i * kGroupThreads < packs;
  };

  // Every load first, so all of them are in flight together.
  Pack xs[kRowPacks];  // xs[i]: pack thread_in_group + i * kGroupThreads of the row
  [[maybe_unused]] uint64_t release_policy = 0;
  if constexpr (X_EVICT_FIRST != 0) release_policy = kf::l2_policy<kf::L2Residency::release>();
#pragma unroll
  for (int i = 0; i < kRowPacks; ++i) {
    if (!owns(i)) continue;
    const Pack* src = x_packs + thread_in_group + i * kGroupThreads;
    if constexpr (X_EVICT_FIRST != 0) {
      xs[i] = kf::load_with_policy<kf::L2Residency::release>(src, release_policy);
    } else {
      xs[i] = *src;
    }
  }
  // EARLY_PARAMS: every pack's weight and bias now, in flight with x. Otherwise each pack's are
  // loaded just before its y is written, so that only one pack's are held at a time.
  [[maybe_unused]] float early_w[EARLY_PARAMS != 0 ? kRowPacks : 1][kVec];
  [[maybe_unused]] float early_b[EARLY_PARAMS != 0 ? kRowPacks : 1][kVec];
  if constexpr (EARLY_PARAMS != 0) {
#pragma unroll
    for (int i = 0; i < kRowPacks; ++i) {
      if (owns(i)) {
        load_params<kVec, kParamsInPacks>(weight, bias, head, thread_in_group + i * kGroupThreads,
                                          early_w[i], early_b[i]);
      }
    }
  }
  const float shift = has_row ? kf_to_float(x_row[0]) : 0.0f;
  const float d_head = has_head ? kf_to_float(x_row[thread_in_group]) - shift : 0.0f;
  const float d_tail = has_tail ? kf_to_float(x_row[tail_index]) - shift : 0.0f;

  // d = x - shift, once per element; packs this thread does not own hold zeros.
  float d[kRowPacks][kVec];
#pragma unroll
  for (int i = 0; i < kRowPacks; ++i) {
    const bool own = owns(i);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      d[i][k] = own ? kf_to_float(xs[i].v[k]) - shift : 0.0f;
    }
  }

  // Pass 1 over registers: the mean of d.
  float sum = d_head + d_tail;
#pragma unroll
  for (int i = 0; i < kRowPacks; ++i) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      sum += d[i][k];
    }
  }
  const float mean = group_sum(sum, group, mean_slots) / float(dim);

  // Pass 2 over registers: the squared deviations from that mean; d becomes d - mean.
  float m2 = 0.0f;
  if (has_head) m2 = fmaf(d_head - mean, d_head - mean, m2);
  if (has_tail) m2 = fmaf(d_tail - mean, d_tail - mean, m2);
#pragma unroll
  for (int i = 0; i < kRowPacks; ++i) {
    const bool own = owns(i);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      d[i][k] -= mean;
      if (own) m2 = fmaf(d[i][k], d[i][k], m2);
    }
  }
  const float row_m2 = group_sum(m2, group, m2_slots);
  if (!has_row) return;
  const float inv_std = rsqrtf(row_m2 / float(dim) + eps);

#pragma unroll
  for (int i = 0; i < kRowPacks; ++i) {
    if (!owns(i)) continue;
    float w[kVec], b[kVec];
    if constexpr (EARLY_PARAMS != 0) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        w[k] = early_w[i][k];
        b[k] = early_b[i][k];
      }
    } else {
      load_params<kVec, kParamsInPacks>(weight, bias, head, thread_in_group + i * kGroupThreads, w,
                                        b);
    }
    Pack yp;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      yp.v[k] = kf_from_float<kf_elem>(fmaf(d[i][k] * inv_std, w[k], b[k]));
    }
    y_packs[thread_in_group + i * kGroupThreads] = yp;
  }
  if (has_head) {
    const int j = thread_in_group;
    y_row[j] = kf_from_float<kf_elem>(
        normalize(d_head, mean, inv_std, kf_to_float(weight[j]), kf_to_float(bias[j])));
  }
  if (has_tail) {
    const int j = tail_index;
    y_row[j] = kf_from_float<kf_elem>(
        normalize(d_tail, mean, inv_std, kf_to_float(weight[j]), kf_to_float(bias[j])));
  }
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 1) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const kf_tensor& bias = args->inputs[2];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || weight.dtype != kf_elem_dtype || bias.dtype != kf_elem_dtype ||
      y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: batch = shape[0] for the [batch, dim] case.
  const int64_t dim = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != dim || kf_numel(&bias) != dim) return KF_ERR_UNSUPPORTED;
  if (dim == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t batch = kf_numel(&x) / dim;
  const int64_t blocks = (batch + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  // Element counts stay exact in fp32 up to 2^24.
  if (dim > (int64_t(1) << 24) || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  const auto* b_data = static_cast<const kf_elem*>(bias.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  // Vector accesses need x and y equally misaligned, which holds when both bases are aligned.
  constexpr size_t kPackBytes = sizeof(ElemPack<VEC>);
  const bool vectorized = kf_is_aligned(x_data, kPackBytes) && kf_is_aligned(y_data, kPackBytes);
  const bool params_in_packs = vectorized && dim % VEC == 0 && kf_is_aligned(w_data, kPackBytes) &&
                               kf_is_aligned(b_data, kPackBytes);
  const dim3 grid(static_cast<unsigned>(blocks));
  if constexpr (ROW_PACKS > 0) {
    // A row's vector body has at most dim / VEC packs, so dim <= ROW_PACKS * VEC * group
    // threads means every row fits in registers; equality with aligned rows means every row
    // fills them exactly.
    if (VEC > 1 && vectorized && dim <= int64_t(ROW_PACKS) * VEC * kGroupThreads) {
      const bool full_rows = params_in_packs && dim == int64_t(ROW_PACKS) * VEC * kGroupThreads;
      if (full_rows) {
        layernorm_rowblock_single<VEC, true, ROW_PACKS, true><<<grid, BLOCK_THREADS, 0, stream>>>(
            x_data, w_data, b_data, y_data, batch, int(dim), eps);
      } else if (params_in_packs) {
        layernorm_rowblock_single<VEC, true, ROW_PACKS, false><<<grid, BLOCK_THREADS, 0, stream>>>(
            x_data, w_data, b_data, y_data, batch, int(dim), eps);
      } else {
        layernorm_rowblock_single<VEC, false, ROW_PACKS, false><<<grid, BLOCK_THREADS, 0, stream>>>(
            x_data, w_data, b_data, y_data, batch, int(dim), eps);
      }
      return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
    }
  }
  if (params_in_packs) {
    layernorm_rowblock<VEC, true>
        <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, w_data, b_data, y_data, batch, int(dim), eps);
  } else if (vectorized) {
    layernorm_rowblock<VEC, false>
        <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, w_data, b_data, y_data, batch, int(dim), eps);
  } else {
    layernorm_rowblock<1, true>
        <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, w_data, b_data, y_data, batch, int(dim), eps);
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
