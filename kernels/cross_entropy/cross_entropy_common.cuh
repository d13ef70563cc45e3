// What the cross-entropy kernel files share: packs and their loads, the cp.async ring, the
// one-exp2-per-element running (max, sum) state, a row's packs added into it, the warp merge,
// and the fixed-order mean over the rows' losses that the last block computes; on the host, the
// checks of a call's tensors.
//
// Not a general header: it is part of the files in this folder and reads their tunables
// (BLOCK_THREADS, PACK_BYTES, VEC, UNROLL, CACHE_HINTS, STAGES) and kRowThreads, the threads
// that share one row (or one row's slice), which the file declares in an unnamed namespace
// before including it. Each file keeps its own idea, its kernel and its launch; see
// cross_entropy_rowblock.cu for the method.
#ifndef KFORGE_CROSS_ENTROPY_COMMON_CUH_
#define KFORGE_CROSS_ENTROPY_COMMON_CUH_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kRowWarps = kRowThreads / kWarpSize;  // warps that share one row
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

static_assert(BLOCK_THREADS % kWarpSize == 0, "blocks are whole warps");
static_assert(kRowThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC <= kRowThreads, "a row's scalar head and tail take one pass of its threads");
static_assert(PACK_BYTES % sizeof(kf_elem) == 0 && VEC * sizeof(kf_elem) == PACK_BYTES,
              "a pack is a whole number of elements");
static_assert(UNROLL >= 1, "UNROLL counts loads");
static_assert(kStages == 0 || kStages >= 2, "a ring needs one batch to read and one to fill");

using Pack = kf::ElemPack<VEC>;

// Loads a pack that nothing writes during the kernel: evict-first (__ldcs) with streaming
// hints, else through the read-only path (__ldg).
__device__ __forceinline__ Pack load_pack(const Pack* p) {
  return kf::load<kStreamingHints>(p);
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

// Adds this thread's packs of a row (or a row's slice), p = first + i * kRowThreads < packs,
// where kRowThreads threads share the row, in batches of UNROLL (batch b:
// p = first + b * UNROLL * kRowThreads + u * kRowThreads, u < UNROLL).
// Every batch but the last is whole; the last may be padded with -inf packs. `ring` is this
// block's cp.async ring (STAGES >= 2); this thread's slot for (stage, u) is
// ring[(stage * UNROLL + u) * BLOCK_THREADS + threadIdx.x], so a warp's slots are adjacent.
__device__ __forceinline__ void add_row_packs(ScaledSum& acc, const Pack* x_packs, int packs,
                                              int first, Pack* ring) {
  constexpr int kBatchStride = UNROLL * kRowThreads;
  if constexpr (kStages == 0) {
    int p = first;
    // Whole batches: all loads first, then the max, then the exps. Rolled, so that UNROLL, not
    // the compiler's unrolling, decides the loads in flight.
#pragma unroll 1
    for (; p + (UNROLL - 1) * kRowThreads < packs; p += kBatchStride) {
      Pack batch[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        batch[u] = load_pack(x_packs + p + u * kRowThreads);
      }
      add_packs(acc, batch);
    }
    // The rest, fewer than UNROLL packs, as one padded batch so that its loads fly together.
    if (p < packs) {
      Pack batch[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int q = p + u * kRowThreads;
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
        if (issue_first + (UNROLL - 1) * kRowThreads < packs) {
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            cp_async_pack(issue_address + u * kSlotBytes, src + u * kRowThreads, policy);
          }
        } else {
#pragma unroll
          for (int u = 0; u < UNROLL; ++u) {
            if (issue_first + u * kRowThreads < packs) {
              cp_async_pack(issue_address + u * kSlotBytes, src + u * kRowThreads, policy);
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
        batch[u] =
            read_first + u * kRowThreads < packs ? read_stage[u * BLOCK_THREADS] : minus_inf_pack();
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

// Merges over the kRowWarps warps of this thread's group (the threads that share its row:
// group = threadIdx.x / kRowThreads); every thread of the group gets the same result. Contains a
// __syncthreads(), so every thread of the block must call it.
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
  if (lane < kRowWarps) {
    part.max = warp_max[group * kRowWarps + lane];
    part.scaled_max = part.max * kLog2e;
    part.sum = warp_sum[group * kRowWarps + lane];
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
  value = lane < kRowWarps ? warp_sum[group * kRowWarps + lane] : 0.0f;
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

// A call's tensors: logits [batch, vocab] (leading dimensions are rows), int64 targets, one per
// row, and a one-element loss, all checked.
struct CrossEntropyCall {
  const kf_elem* logits = nullptr;
  const int64_t* targets = nullptr;
  kf_elem* loss = nullptr;
  int64_t batch = 0;
  int64_t vocab = 0;
  cudaStream_t stream = nullptr;
};

// Fills `call` from `args`; false when the arguments are not a cross-entropy these files take.
bool read_call(const kf_args* args, CrossEntropyCall& call) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return false;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 0) return false;
  const kf_tensor& logits = args->inputs[0];
  const kf_tensor& targets = args->inputs[1];
  const kf_tensor& loss = args->outputs[0];
  if (logits.dtype != kf_elem_dtype || targets.dtype != KF_DTYPE_I64 ||
      loss.dtype != kf_elem_dtype) {
    return false;
  }
  if (logits.ndim < 1 || kf_numel(&loss) != 1) return false;
  call.vocab = logits.shape[logits.ndim - 1];
  call.batch = kf_numel(&targets);
  if (targets.ndim != logits.ndim - 1) return false;
  for (int32_t i = 0; i < targets.ndim; ++i) {
    if (targets.shape[i] != logits.shape[i]) return false;
  }
  // A row without classes has no logsumexp.
  if (call.batch > 0 && call.vocab == 0) return false;
  if (call.vocab > INT32_MAX - kIndexSlack) return false;
  call.logits = static_cast<const kf_elem*>(logits.data);
  call.targets = static_cast<const int64_t*>(targets.data);
  call.loss = static_cast<kf_elem*>(loss.data);
  call.stream = static_cast<cudaStream_t>(args->stream);
  // Rows are split at pack boundaries of their own, so any element-aligned base works.
  return reinterpret_cast<uintptr_t>(call.logits) % sizeof(kf_elem) == 0;
}

}  // namespace

#endif  // KFORGE_CROSS_ENTROPY_COMMON_CUH_
