/* kforge
 * op: rotary_embedding_half
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {128, 256, 512, 1024}
 * param: VEC_BYTES = 16 in {4, 8, 16}
 * param: ITEMS = 2 in {1, 2, 4}
 * param: X_EVICT_FIRST = 1 in {0, 1}
 * param: Y_EVICT_FIRST = 0 in {0, 1}
 * require: BLOCK_THREADS <= max_threads_per_block
 * # A thread holds four packs per item (its x chunk, the partner chunk, cos, sin): ITEMS *
 * # VEC_BYTES registers, plus about 32 of its own, within the 65536 / BLOCK_THREADS it may use.
 * require: (ITEMS * VEC_BYTES + 32) * BLOCK_THREADS <= 65536
 * threads: BLOCK_THREADS
 */
// Rotary embedding, rotate-half pairs (HF LLaMA's): (x[i], x[i + head_dim/2]) at position s
// becomes (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i], computed in fp32 as
// compensated differences of products (accurate even where the two products nearly cancel).
//
// Idea: the output in memory order, one chunk per thread. The other two files give a thread a
// pair of chunks (one from each half of a row) for several heads, so each thread writes two to
// eight places at once, and a block's writes land in as many streams. Here a thread computes
// one chunk of y and nothing else: chunk t of a head is chunk j = t mod (head_dim / chunk) of
// row s = t / (head_dim / chunk). It loads its own x chunk and the partner chunk head_dim / 2
// away (a thread of the same warp loads it too, for its own output: the second load is
// served by L1), and the cos and sin chunk of its position. Consecutive threads write
// consecutive chunks, a block writes one contiguous span, and blocks follow each other
// through memory, so y goes out as one stream, the way a plain elementwise kernel writes.
//
// What it changes, measured on an H100 (bf16, L2 full of dirty lines before each sample): at
// 2x32x1024x128 its best variants (8- and 16-byte chunks) took 16.1-16.3 us, the plateau the
// other two files reach (4-byte chunks: 19-27 us), so the order of the stores is not what
// limits them there; at 1x32x4096x128 it is the fastest of the three (27.5 us against 28.1).
//
// Each thread takes ITEMS chunks, BLOCK_THREADS apart (so a warp's accesses stay contiguous),
// and issues all their loads before any math. Grid: (blocks per head, heads), heads strided
// past the grid's y limit.
//
// Fallbacks, all in this file: when head_dim / 2 is not a multiple of the widest chunk, or a
// base is not aligned for it, the host picks the widest of VEC_BYTES, VEC_BYTES / 2, ... down
// to one element that divides head_dim / 2 and is aligned. Every shape runs.
//
// Tunables:
//   BLOCK_THREADS  threads per block.
//   VEC_BYTES      widest access of x, y, cos and sin; 16 is a full vector load.
//   ITEMS          chunks per thread, all loaded before the first is computed.
//   X_EVICT_FIRST  1: x loaded evict-first (__ldcs): read twice within a warp, then never.
//   Y_EVICT_FIRST  1: y stored evict-first (__stcs); 0: plain stores.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/rotary.cuh"

namespace {

constexpr int kMaxVec = VEC_BYTES / int(sizeof(kf_elem));  // elements of the widest chunk
static_assert(kMaxVec >= 1, "a chunk holds at least one element");

using kf::ElemPack;
using kf::load;
using kf::load_pair;
using kf::rotate;
using kf::store;
using kf::store_pair;

// The output chunk of one thread: y = own * c - partner * s in a row's first half,
// partner * s + own * c in its second (rotate()'s two results, with a and b swapped).
template <int kVec>
__device__ __forceinline__ ElemPack<kVec> rotate_chunk(const ElemPack<kVec>& own,
                                                       const ElemPack<kVec>& partner,
                                                       const ElemPack<kVec>& cp,
                                                       const ElemPack<kVec>& sp, bool first_half) {
  ElemPack<kVec> out;
  if constexpr (kVec == 1) {
    const float o = kf_to_float(own.v[0]), p = kf_to_float(partner.v[0]);
    float out_a, out_b;
    rotate(first_half ? o : p, first_half ? p : o, kf_to_float(cp.v[0]), kf_to_float(sp.v[0]),
           out_a, out_b);
    out.v[0] = kf_from_float<kf_elem>(first_half ? out_a : out_b);
  } else {
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      const float2 o = load_pair(own, j), p = load_pair(partner, j);
      const float2 a = first_half ? o : p, b = first_half ? p : o;
      const float2 c = load_pair(cp, j), sn = load_pair(sp, j);
      float2 out_a, out_b;
      rotate(a.x, b.x, c.x, sn.x, out_a.x, out_b.x);
      rotate(a.y, b.y, c.y, sn.y, out_a.y, out_b.y);
      if (first_half) {
        store_pair(out, j, out_a.x, out_a.y);
      } else {
        store_pair(out, j, out_b.x, out_b.y);
      }
    }
  }
  return out;
}

// kVec: elements per chunk, dividing head_dim / 2; the bases are aligned for it (the host
// checks). Block (bx, by) takes heads by, by + gridDim.y, ... and in each the chunks
// bx * BLOCK_THREADS * ITEMS + k * BLOCK_THREADS + threadIdx.x, k < ITEMS.
template <int kVec>
__global__ void __launch_bounds__(BLOCK_THREADS)
    rotary_embedding_half_pointwise(const kf_elem* __restrict__ x,  // x: [batch * heads, S, D]
                                    const kf_elem* __restrict__ cos_table,  // cos_table: [S, D / 2]
                                    const kf_elem* __restrict__ sin_table,  // sin_table: [S, D / 2]
                                    kf_elem* __restrict__ y,  // y: [batch * heads, S, D]
                                    int64_t batch_heads,
                                    uint32_t head_chunks,  // S * D / kVec
                                    uint32_t row_chunks,   // D / kVec
                                    int64_t head_elems) {  // S * D
  using Pack = ElemPack<kVec>;
  constexpr bool kXEvictFirst = X_EVICT_FIRST != 0;
  constexpr bool kYEvictFirst = Y_EVICT_FIRST != 0;
  const uint32_t half_chunks = row_chunks / 2;
  const uint32_t first_t = blockIdx.x * (BLOCK_THREADS * ITEMS) + threadIdx.x;
  const Pack* cos_packs = reinterpret_cast<const Pack*>(cos_table);  // [S, half_chunks]
  const Pack* sin_packs = reinterpret_cast<const Pack*>(sin_table);

#pragma unroll 1
  for (int64_t head = blockIdx.y; head < batch_heads; head += gridDim.y) {
    const Pack* xh = reinterpret_cast<const Pack*>(x + head * head_elems);
    Pack* yh = reinterpret_cast<Pack*>(y + head * head_elems);
    Pack own[ITEMS], partner[ITEMS], cp[ITEMS], sp[ITEMS];
    bool first_half[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const uint32_t t = first_t + k * BLOCK_THREADS;
      if (t < head_chunks) {
        const uint32_t s = t / row_chunks;
        const uint32_t j = t - s * row_chunks;  // chunk within the row
        first_half[k] = j < half_chunks;
        const uint32_t i = first_half[k] ? j : j - half_chunks;  // chunk within its half
        own[k] = load<kXEvictFirst>(xh + t);
        partner[k] = load<kXEvictFirst>(xh + (first_half[k] ? t + half_chunks : t - half_chunks));
        cp[k] = load<false>(cos_packs + s * half_chunks + i);
        sp[k] = load<false>(sin_packs + s * half_chunks + i);
      }
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const uint32_t t = first_t + k * BLOCK_THREADS;
      if (t < head_chunks) {
        store<kYEvictFirst>(yh + t,
                            rotate_chunk<kVec>(own[k], partner[k], cp[k], sp[k], first_half[k]));
      }
    }
  }
}

template <int kVec>
int launch(const kf::RotaryCall& p) {
  constexpr int64_t kMaxGridY = 65535;
  constexpr int64_t kChunksPerBlock = int64_t(BLOCK_THREADS) * ITEMS;
  const int64_t head_chunks = p.head_elems() / kVec;
  const int64_t blocks_per_head = (head_chunks + kChunksPerBlock - 1) / kChunksPerBlock;
  const dim3 grid(unsigned(blocks_per_head),
                  unsigned(p.batch_heads < kMaxGridY ? p.batch_heads : kMaxGridY));
  rotary_embedding_half_pointwise<kVec><<<grid, BLOCK_THREADS, 0, p.stream>>>(
      p.x, p.cos_table, p.sin_table, p.y, p.batch_heads, uint32_t(head_chunks),
      uint32_t(p.head_dim / kVec), p.head_elems());
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

// Launches the widest chunk of kVec elements or fewer that divides head_dim / 2 and that the
// bases are aligned for; one element always fits.
template <int kVec>
int launch_widest(const kf::RotaryCall& p) {
  constexpr size_t kPackBytes = sizeof(ElemPack<kVec>);
  if constexpr (kVec > 1) {
    if ((p.head_dim / 2) % kVec != 0 || !kf_is_aligned(p.x, kPackBytes) ||
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
  // Chunk indices within a head are 32-bit, and so is the grid's x.
  if (call.seq_len > INT32_MAX / call.head_dim) return KF_ERR_UNSUPPORTED;
  return launch_widest<kMaxVec>(call);
}
