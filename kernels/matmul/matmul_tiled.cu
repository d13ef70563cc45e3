/* kforge
 * op: matmul
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_M = 128 in {32, 64, 128}
 * param: BLOCK_N = 128 in {32, 64, 128}
 * param: BLOCK_K = 16 in {8, 16, 32}
 * param: THREAD_M = 8 in {4, 8}
 * param: THREAD_N = 8 in {4, 8}
 * param: MIN_BLOCKS = 2 in {1, 2, 4}
 * derive: BLOCK_THREADS = (BLOCK_M / THREAD_M) * (BLOCK_N / THREAD_N)
 * require: BLOCK_M % (4 * THREAD_M) == 0 && BLOCK_N % (4 * THREAD_N) == 0
 * require: BLOCK_THREADS % 32 == 0 && BLOCK_THREADS >= 64
 * require: BLOCK_THREADS <= max_threads_per_block
 * # registers, roughly: accumulators, fragments, the prefetched slice and 16 more. MIN_BLOCKS
 * # blocks must fit the register file with that many; past this ptxas (nvcc 13.0) spills.
 * derive: PREFETCH = BLOCK_K * (BLOCK_M + BLOCK_N) / BLOCK_THREADS
 * derive: REGS_ESTIMATE = THREAD_M * THREAD_N + THREAD_M + THREAD_N + PREFETCH + 16
 * require: REGS_ESTIMATE <= 255 && REGS_ESTIMATE * MIN_BLOCKS * BLOCK_THREADS <= regs_per_sm
 * # static shared memory: both fp32 tiles, a_tile padded by 4 floats per row
 * require: 4 * BLOCK_K * (BLOCK_M + 4 + BLOCK_N) <= 48 * 1024
 */
// Shared-memory tiled GEMM on the CUDA cores: C[M, N] = A[M, K] @ B[K, N], all row-major.
//
// Idea: a block computes one BLOCK_M x BLOCK_N tile of C. It walks K in slices of BLOCK_K:
// each slice of A (BLOCK_M x BLOCK_K) and of B (BLOCK_K x BLOCK_N) is read from global memory
// with neighbouring threads on neighbouring addresses, converted to fp32 and stored in shared
// memory (A transposed, so that a column of the slice is contiguous). Each thread then
// accumulates a THREAD_M x THREAD_N micro-tile of C in registers with FFMA: per k, THREAD_M
// values of A and THREAD_N values of B from shared memory feed THREAD_M * THREAD_N FMAs.
// Accumulation is fp32 with no tensor cores, so fp32 inputs get true fp32 (no TF32) results.
//
// The next slice is loaded from global memory into registers while the current one is
// multiplied, which hides most of the global latency behind the FMAs.
//
// A thread's micro-tile rows are THREAD_M / 4 groups of 4 consecutive rows, the groups
// BLOCK_M / THREAD_M * 4 rows apart (columns likewise). Then the threads of a warp read
// consecutive float4s of a shared-memory row, which is free of bank conflicts, where
// THREAD_N consecutive columns per thread would be a 2-way conflict.
//
// Every global access is bounds-checked: rows and columns past M or N are neither read nor
// written, and the K tail of the last slice is read as zeros, so any M, N, K works
// (K = 0 gives C = 0).
//
// Tunables:
//   BLOCK_M, BLOCK_N  the block's tile of C; the block has (BLOCK_M / THREAD_M) *
//                     (BLOCK_N / THREAD_N) threads.
//   BLOCK_K           the K slice held in shared memory.
//   THREAD_M/N        each thread's micro-tile (multiples of 4: float4 shared-memory reads).
//   MIN_BLOCKS        blocks per SM that __launch_bounds__ asks ptxas to fit (it caps the
//                     registers per thread to match). Two 256-thread blocks keep the SM busy
//                     while the other waits at __syncthreads; too low a cap spills.
#include <cstdint>

#include "kforge/elem_cuda.cuh"
#include "matmul_common.cuh"

namespace {

constexpr int kThreadsM = BLOCK_M / THREAD_M;  // threads along M
constexpr int kThreadsN = BLOCK_N / THREAD_N;  // threads along N
constexpr int kThreads = kThreadsM * kThreadsN;
// a_tile is stored transposed ([k][m]) while it is read with k fastest, so without padding
// the threads of a warp that share an m would all store to one bank. 4 more floats per row
// spread them over the banks and keep rows 16-byte aligned for float4 reads.
constexpr int kAPitch = BLOCK_M + 4;

static_assert(THREAD_M % 4 == 0 && THREAD_N % 4 == 0, "micro-tiles are read as float4s");
static_assert(BLOCK_M % (4 * THREAD_M) == 0 && BLOCK_N % (4 * THREAD_N) == 0,
              "a block tile is a whole number of micro-tiles");
static_assert(kThreads % 32 == 0, "whole warps");

// How kThreads threads cover a kRows x kCols slice with columns fastest: kColThreads
// consecutive threads share a row, kRowThreads rows are read at once, and a thread visits
// kColIters columns kColThreads apart and kRowIters rows kRowThreads apart. All sizes are
// powers of two; when kRowThreads > kRows some threads have no row.
template <int kRows, int kCols>
struct SliceWalk {
  static constexpr int kColThreads = kThreads < kCols ? kThreads : kCols;
  static constexpr int kRowThreads = kThreads / kColThreads;
  static constexpr int kColIters = kCols / kColThreads;
  static constexpr int kRowIters = (kRows + kRowThreads - 1) / kRowThreads;
  static constexpr bool kRowsExact = kRows % kRowThreads == 0;
  static_assert(kThreads % kColThreads == 0 && kCols % kColThreads == 0, "powers of two");
  static_assert(kRowsExact || kRowIters == 1, "a partial row pass is the only pass");
  static constexpr int kLoads = kRowIters * kColIters;
  __device__ static int row() { return int(threadIdx.x) / kColThreads; }
  __device__ static int col() { return int(threadIdx.x) % kColThreads; }
};
using AWalk = SliceWalk<BLOCK_M, BLOCK_K>;  // A slice: rows m, columns k
using BWalk = SliceWalk<BLOCK_K, BLOCK_N>;  // B slice: rows k, columns n

// One K slice of A and of B, held in registers between the global load and the
// shared-memory store. a[r * AWalk::kColIters + q] is A[m0 + AWalk::row() + r * kRowThreads]
// [k0 + AWalk::col() + q * kColThreads], and likewise for B.
struct Slice {
  float a[AWalk::kLoads];
  float b[BWalk::kLoads];
};

__device__ __forceinline__ void load_slice(Slice& s,
                                           const kf_elem* __restrict__ a,  // a: [M, K]
                                           const kf_elem* __restrict__ b,  // b: [K, N]
                                           int M, int N, int K, int m0, int n0, int k0) {
#pragma unroll
  for (int r = 0; r < AWalk::kRowIters; ++r) {
    const int m_in_tile = AWalk::row() + r * AWalk::kRowThreads;
    const int m = m0 + m_in_tile;
    const bool row_ok = (AWalk::kRowsExact || m_in_tile < BLOCK_M) && m < M;
#pragma unroll
    for (int q = 0; q < AWalk::kColIters; ++q) {
      const int k = k0 + AWalk::col() + q * AWalk::kColThreads;
      s.a[r * AWalk::kColIters + q] = row_ok && k < K ? kf_to_float(a[int64_t(m) * K + k]) : 0.0f;
    }
  }
#pragma unroll
  for (int r = 0; r < BWalk::kRowIters; ++r) {
    const int k_in_tile = BWalk::row() + r * BWalk::kRowThreads;
    const int k = k0 + k_in_tile;
    const bool row_ok = (BWalk::kRowsExact || k_in_tile < BLOCK_K) && k < K;
#pragma unroll
    for (int q = 0; q < BWalk::kColIters; ++q) {
      const int n = n0 + BWalk::col() + q * BWalk::kColThreads;
      s.b[r * BWalk::kColIters + q] = row_ok && n < N ? kf_to_float(b[int64_t(k) * N + n]) : 0.0f;
    }
  }
}

__device__ __forceinline__ void store_slice(const Slice& s, float (*a_tile)[kAPitch],
                                            float (*b_tile)[BLOCK_N]) {
#pragma unroll
  for (int r = 0; r < AWalk::kRowIters; ++r) {
    const int m = AWalk::row() + r * AWalk::kRowThreads;
    if (!AWalk::kRowsExact && m >= BLOCK_M) continue;
#pragma unroll
    for (int q = 0; q < AWalk::kColIters; ++q) {
      a_tile[AWalk::col() + q * AWalk::kColThreads][m] = s.a[r * AWalk::kColIters + q];
    }
  }
#pragma unroll
  for (int r = 0; r < BWalk::kRowIters; ++r) {
    const int k = BWalk::row() + r * BWalk::kRowThreads;
    if (!BWalk::kRowsExact && k >= BLOCK_K) continue;
#pragma unroll
    for (int q = 0; q < BWalk::kColIters; ++q) {
      b_tile[k][BWalk::col() + q * BWalk::kColThreads] = s.b[r * BWalk::kColIters + q];
    }
  }
}

__global__ void __launch_bounds__(kThreads, MIN_BLOCKS)
    matmul_tiled(const kf_elem* __restrict__ a,  // a: [M, K]
                 const kf_elem* __restrict__ b,  // b: [K, N]
                 kf_elem* __restrict__ c,        // c: [M, N]
                 int M, int N, int K) {
  __shared__ __align__(16) float a_tile[BLOCK_K][kAPitch];  // a_tile[k][m] = A[m0 + m][k0 + k]
  __shared__ __align__(16) float b_tile[BLOCK_K][BLOCK_N];  // b_tile[k][n] = B[k0 + k][n0 + n]

  const int tx = int(threadIdx.x) % kThreadsN;
  const int ty = int(threadIdx.x) / kThreadsN;
  const int m0 = int(blockIdx.y) * BLOCK_M;
  const int n0 = int(blockIdx.x) * BLOCK_N;

  // acc[i][j] is C[m0 + row(i)][n0 + col(j)] with
  //   row(i) = (i / 4) * 4 * kThreadsM + 4 * ty + i % 4,
  //   col(j) = (j / 4) * 4 * kThreadsN + 4 * tx + j % 4.
  float acc[THREAD_M][THREAD_N];
#pragma unroll
  for (int i = 0; i < THREAD_M; ++i) {
#pragma unroll
    for (int j = 0; j < THREAD_N; ++j) {
      acc[i][j] = 0.0f;
    }
  }

  const int k_slices = (K + BLOCK_K - 1) / BLOCK_K;
  Slice slice;
  if (k_slices > 0) load_slice(slice, a, b, M, N, K, m0, n0, 0);
  for (int t = 0; t < k_slices; ++t) {
    store_slice(slice, a_tile, b_tile);
    __syncthreads();
    // Issue the next slice's global loads now; they complete while this slice is multiplied.
    if (t + 1 < k_slices) load_slice(slice, a, b, M, N, K, m0, n0, (t + 1) * BLOCK_K);
#pragma unroll
    for (int kk = 0; kk < BLOCK_K; ++kk) {
      float a_frag[THREAD_M];
      float b_frag[THREAD_N];
#pragma unroll
      for (int g = 0; g < THREAD_M / 4; ++g) {
        const float4 v = *reinterpret_cast<const float4*>(&a_tile[kk][g * 4 * kThreadsM + 4 * ty]);
        a_frag[4 * g + 0] = v.x;
        a_frag[4 * g + 1] = v.y;
        a_frag[4 * g + 2] = v.z;
        a_frag[4 * g + 3] = v.w;
      }
#pragma unroll
      for (int g = 0; g < THREAD_N / 4; ++g) {
        const float4 v = *reinterpret_cast<const float4*>(&b_tile[kk][g * 4 * kThreadsN + 4 * tx]);
        b_frag[4 * g + 0] = v.x;
        b_frag[4 * g + 1] = v.y;
        b_frag[4 * g + 2] = v.z;
        b_frag[4 * g + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < THREAD_M; ++i) {
#pragma unroll
        for (int j = 0; j < THREAD_N; ++j) {
          acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
        }
      }
    }
    __syncthreads();  // the tiles are overwritten by the next slice
  }

#pragma unroll
  for (int i = 0; i < THREAD_M; ++i) {
    const int m = m0 + (i / 4) * 4 * kThreadsM + 4 * ty + i % 4;
    if (m >= M) continue;
    kf_elem* c_row = c + int64_t(m) * N;  // c_row: [N]
#pragma unroll
    for (int j = 0; j < THREAD_N; ++j) {
      const int n = n0 + (j / 4) * 4 * kThreadsN + 4 * tx + j % 4;
      if (n < N) c_row[n] = kf_from_float<kf_elem>(acc[i][j]);
    }
  }
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  MatmulCall call;
  if (!read_matmul_call(args, call)) return KF_ERR_UNSUPPORTED;
  // grid.y is limited to 65535.
  const int64_t m_blocks = (call.M + BLOCK_M - 1) / BLOCK_M;
  const int64_t n_blocks = (call.N + BLOCK_N - 1) / BLOCK_N;
  if (m_blocks > 65535) return KF_ERR_UNSUPPORTED;
  if (call.M == 0 || call.N == 0) return KF_OK;

  const dim3 grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(m_blocks));
  matmul_tiled<<<grid, kThreads, 0, call.stream>>>(call.a, call.b, call.c, int(call.M), int(call.N),
                                                   int(call.K));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
