/* kforge
 * op: fused_mlp
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_K = 16 in {8, 16, 32}
 * param: GATE_UP_BLOCK_M = 128 in {32, 64, 128}
 * param: GATE_UP_BLOCK_N = 64 in {32, 64, 128}
 * param: GATE_UP_THREAD_M = 8 in {4, 8}
 * param: GATE_UP_THREAD_N = 4 in {4, 8}
 * param: DOWN_BLOCK_M = 128 in {32, 64, 128}
 * param: DOWN_BLOCK_N = 128 in {32, 64, 128}
 * param: DOWN_THREAD_M = 8 in {4, 8}
 * param: DOWN_THREAD_N = 8 in {4, 8}
 * param: MIN_BLOCKS = 2 in {1, 2}
 * require: GATE_UP_BLOCK_M % (4 * GATE_UP_THREAD_M) == 0
 * require: GATE_UP_BLOCK_N % (4 * GATE_UP_THREAD_N) == 0
 * require: DOWN_BLOCK_M % (4 * DOWN_THREAD_M) == 0
 * require: DOWN_BLOCK_N % (4 * DOWN_THREAD_N) == 0
 * # threads per block of each kernel: whole warps, within the device limit
 * derive: GATE_UP_THREADS_M = GATE_UP_BLOCK_M / GATE_UP_THREAD_M
 * derive: GATE_UP_THREADS = GATE_UP_THREADS_M * (GATE_UP_BLOCK_N / GATE_UP_THREAD_N)
 * derive: DOWN_THREADS = (DOWN_BLOCK_M / DOWN_THREAD_M) * (DOWN_BLOCK_N / DOWN_THREAD_N)
 * require: GATE_UP_THREADS % 32 == 0 && GATE_UP_THREADS >= 64
 * require: DOWN_THREADS % 32 == 0 && DOWN_THREADS >= 64
 * require: max(GATE_UP_THREADS, DOWN_THREADS) <= max_threads_per_block
 * # registers, roughly: accumulators, fragments, the prefetched slices and 16 more. MIN_BLOCKS
 * # blocks must fit the register file with that many; past this ptxas (nvcc 13.0) spills.
 * derive: GATE_UP_ACC = 2 * GATE_UP_THREAD_M * GATE_UP_THREAD_N
 * derive: GATE_UP_FRAG = GATE_UP_THREAD_M + 2 * GATE_UP_THREAD_N
 * derive: GATE_UP_SLICE = BLOCK_K * (GATE_UP_BLOCK_M + 2 * GATE_UP_BLOCK_N) / GATE_UP_THREADS
 * derive: GATE_UP_REGS = GATE_UP_ACC + GATE_UP_FRAG + GATE_UP_SLICE + 16
 * derive: DOWN_MICRO = DOWN_THREAD_M * DOWN_THREAD_N + DOWN_THREAD_M + DOWN_THREAD_N
 * derive: DOWN_REGS = DOWN_MICRO + BLOCK_K * (DOWN_BLOCK_M + DOWN_BLOCK_N) / DOWN_THREADS + 16
 * require: GATE_UP_REGS <= 255 && GATE_UP_REGS * MIN_BLOCKS * GATE_UP_THREADS <= regs_per_sm
 * require: DOWN_REGS <= 255 && DOWN_REGS * MIN_BLOCKS * DOWN_THREADS <= regs_per_sm
 * # static shared memory: fp32 tiles, rows padded by 4 floats (two B tiles for gate and up)
 * require: 4 * BLOCK_K * (GATE_UP_BLOCK_M + 4 + 2 * (GATE_UP_BLOCK_N + 4)) <= 48 * 1024
 * require: 4 * BLOCK_K * (DOWN_BLOCK_M + 4 + DOWN_BLOCK_N + 4) <= 48 * 1024
 */
// SwiGLU MLP as two shared-memory tiled GEMMs on the CUDA cores, through an fp32 workspace.
//
//   1. gate-up: h[batch, hidden] = silu(x @ w_gate^T) * (x @ w_up^T). A block computes one
//      GATE_UP_BLOCK_M x GATE_UP_BLOCK_N tile of both products from the same slices of x, so x
//      is read once for both, and applies silu(gate) * up in registers before the one write.
//   2. down: y[batch, dim] = h @ w_down^T.
//
// h stays fp32 (it is the most accurate choice and costs batch * hidden * 4 bytes of traffic
// twice); it lives in a workspace from cudaMallocAsync on the stream, freed on the stream after
// the second kernel.
//
// Both GEMMs are "NT": each operand is row-major with the reduction dimension K contiguous
// (x [batch, dim], w_gate [hidden, dim]; h [batch, hidden], w_down [dim, hidden]). A block
// walks K in slices of BLOCK_K; each operand's slice is read from global memory with
// consecutive threads on consecutive k, converted to fp32 and stored transposed ([k][row]) in
// shared memory, rows padded by 4 floats against bank conflicts on that store. Each thread
// accumulates a THREAD_M x THREAD_N micro-tile with FFMA (fp32 all the way: no TF32). Its rows
// are THREAD_M / 4 groups of 4 consecutive rows spread across the tile (columns likewise), so
// the float4 shared-memory reads of a warp are conflict-free. The next slice's global loads
// are issued before the current slice is multiplied.
//
// All global accesses are bounds-checked (rows past M or N are not read or written; the K
// tail reads as zeros), so any batch, dim and hidden work.
//
// Tunables:
//   BLOCK_K                  the K slice held in shared memory (both kernels).
//   GATE_UP_BLOCK_M/N        block tile of h in kernel 1 ((M/THREAD_M) * (N/THREAD_N) threads).
//   GATE_UP_THREAD_M/N       micro-tile per thread in kernel 1 (two accumulators per element).
//   DOWN_BLOCK_M/N           block tile of y in kernel 2.
//   DOWN_THREAD_M/N          micro-tile per thread in kernel 2.
//   MIN_BLOCKS               blocks per SM that __launch_bounds__ asks ptxas to fit.
#include <cstdint>

#include "fused_mlp_common.cuh"
#include "kforge/elem_cuda.cuh"

namespace {

// Shared-memory tiles are [BLOCK_K][rows + kPad] floats: the padding spreads the transposing
// store over the banks and keeps rows 16-byte aligned for float4 reads.
constexpr int kPad = 4;

template <int kBlockM, int kBlockN, int kThreadM, int kThreadN>
struct TileShape {
  static constexpr int kBlockRows = kBlockM;
  static constexpr int kBlockCols = kBlockN;
  static constexpr int kMicroRows = kThreadM;
  static constexpr int kMicroCols = kThreadN;
  static constexpr int kThreadsM = kBlockM / kThreadM;  // threads along M
  static constexpr int kThreadsN = kBlockN / kThreadN;  // threads along N
  static constexpr int kThreads = kThreadsM * kThreadsN;
  static_assert(kThreadM % 4 == 0 && kThreadN % 4 == 0, "micro-tiles are read as float4s");
  static_assert(kBlockM % (4 * kThreadM) == 0 && kBlockN % (4 * kThreadN) == 0,
                "a block tile is a whole number of micro-tiles");
  static_assert(kThreads % 32 == 0, "whole warps");
};

using GateUpShape = TileShape<GATE_UP_BLOCK_M, GATE_UP_BLOCK_N, GATE_UP_THREAD_M, GATE_UP_THREAD_N>;
using DownShape = TileShape<DOWN_BLOCK_M, DOWN_BLOCK_N, DOWN_THREAD_M, DOWN_THREAD_N>;

// One K slice (rows [row0, row0 + kRows) x columns [k0, k0 + BLOCK_K)) of a row-major
// [rows, K] operand, held in registers between the global load and the shared-memory store.
// kColThreads consecutive threads read consecutive k of one row, kRowThreads rows at once;
// a thread visits kRowIters rows kRowThreads apart. All sizes are powers of two; when
// kRowThreads > kRows some threads have no row.
template <int kRows, int kThreads>
struct KSlice {
  static constexpr int kColThreads = kThreads < BLOCK_K ? kThreads : BLOCK_K;
  static constexpr int kRowThreads = kThreads / kColThreads;
  static constexpr int kColIters = BLOCK_K / kColThreads;
  static constexpr int kRowIters = (kRows + kRowThreads - 1) / kRowThreads;
  static constexpr bool kRowsExact = kRows % kRowThreads == 0;
  static_assert(kThreads % kColThreads == 0 && BLOCK_K % kColThreads == 0, "powers of two");
  static_assert(kRowsExact || kRowIters == 1, "a partial row pass is the only pass");

  // v[r * kColIters + q] = src[row0 + row() + r * kRowThreads][k0 + col() + q * kColThreads]
  float v[kRowIters * kColIters];

  __device__ static int row() { return int(threadIdx.x) / kColThreads; }
  __device__ static int col() { return int(threadIdx.x) % kColThreads; }

  template <typename T>
  __device__ __forceinline__ void load(const T* __restrict__ src,  // src: [rows, K]
                                       int rows, int K, int row0, int k0) {
#pragma unroll
    for (int r = 0; r < kRowIters; ++r) {
      const int row_in_tile = row() + r * kRowThreads;
      const int m = row0 + row_in_tile;
      const bool row_ok = (kRowsExact || row_in_tile < kRows) && m < rows;
#pragma unroll
      for (int q = 0; q < kColIters; ++q) {
        const int k = k0 + col() + q * kColThreads;
        v[r * kColIters + q] = row_ok && k < K ? kf_to_float(src[int64_t(m) * K + k]) : 0.0f;
      }
    }
  }

  // tile[k][m] = operand[row0 + m][k0 + k]
  __device__ __forceinline__ void store(float (*tile)[kRows + kPad]) const {
#pragma unroll
    for (int r = 0; r < kRowIters; ++r) {
      const int m = row() + r * kRowThreads;
      if (!kRowsExact && m >= kRows) continue;
#pragma unroll
      for (int q = 0; q < kColIters; ++q) {
        tile[col() + q * kColThreads][m] = v[r * kColIters + q];
      }
    }
  }
};

// Reads kCount consecutive-in-groups-of-4 values of row kk of a shared tile: element
// 4 * g + i is tile[kk][g * 4 * kThreadsAlong + 4 * t + i].
template <int kCount, int kThreadsAlong, int kPitch>
__device__ __forceinline__ void read_fragment(const float (*tile)[kPitch], int kk, int t,
                                              float (&frag)[kCount]) {
#pragma unroll
  for (int g = 0; g < kCount / 4; ++g) {
    const float4 v = *reinterpret_cast<const float4*>(&tile[kk][g * 4 * kThreadsAlong + 4 * t]);
    frag[4 * g + 0] = v.x;
    frag[4 * g + 1] = v.y;
    frag[4 * g + 2] = v.z;
    frag[4 * g + 3] = v.w;
  }
}

__device__ __forceinline__ float silu(float x) {
  // expf(-x) overflows to inf for x < -88, giving x / inf = -0: the right limit.
  return x / (1.0f + expf(-x));
}

// C[M, N] = A[M, K] @ B[N, K]^T for one Shape::kBlockRows x Shape::kBlockCols tile of C.
// kGateUp: two B operands (w_gate, w_up) and C = silu(A @ B0^T) * (A @ B1^T), stored as fp32.
// Otherwise one B operand and C = A @ B0^T, stored as kf_elem.
template <typename Shape, bool kGateUp, typename TA, typename TC>
__global__ void __launch_bounds__(Shape::kThreads, MIN_BLOCKS)
    mlp_gemm_nt(const TA* __restrict__ a,        // a: [M, K]
                const kf_elem* __restrict__ b0,  // b0: [N, K]
                const kf_elem* __restrict__ b1,  // b1: [N, K] (kGateUp only)
                TC* __restrict__ c,              // c: [M, N]
                int M, int N, int K) {
  constexpr int kBM = Shape::kBlockRows, kBN = Shape::kBlockCols;
  constexpr int kTM = Shape::kMicroRows, kTN = Shape::kMicroCols;
  constexpr int kThreadsM = Shape::kThreadsM, kThreadsN = Shape::kThreadsN;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kNumB = kGateUp ? 2 : 1;

  __shared__ __align__(16) float a_tile[BLOCK_K][kBM + kPad];          // [k][m]
  __shared__ __align__(16) float b_tiles[kNumB][BLOCK_K][kBN + kPad];  // [operand][k][n]

  const int tx = int(threadIdx.x) % kThreadsN;
  const int ty = int(threadIdx.x) / kThreadsN;
  const int m0 = int(blockIdx.y) * kBM;
  const int n0 = int(blockIdx.x) * kBN;

  // acc[o][i][j] is operand o's product at C[m0 + row(i)][n0 + col(j)] with
  //   row(i) = (i / 4) * 4 * kThreadsM + 4 * ty + i % 4,
  //   col(j) = (j / 4) * 4 * kThreadsN + 4 * tx + j % 4.
  float acc[kNumB][kTM][kTN];
#pragma unroll
  for (int o = 0; o < kNumB; ++o) {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) {
        acc[o][i][j] = 0.0f;
      }
    }
  }

  KSlice<kBM, kThreads> a_slice;
  KSlice<kBN, kThreads> b_slices[kNumB];
  const int k_slices = (K + BLOCK_K - 1) / BLOCK_K;
  if (k_slices > 0) {
    a_slice.load(a, M, K, m0, 0);
    b_slices[0].load(b0, N, K, n0, 0);
    if constexpr (kGateUp) b_slices[1].load(b1, N, K, n0, 0);
  }
  for (int t = 0; t < k_slices; ++t) {
    a_slice.store(a_tile);
#pragma unroll
    for (int o = 0; o < kNumB; ++o) {
      b_slices[o].store(b_tiles[o]);
    }
    __syncthreads();
    // Issue the next slice's global loads now; they complete while this slice is multiplied.
    if (t + 1 < k_slices) {
      const int k0 = (t + 1) * BLOCK_K;
      a_slice.load(a, M, K, m0, k0);
      b_slices[0].load(b0, N, K, n0, k0);
      if constexpr (kGateUp) b_slices[1].load(b1, N, K, n0, k0);
    }
#pragma unroll
    for (int kk = 0; kk < BLOCK_K; ++kk) {
      float a_frag[kTM];
      read_fragment<kTM, kThreadsM>(a_tile, kk, ty, a_frag);
#pragma unroll
      for (int o = 0; o < kNumB; ++o) {
        float b_frag[kTN];
        read_fragment<kTN, kThreadsN>(b_tiles[o], kk, tx, b_frag);
#pragma unroll
        for (int i = 0; i < kTM; ++i) {
#pragma unroll
          for (int j = 0; j < kTN; ++j) {
            acc[o][i][j] = fmaf(a_frag[i], b_frag[j], acc[o][i][j]);
          }
        }
      }
    }
    __syncthreads();  // the tiles are overwritten by the next slice
  }

#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int m = m0 + (i / 4) * 4 * kThreadsM + 4 * ty + i % 4;
    if (m >= M) continue;
    TC* c_row = c + int64_t(m) * N;  // c_row: [N]
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int n = n0 + (j / 4) * 4 * kThreadsN + 4 * tx + j % 4;
      if (n >= N) continue;
      if constexpr (kGateUp) {
        c_row[n] = silu(acc[0][i][j]) * acc[kNumB - 1][i][j];
      } else {
        c_row[n] = kf_from_float<TC>(acc[0][i][j]);
      }
    }
  }
}

template <typename Shape>
dim3 grid_for(int64_t M, int64_t N) {
  return dim3(static_cast<unsigned>((N + Shape::kBlockCols - 1) / Shape::kBlockCols),
              static_cast<unsigned>((M + Shape::kBlockRows - 1) / Shape::kBlockRows));
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  MlpCall call;
  if (!read_mlp_call(args, call)) return KF_ERR_UNSUPPORTED;
  const int batch = call.batch, dim = call.dim, hidden = call.hidden;
  // grid.y is limited to 65535.
  const dim3 gate_up_grid = grid_for<GateUpShape>(batch, hidden);
  const dim3 down_grid = grid_for<DownShape>(batch, dim);
  if (gate_up_grid.y > 65535 || down_grid.y > 65535) return KF_ERR_UNSUPPORTED;
  if (batch == 0 || dim == 0) return KF_OK;
  const cudaStream_t stream = call.stream;

  // h: [batch, hidden] fp32. With hidden == 0 there is nothing to compute and y = 0.
  float* h = nullptr;
  if (hidden > 0) {
    const size_t h_bytes = size_t(batch) * size_t(hidden) * sizeof(float);
    if (cudaMallocAsync(reinterpret_cast<void**>(&h), h_bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; leave no error behind for the caller
      return KF_ERR_OUT_OF_MEMORY;
    }
    mlp_gemm_nt<GateUpShape, true><<<gate_up_grid, GateUpShape::kThreads, 0, stream>>>(
        call.x, call.w_gate, call.w_up, h, batch, hidden, dim);
  }
  mlp_gemm_nt<DownShape, false><<<down_grid, DownShape::kThreads, 0, stream>>>(
      h, call.w_down, nullptr, call.y, batch, dim, hidden);
  const bool launched = cudaGetLastError() == cudaSuccess;
  if (h != nullptr) cudaFreeAsync(h, stream);
  return launched ? KF_OK : KF_ERR_LAUNCH;
}
