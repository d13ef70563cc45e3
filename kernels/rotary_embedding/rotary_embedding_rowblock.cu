/* kforge
 * op: rotary_embedding
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {2, 4, 8}
 * param: HEADS_PER_THREAD = 4 in {1, 2, 4}
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 */
// Rotary embedding, interleaved pairs: (x[2i], x[2i+1]) at position s becomes
// (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i], computed in fp32 as compensated
// differences of products (accurate even where the two products nearly cancel).
//
// Idea: rows of head_dim elements are short (64, 128), so a block covers many of them. It is
// a 2-D block: threadIdx.x walks the VEC-element chunks of one row (VEC / 2 pairs each, one
// vector load of x and one of VEC / 2 elements from each of cos and sin), threadIdx.y picks
// the position s. The grid's x covers positions, its y covers (batch * heads). A thread loads
// its cos and sin chunk once and applies it to HEADS_PER_THREAD consecutive heads at the same
// position, issuing their loads back to back, so the tables are read once per
// HEADS_PER_THREAD heads. Consecutive threads touch consecutive vector chunks, and
// consecutive threadIdx.y rows are consecutive positions, adjacent in memory, so a warp reads
// one contiguous span.
//
// When head_dim is not a multiple of VEC, or a base is not aligned for the vector accesses,
// the kernel falls back to one pair per thread with scalar accesses, which fits any shape.
//
// Tunables:
//   BLOCK_THREADS     threads per block (split into chunks x positions at launch).
//   VEC               elements of x per vector access (VEC * elem_bytes <= 16).
//   HEADS_PER_THREAD  heads that share one load of cos and sin.
#include <cstdint>
#include <type_traits>

#include "kforge/elem_cuda.cuh"
#include "kforge/rotary.cuh"

namespace {

// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
constexpr int kMaxRegisters = 64;

static_assert(VEC % 2 == 0, "an x chunk holds whole pairs");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");

using kf::ElemPack;
using kf::load_pair;
using kf::rotate;
using kf::store_pair;

// Each thread rotates kPairs consecutive pairs of a row: x chunk [2 * kPairs], cos and sin
// chunks [kPairs]. kPacked: vector accesses (half_dim % kPairs == 0 and aligned bases);
// otherwise kPairs == 1 with element accesses.
template <int kPairs, bool kPacked>
__global__ void __maxnreg__(kMaxRegisters) rotary_embedding_rowblock(
    const kf_elem* __restrict__ x,          // x: [batch * heads, seq_len, dim]
    const kf_elem* __restrict__ cos_table,  // cos_table: [seq_len, dim / 2]
    const kf_elem* __restrict__ sin_table,  // sin_table: [seq_len, dim / 2]
    kf_elem* __restrict__ y,                // y: [batch * heads, seq_len, dim]
    int64_t batch_heads, int seq_len, int half_dim) {
  static_assert(kPacked || kPairs == 1, "element accesses move one pair");
  using XPack = ElemPack<2 * kPairs>;
  using TablePack = ElemPack<kPairs>;

  const int64_t s = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;  // position
  if (s >= seq_len) return;
  const int chunks = half_dim / kPairs;  // exact: the host checks
  const int64_t dim = 2 * int64_t(half_dim);

  // The loads of one round are already batched across heads; unrolling these loops as well
  // would multiply the registers held.
#pragma unroll 1
  for (int chunk = threadIdx.x; chunk < chunks; chunk += blockDim.x) {
    const int64_t table_offset = s * half_dim + int64_t(chunk) * kPairs;
    // Kept in the storage type (half the registers of fp32 for f16 and bf16) and widened
    // where used.
    TablePack cp, sp;
    if constexpr (kPacked) {
      cp = *reinterpret_cast<const TablePack*>(cos_table + table_offset);
      sp = *reinterpret_cast<const TablePack*>(sin_table + table_offset);
    } else {
      cp.v[0] = cos_table[table_offset];
      sp.v[0] = sin_table[table_offset];
    }

    // Heads bh0, bh0 + 1, ... share this position's cos and sin. The grid's y may be capped
    // below batch * heads / HEADS_PER_THREAD, so it strides.
#pragma unroll 1
    for (int64_t bh0 = int64_t(blockIdx.y) * HEADS_PER_THREAD; bh0 < batch_heads;
         bh0 += int64_t(gridDim.y) * HEADS_PER_THREAD) {
      // The x offset of this chunk in head bh0; head bh0 + h is h * seq_len * dim further.
      const int64_t offset = (bh0 * seq_len + s) * dim + int64_t(chunk) * 2 * kPairs;
      const int64_t head_stride = int64_t(seq_len) * dim;
      if constexpr (kPacked) {
        XPack xp[HEADS_PER_THREAD];
#pragma unroll
        for (int h = 0; h < HEADS_PER_THREAD; ++h) {
          if (bh0 + h < batch_heads) {
            xp[h] = *reinterpret_cast<const XPack*>(x + offset + h * head_stride);
          }
        }
#pragma unroll
        for (int h = 0; h < HEADS_PER_THREAD; ++h) {
          if (bh0 + h < batch_heads) {
            XPack yp;
            // Pair k is elements 2k and 2k + 1 of the x pack; its cos and sin are element k of
            // the table packs, taken two at a time when there are two.
            if constexpr (kPairs == 1) {
              const float2 ab = load_pair(xp[h], 0);
              float out_a, out_b;
              rotate(ab.x, ab.y, kf_to_float(cp.v[0]), kf_to_float(sp.v[0]), out_a, out_b);
              store_pair(yp, 0, out_a, out_b);
            } else {
#pragma unroll
              for (int j = 0; j < kPairs / 2; ++j) {
                const float2 c = load_pair(cp, j), sn = load_pair(sp, j);
                const float2 ab0 = load_pair(xp[h], 2 * j), ab1 = load_pair(xp[h], 2 * j + 1);
                float out_a, out_b;
                rotate(ab0.x, ab0.y, c.x, sn.x, out_a, out_b);
                store_pair(yp, 2 * j, out_a, out_b);
                rotate(ab1.x, ab1.y, c.y, sn.y, out_a, out_b);
                store_pair(yp, 2 * j + 1, out_a, out_b);
              }
            }
            *reinterpret_cast<XPack*>(y + offset + h * head_stride) = yp;
          }
        }
      } else {
#pragma unroll
        for (int h = 0; h < HEADS_PER_THREAD; ++h) {
          if (bh0 + h < batch_heads) {
            const int64_t i = offset + h * head_stride;
            const float a = kf_to_float(x[i]);
            const float b = kf_to_float(x[i + 1]);
            const float c = kf_to_float(cp.v[0]);
            const float sn = kf_to_float(sp.v[0]);
            float out_a, out_b;
            rotate(a, b, c, sn, out_a, out_b);
            y[i] = kf_from_float<kf_elem>(out_a);
            y[i + 1] = kf_from_float<kf_elem>(out_b);
          }
        }
      }
    }
  }
}

// Block shape for rows of `chunks` chunks: x = the smallest power of two >= chunks, up to
// the whole block; y = positions per block.
dim3 block_shape(int chunks) {
  int x = 1;
  while (x < chunks && x < BLOCK_THREADS)
    x *= 2;
  return dim3(unsigned(x), unsigned(BLOCK_THREADS / x));
}

template <int kPairs, bool kPacked>
int launch(const kf_elem* x, const kf_elem* cos_table, const kf_elem* sin_table, kf_elem* y,
           int64_t batch_heads, int seq_len, int half_dim, cudaStream_t stream) {
  const dim3 block = block_shape(half_dim / kPairs);
  const int64_t position_blocks = (seq_len + int64_t(block.y) - 1) / block.y;
  const int64_t head_blocks = (batch_heads + HEADS_PER_THREAD - 1) / HEADS_PER_THREAD;
  constexpr int64_t kMaxGridY = 65535;
  const dim3 grid(unsigned(position_blocks),
                  unsigned(head_blocks < kMaxGridY ? head_blocks : kMaxGridY));
  rotary_embedding_rowblock<kPairs, kPacked>
      <<<grid, block, 0, stream>>>(x, cos_table, sin_table, y, batch_heads, seq_len, half_dim);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  kf::RotaryCall call;
  if (!kf::read_rotary_call(args, call)) return KF_ERR_UNSUPPORTED;
  if (call.empty()) return KF_OK;
  const int64_t seq_len = call.seq_len;
  const int64_t head_dim = call.head_dim;
  if (seq_len > INT32_MAX || head_dim > INT32_MAX) return KF_ERR_UNSUPPORTED;
  const int half_dim = int(head_dim / 2);

  // Vector accesses need every row to start on a chunk boundary (half_dim % pairs == 0) and
  // aligned bases.
  constexpr int kPairs = VEC / 2;
  constexpr size_t kXPackBytes = sizeof(ElemPack<VEC>);
  constexpr size_t kTablePackBytes = sizeof(ElemPack<kPairs>);
  const bool packed = half_dim % kPairs == 0 && kf_is_aligned(call.x, kXPackBytes) &&
                      kf_is_aligned(call.y, kXPackBytes) &&
                      kf_is_aligned(call.cos_table, kTablePackBytes) &&
                      kf_is_aligned(call.sin_table, kTablePackBytes);
  if (packed) {
    return launch<kPairs, true>(call.x, call.cos_table, call.sin_table, call.y, call.batch_heads,
                                int(seq_len), half_dim, call.stream);
  }
  return launch<1, false>(call.x, call.cos_table, call.sin_table, call.y, call.batch_heads,
                          int(seq_len), half_dim, call.stream);
}
