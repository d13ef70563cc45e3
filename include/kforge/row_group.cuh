// Rows handled by groups of warps inside a block, for the persistent row kernels that stage
// rows in shared memory (kforge/bulk_copy.cuh): a sum or maximum over one group's warps, and
// where a row's whole packs are.
#ifndef KFORGE_ROW_GROUP_CUH_
#define KFORGE_ROW_GROUP_CUH_

#include <cstdint>

#include "kforge/bulk_copy.cuh"
#include "kforge/elem_cuda.cuh"

namespace kf_bulk {

// Butterfly over the lanes of aligned runs of kLanes lanes: every lane combines the same pairs
// (a + b == b + a, max likewise), so all lanes of a run end with bit-identical results.
template <int kLanes, typename Op>
__device__ __forceinline__ float butterfly(float value, Op op) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sums and maxima over the kGroupWarps warps of one group; every thread of the group gets the
// same value. The warps' partials go through shared memory in two alternating slots, so the
// next reduction's writes cannot overtake this one's reads: a thread writes a slot again only
// after the barrier of the reduction in between, which every thread of the group reaches
// after reading.
template <int kGroupWarps>
class GroupReduce {
 public:
  // partials: [groups][2][kGroupWarps] floats in shared memory; barrier 1 + group is this
  // group's own.
  __device__ GroupReduce(float* partials, int group)
      : slots_(partials + group * 2 * kGroupWarps), barrier_(1 + group) {}

  __device__ float sum(float value) { return reduce(value, Add()); }
  __device__ float max(float value) { return reduce(value, Max()); }

 private:
  static constexpr int kWarpSize = 32;
  struct Add {
    __device__ float operator()(float a, float b) const { return a + b; }
  };
  struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  };

  template <typename Op>
  __device__ float reduce(float value, Op op) {
    value = butterfly<kWarpSize>(value, op);
    if constexpr (kGroupWarps > 1) {
      const int lane = threadIdx.x % kWarpSize;
      float* slot = slots_ + parity_ * kGroupWarps;
      if (lane == 0) slot[threadIdx.x / kWarpSize % kGroupWarps] = value;
      named_barrier_sync(barrier_, kGroupWarps * kWarpSize);
      parity_ ^= 1;
      // Every aligned run of kGroupWarps lanes holds all partials.
      value = butterfly<kGroupWarps>(slot[lane % kGroupWarps], op);
    }
    return value;
  }

  float* slots_;
  int barrier_;
  int parity_ = 0;
};

// Where a row's packs are: [0, head) scalar, then `packs` packs of kVec elements starting on
// a pack boundary of y, then the scalar tail [tail_start, n). The head and the tail are
// shorter than kVec <= 32, so a group's thread t handles at most one element of each: head
// element t and tail element tail_start + t.
template <int kVec>
struct RowSplit {
  int head;
  int packs;
  int tail_start;

  __device__ RowSplit(const kf_elem* y_row, int n) {
    constexpr int kPackBytes = kVec * int(sizeof(kf_elem));
    const int misalignment = int(reinterpret_cast<uintptr_t>(y_row) % kPackBytes);
    head = min(n, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
    packs = (n - head) / kVec;
    tail_start = head + packs * kVec;
  }
};

}  // namespace kf_bulk

#endif  // KFORGE_ROW_GROUP_CUH_
