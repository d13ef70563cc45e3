// For kernel files built on CUTLASS's GEMM collectives (`uses: cutlass`): the headers they
// need, kf::CutlassElement (CUTLASS's type for the compiled 16-bit dtype), and the host side of
// a persistent CUTLASS GEMM:
//
//   - kf::GemmDeviceSetup / kf::setup_gemm_device: the per-device host setup (the SM count, the
//     shared-memory opt-in, how many clusters fit), done on a device's first call so that later
//     calls can be captured into a CUDA graph. kf::clusters_that_fit is its cluster count,
//     also used by files that launch kernels of their own (after their shared-memory opt-in).
//   - kf::run_cutlass_gemm: the launch once the operands and epilogue are set (the device's
//     setup, the scheduler's arguments, the workspace, initialize and run).
//   - kf::is_tma_aligned: TMA's 16-byte alignment of a base pointer.
#ifndef KFORGE_CUTLASS_GEMM_CUH_
#define KFORGE_CUTLASS_GEMM_CUH_

// wgmma shapes whose N is not a multiple of 32 or 64 (N = 176, 224) sit behind this switch.
// Without it, CuTe's builders tile a TILE_N of 176 with the largest enabled N that divides it,
// 16: eleven wgmmas per k-step instead of one. Tiles of 64, 128, 192 or 256 get the same atoms
// either way. It must precede every CuTe header, so files include this header before them.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif

// CUTLASS 4.2's sm100 collectives (pulled in by the builders' headers, never instantiated
// here) capture `this` implicitly, which C++20 deprecates: six warnings per compile otherwise.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 2908
#include <cute/tensor.hpp>

#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/numeric_types.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#pragma nv_diagnostic pop

#include <cstdint>

#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

namespace kf {

// kf_elem and CUTLASS's type of the same name share the 16-bit layout: pointers are
// reinterpreted, values never converted.
#if defined(KF_ELEM_BF16)
using CutlassElement = cutlass::bfloat16_t;
#elif defined(KF_ELEM_F16)
using CutlassElement = cutlass::half_t;
#else
#error "the CUTLASS kernel files are for bf16 and f16; fp32 has the CUDA-core files"
#endif
static_assert(sizeof(CutlassElement) == sizeof(kf_elem), "same storage");

// ---- per-device setup of a persistent CUTLASS kernel ------------------------------------------

struct GemmDeviceSetup {
  bool ready = false;
  int sm_count = 0;
  int max_active_clusters = 0;  // clusters of ClusterM x ClusterN that fit at once; 0: unknown
};

// Clusters of ClusterM x ClusterN blocks of `kernel` (`threads` each, `smem_bytes` of dynamic
// shared memory) that fit on the current device at once; 0 where the device does not say.
inline int clusters_that_fit(const void* kernel, int cluster_m, int cluster_n, int threads,
                             int smem_bytes) {
  cudaLaunchAttribute cluster_attr{};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = unsigned(cluster_m);
  cluster_attr.val.clusterDim.y = unsigned(cluster_n);
  cluster_attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(cluster_m), unsigned(cluster_n), 1);
  config.blockDim = dim3(unsigned(threads), 1, 1);
  config.dynamicSmemBytes = size_t(smem_bytes);
  config.attrs = &cluster_attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

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
  // clusters than fit would leave a second wave of one cluster per SM pair. 0: CUTLASS's
  // estimate then.
  setup.max_active_clusters =
      clusters_that_fit(kernel, ClusterM, ClusterN, GemmKernel::MaxThreadsPerBlock, kSmemBytes);
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
  GemmDeviceSetup& setup = setups[device];
  if (!setup_gemm_device<typename Gemm::GemmKernel, ClusterM, ClusterN>(device, setup)) {
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

inline bool is_tma_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace kf

#endif  // KFORGE_CUTLASS_GEMM_CUH_
