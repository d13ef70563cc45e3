// For the CUTLASS GEMM files whose epilogue adds a term to A @ B (matmul_bias_wgmma.cu,
// matmul_residual_wgmma.cu): what they share besides their epilogue and the CUTLASS launch
// (kforge/cutlass_gemm.cuh).
//
//   - kf::run_plain_gemm: C = A @ B + term(m, n) for the shapes TMA cannot address (K or N not a
//     multiple of 8, misaligned pointers, K == 0): a bounds-checked shared-memory tiled FFMA
//     kernel with fp32 accumulation, correct at any size, not fast.
#ifndef KFORGE_GEMM_EPILOGUE_CUH_
#define KFORGE_GEMM_EPILOGUE_CUH_

#include <cstdint>

#include "kforge/cutlass_gemm.cuh"
#include "kforge/elem_cuda.cuh"

namespace kf {

// ---- the plain path: shared-memory tiled FFMA --------------------------------------------------

namespace plain_gemm {

constexpr int kTile = 64;  // a block's output tile: kTile x kTile
constexpr int kK = 16;     // K slice held in shared memory
constexpr int kThreads = 256;
constexpr int kLanes = 16;              // threads along M and along N
constexpr int kMicro = kTile / kLanes;  // outputs per thread, per axis
static_assert(kLanes * kLanes == kThreads, "a square thread grid");
static_assert(kTile * kK % kThreads == 0, "whole loads per thread");
constexpr int kASmem = kK * (kTile + 1);  // floats
constexpr int kSmemBytes = (kASmem + kK * kTile) * 4;

// Each thread owns the outputs (ty + 16 i, tx + 16 j), i, j < 4: a warp's shared-memory reads
// of one k are 16 consecutive floats (broadcast between its two halves), free of conflicts.
// `term(m, n)` is the float added to element (m, n) before its one rounding.
template <class Term>
__global__ void __launch_bounds__(kThreads) kernel(const kf_elem* __restrict__ a,  // a: [M, K]
                                                   const kf_elem* __restrict__ b,  // b: [K, N]
                                                   kf_elem* __restrict__ c,        // c: [M, N]
                                                   int M, int N, int K, Term term) {
  // Dynamic, so that ptxas reports no static shared memory: kforge adds the largest static
  // amount of any kernel in the file to the GEMM kernel's shared_bytes.
  extern __shared__ float plain_smem[];
  // a_tile[k][m] = A[m0 + m][k0 + k] (padded: stored with m fastest, loaded with k fastest)
  auto a_tile = reinterpret_cast<float(*)[kTile + 1]>(plain_smem);
  // b_tile[k][n] = B[k0 + k][n0 + n]
  auto b_tile = reinterpret_cast<float(*)[kTile]>(plain_smem + kASmem);

  const int tx = int(threadIdx.x) % kLanes;
  const int ty = int(threadIdx.x) / kLanes;
  const int64_t m0 = int64_t(blockIdx.x) * kTile;
  const int64_t n0 = int64_t(blockIdx.y) * kTile;

  float acc[kMicro][kMicro] = {};
  for (int k0 = 0; k0 < K; k0 += kK) {
#pragma unroll
    for (int r = 0; r < kTile * kK / kThreads; ++r) {
      const int idx = int(threadIdx.x) + r * kThreads;
      // A: rows of kK consecutive k; B: rows of kTile consecutive n.
      const int am = idx / kK, ak = idx % kK;
      const int64_t m = m0 + am;
      const int k_a = k0 + ak;
      a_tile[ak][am] = m < M && k_a < K ? kf_to_float(a[m * K + k_a]) : 0.0f;
      const int bk = idx / kTile, bn = idx % kTile;
      const int k_b = k0 + bk;
      const int64_t n = n0 + bn;
      b_tile[bk][bn] = k_b < K && n < N ? kf_to_float(b[int64_t(k_b) * N + n]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kK; ++kk) {
      float a_frag[kMicro], b_frag[kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
        a_frag[i] = a_tile[kk][ty + i * kLanes];
        b_frag[i] = b_tile[kk][tx + i * kLanes];
      }
#pragma unroll
      for (int i = 0; i < kMicro; ++i) {
#pragma unroll
        for (int j = 0; j < kMicro; ++j) {
          acc[i][j] = fmaf(a_frag[i], b_frag[j], acc[i][j]);
        }
      }
    }
    __syncthreads();  // the tiles are overwritten by the next slice
  }
#pragma unroll
  for (int i = 0; i < kMicro; ++i) {
    const int64_t m = m0 + ty + i * kLanes;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < kMicro; ++j) {
      const int64_t n = n0 + tx + j * kLanes;
      if (n < N) c[m * N + n] = kf_from_float<kf_elem>(acc[i][j] + term(m, n));
    }
  }
}

}  // namespace plain_gemm

// C = A @ B + term(m, n), on `stream`; KF_ERR_UNSUPPORTED where N needs more than 65535 blocks.
template <class Term>
int run_plain_gemm(const kf_elem* a, const kf_elem* b, kf_elem* c, int M, int N, int K, Term term,
                   cudaStream_t stream) {
  using namespace plain_gemm;
  const int64_t m_blocks = (int64_t(M) + kTile - 1) / kTile;
  const int64_t n_blocks = (int64_t(N) + kTile - 1) / kTile;
  if (n_blocks > 65535) return KF_ERR_UNSUPPORTED;  // grid.y's limit
  const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(n_blocks));
  kernel<Term><<<grid, kThreads, kSmemBytes, stream>>>(a, b, c, M, N, K, term);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

}  // namespace kf

#endif  // KFORGE_GEMM_EPILOGUE_CUH_
