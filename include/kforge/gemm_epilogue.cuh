// For the CUTLASS GEMM files whose epilogue adds a term to A @ B (matmul_bias_wgmma.cu,
// matmul_residual_wgmma.cu): what they share besides their epilogue.
//
//   - kf::GemmDeviceSetup / kf::setup_gemm_device: the per-device host setup of a persistent
//     CUTLASS kernel (the SM count, the shared-memory opt-in, how many clusters fit), done on a
//     device's first call so that later calls can be captured into a CUDA graph.
//   - kf::run_cutlass_gemm: the launch of such a kernel once its operands and epilogue are set
//     (the device's setup, the scheduler's arguments, the workspace, initialize and run).
//   - kf::run_plain_gemm: C = A @ B + term(m, n) for the shapes TMA cannot address (K or N not a
//     multiple of 8, misaligned pointers, K == 0): a bounds-checked shared-memory tiled FFMA
//     kernel with fp32 accumulation, correct at any size, not fast.
#ifndef KFORGE_GEMM_EPILOGUE_CUH_
#define KFORGE_GEMM_EPILOGUE_CUH_

#include <cstdint>

#include "kforge/cutlass_gemm.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

namespace kf {

// ---- per-device setup of a persistent CUTLASS kernel ------------------------------------------

struct GemmDeviceSetup {
  bool ready = false;
  int sm_count = 0;
  int max_active_clusters = 0;  // clusters of ClusterM x ClusterN that fit at once; 0: unknown
};

// Fills `setup` for `device` once; false when a query fails.
template <class GemmKernel, int ClusterM, int ClusterN>
bool setup_gemm_device(int device, GemmDeviceSetup& setup) {
  if (setup.ready) return true;
  if (cudaDeviceGetAttribute(&setup.sm_count, cudaDevAttrMultiProcessorCount, device) !=
      cudaSuccess) {
    return false;
  }
  const void* kernel = reinterpret_cast<const void*>(cutlass::device_kernel<GemmKernel>);
  constexpr int kSmemBytes = GemmKernel::SharedStorageSize;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
      cudaSuccess) {
    return false;
  }
  // Without this count CUTLASS guesses from the GPC layout of a full GH100; a grid of more
  // clusters than fit would leave a second wave of one cluster per SM pair.
  cudaLaunchAttribute cluster_attr{};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = ClusterM;
  cluster_attr.val.clusterDim.y = ClusterN;
  cluster_attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(ClusterM, ClusterN, 1);
  config.blockDim = dim3(GemmKernel::MaxThreadsPerBlock, 1, 1);
  config.dynamicSmemBytes = kSmemBytes;
  config.attrs = &cluster_attr;
  config.numAttrs = 1;
  if (cudaOccupancyMaxActiveClusters(&setup.max_active_clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    setup.max_active_clusters = 0;  // CUTLASS's estimate then
  }
  setup.ready = true;
  return true;
}

// ---- the launch ------------------------------------------------------------------------------

// Runs `Gemm` with `arguments` (problem, operands and epilogue set) on the current device: its
// setup on the device's first call, the scheduler's hardware info, raster order (0: CUTLASS's
// heuristic, 1: along M, 2: along N) and swizzle, the workspace (Stream-K's partial sums and tile
// flags; empty for the persistent scheduler; kept between calls), then initialize and run.
// Returns `plain()` instead when CUTLASS cannot implement the arguments.
template <class Gemm, int ClusterM, int ClusterN, class Plain>
int run_cutlass_gemm(typename Gemm::Arguments arguments, int raster, int swizzle,
                     cudaStream_t stream, Plain plain) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return KF_ERR_LAUNCH;
  constexpr int kMaxDevices = 64;
  static GemmDeviceSetup setups[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return KF_ERR_UNSUPPORTED;
  const GemmDeviceSetup& setup = setups[device];
  if (!setup_gemm_device<typename Gemm::GemmKernel, ClusterM, ClusterN>(device, setups[device])) {
    cudaGetLastError();
    return KF_ERR_LAUNCH;
  }
  arguments.hw_info.device_id = device;
  arguments.hw_info.sm_count = setup.sm_count;
  arguments.hw_info.max_active_clusters = setup.max_active_clusters;
  using RasterOrder = decltype(arguments.scheduler.raster_order);
  arguments.scheduler.max_swizzle_size = swizzle;
  arguments.scheduler.raster_order = raster == 1   ? RasterOrder::AlongM
                                     : raster == 2 ? RasterOrder::AlongN
                                                   : RasterOrder::Heuristic;

  if (Gemm::can_implement(arguments) != cutlass::Status::kSuccess) return plain();
  static Workspace workspace;
  const size_t workspace_bytes = Gemm::get_workspace_size(arguments);
  void* workspace_data = workspace.get(workspace_bytes, stream);
  if (workspace_bytes > 0 && workspace_data == nullptr) return KF_ERR_OUT_OF_MEMORY;

  Gemm gemm;
  if (gemm.initialize(arguments, workspace_data, stream) != cutlass::Status::kSuccess) {
    return KF_ERR_LAUNCH;
  }
  if (gemm.run(stream) != cutlass::Status::kSuccess) return KF_ERR_LAUNCH;
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

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

inline bool is_tma_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace kf

#endif  // KFORGE_GEMM_EPILOGUE_CUH_
