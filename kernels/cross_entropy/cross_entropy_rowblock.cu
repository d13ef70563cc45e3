/* kforge
 * op: cross_entropy
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: PACK_BYTES = 16 in {4, 8, 16}
 * param: UNROLL = 4 in {1, 2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8}
 * param: CACHE_HINTS = 0 in {0, 1}
 * param: STAGES = 3 in {0, 2, 3, 4}
 * derive: VEC = PACK_BYTES / elem_bytes
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: BLOCK_THREADS <= max_threads_per_block
 * threads: BLOCK_THREADS
 * shared_bytes: STAGES * UNROLL * BLOCK_THREADS * PACK_BYTES
 */
// Mean cross-entropy over the rows whose target is not -100, in one launch.
//
// Idea: each row goes to a group of whole warps (ROWS_PER_BLOCK groups per block), which reads
// it once. A thread takes UNROLL packs of PACK_BYTES at a time (a batch), finds the batch's
// largest element first, and only then computes exponentials, so every element costs one exp
// (MUFU.EX2) and the running sum is rescaled once per batch, not per element:
//
//   state (m, c, s): m = largest element so far, c = m * log2(e) rounded to fp32,
//                    s = sum of 2^(x * log2(e) - c) over the elements so far.
//   batch: m' = max(m, batch max), c' = m' * log2(e), s = s * 2^(c - c') if m grew,
//          then s += 2^fma(x, log2(e), -c') per element (one FFMA and one MUFU.EX2).
//
// The fma rounds only its small result, so each term is as exact as the MUFU (about 2^-22
// relative), whatever c is. c needs no exactness: the loss is taken relative to it,
// loss = (c - x[target] * log2(e) + log2(s)) * ln(2), the first difference again in one fma.
// The states of the group's threads merge as (max m, sum of s_t * 2^(c_t - c)), over a warp
// with shuffles and across warps through shared memory.
//
// That needs 2^(x * log2(e) - c) not to overflow, i.e. c within a few units of m * log2(e):
// true for |m| < 2^23, where c's spacing is at most 1. A thread whose largest element is
// beyond that (logits near the fp32 maximum, which bf16 and f32 allow), or whose sum is not
// finite (inf or NaN logits), marks its sum NaN; the merge carries the NaN to the whole row,
// and the row is summed again as sum(exp(x - max)) with the row's max known (right for any
// finite logits, NaN where the reference is NaN). The block decides this together
// (__syncthreads_or), so its barriers stay uniform. Ordinary logits never take that path.
//
// Loads in flight: with STAGES = 0 a thread loads a batch into registers and waits for it.
// With STAGES = k >= 2 each thread streams its packs through a private ring of k batches in
// shared memory with cp.async, keeping the next k - 1 batches in flight while it works on
// one, without holding them in registers. Each thread reads back only the slots it filled,
// so cp.async.wait_group alone orders the copies before the reads: no barrier. A slot is
// refilled one batch after it was read, when the values read have already been used.
//
// The mean: each row's loss goes to a per-row fp32 workspace (0 for an ignored row, which is
// not read at all). Then each block bumps a counter; the block that finds itself last adds
// the losses of the counted rows in a fixed order (each thread a fixed stride of rows, in
// fp64, then a fixed tree), writes the mean, or NaN when no row counts, and sets the counter
// back to 0 for the next launch. Launches on one stream run one after another, so one counter
// (and one workspace, kept for the module's life: kforge/workspace.cuh) serves them all;
// calls of one module on two streams at once would share both. No atomic touches a value, so
// results are bit-reproducible.
//
// Rows need not start on a pack boundary (vocab = 50257 is common): each row is split into a
// scalar head up to the first pack-aligned element, a body of packs and a scalar tail; any
// element-aligned base works. A target outside [0, vocab) that is not -100 makes its row's
// loss NaN instead of reading out of bounds.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   PACK_BYTES      bytes per vector load (VEC = PACK_BYTES / elem_bytes elements); 16 is one
//                   128-bit load.
//   UNROLL          packs per batch: loads a thread issues together, and the span over which
//                   the max is taken before the exps.
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows from leaving most of a
//                   large block idle.
//   CACHE_HINTS     1: logits are read with an evict-first hint (__ldcs, or an L2 evict-first
//                   policy on cp.async): each byte is read once. 0: no hint.
//   STAGES          0: batches load into registers. k >= 2: a cp.async ring of k batches per
//                   thread in shared memory (k * UNROLL * BLOCK_THREADS * PACK_BYTES bytes).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;
constexpr bool kStreamingHints = CACHE_HINTS != 0;
constexpr int kStages = STAGES;
constexpr int kLastStage = kStages > 0 ? kStages - 1 : 0;  // the ring's last stage
// Index arithmetic below runs up to this far past the row's end in int.
constexpr int kIndexSlack = UNROLL * 1024 + 16;
constexpr int64_t kIgnoreIndex = -100;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// Largest |max| for which the fast state is trusted: below it, m * log2(e) < 2^24, so the
// rounding of c moves the largest term by at most 2^0.5.
constexpr float kFastMaxMagnitude = 8388608.0f;  // 2^23
// Row losses the last block loads before adding any of them.
constexpr int kMeanUnroll = 8;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(PACK_BYTES % sizeof(kf_elem) == 0 && VEC * sizeof(kf_elem) == PACK_BYTES,
              "a pack is a whole number of elements");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");
static_assert(UNROLL >= 1, "UNROLL counts loads");
static_assert(kStages == 0 || kStages >= 2, "a ring needs one batch to read and one to fill");

// Blocks of the running launch that have finished their rows. The last one resets it to 0.
__device__ unsigned int g_blocks_done = 0;

// kVec consecutive elements, aligned so that one instruction loads all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};
using Pack = ElemPack<VEC>;

// The built-in type of a given size that __ldg and __ldcs accept.
template <int kBytes>
struct AccessBits;
template <>
struct AccessBits<4> {
  using Type = unsigned int;
};
template <>
struct AccessBits<8> {
  using Type = uint2;
};
template <>
struct AccessBits<16> {
  using Type = uint4;
};

// Loads a pack that nothing writes during the kernel: evict-first (__ldcs) with streaming
// hints, else through the read-only path (__ldg).
__device__ __forceinline__ Pack load_pack(const Pack* p) {
  using Bits = typename AccessBits<sizeof(Pack)>::Type;
  const Bits* bits_ptr = reinterpret_cast<const Bits*>(p);
  const Bits bits = kStreamingHints ? __ldcs(bits_ptr) : __ldg(bits_ptr);
  Pack pack;
  memcpy(&pack, &bits, sizeof(Pack));
  return pack;
}

// The pack's elements as fp32. bf16 widens by bit moves, one integer op per element (the
// high element of a 32-bit word is the word with its low half cleared).
__device__ __forceinline__ void unpack(const Pack& pack, float (&v)[VEC]) {
#if defined(KF_ELEM_BF16)
  uint32_t words[VEC / 2];
  memcpy(&words, &pack, sizeof(words));
#pragma unroll
  for (int i = 0; i < VEC / 2; ++i) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
#else
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    v[k] = kf_to_float(pack.v[k]);
  }
#endif
}

// ---- cp.async ring (STAGES >= 2) ----

// Starts copying *src into the shared-memory slot at shared address dst (cp.async: completes
// in the background; cp_async_wait makes it visible to this thread). 16-byte copies skip L1
// (.cg).
__device__ __forceinline__ void cp_async_pack(unsigned dst, const Pack* src, uint64_t policy) {
  if constexpr (sizeof(Pack) == 16) {
    if constexpr (kStreamingHints) {
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst),
                   "l"(src), "l"(policy)
                   : "memory");
    } else {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    }
  } else {
    if constexpr (kStreamingHints) {
      asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3;" ::"r"(dst),
                   "l"(src), "n"(int(sizeof(Pack))), "l"(policy)
                   : "memory");
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src),
                   "n"(int(sizeof(Pack)))
                   : "memory");
    }
  }
}

// Closes the group of copies issued since the last commit (possibly none).
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most kPending of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// L2 policy for the streaming hint: evict first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
  if constexpr (kStreamingHints) {
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

// 2^x in one MUFU.EX2; results below 2^-126 flush to 0, which no sum here can notice.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// fence.acq_rel.gpu: on the counting side, a release (this block's stores, and those of its
// threads ordered before it by a barrier, become visible before the count that follows); on
// the last block's side, an acquire (stores counted before are visible to what follows, and
// through a barrier to the block's other threads).
__device__ __forceinline__ void fence_acq_rel_gpu() {
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Adds v[0..kCount) pairwise (fixed tree: short dependency chains, fixed order).
template <int kCount>
__device__ __forceinline__ float tree_sum(float (&v)[kCount]) {
#pragma unroll
  for (int stride = 1; stride < kCount; stride *= 2) {
#pragma unroll
    for (int i = 0; i + stride < kCount; i += 2 * stride) {
      v[i] += v[i + stride];
    }
  }
  return v[0];
}

// Largest element of kCount packs. 16-bit elements are compared two at a time (max.bf16x2 /
// max.f16x2 are exact, as fmaxf is), and only the last pair is widened to fp32. NaN elements
// are passed over, as by fmaxf; their exps make the sum NaN.
template <int kCount>
__device__ __forceinline__ float packs_max(const Pack (&packs)[kCount]) {
#if defined(KF_ELEM_F32)
  float v[kCount * VEC];
#pragma unroll
  for (int u = 0; u < kCount; ++u) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      v[u * VEC + k] = packs[u].v[k];
    }
  }
#pragma unroll
  for (int stride = 1; stride < kCount * VEC; stride *= 2) {
#pragma unroll
    for (int i = 0; i + stride < kCount * VEC; i += 2 * stride) {
      v[i] = fmaxf(v[i], v[i + stride]);
    }
  }
  return v[0];
#else
#if defined(KF_ELEM_BF16)
  using Pair = __nv_bfloat162;
#else
  using Pair = __half2;
#endif
  constexpr int kPairs = kCount * VEC / 2;
  static_assert(VEC % 2 == 0, "16-bit packs hold whole pairs");
  Pair w[kPairs];
  memcpy(&w, &packs, sizeof(w));
#pragma unroll
  for (int stride = 1; stride < kPairs; stride *= 2) {
#pragma unroll
    for (int i = 0; i + stride < kPairs; i += 2 * stride) {
      w[i] = __hmax2(w[i], w[i + stride]);
    }
  }
  return fmaxf(kf_to_float(w[0].x), kf_to_float(w[0].y));
#endif
}

// The fast state of one thread (see the top of the file).
struct ScaledSum {
  float max = -INFINITY;         // m: largest element so far
  float scaled_max = -INFINITY;  // c = m * log2(e), rounded
  float sum = 0.0f;              // s = sum of 2^(x * log2(e) - c)
};

// Moves the state's reference to a new max; returns the new c. s is rescaled only when the
// max grows, so it is never multiplied by an approximate 1. From the empty state, s stays 0
// (0 * 2^-inf).
__device__ __forceinline__ float raise_max(ScaledSum& acc, float candidate) {
  const float new_max = fmaxf(acc.max, candidate);
  const float new_scaled = new_max * kLog2e;
  if (new_max > acc.max) acc.sum *= exp2_approx(acc.scaled_max - new_scaled);
  acc.max = new_max;
  acc.scaled_max = new_scaled;
  return new_scaled;
}

// Adds kCount packs: one max, one rescale, then one FFMA and one MUFU.EX2 per element.
template <int kCount>
__device__ __forceinline__ void add_packs(ScaledSum& acc, const Pack (&packs)[kCount]) {
  const float neg_scaled = -raise_max(acc, packs_max(packs));
  float terms[kCount * VEC];
#pragma unroll
  for (int u = 0; u < kCount; ++u) {
    float v[VEC];
    unpack(packs[u], v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      terms[u * VEC + k] = exp2_approx(fmaf(v[k], kLog2e, neg_scaled));
    }
  }
  acc.sum += tree_sum(terms);
}

__device__ __forceinline__ void add_element(ScaledSum& acc, float x) {
  const float neg_scaled = -raise_max(acc, x);
  acc.sum += exp2_approx(fmaf(x, kLog2e, neg_scaled));
}

// A pack whose elements are all -inf: fills the unused slots of the last batch, where each
// adds exactly 0 (2^-inf) and never raises the max.
__device__ __forceinline__ Pack minus_inf_pack() {
#if defined(KF_ELEM_F32)
  constexpr uint32_t kBits = 0xff800000u;  // one -inf
#elif defined(KF_ELEM_BF16)
  constexpr uint32_t kBits = 0xff80ff80u;  // two
#else
  constexpr uint32_t kBits = 0xfc00fc00u;  // two
#endif
  uint32_t words[sizeof(Pack) / 4];
#pragma unroll
  for (int i = 0; i < int(sizeof(Pack) / 4); ++i) {
    words[i] = kBits;
  }
  Pack pack;
  memcpy(&pack, &words, sizeof(Pack));
  return pack;
}

// Adds this thread's packs of a row, p = first + i * kGroupThreads < packs, in batches of
// UNROLL (batch b: p = first + b * UNROLL * kGroupThreads + u * kGroupThreads, u < UNROLL).
// Every batch but the last is whole; the last may be padded with -inf packs. `ring` is this
// block's cp.async ring (STAGES >= 2); this thread's slot for (stage, u) is
// ring[(stage * UNROLL + u) * BLOCK_THREADS + threadIdx.x], so a warp's slots are adjacent.
__device__ __forceinline__ void add_row_packs(ScaledSum& acc, const Pack* x_packs, int packs,
                                              int first, Pack* ring) {
  constexpr int kBatchStride = UNROLL * kGroupThreads;
  if constexpr (kStages == 0) {
    int p = first;
    // Whole batches: all loads first, then the max, then the exps. Rolled, so that UNROLL, not
    // the compiler's unrolling, decides the loads in flight.
#pragma unroll 1
    for (; p + (UNROLL - 1) * kGroupThreads < packs; p += kBatchStride) {
      Pack batch[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        batch[u] = load_pack(x_packs + p + u * kGroupThreads);
      }
      add_packs(acc, batch);
    }
    // The rest, fewer than UNROLL packs, as one padded batch so that its loads fly together.
    if (p < packs) {
      Pack batch[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int q = p + u * kGroupThreads;
        batch[u] = q < packs ? load_pack(x_packs + q) : minus_inf_pack();
      }
      add_packs(acc, batch);
    }
  } else {
    const uint64_t policy = evict_first_policy();
    constexpr int kStageSlots = UNROLL * BLOCK_THREADS;
    constexpr unsigned kSlotBytes = BLOCK_THREADS * sizeof(Pack);  // from slot u to u + 1
    constexpr unsigned kStageBytes = UNROLL * kSlotBytes;
    // This thread's slots of stage 0: a generic pointer to read them, their shared address
    // (taken once) to fill them. Stages follow each other.
    const Pack* slots = ring + threadIdx.x;
    const Pack* const last_stage = slots + kLastStage * kStageSlots;
    const unsigned slots_address = static_cast<unsigned>(__cvta_generic_to_shared(slots));
    const unsigned last_stage_address = slots_address + kLastStage * kStageBytes;

    // Issue side: the next batch to start (its first pack) and its stage. Every call commits a
    // group, empty once the packs run out, so group j holds batch j and "batch k has landed" is
    // "at most kStages - 1 groups pending" after the call of step k.
    int issue_first = first;
    unsigned issue_address = slots_address;
    const auto issue_next = [&]() {
      if (issue_first < packs) {
        const Pack* src = x_packs + issue_first;
        if (issue_first + (UNROLL - 1) * kGroupThreads < packs) {
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            cp_async_pack(issue_address + u * kSlotBytes, src + u * kGroupThreads, policy);
          }
        } else {
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            if (issue_first + u * kGroupThreads < packs) {
              cp_async_pack(issue_address + u * kSlotBytes, src + u * kGroupThreads, policy);
            }
          }
        }
        issue_first += kBatchStride;
        issue_address =
            issue_address == last_stage_address ? slots_address : issue_address + kStageBytes;
      }
      cp_async_commit();
    };
#pragma unroll
    for (int b = 0; b < kLastStage; ++b) {
      issue_next();
    }

    // Read side. Step k: refill the stage read in step k - 1 (its values are used by now) with
    // batch k + kStages - 1, wait for batch k, read it. A batch followed by another is whole.
    int read_first = first;
    const Pack* read_stage = slots;
#pragma unroll 1
    while (read_first + kBatchStride < packs) {
      issue_next();
      cp_async_wait<kLastStage>();
      Pack batch[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        batch[u] = read_stage[u * BLOCK_THREADS];
      }
      add_packs(acc, batch);
      read_first += kBatchStride;
      read_stage = read_stage == last_stage ? slots : read_stage + kStageSlots;
    }
    if (read_first < packs) {  // the last batch, possibly partial; nothing left to issue
      cp_async_wait<0>();
      Pack batch[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        batch[u] = read_first + u * kGroupThreads < packs ? read_stage[u * BLOCK_THREADS]
                                                          : minus_inf_pack();
      }
      add_packs(acc, batch);
    }
  }
}

// Merges the states of a warp's lanes: the warp's max, each lane's sum rescaled to it, then
// summed. Lanes with the empty state add 0 (2^(-inf - c)). The butterfly adds the same pairs in
// every lane (a + b == b + a), so all lanes end with bit-identical results.
__device__ __forceinline__ ScaledSum warp_merge(const ScaledSum& acc) {
  float max = acc.max;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  }
  const float scaled = max * kLog2e;
  float sum = acc.sum * exp2_approx(acc.scaled_max - scaled);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return ScaledSum{max, scaled, sum};
}

// Merges over the kWarpsPerGroup warps of this thread's group; every thread of the group gets
// the same result. Contains a __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ ScaledSum group_merge(const ScaledSum& acc, int group) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  const ScaledSum merged = warp_merge(acc);
  if (lane == 0) {
    warp_max[threadIdx.x / kWarpSize] = merged.max;
    warp_sum[threadIdx.x / kWarpSize] = merged.sum;
  }
  __syncthreads();
  ScaledSum part;  // lanes past the group's warp count hold the empty state
  if (lane < kWarpsPerGroup) {
    part.max = warp_max[group * kWarpsPerGroup + lane];
    part.scaled_max = part.max * kLog2e;
    part.sum = warp_sum[group * kWarpsPerGroup + lane];
  }
  return warp_merge(part);
}

// Sum over the group, every thread of the group gets it; as group_merge, every thread of the
// block must call it. Its shared array is its own, so it needs no barrier against
// group_merge's.
__device__ __forceinline__ float group_sum(float value, int group) {
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (lane == 0) warp_sum[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  value = lane < kWarpsPerGroup ? warp_sum[group * kWarpsPerGroup + lane] : 0.0f;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Run by every thread of the last block: loss = sum of the counted rows' losses / their count,
// NaN if none. Each thread adds rows threadIdx.x, + BLOCK_THREADS, ... in order (in fp64: a
// batch of losses near the fp32 maximum must not overflow the sum); the threads' sums then
// meet in a fixed tree. row_loss was written by other blocks of this launch, so it is read
// through L2 (__ldcg), never through the read-only path.
__device__ __forceinline__ void write_mean(const float* row_loss,                // [batch]
                                           const int64_t* __restrict__ targets,  // [batch]
                                           kf_elem* __restrict__ loss,           // []
                                           int64_t batch) {
  __shared__ double warp_losses[kWarps];
  __shared__ int64_t warp_counts[kWarps];
  double total = 0.0;
  int64_t count = 0;
  for (int64_t first = threadIdx.x; first < batch; first += kMeanUnroll * BLOCK_THREADS) {
    float losses[kMeanUnroll];
    int64_t row_targets[kMeanUnroll];
#pragma unroll
    for (int k = 0; k < kMeanUnroll; ++k) {
      const int64_t r = first + int64_t(k) * BLOCK_THREADS;
      losses[k] = r < batch ? __ldcg(row_loss + r) : 0.0f;
      row_targets[k] = r < batch ? targets[r] : kIgnoreIndex;
    }
#pragma unroll
    for (int k = 0; k < kMeanUnroll; ++k) {
      if (row_targets[k] != kIgnoreIndex) {
        total += double(losses[k]);
        ++count;
      }
    }
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  total = warp_sum(total);
  count = warp_sum(count);
  if (lane == 0) {
    warp_losses[warp] = total;
    warp_counts[warp] = count;
  }
  __syncthreads();
  if (warp != 0) return;
  total = lane < kWarps ? warp_losses[lane] : 0.0;
  count = lane < kWarps ? warp_counts[lane] : 0;
  total = warp_sum(total);
  count = warp_sum(count);
  if (lane == 0) {
    loss[0] = kf_from_float<kf_elem>(count > 0 ? float(total / double(count)) : NAN);
  }
}

// row_loss[r] = logsumexp(logits[r, :]) - logits[r, targets[r]] (0 for an ignored row), then,
// in the last block to finish, loss = the mean over the counted rows.
//
// Launch bounds: registers stay within what one block of BLOCK_THREADS may hold, so every
// variant can launch. The explicit minimum of one block per SM keeps ptxas from picking a
// lower register target of its own (and spilling) to raise occupancy.
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    cross_entropy_rowblock(const kf_elem* __restrict__ logits,   // logits: [batch, vocab]
                           const int64_t* __restrict__ targets,  // targets: [batch]
                           float* row_loss,                      // row_loss: [batch]
                           kf_elem* __restrict__ loss,           // loss: [] (one element)
                           int64_t batch, int vocab) {
  constexpr int kPackBytes = int(sizeof(Pack));
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  Pack* ring = reinterpret_cast<Pack*>(dynamic_shared);  // STAGES >= 2: the cp.async ring

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  const int64_t target = row < batch ? targets[row] : kIgnoreIndex;
  // The last block can hold fewer than ROWS_PER_BLOCK rows, and some rows are ignored; those
  // groups still take part in the barriers, so they cannot return early.
  const bool has_row = row < batch && target != kIgnoreIndex;
  const bool target_in_range = target >= 0 && target < vocab;

  const kf_elem* x_row = logits + row * vocab;  // x_row: [vocab]

  // The target's logit, loaded early so that its latency hides behind the row's.
  float target_logit = NAN;
  if (has_row && thread_in_group == 0 && target_in_range) {
    target_logit = kf_to_float(x_row[target]);
  }

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` packs, [tail_start, vocab)
  // scalar. head and the tail are shorter than VEC <= kGroupThreads, so each thread reads at
  // most one element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(vocab, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (vocab - head) / VEC;
  const int tail_start = head + packs * VEC;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < vocab
  const bool has_head = has_row && thread_in_group < head;
  const bool has_tail = has_row && tail_index < vocab;
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]

  ScaledSum acc;
  if (has_row) add_row_packs(acc, x_packs, packs, thread_in_group, ring);
  if (has_head) add_element(acc, kf_to_float(x_row[thread_in_group]));
  if (has_tail) add_element(acc, kf_to_float(x_row[tail_index]));
  // A state that cannot be trusted (see the top) poisons the merge. The empty state (m = -inf,
  // s = 0) is fine.
  if (!(fabsf(acc.max) < kFastMaxMagnitude) && acc.max != -INFINITY) acc.sum = NAN;

  const ScaledSum row_acc = group_merge(acc, group);
  const bool fast_ok = isfinite(row_acc.sum);
  float row_value = 0.0f;  // the row's loss; 0 for an ignored row
  if (has_row && fast_ok) {
    row_value = (fmaf(-target_logit, kLog2e, row_acc.scaled_max) + log2f(row_acc.sum)) * kLn2;
  }

  // Rows whose fast state was not trusted, summed again as sum(exp(x - max)) with the row's
  // exact max (every term <= 1, the max's term 1). The whole block enters or skips this
  // together, since group_sum holds a barrier.
  const bool redo = has_row && !fast_ok;
  if (__syncthreads_or(redo)) {
    const float max = row_acc.max;
    float sum = 0.0f;
    if (redo) {
      for (int p = thread_in_group; p < packs; p += kGroupThreads) {
        const Pack pack = load_pack(x_packs + p);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          sum += expf(kf_to_float(pack.v[k]) - max);
        }
      }
      if (has_head) sum += expf(kf_to_float(x_row[thread_in_group]) - max);
      if (has_tail) sum += expf(kf_to_float(x_row[tail_index]) - max);
    }
    const float row_sum = group_sum(sum, group);
    // max - x[target] first: both may be near the fp32 maximum, their difference is not.
    if (redo) row_value = (max - target_logit) + logf(row_sum);
  }

  // Publish the row's loss, then count this block as done: the barrier orders every group's
  // store before thread 0's release and increment.
  if (row < batch && thread_in_group == 0) row_loss[row] = row_value;
  __shared__ bool is_last_block;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_gpu();
    const bool last = atomicAdd(&g_blocks_done, 1u) == gridDim.x - 1;
    if (last) fence_acq_rel_gpu();
    is_last_block = last;
  }
  __syncthreads();
  if (!is_last_block) return;
  // Every block has published its rows and counted itself; nothing else touches the counter in
  // this launch.
  if (threadIdx.x == 0) g_blocks_done = 0;
  write_mean(row_loss, targets, loss, batch);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& logits = args->inputs[0];
  const kf_tensor& targets = args->inputs[1];
  const kf_tensor& loss = args->outputs[0];
  if (logits.dtype != kf_elem_dtype || targets.dtype != KF_DTYPE_I64 ||
      loss.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  // logits: [batch, vocab] (leading dimensions are rows); targets: one per row; loss: one
  // element.
  if (logits.ndim < 1 || kf_numel(&loss) != 1) return KF_ERR_UNSUPPORTED;
  const int64_t vocab = logits.shape[logits.ndim - 1];
  const int64_t batch = kf_numel(&targets);
  if (targets.ndim != logits.ndim - 1) return KF_ERR_UNSUPPORTED;
  for (int32_t i = 0; i < targets.ndim; ++i) {
    if (targets.shape[i] != logits.shape[i]) return KF_ERR_UNSUPPORTED;
  }
  // A row without classes has no logsumexp.
  if (batch > 0 && vocab == 0) return KF_ERR_UNSUPPORTED;
  // At least one block, so that an empty batch still writes its NaN.
  const int64_t blocks = batch > 0 ? (batch + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK : 1;
  if (vocab > INT32_MAX - kIndexSlack || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(logits.data);
  const auto* t_data = static_cast<const int64_t*>(targets.data);
  auto* loss_data = static_cast<kf_elem*>(loss.data);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);
  // Rows are split at pack boundaries of their own, so any element-aligned base works.
  if (reinterpret_cast<uintptr_t>(x_data) % sizeof(kf_elem) != 0) return KF_ERR_UNSUPPORTED;

  // Per-row losses in the module's workspace (allocated once, grown in stream order).
  static kf::Workspace workspace;
  float* row_loss = nullptr;
  if (batch > 0) {
    row_loss = static_cast<float*>(workspace.get(size_t(batch) * sizeof(float), stream));
    if (row_loss == nullptr) return KF_ERR_OUT_OF_MEMORY;
  }
  // The cp.async ring may take the block past the default 48 KB of shared memory (static
  // shared memory counts too), so any ring opts in; set once per process (the module lives in one
  // process, on one device).
  constexpr size_t kRingBytes = size_t(kStages) * UNROLL * BLOCK_THREADS * sizeof(Pack);
  static const bool ring_allowed =
      kRingBytes == 0 ||
      cudaFuncSetAttribute(cross_entropy_rowblock, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kRingBytes)) == cudaSuccess;
  if (!ring_allowed) return KF_ERR_LAUNCH;
  cross_entropy_rowblock<<<dim3(static_cast<unsigned>(blocks)), BLOCK_THREADS, kRingBytes,
                           stream>>>(x_data, t_data, row_loss, loss_data, batch, int(vocab));
  const bool launched = cudaGetLastError() == cudaSuccess;
  return launched ? KF_OK : KF_ERR_LAUNCH;
}
