/* kforge
 * op: rotary_embedding_half
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
 * # x bytes a thread holds per item (two chunks per head): at most 128, and at most 64 at
 * # 1024 threads, whose 64 registers hold no more.
 * require: 2 * HEADS_PER_THREAD * VEC_BYTES <= 128
 * require: BLOCK_THREADS < 1024 || 2 * HEADS_PER_THREAD * VEC_BYTES <= 64
 * threads: BLOCK_THREADS
 */
// Rotary embedding, rotate-half pairs (HF LLaMA's): (x[i], x[i + head_dim/2]) at position s
// becomes (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i], computed in fp32 as
// compensated differences of products (accurate even where the two products nearly cancel).
//
// Idea: number the chunk_elems-wide chunks of the first halves of a head's rows
// t = s * half_chunks + j (half_chunks = head_dim / 2 / chunk_elems chunks per half row, 16
// bytes each at the widest). Chunk t pairs x elements [t * chunk_elems + s * half_dim, ...)
// with the same chunk half_dim further, and uses cos and sin chunk t: the tables are
// [seq_len, head_dim / 2], the same order as the first halves. One division (s = t /
// half_chunks) per item places it. A work item is one t for HEADS_PER_THREAD consecutive
// heads: the thread loads the cos and sin chunks once (__ldg: the tables are small and reused
// by every head, so they stay in L2) and issues the 2 * HEADS_PER_THREAD x loads back to back,
// so that many 16-byte loads are in flight per thread, then rotates and stores. Consecutive
// threads take consecutive t, so a warp's loads cover whole half rows, contiguous 128-byte
// spans or more.
//
// The grid is (chunk blocks, head groups). PERSISTENT = 1 launches only the blocks that are
// resident at once (occupancy x SMs, split evenly over the head groups) and each thread
// strides over t, so no block launches or retires mid-kernel and loads keep flowing from one
// item to the next. PERSISTENT = 0 gives each thread one item.
//
// x is read once and y written once: evict-first hints (__ldcs, __stcs) keep them from pushing
// the tables, and anything else worth keeping, out of L2.
//
// Fallbacks, all in this file: when head_dim / 2 is not a multiple of the widest chunk, or a
// base is not aligned for it, the host picks the widest of VEC_BYTES, VEC_BYTES / 2, ... down
// to one element that divides head_dim / 2 and is aligned. Every shape runs.
//
// Tunables:
//   BLOCK_THREADS     threads per block. It also caps registers at 65536 / BLOCK_THREADS, and
//                     ptxas meets a tight cap by issuing the second head's loads only after
//                     the first head's math (at 1024 threads and HEADS_PER_THREAD = 2, say),
//                     which halves the loads in flight.
//   VEC_BYTES         widest access of each half row, and of cos and sin; 16 is a full vector
//                     load.
//   HEADS_PER_THREAD  heads that share one load of cos and sin; each takes two x loads, so
//                     2 * HEADS_PER_THREAD x loads are in flight per thread. The default, 4,
//                     with 256 threads: all 8 loads issued together (116 registers in bf16,
//                     2 blocks per SM), 128 bytes per thread and 64 KB per SM in flight.
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
static_assert(kMaxVec >= 1, "a chunk holds at least one element");

using kf::ElemPack;
using kf::load;
using kf::load_pair;
using kf::rotate;
using kf::store;
using kf::store_pair;

// Rotates chunk t of kHeads heads, head h at x + h * head_stride (y likewise): one load of the
// cos and sin chunks, then the 2 * kHeads x loads back to back, then the rotations and stores.
// half_chunks: chunks per half row; half_dim: elements per half row.
template <int kVec, int kHeads>
__device__ __forceinline__ void rotate_item(const kf_elem* __restrict__ x,
                                            const kf_elem* __restrict__ cos_table,
                                            const kf_elem* __restrict__ sin_table,
                                            kf_elem* __restrict__ y, int64_t head_stride,
                                            uint32_t half_chunks, uint32_t half_dim, uint32_t t) {
  using Pack = ElemPack<kVec>;
  constexpr bool kXEvictFirst = X_EVICT_FIRST != 0;
  constexpr bool kYEvictFirst = Y_EVICT_FIRST != 0;
  // First-half elements of chunk t: row s = t / half_chunks starts at s * 2 * half_dim, and
  // the chunks before it in the row are t * kVec - s * half_dim elements.
  const uint32_t s = t / half_chunks;
  const size_t first = size_t(t) * kVec + size_t(s) * half_dim;  // < S * D < 2^31
  const kf_elem* x_first = x + first;
  kf_elem* y_first = y + first;

  const Pack cp = load<false>(reinterpret_cast<const Pack*>(cos_table) + t);
  const Pack sp = load<false>(reinterpret_cast<const Pack*>(sin_table) + t);
  Pack lo[kHeads], hi[kHeads];  // the chunk of each half row
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const kf_elem* xh = x_first + h * head_stride;
    lo[h] = load<kXEvictFirst>(reinterpret_cast<const Pack*>(xh));
    hi[h] = load<kXEvictFirst>(reinterpret_cast<const Pack*>(xh + half_dim));
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    Pack lo_out, hi_out;
    if constexpr (kVec == 1) {
      float out_a, out_b;
      rotate(kf_to_float(lo[h].v[0]), kf_to_float(hi[h].v[0]), kf_to_float(cp.v[0]),
             kf_to_float(sp.v[0]), out_a, out_b);
      lo_out.v[0] = kf_from_float<kf_elem>(out_a);
      hi_out.v[0] = kf_from_float<kf_elem>(out_b);
    } else {
      // Elements 2j and 2j + 1 of each pack, two at a time.
#pragma unroll
      for (int j = 0; j < kVec / 2; ++j) {
        const float2 a = load_pair(lo[h], j), b = load_pair(hi[h], j);
        const float2 c = load_pair(cp, j), sn = load_pair(sp, j);
        float2 out_a, out_b;
        rotate(a.x, b.x, c.x, sn.x, out_a.x, out_b.x);
        rotate(a.y, b.y, c.y, sn.y, out_a.y, out_b.y);
        store_pair(lo_out, j, out_a.x, out_a.y);
        store_pair(hi_out, j, out_b.x, out_b.y);
      }
    }
    kf_elem* yh = y_first + h * head_stride;
    store<kYEvictFirst>(reinterpret_cast<Pack*>(yh), lo_out);
    store<kYEvictFirst>(reinterpret_cast<Pack*>(yh + half_dim), hi_out);
  }
}

// Launch bounds: registers stay within what MIN_BLOCKS blocks of BLOCK_THREADS may hold
// (65536 / (MIN_BLOCKS * BLOCK_THREADS), at most 255), so every variant can launch that many
// blocks per SM; the explicit minimum keeps ptxas from choosing a lower register target of
// its own and spilling (see kernels/rmsnorm/rmsnorm_rowblock.cu).
//
// kVec: elements per chunk, dividing head_dim / 2; the bases are aligned for it (the host
// checks). Block (bx, by) takes head groups by, by + gridDim.y, ... and in each the chunks
// t = bx * BLOCK_THREADS + threadIdx.x + k * gridDim.x * BLOCK_THREADS < head_chunks.
template <int kVec>
__global__ void __launch_bounds__(BLOCK_THREADS, MIN_BLOCKS)
    rotary_embedding_half_flat(const kf_elem* __restrict__ x,          // x: [batch * heads, S, D]
                               const kf_elem* __restrict__ cos_table,  // cos_table: [S, D / 2]
                               const kf_elem* __restrict__ sin_table,  // sin_table: [S, D / 2]
                               kf_elem* __restrict__ y,                // y: [batch * heads, S, D]
                               int64_t batch_heads, int64_t head_groups,
                               uint32_t head_chunks,   // S * half_chunks: items per head group
                               uint32_t half_chunks,   // D / 2 / kVec
                               int64_t head_stride) {  // S * D
  const uint32_t half_dim = half_chunks * kVec;
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
        rotate_item<kVec, HEADS_PER_THREAD>(x_group, cos_table, sin_table, y_group, head_stride,
                                            half_chunks, half_dim, t);
      }
    } else {
      // The last group of a batch * heads that HEADS_PER_THREAD does not divide: one head at
      // a time.
#pragma unroll 1
      for (uint32_t t = first_t; t < head_chunks; t += t_stride) {
#pragma unroll 1
        for (int64_t h = 0; h < heads; ++h) {
          rotate_item<kVec, 1>(x_group + h * head_stride, cos_table, sin_table,
                               y_group + h * head_stride, head_stride, half_chunks, half_dim, t);
        }
      }
    }
  }
}

// Blocks of rotary_embedding_half_flat<kVec> resident on the whole device at once
// (occupancy x SMs), asked once per kernel and device: it does not change while the process
// runs.
template <int kVec>
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
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rotary_embedding_half_flat<kVec>,
                                                    BLOCK_THREADS, 0) != cudaSuccess) {
    return 0;
  }
  const int blocks = sms * per_sm;
  if (device >= 0 && device < kMaxDevices) cached[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

template <int kVec>
int launch(const kf::RotaryCall& p) {
  const int64_t half_dim = p.head_dim / 2;
  const auto kernel = rotary_embedding_half_flat<kVec>;
  constexpr int64_t kMaxGridY = 65535;
  const int64_t head_groups = (p.batch_heads + HEADS_PER_THREAD - 1) / HEADS_PER_THREAD;
  const int64_t half_chunks = half_dim / kVec;
  const int64_t head_chunks = p.head_elems() / 2 / kVec;
  const int64_t chunk_blocks = (head_chunks + BLOCK_THREADS - 1) / BLOCK_THREADS;
  int64_t grid_x = chunk_blocks;
  if constexpr (PERSISTENT != 0) {
    // The resident blocks, split evenly over the head groups. With more groups than
    // resident blocks, every group gets one block (a block still strides over all its
    // chunks), and blocks come in waves.
    const int64_t resident = resident_blocks<kVec>();
    if (resident <= 0) return KF_ERR_LAUNCH;
    grid_x = resident / head_groups;
    if (grid_x < 1) grid_x = 1;
    if (grid_x > chunk_blocks) grid_x = chunk_blocks;
  }
  const dim3 grid(unsigned(grid_x), unsigned(head_groups < kMaxGridY ? head_groups : kMaxGridY));
  kernel<<<grid, BLOCK_THREADS, 0, p.stream>>>(p.x, p.cos_table, p.sin_table, p.y, p.batch_heads,
                                               head_groups, uint32_t(head_chunks),
                                               uint32_t(half_chunks), p.head_elems());
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

// Launches the widest chunk of kVec elements or fewer that divides head_dim / 2 and that the
// bases are aligned for; one element always fits.
template <int kVec>
int launch_widest(const kf::RotaryCall& p) {
  const int64_t half_dim = p.head_dim / 2;
  constexpr size_t kPackBytes = sizeof(ElemPack<kVec>);
  if constexpr (kVec > 1) {
    if (half_dim % kVec != 0 || !kf_is_aligned(p.x, kPackBytes) ||
        !kf_is_aligned(p.y, kPackBytes) || !kf_is_aligned(p.cos_table, kPackBytes) ||
        !kf_is_aligned(p.sin_table, kPackBytes)) {
      return launch_widest<kVec / 2>(p);
    }
  }
  return launch<kVec>(p);
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
