/* kforge
 * op: rotary_embedding_half
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {1, 2, 4, 8}
 * param: HEADS_PER_THREAD = 2 in {1, 2, 4, 8}
 * require: VEC * elem_bytes <= 16
 * # x bytes a thread holds per round: more spill at 64 registers.
 * require: 2 * HEADS_PER_THREAD * VEC * elem_bytes <= 64
 * require: BLOCK_THREADS <= max_threads_per_block
 */
// Rotary embedding, rotate-half pairs (HF LLaMA's): (x[i], x[i + head_dim/2]) at position s
// becomes (a cos - b sin, a sin + b cos) with cos[s, i], sin[s, i], computed in fp32 as
// compensated differences of products (accurate even where the two products nearly cancel).
//
// Idea: rows of head_dim elements are short (64, 128), so a block covers many of them. It is
// a 2-D block: threadIdx.x walks the VEC-pair chunks of one row (a vector load of VEC
// elements from each half of the row, and VEC elements from each of cos and sin),
// threadIdx.y picks the position s. The grid's x covers positions, its y covers
// (batch * heads). A thread loads its cos and sin chunk once and applies it to
// HEADS_PER_THREAD consecutive heads at the same position, issuing their loads back to back,
// so the tables are read once per HEADS_PER_THREAD heads. Consecutive threads touch
// consecutive chunks of each half, and consecutive threadIdx.y rows are consecutive
// positions, adjacent in memory, so a warp reads contiguous spans.
//
// When head_dim / 2 is not a multiple of VEC, or a base is not aligned for the vector
// accesses, the kernel falls back to one pair per thread with element accesses, which fits
// any shape.
//
// Tunables:
//   BLOCK_THREADS     threads per block (split into chunks x positions at launch).
//   VEC               pairs per thread, i.e. elements per vector access of each half
//                     (VEC * elem_bytes <= 16).
//   HEADS_PER_THREAD  heads that share one load of cos and sin.
#include <cstdint>
#include <type_traits>

#include "kforge/elem_cuda.cuh"
#include "kforge/rotary.cuh"

namespace {

// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
constexpr int kMaxRegisters = 64;

static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");

using kf::ElemPack;
using kf::load_pair;
using kf::rotate;
using kf::store_pair;

// Each thread rotates kPairs consecutive pairs of a row: chunks [kPairs] of the row's first
// half, of its second half, of cos and of sin. kPairs > 1 needs half_dim % kPairs == 0 and
// aligned bases (the host checks); kPairs == 1 fits any shape.
template <int kPairs>
__global__ void __maxnreg__(kMaxRegisters) rotary_embedding_half_rowblock(
    const kf_elem* __restrict__ x,          // x: [batch * heads, seq_len, dim]
    const kf_elem* __restrict__ cos_table,  // cos_table: [seq_len, dim / 2]
    const kf_elem* __restrict__ sin_table,  // sin_table: [seq_len, dim / 2]
    kf_elem* __restrict__ y,                // y: [batch * heads, seq_len, dim]
    int64_t batch_heads, int seq_len, int half_dim) {
  using Pack = ElemPack<kPairs>;

  const int64_t s = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;  // position
  if (s >= seq_len) return;
  const int chunks = half_dim / kPairs;  // exact: the host checks
  const int64_t dim = 2 * int64_t(half_dim);
  const int64_t head_stride = int64_t(seq_len) * dim;  // x offset from one head to the next

  // The loads of one round are already batched across heads; unrolling these loops as well
  // would multiply the registers held.
#pragma unroll 1
  for (int chunk = threadIdx.x; chunk < chunks; chunk += blockDim.x) {
    const int64_t table_offset = s * half_dim + int64_t(chunk) * kPairs;
    // Kept in the storage type (half the registers of fp32 for f16 and bf16) and widened
    // where used.
    const Pack cp = *reinterpret_cast<const Pack*>(cos_table + table_offset);
    const Pack sp = *reinterpret_cast<const Pack*>(sin_table + table_offset);

    // Heads bh0, bh0 + 1, ... share this position's cos and sin. The grid's y may be capped
    // below batch * heads / HEADS_PER_THREAD, so it strides.
#pragma unroll 1
    for (int64_t bh0 = int64_t(blockIdx.y) * HEADS_PER_THREAD; bh0 < batch_heads;
         bh0 += int64_t(gridDim.y) * HEADS_PER_THREAD) {
      // Offset of this chunk's first-half elements in head bh0; the second half's are
      // half_dim further, head bh0 + h's are h * head_stride further.
      const int64_t offset = (bh0 * seq_len + s) * dim + int64_t(chunk) * kPairs;
      Pack first[HEADS_PER_THREAD], second[HEADS_PER_THREAD];
#pragma unroll
      for (int h = 0; h < HEADS_PER_THREAD; ++h) {
        if (bh0 + h < batch_heads) {
          first[h] = *reinterpret_cast<const Pack*>(x + offset + h * head_stride);
          second[h] = *reinterpret_cast<const Pack*>(x + offset + h * head_stride + half_dim);
        }
      }
#pragma unroll
      for (int h = 0; h < HEADS_PER_THREAD; ++h) {
        if (bh0 + h < batch_heads) {
          Pack first_out, second_out;
          if constexpr (kPairs == 1) {
            float out_a, out_b;
            rotate(kf_to_float(first[h].v[0]), kf_to_float(second[h].v[0]), kf_to_float(cp.v[0]),
                   kf_to_float(sp.v[0]), out_a, out_b);
            first_out.v[0] = kf_from_float<kf_elem>(out_a);
            second_out.v[0] = kf_from_float<kf_elem>(out_b);
          } else {
#pragma unroll
            for (int j = 0; j < kPairs / 2; ++j) {
              const float2 a = load_pair(first[h], j), b = load_pair(second[h], j);
              const float2 c = load_pair(cp, j), sn = load_pair(sp, j);
              float2 out_a, out_b;
              rotate(a.x, b.x, c.x, sn.x, out_a.x, out_b.x);
              rotate(a.y, b.y, c.y, sn.y, out_a.y, out_b.y);
              store_pair(first_out, j, out_a.x, out_a.y);
              store_pair(second_out, j, out_b.x, out_b.y);
            }
          }
          *reinterpret_cast<Pack*>(y + offset + h * head_stride) = first_out;
          *reinterpret_cast<Pack*>(y + offset + h * head_stride + half_dim) = second_out;
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

template <int kPairs>
int launch(const kf_elem* x, const kf_elem* cos_table, const kf_elem* sin_table, kf_elem* y,
           int64_t batch_heads, int seq_len, int half_dim, cudaStream_t stream) {
  const dim3 block = block_shape(half_dim / kPairs);
  const int64_t position_blocks = (seq_len + int64_t(block.y) - 1) / block.y;
  const int64_t head_blocks = (batch_heads + HEADS_PER_THREAD - 1) / HEADS_PER_THREAD;
  constexpr int64_t kMaxGridY = 65535;
  const dim3 grid(unsigned(position_blocks),
                  unsigned(head_blocks < kMaxGridY ? head_blocks : kMaxGridY));
  rotary_embedding_half_rowblock<kPairs>
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

  // Vector accesses need every half row to start on a chunk boundary (half_dim % VEC == 0)
  // and aligned bases.
  constexpr size_t kPackBytes = sizeof(ElemPack<VEC>);
  const bool packed = half_dim % VEC == 0 && kf_is_aligned(call.x, kPackBytes) &&
                      kf_is_aligned(call.y, kPackBytes) &&
                      kf_is_aligned(call.cos_table, kPackBytes) &&
                      kf_is_aligned(call.sin_table, kPackBytes);
  if (packed) {
    return launch<VEC>(call.x, call.cos_table, call.sin_table, call.y, call.batch_heads,
                       int(seq_len), half_dim, call.stream);
  }
  return launch<1>(call.x, call.cos_table, call.sin_table, call.y, call.batch_heads, int(seq_len),
                   half_dim, call.stream);
}
