// Hopper (sm_90) bulk copies from global into shared memory, the mbarriers they complete on,
// and a ring of shared-memory stages that row kernels stream their input through.
//
// Why: a kernel bound by memory traffic needs tens of kilobytes in flight per SM. Loads into
// registers hold every byte in flight in a register until it lands; a bulk copy (the 1-D form
// of the tensor memory accelerator, no tensor map needed) hands the whole transfer to the
// SM's copy engine, which writes shared memory and counts the bytes on an mbarrier. One thread
// keeps several stages in flight while every thread computes on an earlier one.
//
// PTX used (ISA 8.0, sm_90):
//   cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes{.L2::cache_hint}
//       [dst], [src], size, [mbar]{, policy}
//     dst and src 16-byte aligned, size a multiple of 16. A block launched without clusters
//     is a cluster of one, so its own shared::cta address is a valid shared::cluster address.
//   createpolicy.fractional.L2::evict_first.b64      an L2 policy for data read once
//   mbarrier.init / arrive / arrive.expect_tx / try_wait.parity (release and acquire at CTA
//     scope, the defaults)
//   fence.mbarrier_init.release.cluster               barrier init visible to the copy engine
//   fence.proxy.async.shared::cta                     orders this thread's view of shared
//     memory (generic proxy) before its later bulk copies (async proxy)
//   barrier.sync id, threads                          a barrier for a subset of the block's warps
//
// A bulk copy's completion is observed through its mbarrier phase, and it carries an implicit
// async-to-generic proxy fence, so data read after mbarrier_wait is the copied data. The other
// direction needs the explicit fence: before a stage is refilled, every thread's reads (and
// writes) of it must be ordered before the copy. TileRing does it as: each warp arrives on
// the stage's "empty" barrier after its last access (release), the refilling thread waits on
// it (acquire), issues fence.proxy.async.shared::cta, then the copy.
#ifndef KFORGE_BULK_COPY_CUH_
#define KFORGE_BULK_COPY_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace kf_bulk {

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Sets up `bar` for phases that complete after `arrivals` arrivals and all announced bytes.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals)
               : "memory");
}

// Makes this thread's mbarrier_init calls visible to the copy engine; the other threads of the
// block still need a __syncthreads() before they use the barriers.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival (release semantics: this thread's earlier accesses happen before the phase
// completes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile(
      "{\n\t.reg .b64 state;\n\t"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n\t}" ::"r"(shared_address(bar))
      : "memory");
}

// One arrival that also announces `bytes` more bytes the phase waits for (the copies that
// complete_tx on this barrier).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n\t.reg .b64 state;\n\t"
      "mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n\t}" ::"r"(shared_address(bar)),
      "r"(bytes)
      : "memory");
}

// Waits until the phase of `bar` with the given parity (0 or 1) has completed (acquire
// semantics). Phases alternate parity, so a waiter that tracks the parity of the phase it
// needs never confuses it with the phase before, as long as the barrier cannot run two phases
// ahead of it (the ring below guarantees that).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = shared_address(bar);
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred complete;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n\t"
        "selp.b32 %0, 1, 0, complete;\n\t}"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Orders this thread's earlier generic-proxy accesses of shared memory (and those it has
// acquired from other threads) before its later async-proxy ones (bulk copies).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// An L2 policy for data read once: its lines are the first to be evicted.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Copies `bytes` from global `src` to shared `dst` and counts them on `bar` (complete_tx).
// dst and src 16-byte aligned, bytes a multiple of 16; announce the bytes on `bar` first.
__device__ __forceinline__ void copy_to_shared(void* dst, const void* src, uint32_t bytes,
                                               uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}

// The same with an L2 cache policy for the source (from evict_first_policy, say).
__device__ __forceinline__ void copy_to_shared(void* dst, const void* src, uint32_t bytes,
                                               uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}

// Barrier for the `threads` threads (whole warps) that use the same `id` (1..15; 0 is
// __syncthreads()'s). The non-.aligned form: threads of a warp may arrive at different times
// (in TileRing, thread 0 can still be refilling a stage while the rest of its warp moves on).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// __syncthreads() in its non-.aligned form (barrier.sync 0; __syncthreads() is bar.sync 0, the
// .aligned form, which wants whole warps to arrive together): for barriers that a warp may
// reach with its lanes apart.
__device__ __forceinline__ void block_barrier() {
  asm volatile("barrier.sync 0;" ::: "memory");
}

// ---- A ring of stages fed by bulk copies ----

// Dynamic shared memory a launch may use besides the kernel's static shared memory (barriers
// and reduction scratch, which must stay within this reserve). Kernel headers state their
// `shared_bytes:` against max_shared_per_block - kStaticSharedReserve, like plan_stages.
constexpr int kStaticSharedReserve = 1024;

// Streams a contiguous tensor of `total` elements of T through `stages` shared-memory buffers
// of `stage_bytes` each (a multiple of 16, at the 16-byte aligned start of dynamic shared
// memory), one tile at a time. Tile t is elements [t * tile_elems, min((t + 1) * tile_elems,
// total)); block b takes tiles b, b + gridDim.x, ..., and its i-th tile goes to stage
// i % stages. Thread 0 issues the copies; every thread of the block calls start(), then
// acquire(t) and release(t) for each of its tiles in order.
//
// Alignment: a bulk copy moves the 16-byte aligned cover of a tile, [start rounded down to
// 16, end rounded up to 16), so a tile of any length and alignment lands in its stage at byte
// offset start % 16; acquire() returns a pointer to its first element. The stage needs room
// for tile bytes + 15, which stage_bytes = round_up(tile bytes + 16, 16) gives. A cover that
// would reach outside the tensor (its first or last few tiles when the base or the end is not
// 16-byte aligned) is not copied: the block fills that stage with ordinary loads, at the
// same offset. Shared memory then holds element e of a tile at the same address modulo 16 as
// in global memory, whichever way it came, so vector accesses line up the same way in both.
//
// Ordering:
//   full[s]   one arrival (thread 0's arrive_expect_tx) plus the copied bytes per phase.
//             Every thread waits on it once per bulk-copied use of the stage and tracks its
//             parity with one bit per stage (filled uses do not touch it).
//   empty[s]  one arrival per warp per use of the stage, after the warp's last access.
//             Thread 0 waits on it for use u (parity u % 2) before it copies use u + 1 into
//             the stage. It cannot run two phases ahead of that wait: use u + 1 is not
//             consumed before thread 0 issues it (or, when it is filled, before thread 0
//             reaches the fill's block_barrier()).
//   fill      block_barrier() before (every warp is done with the stage's previous use) and
//             after (the loads are visible to every thread). The non-.aligned barrier, since
//             thread 0 may reach it after the rest of its warp (it refills stages alone).
template <typename T, int kMaxStages>
class TileRing {
 public:
  static_assert(kMaxStages >= 1 && kMaxStages <= 32, "one parity bit per stage in a uint32");

  struct Barriers {
    uint64_t full[kMaxStages];
    uint64_t empty[kMaxStages];
  };

  __device__ TileRing(Barriers& barriers, unsigned char* stage_memory, int stage_bytes, int stages,
                      const T* src, int64_t total, int64_t tile_elems, int64_t tiles,
                      bool evict_first)
      : barriers_(barriers),
        stage_memory_(stage_memory),
        src_(src),
        total_(total),
        tile_elems_(tile_elems),
        tiles_(tiles),
        stage_bytes_(stage_bytes),
        stages_(stages),
        evict_first_(evict_first) {}

  // Every thread of the block: sets up the barriers and issues the block's first tiles.
  __device__ void start() {
    if (threadIdx.x == 0) {
      const uint32_t warps = (blockDim.x + 31) / 32;
      for (int s = 0; s < stages_; ++s) {
        mbarrier_init(&barriers_.full[s], 1);
        mbarrier_init(&barriers_.empty[s], warps);
      }
      fence_mbarrier_init();
      if (evict_first_) policy_ = evict_first_policy();
    }
    block_barrier();
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages_; ++s) {
        const int64_t tile = blockIdx.x + int64_t(s) * gridDim.x;
        if (tile < tiles_ && cover(tile).copied) issue(tile, s);
      }
    }
  }

  // Every thread of the block, for its tiles in order: waits until `tile` is in its stage and
  // returns its first element (in shared memory).
  __device__ const T* acquire(int64_t tile) {
    const Cover c = cover(tile);
    T* first = reinterpret_cast<T*>(stage(stage_) + c.offset);
    if (c.copied) {
      mbarrier_wait(&barriers_.full[stage_], (full_parity_ >> stage_) & 1u);
      full_parity_ ^= 1u << stage_;
    } else {
      block_barrier();
      const T* src = src_ + tile * tile_elems_;
      for (int64_t e = threadIdx.x; e < c.elems; e += blockDim.x) {
        first[e] = src[e];
      }
      block_barrier();
    }
    return first;
  }

  // Every thread of the block, after its last access to `tile`'s stage: hands the stage back;
  // thread 0 refills it with the block's tile `stages` iterations ahead.
  __device__ void release(int64_t tile) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(&barriers_.empty[stage_]);
    if (threadIdx.x == 0) {
      const int64_t next = tile + int64_t(stages_) * gridDim.x;
      if (next < tiles_ && cover(next).copied) {
        mbarrier_wait(&barriers_.empty[stage_], round_ & 1u);
        fence_proxy_async_shared();
        issue(next, stage_);
      }
    }
    if (++stage_ == stages_) {
      stage_ = 0;
      ++round_;
    }
  }

 private:
  struct Cover {
    const unsigned char* start;  // 16-byte aligned
    uint32_t bytes;              // a multiple of 16
    uint32_t offset;             // of the tile's first byte from `start`
    int64_t elems;               // in the tile
    bool copied;                 // the cover lies inside the tensor
  };

  __device__ Cover cover(int64_t tile) const {
    const int64_t first = tile * tile_elems_;
    const int64_t elems = min(tile_elems_, total_ - first);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(src_ + first);
    const uintptr_t end = begin + uintptr_t(elems) * sizeof(T);
    const uintptr_t cover_begin = begin & ~uintptr_t(15);
    const uintptr_t cover_end = (end + 15) & ~uintptr_t(15);
    Cover c;
    c.start = reinterpret_cast<const unsigned char*>(cover_begin);
    c.bytes = uint32_t(cover_end - cover_begin);
    c.offset = uint32_t(begin - cover_begin);
    c.elems = elems;
    c.copied = cover_begin >= reinterpret_cast<uintptr_t>(src_) &&
               cover_end <= reinterpret_cast<uintptr_t>(src_ + total_);
    return c;
  }

  __device__ unsigned char* stage(int s) const { return stage_memory_ + s * stage_bytes_; }

  // Thread 0: copies `tile` into stage s.
  __device__ void issue(int64_t tile, int s) {
    const Cover c = cover(tile);
    mbarrier_arrive_expect_tx(&barriers_.full[s], c.bytes);
    if (evict_first_) {
      copy_to_shared(stage(s), c.start, c.bytes, &barriers_.full[s], policy_);
    } else {
      copy_to_shared(stage(s), c.start, c.bytes, &barriers_.full[s]);
    }
  }

  Barriers& barriers_;
  unsigned char* stage_memory_;
  const T* src_;
  int64_t total_;
  int64_t tile_elems_;
  int64_t tiles_;
  int stage_bytes_;
  int stages_;
  bool evict_first_;
  uint64_t policy_ = 0;       // thread 0's L2 policy, when evict_first_
  int stage_ = 0;             // of the current tile
  uint32_t round_ = 0;        // uses of the current stage before this one
  uint32_t full_parity_ = 0;  // bit s: parity of the next phase of full[s] to wait for
};

// ---- Host side ----

// The device facts a launch needs, read once per process: kforge runs a module on one device.
struct DeviceFacts {
  int sm_count = 1;
  int max_shared_per_block = 48 * 1024;  // with opt-in
};

inline const DeviceFacts& device_facts() {
  static const DeviceFacts facts = [] {
    DeviceFacts f;
    int device = 0;
    int value = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return f;
    if (cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
        value > 0) {
      f.sm_count = value;
    }
    if (cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
            cudaSuccess &&
        value > 0) {
      f.max_shared_per_block = value;
    }
    return f;
  }();
  return facts;
}

// How a launch lays out its stages. stages == 0: not even one stage fits.
struct StagePlan {
  int rows_per_stage = 0;
  int stage_bytes = 0;
  int stages = 0;
  int shared_bytes = 0;  // dynamic shared memory of the launch: stages * stage_bytes
};

// Stages of up to `max_rows_per_stage` rows of `row_bytes` each: as many rows as the tensor
// has, up to that; as many stages as fit, up to `max_stages`. A kernel header's
// `shared_bytes:` line spells out the same arithmetic:
//   min(STAGES, (max_shared_per_block - 1024) / SB) * SB,
//   SB = (min(ROWS_PER_STAGE, rows) * row_bytes + 31) / 16 * 16.
inline StagePlan plan_stages(int64_t rows, int64_t row_bytes, int max_rows_per_stage,
                             int max_stages) {
  StagePlan plan;
  plan.rows_per_stage = int(std::min<int64_t>(max_rows_per_stage, rows));
  const int64_t stage_bytes = (plan.rows_per_stage * row_bytes + 31) / 16 * 16;
  const int64_t budget = int64_t(device_facts().max_shared_per_block) - kStaticSharedReserve;
  const int64_t stages = std::min<int64_t>(max_stages, budget / stage_bytes);
  if (stages < 1) return plan;
  plan.stage_bytes = int(stage_bytes);
  plan.stages = int(stages);
  plan.shared_bytes = plan.stages * plan.stage_bytes;
  return plan;
}

// Lets `kernel` use up to max_shared_per_block - kStaticSharedReserve bytes of dynamic shared
// memory (more than 48 KB needs the opt-in). Call once per kernel instantiation.
inline cudaError_t opt_in_stage_memory(const void* kernel) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              device_facts().max_shared_per_block - kStaticSharedReserve);
}

// Blocks of `kernel` that fit on one SM at once, at least 1.
inline int resident_blocks_per_sm(const void* kernel, int threads, int shared_bytes) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes) !=
      cudaSuccess) {
    cudaGetLastError();  // not sticky; do not report it from the launch
    return 1;
  }
  return std::max(blocks, 1);
}

}  // namespace kf_bulk

#endif  // KFORGE_BULK_COPY_CUH_
