/* kforge
 * op: flash_attention
 * backend: cuda
 * dtypes: f16, bf16
 * param: WARPS = 4 in {2, 4, 8}
 * param: BLOCK_KV = 64 in {32, 64, 128}
 * derive: BLOCK_Q = 16 * WARPS
 * # a Q tile and two K and V tiles (double-buffered) of 16-bit elements at head_dim 128, rows
 * # padded by 8 elements
 * derive: SMEM_BYTES = (BLOCK_Q + 4 * BLOCK_KV) * (128 + 8) * 2
 * require: SMEM_BYTES <= max_shared_per_block
 * # registers per thread at head_dim 128: q fragments 32, o accumulators 64, scores BLOCK_KV / 2
 * # and as much again while they become P fragments, addresses and softmax state (about 40);
 * # ptxas (sm_90a) used 168 at BLOCK_KV 32, 179 at 64, and spilled at 128
 * derive: REGS_ESTIMATE = 32 + 64 + BLOCK_KV + 40
 * require: REGS_ESTIMATE <= 255 && REGS_ESTIMATE * 32 * WARPS <= regs_per_block
 * threads: 32 * WARPS
 * shared_bytes: SMEM_BYTES
 */
// Flash attention forward on the tensor cores (mma.sync, m16n8k16, fp32 accumulation): one pass
// over the keys with an online softmax, the scores and the output never leaving registers.
//
// Idea: a block takes BLOCK_Q = 16 * WARPS query rows of one (batch, head), reading the key/value
// head its query head maps to under grouped-query attention (head / group). Each warp owns 16
// rows. The block stages its Q tile in shared memory once, and each warp loads its rows' Q as
// mma A fragments (ldmatrix) that stay in registers. Then the block walks the keys in tiles of
// BLOCK_KV rows, K and V staged in shared memory (rows padded by 16 bytes, so the eight row
// addresses of an ldmatrix fall in different banks) in two buffers: the next tile's copy
// (cp.async) is in flight while the warps compute on this one. Per tile, each warp:
//   1. S = Q K^T with mma: K's rows are the B operand as they lie (ldmatrix, no transpose);
//   2. scales S to log2 units, masks keys past seq_len (and past the row under causal), and
//      runs the online softmax on the accumulator fragments: with m the running maximum and l
//      the running sum of exp2(s - m), m' = max(m, tile max), and l and the output accumulator
//      are rescaled by exp2(m - m'); the row maximum needs only the four lanes of a quad, which
//      hold one row between them;
//   3. O += P V with mma: P is the score fragments rounded to the input type, which already have
//      the layout of A fragments (the m16n8 accumulators of two neighbouring key octets are one
//      m16k16 operand), and V is the B operand through ldmatrix.trans.
// At the end O = o / l, with l summed over the quad.
//
// Stability: as in flash_attention_tiled.cu. m starts at -inf; scores are exponentiated only
// after the running maximum is subtracted; while every key so far is masked the reference
// point is 0, so masked scores give exp2f(-inf) = 0, not NaN. P is rounded to f16/bf16 for the
// second mma (p in [0, 1]); l sums the unrounded p in fp32.
//
// Causal: a block stops after the tile holding its last row's diagonal, and blocks are
// launched last-rows-first because those have the most keys.
//
// Edges: head_dim up to 128, instantiated for 64 and 128; narrower heads are padded with zeros
// (in Q, K and V, so padded dimensions add nothing). Rows past seq_len compute on zeros and are
// not written; keys past seq_len are masked. Tiles move in 16-byte loads where head_dim is the
// instantiated width and the tensors are 16-byte aligned, element by element otherwise.
//
// Tunables:
//   WARPS     warps per block; each owns 16 query rows (BLOCK_Q = 16 * WARPS).
//   BLOCK_KV  keys per shared-memory tile; a warp holds BLOCK_KV / 2 scores per thread.
#include <cmath>
#include <cstdint>

#include "flash_attention_common.cuh"
#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kThreads = 32 * WARPS;
constexpr int kBlockQ = 16 * WARPS;
constexpr int kMaxHeadDim = 128;
constexpr int kPad = 8;  // elements added to each shared-memory row (16 bytes)

static_assert(BLOCK_KV % 16 == 0, "P V takes keys in steps of 16");
static_assert(sizeof(kf_elem) == 2, "mma.sync m16n8k16 takes f16 or bf16");

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const kf_elem* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// The same, each matrix transposed on the way.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const kf_elem* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// d[16x8] += a[16x16] b[16x8] in fp32.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
#if defined(KF_ELEM_BF16)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two values rounded to the element type, `low` in the low half (the lower column of a pair).
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
#if defined(KF_ELEM_BF16)
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
#else
  const __half2 pair = __floats2half2_rn(low, high);
#endif
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// 16 bytes from global to shared memory without passing through registers; with `valid` false
// nothing is read and the 16 bytes are zeros.
__device__ __forceinline__ void copy_16_async(kf_elem* dst, const kf_elem* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void wait_for_copies() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// tile[r][d] = src[row0 + r][d] for rows below seq_len and d < head_dim, else 0.
// tile: [rows][kDim + kPad] in shared memory; src: [seq_len, head_dim] of this head.
// packed: head_dim == kDim and src is 16-byte aligned, so rows move in 16-byte asynchronous
// copies (complete after wait_for_copies()); otherwise element by element, at once.
template <int kDim, int kRows>
__device__ __forceinline__ void load_tile(kf_elem* __restrict__ tile,
                                          const kf_elem* __restrict__ src, int row0, int seq_len,
                                          int head_dim, bool packed) {
  constexpr int kStride = kDim + kPad;
  if (packed) {
    constexpr int kPiecesPerRow = kDim / 8;
    for (int p = int(threadIdx.x); p < kRows * kPiecesPerRow; p += kThreads) {
      const int r = p / kPiecesPerRow;
      const int d = p % kPiecesPerRow * 8;
      const bool valid = row0 + r < seq_len;
      copy_16_async(tile + r * kStride + d, valid ? src + int64_t(row0 + r) * kDim + d : src,
                    valid);
    }
  } else {
    for (int e = int(threadIdx.x); e < kRows * kDim; e += kThreads) {
      const int r = e / kDim;
      const int d = e % kDim;
      tile[r * kStride + d] = row0 + r < seq_len && d < head_dim
                                  ? src[int64_t(row0 + r) * head_dim + d]
                                  : kf_from_float<kf_elem>(0.0f);
    }
  }
}

// The fragment names follow the PTX ISA's m16n8k16 layouts: in a warp, lane l is in quad
// g = l / 4 at position t = l % 4; an accumulator's c0, c1 lie in row g at columns 2t, 2t + 1,
// and c2, c3 in row g + 8.
template <int kDim>
__global__ void __launch_bounds__(kThreads)
    flash_attention_mma(const kf_elem* __restrict__ q,  // q: [batch * heads, seq_len, head_dim]
                        const kf_elem* __restrict__ k,  // k: [batch * kv_heads, seq_len, ...]
                        const kf_elem* __restrict__ v,  // v: like k
                        kf_elem* __restrict__ o,        // o: like q
                        int seq_len, int head_dim, int group, float scale_log2, bool causal,
                        bool packed) {
  constexpr int kStride = kDim + kPad;
  constexpr int kDimChunks = kDim / 16;     // k-steps of S = Q K^T
  constexpr int kKeyOctets = BLOCK_KV / 8;  // n-tiles of S
  constexpr int kDimOctets = kDim / 8;      // n-tiles of O

  extern __shared__ uint4 smem[];                      // 16-byte aligned
  kf_elem* q_tile = reinterpret_cast<kf_elem*>(smem);  // q_tile: [kBlockQ][kStride]
  // Buffer b's K and V tiles, each [BLOCK_KV][kStride].
  const auto k_tile_of = [&](int b) { return q_tile + (kBlockQ + 2 * b * BLOCK_KV) * kStride; };
  const auto v_tile_of = [&](int b) { return k_tile_of(b) + BLOCK_KV * kStride; };

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kBlockQ;  // last rows first
  const int row_lo = q0 + warp * 16 + g;                            // this lane's two rows
  const int row_hi = row_lo + 8;
  const int64_t head_offset = int64_t(blockIdx.y) * seq_len * head_dim;
  // Grouped-query attention: `group` consecutive query heads share one key/value head.
  const int64_t kv_offset = int64_t(blockIdx.y) / group * seq_len * head_dim;
  q += head_offset;
  k += kv_offset;
  v += kv_offset;
  o += head_offset;

  // Causal: no row of this block needs keys past its last row.
  const int kv_end = causal ? min(seq_len, q0 + kBlockQ) : seq_len;
  load_tile<kDim, kBlockQ>(q_tile, q, q0, seq_len, head_dim, packed);
  load_tile<kDim, BLOCK_KV>(k_tile_of(0), k, 0, seq_len, head_dim, packed);
  load_tile<kDim, BLOCK_KV>(v_tile_of(0), v, 0, seq_len, head_dim, packed);
  commit_copies();
  wait_for_copies();
  __syncthreads();
  // This warp's 16 rows of Q as A fragments, one per 16 dimensions: matrix i of the ldmatrix
  // is rows 8 * (i % 2) + 0..7, dimensions 8 * (i / 2) + 0..7 of the step.
  uint32_t q_frag[kDimChunks][4];
#pragma unroll
  for (int c = 0; c < kDimChunks; ++c) {
    const int m = lane / 8;
    ldmatrix_x4(q_frag[c],
                q_tile + (warp * 16 + (m % 2) * 8 + lane % 8) * kStride + c * 16 + (m / 2) * 8);
  }

  float o_acc[kDimOctets][4];
#pragma unroll
  for (int n = 0; n < kDimOctets; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o_acc[n][i] = 0.0f;
    }
  }
  float row_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8, log2 units
  float row_sum[2] = {0.0f, 0.0f};            // this lane's share of the running sums

  for (int kv0 = 0, buffer = 0; kv0 < kv_end; kv0 += BLOCK_KV, buffer ^= 1) {
    // This tile is in `buffer`. The other buffer held the previous tile, which every warp is
    // done with (the barrier that ended the last step): the next tile goes there meanwhile.
    if (kv0 + BLOCK_KV < kv_end) {
      load_tile<kDim, BLOCK_KV>(k_tile_of(buffer ^ 1), k, kv0 + BLOCK_KV, seq_len, head_dim,
                                packed);
      load_tile<kDim, BLOCK_KV>(v_tile_of(buffer ^ 1), v, kv0 + BLOCK_KV, seq_len, head_dim,
                                packed);
      commit_copies();
    }
    const kf_elem* k_tile = k_tile_of(buffer);
    const kf_elem* v_tile = v_tile_of(buffer);

    // 1. S = Q K^T. For key octet j and two dimension steps at once: matrix i of the ldmatrix
    // is keys 8j + 0..7, dimensions 32 * (c / 2) + 8i + 0..7, which gives the B fragments of
    // steps c (registers 0, 1) and c + 1 (registers 2, 3).
    float s[kKeyOctets][4];
#pragma unroll
    for (int j = 0; j < kKeyOctets; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[j][i] = 0.0f;
      }
#pragma unroll
      for (int c = 0; c < kDimChunks; c += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + (j * 8 + lane % 8) * kStride + c * 16 + (lane / 8) * 8);
        mma_16x8x16(s[j], q_frag[c], b[0], b[1]);
        mma_16x8x16(s[j], q_frag[c + 1], b[2], b[3]);
      }
    }

    // 2. Scale, mask, online softmax. Element i of s[j] is row (i < 2 ? g : g + 8), key
    // kv0 + 8j + 2t + i % 2.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kKeyOctets; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = kv0 + j * 8 + 2 * t + i % 2;
        const int row = i < 2 ? row_lo : row_hi;
        const bool visible = key < seq_len && (!causal || key <= row);
        s[j][i] = visible ? s[j][i] * scale_log2 : -INFINITY;
        tile_max[i / 2] = fmaxf(tile_max[i / 2], s[j][i]);
      }
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // The quad's four lanes hold the row between them; xor shuffles give each the same max.
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float new_max = fmaxf(row_max[h], tile_max[h]);
      // Reference point for the exponentials; 0 while every key so far is masked.
      base[h] = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = exp2f(row_max[h] - base[h]);  // 0 on the first tile
      row_max[h] = new_max;
      row_sum[h] *= rescale;
#pragma unroll
      for (int n = 0; n < kDimOctets; ++n) {
        o_acc[n][2 * h] *= rescale;
        o_acc[n][2 * h + 1] *= rescale;
      }
    }
#pragma unroll
    for (int j = 0; j < kKeyOctets; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[j][i] = exp2f(s[j][i] - base[i / 2]);
        row_sum[i / 2] += s[j][i];
      }
    }

    // 3. O += P V, 16 keys a step. P's A fragment for keys 16kk + 0..15 is the accumulators of
    // key octets 2kk and 2kk + 1. V's B fragments through ldmatrix.trans: matrix i is keys
    // 16kk + 8 * (i % 2) + 0..7, dimensions 16 * (n / 2) + 8 * (i / 2) + 0..7, which gives
    // dimension octets n (registers 0, 1) and n + 1 (registers 2, 3).
#pragma unroll
    for (int kk = 0; kk < BLOCK_KV / 16; ++kk) {
      const uint32_t p[4] = {pack_pair(s[2 * kk][0], s[2 * kk][1]),
                             pack_pair(s[2 * kk][2], s[2 * kk][3]),
                             pack_pair(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_pair(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < kDimOctets; n += 2) {
        const int m = lane / 8;
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, v_tile + (kk * 16 + (m % 2) * 8 + lane % 8) * kStride + n * 8 + (m / 2) * 8);
        mma_16x8x16(o_acc[n], p, b[0], b[1]);
        mma_16x8x16(o_acc[n + 1], p, b[2], b[3]);
      }
    }
    wait_for_copies();
    __syncthreads();  // the next tile is in, and this one is free for the tile after it
  }

  // O = o / l, l summed over the quad (a valid row always saw key 0, so l >= 1).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
    const int row = h == 0 ? row_lo : row_hi;
    if (row >= seq_len) continue;
    const float inv_sum = 1.0f / row_sum[h];
    kf_elem* o_row = o + int64_t(row) * head_dim;  // o_row: [head_dim]
#pragma unroll
    for (int n = 0; n < kDimOctets; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + 2 * t + e;
        if (d < head_dim) o_row[d] = kf_from_float<kf_elem>(o_acc[n][2 * h + e] * inv_sum);
      }
    }
  }
}

template <int kDim>
int launch(const kf_attention::Problem& p) {
  constexpr int kSmemBytes = (kBlockQ + 4 * BLOCK_KV) * (kDim + kPad) * int(sizeof(kf_elem));
  const bool packed = p.head_dim == kDim && kf_is_aligned(p.q, 16) && kf_is_aligned(p.k, 16) &&
                      kf_is_aligned(p.v, 16);
  return kf_attention::launch(flash_attention_mma<kDim>, p, kBlockQ, kThreads, kSmemBytes, packed);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  kf_attention::Problem problem;
  if (const int status = kf_attention::read_problem(args, kMaxHeadDim, &problem); status != KF_OK)
    return status;
  if (problem.heads == 0 || problem.seq_len == 0) return KF_OK;
  return problem.head_dim <= 64 ? launch<64>(problem) : launch<128>(problem);
}
