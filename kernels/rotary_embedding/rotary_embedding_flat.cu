/* kforge
 * op: rotary_embedding
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC_BYTES = 16 in {8, 16}
 * param: HEADS_PER_THREAD = 4 in {1, 2, 4, 8}
 * param: PERSISTENT = 1 in {0, 1}
 * param: X_EVICT_FIRST = 1 in {0, 1}
 * param: Y_EVICT_FIRST = 1 in {0, 1}
 * param: MIN_BLOCKS = 1 in {1, 2, 4, 6, 8}
 * require: BLOCK_THREADS <= max_threads_per_block
 * require: BLOCK_THREADS * MIN_BLOCKS <= max_threads_per_sm
 * # x bytes a thread holds per item: 128 f32 bytes do not fit the 64 registers of 1024 threads.
 * require: BLOCK_THREADS < 1024 || HEADS_PER_THREAD * VEC_BYTES <= 64 || elem_bytes == 2
 * threads: BLOCK_THREADS
 */
// Rotary embedding, interleaved pairs: (x[2i], x[2i+1]) at position s becomes
// (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i], computed in fp32 as compensated
// differences of products (accurate even where the two products nearly cancel).
//
// Idea: within one head, x is a flat array of seq_len * head_dim elements, and the pair at
// even element e uses table entry e / 2 (cos and sin are [seq_len, head_dim / 2]: the same
// flat order at half the rate, wherever the row boundaries fall). So chunk t of a head
// (chunk_elems elements, 16 bytes at the widest) needs table chunk t (chunk_elems / 2
// entries), at the same index in every head: no position or row arithmetic at all. A work
// item is one chunk index t for HEADS_PER_THREAD consecutive heads: the thread loads the cos
// and sin chunks once (__ldg: the tables are small and every head reuses them, so they stay in
// L2) and issues the HEADS_PER_THREAD x loads back to back, so that many 16-byte loads are in
// flight per thread, then rotates and stores. Consecutive threads take consecutive t, so each
// warp access is one contiguous span of a head (512 bytes at the widest).
//
// The grid is (chunk blocks, head groups). PERSISTENT = 1 launches only the blocks that are
// resident at once (occupancy x SMs, split evenly over the head groups) and each thread
// strides over t, so no block launches or retires mid-kernel and loads keep flowing from one
// item to the next. PERSISTENT = 0 gives each thread one item.
//
// x is read once and y written once: evict-first hints (__ldcs, __stcs) keep them from pushing
// the tables, and anything else worth keeping, out of L2.
//
// Fallbacks, all in this file: when a head (seq_len * head_dim elements) does not split into
// whole chunks of the widest size, or a base is not aligned for it, the host picks the widest
// of VEC_BYTES, VEC_BYTES / 2, ... down to one pair that fits; when x or y is not even
// pair-aligned, element accesses. Every shape runs.
//
// Tunables:
//   BLOCK_THREADS     threads per block. With the other defaults (59 registers in bf16) four
//                     blocks of 256 fit an SM: 1024 threads, each with 64 bytes of x loads in
//                     flight, 64 KB per SM.
//   VEC_BYTES         widest x access; 16 is a full vector load.
//   HEADS_PER_THREAD  heads that share one load of cos and sin, i.e. x loads in flight per
//                     thread.
//   PERSISTENT        1: resident grid, threads stride over the chunks; 0: one item per thread.
//   X_EVICT_FIRST     1: x loaded evict-first (__ldcs): read once, not worth keeping in L2.
//   Y_EVICT_FIRST     1: y stored evict-first (__stcs): not read again here.
//   MIN_BLOCKS        blocks per SM the registers must leave room for (the second argument of
//                     __launch_bounds__): more resident threads, but a tight register cap can
//                     make ptxas spill or issue some loads only after earlier math.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/rotary.cuh"

namespace {

constexpr int kMaxVec = VEC_BYTES / int(sizeof(kf_elem));  // elements of the widest x chunk
static_assert(kMaxVec >= 2, "a chunk holds at least one pair");

using kf::ElemPack;
using kf::load;
using kf::load_pair;
using kf::rotate;
using kf::store;
using kf::store_pair;

// The rotated chunk: kVec elements of x (kVec / 2 pairs) with table chunks of kVec / 2.
template <int kVec>
__device__ __forceinline__ ElemPack<kVec> rotate_chunk(const ElemPack<kVec>& xp,
                                                       const ElemPack<kVec / 2>& cp,
                                                       const ElemPack<kVec / 2>& sp) {
  ElemPack<kVec> yp;
  if constexpr (kVec == 2) {
    const float2 ab = load_pair(xp, 0);
    float out_a, out_b;
    rotate(ab.x, ab.y, kf_to_float(cp.v[0]), kf_to_float(sp.v[0]), out_a, out_b);
    store_pair(yp, 0, out_a, out_b);
  } else {
    // Table entries 2j and 2j + 1 belong to pairs 2j and 2j + 1 of the chunk; like x, the
    // table is widened two entries at a time.
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j) {
      const float2 c = load_pair(cp, j), sn = load_pair(sp, j);
      const float2 ab0 = load_pair(xp, 2 * j), ab1 = load_pair(xp, 2 * j + 1);
      float out_a, out_b;
      rotate(ab0.x, ab0.y, c.x, sn.x, out_a, out_b);
      store_pair(yp, 2 * j, out_a, out_b);
      rotate(ab1.x, ab1.y, c.y, sn.y, out_a, out_b);
      store_pair(yp, 2 * j + 1, out_a, out_b);
    }
  }
  return yp;
}

// Rotates chunk t of kHeads heads, head h at x + h * head_stride (y likewise): one load of the
// cos and sin chunks, then the kHeads x loads back to back, then the rotations and stores.
// kVec: elements per x chunk (whole pairs). kPacked: chunks and table chunks move as single
// aligned accesses; otherwise kVec == 2 and every element moves alone.
template <int kVec, bool kPacked, int kHeads>
__device__ __forceinline__ void rotate_item(const kf_elem* __restrict__ x,
                                            const kf_elem* __restrict__ cos_table,
                                            const kf_elem* __restrict__ sin_table,
                                            kf_elem* __restrict__ y, int64_t head_stride,
                                            uint32_t t) {
  static_assert(kVec % 2 == 0 && (kPacked || kVec == 2), "whole pairs; unpacked moves one");
  using XPack = ElemPack<kVec>;
  using TablePack = ElemPack<kVec / 2>;
  constexpr bool kXEvictFirst = X_EVICT_FIRST != 0;
  constexpr bool kYEvictFirst = Y_EVICT_FIRST != 0;
  const kf_elem* x_item = x + size_t(t) * kVec;
  kf_elem* y_item = y + size_t(t) * kVec;
  if constexpr (kPacked) {
    const TablePack cp = load<false>(reinterpret_cast<const TablePack*>(cos_table) + t);
    const TablePack sp = load<false>(reinterpret_cast<const TablePack*>(sin_table) + t);
    XPack xp[kHeads];
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      xp[h] = load<kXEvictFirst>(reinterpret_cast<const XPack*>(x_item + h * head_stride));
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      store<kYEvictFirst>(reinterpret_cast<XPack*>(y_item + h * head_stride),
                          rotate_chunk<kVec>(xp[h], cp, sp));
    }
  } else {
    const float c = kf_to_float(load<false>(cos_table + t));
    const float sn = kf_to_float(load<false>(sin_table + t));
    float a[kHeads], b[kHeads];
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      a[h] = kf_to_float(load<kXEvictFirst>(x_item + h * head_stride));
      b[h] = kf_to_float(load<kXEvictFirst>(x_item + h * head_stride + 1));
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float out_a, out_b;
      rotate(a[h], b[h], c, sn, out_a, out_b);
      store<kYEvictFirst>(y_item + h * head_stride, kf_from_float<kf_elem>(out_a));
      store<kYEvictFirst>(y_item + h * head_stride + 1, kf_from_float<kf_elem>(out_b));
    }
  }
}

// Launch bounds: registers stay within what MIN_BLOCKS blocks of BLOCK_THREADS may hold
// (65536 / (MIN_BLOCKS * BLOCK_THREADS), at most 255), so every variant can launch that many
// blocks per SM; the explicit minimum keeps ptxas from choosing a lower register target of
// its own and spilling (see kernels/rmsnorm/rmsnorm_rowblock.cu).
//
// Block (bx, by) takes head groups by, by + gridDim.y, ... and in each the chunks
// t = bx * BLOCK_THREADS + threadIdx.x + k * gridDim.x * BLOCK_THREADS < head_chunks.
template <int kVec, bool kPacked>
__global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)
    rotary_embedding_flat(const kf_elem* __restrict__ x,          // x: [batch * heads, S * D]
                          const kf_elem* __restrict__ cos_table,  // cos_table: [S * D / 2]
                          const kf_elem* __restrict__ sin_table,  // sin_table: [S * D / 2]
                          kf_elem* __restrict__ y,                // y: [batch * heads, S * D]
                          int64_t batch_heads, int64_t head_groups,
                          uint32_t head_chunks,   // S * D / kVec: items per head group
                          int64_t head_stride) {  // S * D
  const uint32_t first_t = blockIdx.x * BLOCK_THREADS + threadIdx.x;
  const uint32_t t_stride = gridDim.x * BLOCK_THREADS;
#pragma unroll 1
  for (int64_t group = blockIdx.y; group < head_groups; group += gridDim.y) {
    const int64_t first_head = group * HEADS_PER_THREAD;
    const kf_elem* x_group = x + first_head * head_stride;
    kf_elem* y_group = y + first_head * head_stride;
    const int64_t heads = min(int64_t(HEADS_PER_THREAD), batch_heads - first_head);
    if (heads == HEADS_PER_THREAD) {
#pragma unroll 1
      for (uint32_t t = first_t; t < head_chunks; t += t_stride) {
        rotate_item<kVec, kPacked, HEADS_PER_THREAD>(x_group, cos_table, sin_table, y_group,
                                                     head_stride, t);
      }
    } else {
      // The last group of a batch * heads that HEADS_PER_THREAD does not divide: one head at
      // a time.
#pragma unroll 1
      for (uint32_t t = first_t; t < head_chunks; t += t_stride) {
#pragma unroll 1
        for (int64_t h = 0; h < heads; ++h) {
          rotate_item<kVec, kPacked, 1>(x_group + h * head_stride, cos_table, sin_table,
                                        y_group + h * head_stride, head_stride, t);
        }
      }
    }
  }
}

// Blocks of rotary_embedding_flat<kVec, kPacked> resident on the whole device at once
// (occupancy x SMs), asked once per kernel and device: it does not change while the process
// runs.
template <int kVec, bool kPacked>
int resident_blocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device >= 0 && device < kMaxDevices) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rotary_embedding_flat<kVec, kPacked>,
                                                    BLOCK_THREADS, 0) != cudaSuccess) {
    return 0;
  }
  const int blocks = sms * per_sm;
  if (device >= 0 && device < kMaxDevices) cached[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

template <int kVec, bool kPacked>
int launch(const kf::RotaryCall& p) {
  const auto kernel = rotary_embedding_flat<kVec, kPacked>;
  constexpr int64_t kMaxGridY = 65535;
  const int64_t head_groups = (p.batch_heads + HEADS_PER_THREAD - 1) / HEADS_PER_THREAD;
  const int64_t head_chunks = p.head_elems() / kVec;
  const int64_t chunk_blocks = (head_chunks + BLOCK_THREADS - 1) / BLOCK_THREADS;
  int64_t grid_x = chunk_blocks;
  if constexpr (PERSISTENT != 0) {
    // The resident blocks, split evenly over the head groups. With more groups than
    // resident blocks, every group gets one block (a block still strides over all its
    // chunks), and blocks come in waves.
    const int64_t resident = resident_blocks<kVec, kPacked>();
    if (resident <= 0) return KF_ERR_LAUNCH;
    grid_x = resident / head_groups;
    if (grid_x < 1) grid_x = 1;
    if (grid_x > chunk_blocks) grid_x = chunk_blocks;
  }
  const dim3 grid(unsigned(grid_x), unsigned(head_groups < kMaxGridY ? head_groups : kMaxGridY));
  kernel<<<grid, BLOCK_THREADS, 0, p.stream>>>(p.x, p.cos_table, p.sin_table, p.y, p.batch_heads,
                                               head_groups, uint32_t(head_chunks), p.head_elems());
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

// Launches the widest chunk of kVec elements or fewer that divides a head and that the bases
// are aligned for. A chunk may span two rows: pair (e, e + 1) of a head uses table entry e / 2
// wherever it lies, so only the head (whose start every chunk offset is relative to) must
// split into whole chunks.
template <int kVec>
int launch_widest(const kf::RotaryCall& p) {
  if constexpr (kVec >= 2) {
    constexpr size_t kXBytes = sizeof(ElemPack<kVec>);
    constexpr size_t kTableBytes = sizeof(ElemPack<kVec / 2>);
    if (p.head_elems() % kVec == 0 && kf_is_aligned(p.x, kXBytes) && kf_is_aligned(p.y, kXBytes) &&
        kf_is_aligned(p.cos_table, kTableBytes) && kf_is_aligned(p.sin_table, kTableBytes)) {
      return launch<kVec, true>(p);
    }
    if constexpr (kVec > 2) return launch_widest<kVec / 2>(p);
  }
  return launch<2, false>(p);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  kf::RotaryCall call;
  if (!kf::read_rotary_call(args, call)) return KF_ERR_UNSUPPORTED;
  if (call.empty()) return KF_OK;
  // Offsets within a head are 32-bit.
  if (call.seq_len > INT32_MAX / call.head_dim) return KF_ERR_UNSUPPORTED;
  return launch_widest<kMaxVec>(call);
}
