/* kforge
 * op: flash_attention
 * backend: cuda
 * dtypes: f16, bf16
 * param: BLOCK_Q = 32 in {16, 32, 64, 128}
 * param: BLOCK_KV = 32 in {16, 32, 64}
 * param: THREADS_PER_ROW = 4 in {2, 4, 8}
 * derive: BLOCK_THREADS = BLOCK_Q * THREADS_PER_ROW
 * require: BLOCK_THREADS % 32 == 0 && BLOCK_THREADS <= max_threads_per_block
 * # registers at head_dim 128, roughly: q and o slices (128 / THREADS_PER_ROW each), the
 * # tile's scores and 64 more. Past the limits below, ptxas (nvcc 13.0) spills.
 * derive: REGS_ESTIMATE = 2 * 128 / THREADS_PER_ROW + BLOCK_KV + 64
 * require: REGS_ESTIMATE <= 208 && REGS_ESTIMATE * BLOCK_THREADS <= regs_per_block
 * # K and V tiles in fp32, sized for the largest head_dim (128)
 * shared_bytes: 2 * BLOCK_KV * 128 * 4
 */
// Flash attention forward on the CUDA cores, one pass over the keys with an online softmax.
//
// Idea: a block takes BLOCK_Q query rows of one (batch, head) (reading the key/value head its
// query head maps to: head / (heads / kv_heads) under grouped-query attention); THREADS_PER_ROW
// consecutive lanes share a row, each holding a slice of the row's q and of its output accumulator
// o in registers (fp32). The block walks the keys in tiles of BLOCK_KV rows: K and V tiles are
// converted to fp32 in shared memory, then for each key a lane computes a partial dot product
// over its slice, and a butterfly shuffle across the row's lanes completes it (every lane gets
// the same bits). The softmax runs online in fp32: with m the running maximum of the scaled
// scores and l the running sum of exp(score - m),
//   m' = max(m, tile max),  l = l * exp(m - m') + sum exp(s - m'),  o = o * exp(m - m') + ...,
// and at the end O = o / l. Scores are scaled by sm_scale * log2(e) so that exp2f applies.
//
// Stability: m starts at -inf. Every score is exponentiated only after the running maximum is
// subtracted, so huge scores (|q|, |k| ~ 1e13, dots ~ 1e29: still finite in fp32) give
// exp2f(<= 0). When every key seen so far is masked (m' = -inf) the reference point is 0
// instead, so that masked scores give exp2f(-inf) = 0 rather than exp2f(-inf - -inf) = NaN.
// A valid row always sees key 0 in its first tile, so l >= 1 at the end.
//
// Causal (keys j <= i): a block stops after the tile holding its last row's diagonal, and
// blocks are launched last-rows-first because those have the most keys.
//
// Edges: query rows past seq_len compute on zeros and are not written; keys past seq_len
// are masked (and their K and V rows read as zeros). head_dim may be anything up to 128: the
// kernel is instantiated for 64 and 128 and pads q, K and V with zeros to that width.
//
// Tunables:
//   BLOCK_Q          query rows per block (the block has BLOCK_Q * THREADS_PER_ROW threads).
//   BLOCK_KV         keys per shared-memory tile; also the number of scores each thread holds
//                    in registers.
//   THREADS_PER_ROW  lanes sharing a query row: more lanes mean fewer registers per thread
//                    and more shuffles per score.
#include <cmath>
#include <cstdint>

#include "flash_attention_common.cuh"
#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kThreads = BLOCK_Q * THREADS_PER_ROW;
constexpr int kMaxHeadDim = 128;

static_assert(32 % THREADS_PER_ROW == 0, "a row's lanes lie within one warp");
static_assert(kThreads % 32 == 0, "whole warps: the shuffles use a full mask");

// Four consecutive elements, aligned so that one 8-byte load moves them (f16/bf16).
struct alignas(4 * sizeof(kf_elem)) ElemPack4 {
  kf_elem v[4];
};

// tile[r][d] = src[kv0 + r][d] for keys below seq_len and d < head_dim, else 0.
// tile: [BLOCK_KV][kDim] fp32 in shared memory; src: [seq_len, head_dim] of this head.
// packed: head_dim == kDim and src is 8-byte aligned, so rows can be read in ElemPack4s.
template <int kDim>
__device__ __forceinline__ void load_kv_tile(float* __restrict__ tile,
                                             const kf_elem* __restrict__ src, int kv0, int seq_len,
                                             int head_dim, bool packed) {
  if (packed) {
    constexpr int kPacksPerRow = kDim / 4;
    for (int p = int(threadIdx.x); p < BLOCK_KV * kPacksPerRow; p += kThreads) {
      const int key = kv0 + p / kPacksPerRow;
      const int d = p % kPacksPerRow * 4;
      float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (key < seq_len) {
        const ElemPack4 e = *reinterpret_cast<const ElemPack4*>(src + int64_t(key) * kDim + d);
        f = make_float4(kf_to_float(e.v[0]), kf_to_float(e.v[1]), kf_to_float(e.v[2]),
                        kf_to_float(e.v[3]));
      }
      // Consecutive threads store consecutive float4s: no bank conflicts.
      reinterpret_cast<float4*>(tile)[p] = f;
    }
  } else {
    for (int e = int(threadIdx.x); e < BLOCK_KV * kDim; e += kThreads) {
      const int key = kv0 + e / kDim;
      const int d = e % kDim;
      tile[e] =
          key < seq_len && d < head_dim ? kf_to_float(src[int64_t(key) * head_dim + d]) : 0.0f;
    }
  }
}

// kDim: head_dim rounded up to 64 or 128. A lane owns kSlice = kDim / THREADS_PER_ROW
// dimensions of its row, in float4 chunks: chunk c covers d = c * 4 * THREADS_PER_ROW +
// 4 * lane_in_row + {0, 1, 2, 3}, so the lanes of a row read one contiguous stretch of a
// K or V row from shared memory (and all rows of a warp read the same stretch: a broadcast).
template <int kDim>
__global__ void __launch_bounds__(kThreads)
    flash_attention_tiled(const kf_elem* __restrict__ q,  // q: [batch * heads, seq_len, head_dim]
                          const kf_elem* __restrict__ k,  // k: [batch * kv_heads, seq_len, ...]
                          const kf_elem* __restrict__ v,  // v: like k
                          kf_elem* __restrict__ o,        // o: like q
                          int seq_len, int head_dim, int group, float scale_log2, bool causal,
                          bool packed) {
  constexpr int kChunkStride = 4 * THREADS_PER_ROW;
  constexpr int kChunks = kDim / kChunkStride;
  constexpr int kSlice = 4 * kChunks;
  static_assert(kDim % kChunkStride == 0, "a row's lanes split head_dim in float4 chunks");

  extern __shared__ float4 kv_smem[];                 // 16-byte aligned
  float* k_tile = reinterpret_cast<float*>(kv_smem);  // k_tile: [BLOCK_KV][kDim]
  float* v_tile = k_tile + BLOCK_KV * kDim;           // v_tile: [BLOCK_KV][kDim]

  const int lane_in_row = int(threadIdx.x) % THREADS_PER_ROW;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * BLOCK_Q;  // last rows first
  const int row = q0 + int(threadIdx.x) / THREADS_PER_ROW;
  const bool has_row = row < seq_len;
  const int64_t head_offset = int64_t(blockIdx.y) * seq_len * head_dim;
  // Grouped-query attention: `group` consecutive query heads share one key/value head.
  const int64_t kv_offset = int64_t(blockIdx.y) / group * seq_len * head_dim;
  q += head_offset;
  k += kv_offset;
  v += kv_offset;
  o += head_offset;

  // This lane's slice of its q row (zero past head_dim or seq_len) and of the accumulator.
  float q_slice[kSlice];
  float o_acc[kSlice];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int d = c * kChunkStride + 4 * lane_in_row + i;
      q_slice[4 * c + i] =
          has_row && d < head_dim ? kf_to_float(q[int64_t(row) * head_dim + d]) : 0.0f;
      o_acc[4 * c + i] = 0.0f;
    }
  }
  float row_max = -INFINITY;  // running max of the scaled scores (log2 units)
  float row_sum = 0.0f;       // running sum of exp2(score - row_max)

  // Causal: no row of this block needs keys past its last row.
  const int kv_end = causal ? min(seq_len, q0 + BLOCK_Q) : seq_len;
  for (int kv0 = 0; kv0 < kv_end; kv0 += BLOCK_KV) {
    __syncthreads();  // every thread is done with the previous tiles
    load_kv_tile<kDim>(k_tile, k, kv0, seq_len, head_dim, packed);
    load_kv_tile<kDim>(v_tile, v, kv0, seq_len, head_dim, packed);
    __syncthreads();

    // Scores of this tile, scaled to log2 units; masked keys are -inf.
    float s[BLOCK_KV];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < BLOCK_KV; ++j) {
      const float* k_row = k_tile + j * kDim + 4 * lane_in_row;
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 kc = *reinterpret_cast<const float4*>(k_row + c * kChunkStride);
        dot = fmaf(q_slice[4 * c + 0], kc.x, dot);
        dot = fmaf(q_slice[4 * c + 1], kc.y, dot);
        dot = fmaf(q_slice[4 * c + 2], kc.z, dot);
        dot = fmaf(q_slice[4 * c + 3], kc.w, dot);
      }
      // Butterfly over the row's lanes: each lane adds the same pairs, so all get equal bits.
#pragma unroll
      for (int offset = THREADS_PER_ROW / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      const int key = kv0 + j;
      const bool visible = key < seq_len && (!causal || key <= row);
      s[j] = visible ? dot * scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }

    const float new_max = fmaxf(row_max, tile_max);
    // Reference point for the exponentials; 0 while every key so far is masked.
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    const float rescale = exp2f(row_max - base);  // 0 on the first tile (row_max = -inf)
    row_max = new_max;
    row_sum *= rescale;
#pragma unroll
    for (int i = 0; i < kSlice; ++i) {
      o_acc[i] *= rescale;
    }
#pragma unroll
    for (int j = 0; j < BLOCK_KV; ++j) {
      const float p = exp2f(s[j] - base);
      row_sum += p;
      const float* v_row = v_tile + j * kDim + 4 * lane_in_row;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 vc = *reinterpret_cast<const float4*>(v_row + c * kChunkStride);
        o_acc[4 * c + 0] = fmaf(p, vc.x, o_acc[4 * c + 0]);
        o_acc[4 * c + 1] = fmaf(p, vc.y, o_acc[4 * c + 1]);
        o_acc[4 * c + 2] = fmaf(p, vc.z, o_acc[4 * c + 2]);
        o_acc[4 * c + 3] = fmaf(p, vc.w, o_acc[4 * c + 3]);
      }
    }
  }

  if (!has_row) return;
  const float inv_sum = 1.0f / row_sum;
  kf_elem* o_row = o + int64_t(row) * head_dim;  // o_row: [head_dim]
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int d = c * kChunkStride + 4 * lane_in_row + i;
      if (d < head_dim) o_row[d] = kf_from_float<kf_elem>(o_acc[4 * c + i] * inv_sum);
    }
  }
}

template <int kDim>
int launch(const kf_attention::Problem& p) {
  constexpr int kSmemBytes = 2 * BLOCK_KV * kDim * int(sizeof(float));
  const bool packed = p.head_dim == kDim && kf_is_aligned(p.k, sizeof(ElemPack4)) &&
                      kf_is_aligned(p.v, sizeof(ElemPack4));
  return kf_attention::launch(flash_attention_tiled<kDim>, p, BLOCK_Q, kThreads, kSmemBytes,
                              packed);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  kf_attention::Problem problem;
  if (const int status = kf_attention::read_problem(args, kMaxHeadDim, &problem); status != KF_OK)
    return status;
  if (problem.heads == 0 || problem.seq_len == 0) return KF_OK;
  return problem.head_dim <= 64 ? launch<64>(problem) : launch<128>(problem);
}
