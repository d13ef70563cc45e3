/* kforge
 * op: matmul_residual
 * backend: cuda
 * dtypes: bf16, f16
 * param: TILE_M = 128 in {64, 128, 256}
 * param: TILE_N = 256 in {64, 128, 192, 256}
 * param: TILE_K = 64 in {32, 64, 128}
 * param: CLUSTER_M = 2 in {1, 2}
 * param: CLUSTER_N = 1 in {1, 2}
 * param: STAGES = 4 in {2, 3, 4, 5, 6, 7, 8}
 * param: SCHEDULE = 0 in {0, 1}
 * param: EPILOGUE = 0 in {0, 1}
 * param: RASTER = 0 in {0, 1, 2}
 * param: SWIZZLE = 1 in {1, 2, 4, 8}
 * param: SPLIT = 0 in {0, 1}
 * # wgmma and the TMA: Hopper (sm_90a) alone. First, so that it is what another GPU is told.
 * require: cc == 90
 * # Cooperative: the two consumer warp groups take 64-row wgmma atoms side by side along M, so
 * # a tile is a whole number of 128-row pairs. Ping-pong: one warp group per tile, 64-row atoms.
 * require: SCHEDULE == 0 ? TILE_M % 128 == 0 : TILE_M % 64 == 0
 * # fp32 accumulators per consumer thread. A consumer warp group gets 232 or 240 registers
 * # (setmaxnreg): 192 accumulators compile without spills, 256 spill (nvcc 13.0).
 * derive: ACC_REGS = TILE_M * TILE_N / (SCHEDULE == 0 ? 256 : 128)
 * require: ACC_REGS <= 192
 * # CUTLASS's ping-pong kernel has no stream-K scheduler.
 * require: SPLIT == 0 || SCHEDULE == 0
 * # shared memory: the STAGES-deep ring of A and B tiles; the TMA epilogue's buffers of one
 * # epilogue sub-tile each (EPI_ROWS = min(TILE_M, 128 or 64) rows x 32): R's sub-tiles are
 * # loaded into EPI_STAGES of them and C is written back from the same buffers (R and C are both
 * # 16-bit, so CUTLASS reuses R's buffers for C), as many as CUTLASS gives a source: one per
 * # sub-tile of the block's tile, at most 4 and at least one more than C's 2 (or 1) stores in
 * # flight; the pipelines' barriers and the 1024-byte alignment of swizzled tiles (an upper
 * # bound, checked by a static_assert).
 * derive: EPI_ROWS = min(TILE_M, SCHEDULE == 0 ? 128 : 64)
 * derive: EPI_TILES = TILE_M / EPI_ROWS * (TILE_N / 32)
 * derive: EPI_STAGES = max(min(EPI_TILES, 4), min(EPI_TILES, 2) + 1)
 * derive: EPI_BYTES = EPILOGUE == 0 ? EPI_STAGES * EPI_ROWS * 32 * elem_bytes : 0
 * derive: SMEM_BYTES = STAGES * (TILE_M + TILE_N) * TILE_K * elem_bytes + EPI_BYTES + 1024
 * require: SMEM_BYTES <= max_shared_per_block
 * threads: 384
 * shared_bytes: SMEM_BYTES
 * cluster: CLUSTER_M * CLUSTER_N
 * let: TILES_M = ceil_div(M, TILE_M)
 * let: TILES_N = ceil_div(N, TILE_N)
 * let: CLUSTERED_M = ceil_div(TILES_M, CLUSTER_M) * CLUSTER_M
 * let: CLUSTERED_N = ceil_div(TILES_N, CLUSTER_N) * CLUSTER_N
 * let: SHORT_SIDE = min(CLUSTERED_M, CLUSTERED_N)
 * let: WIDEST_BAND = SHORT_SIDE >= 6 ? 8 : (SHORT_SIDE >= 3 ? 4 : (SHORT_SIDE >= 2 ? 2 : 1))
 * let: BAND = min(SWIZZLE, WIDEST_BAND)
 * let: SLOTS_M = ceil_div(TILES_M, BAND * CLUSTER_M) * BAND * CLUSTER_M
 * let: SLOTS_N = ceil_div(TILES_N, BAND * CLUSTER_N) * BAND * CLUSTER_N
 * busy: ceil_div(SLOTS_M * SLOTS_N, sm_count) * TILE_M * TILE_N * K
 * uses: cutlass
 */
// Hopper tensor-core GEMM with a fused residual add on CUTLASS 3 / CuTe: C[M, N] = A[M, K] @
// B[K, N] + R[M, N], all row-major, bf16 or f16 in and out, fp32 accumulation; R is added in
// fp32 and each element rounded once. The residual after a Llama or Qwen2 block's o_proj and
// down_proj.
//
// Idea: matmul_wgmma.cu's kernel (the same mainloop, schedules, clusters, tile scheduler and
// tunables; see that file for the design) whose epilogue reads R as the GEMM's source operand:
// CUTLASS's fusion operation LinearCombination, D = alpha * acc + beta * C, with C = R,
// alpha = 1 and beta = 1. R is read once, in the epilogue, instead of C being written and read
// back by a second kernel.
//
//   - EPILOGUE 0 (TMA epilogue): a producer warp loads R's epilogue sub-tiles with TMA into
//     shared memory ahead of the consumers, who add them to the accumulators and stage C in the
//     same buffers for its TMA stores.
//   - EPILOGUE 1 (direct register stores): each thread loads its R elements from global memory
//     next to its accumulators and stores C from registers (no shared memory).
//
// TMA needs 16-byte aligned base pointers and row strides: K % 8 == 0, N % 8 == 0 and R aligned
// too. Any other shape (and K == 0, which CUTLASS's mainloop does not handle) takes the plain
// path of kforge/gemm_epilogue.cuh: a bounds-checked shared-memory tiled FFMA kernel that adds R
// before its one rounding. M needs nothing: TMA clips rows past M on load and store.
//
// The header's busy: and let: lines are matmul_wgmma.cu's: the multiply-adds of the SM with the
// most of the scheduler's slots, for the library's choice of a row at a size without one.
//
// The kernel's host setup (cudaFuncSetAttribute, the clusters-per-device query) happens on a
// device's first call; later calls only encode the TMA descriptors and launch, so they can be
// captured into a CUDA graph. All work is on args->stream.
//
// Tunables (as in matmul_wgmma.cu):
//   TILE_M, TILE_N   output tile of one block (of one consumer warp group under ping-pong).
//   TILE_K           K slice per pipeline stage; 64 16-bit elements = one 128-byte swizzle row.
//   CLUSTER_M/N      blocks per cluster along M / N (TMA multicast of B / A across them).
//   STAGES           depth of the shared-memory ring; more stages hide more load latency.
//   SCHEDULE         0 = KernelTmaWarpSpecializedCooperative, 1 = KernelTmaWarpSpecializedPingpong.
//   EPILOGUE         0 = TMA epilogue (R loaded and C stored through shared memory), 1 = direct
//                    register loads and stores.
//   RASTER           tile order: 1 = along M, 2 = along N, 0 = CUTLASS's heuristic.
//   SWIZZLE          width of the raster bands, in tiles (CUTLASS's max_swizzle_size).
//   SPLIT            0 = persistent data-parallel scheduler, 1 = stream-K scheduler.
#include <cstdint>
#include <type_traits>

#include "kforge/cutlass_gemm.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/gemm_epilogue.cuh"

namespace {

using Element = kf::CutlassElement;

using LayoutA = cutlass::layout::RowMajor;  // A: [M, K], K contiguous
using LayoutB = cutlass::layout::RowMajor;  // B: [K, N], N contiguous (MN-major for wgmma)
using LayoutC = cutlass::layout::RowMajor;  // R: [M, N], the epilogue's source
using LayoutD = cutlass::layout::RowMajor;  // C: [M, N]
using Accumulator = float;

// TMA's 16-byte rule in elements: the alignment every operand's rows and base must have.
constexpr int kAlignment = 16 / int(sizeof(Element));

using TileShape = cute::Shape<cute::Int<TILE_M>, cute::Int<TILE_N>, cute::Int<TILE_K>>;
using ClusterShape = cute::Shape<cute::Int<CLUSTER_M>, cute::Int<CLUSTER_N>, cute::_1>;

using MainloopSchedule =
    std::conditional_t<SCHEDULE == 0, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                       cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
// The TMA epilogue must match the mainloop's warp-group arrangement.
using TmaEpilogueSchedule =
    std::conditional_t<SCHEDULE == 0, cutlass::epilogue::TmaWarpSpecializedCooperative,
                       cutlass::epilogue::TmaWarpSpecialized>;
using EpilogueSchedule = std::conditional_t<EPILOGUE == 0, TmaEpilogueSchedule,
                                            cutlass::epilogue::NoSmemWarpSpecialized>;
using TileSchedulerTag = std::conditional_t<SPLIT == 0, cutlass::gemm::PersistentScheduler,
                                            cutlass::gemm::StreamKScheduler>;
static_assert(SPLIT == 0 || SCHEDULE == 0, "the ping-pong kernel has no stream-K scheduler");

// D = alpha * acc + beta * C in fp32, rounded once to Element; C (= R) in Element.
using ResidualFusion = cutlass::epilogue::fusion::LinearCombination</*ElementOutput=*/Element,
                                                                    /*ElementCompute=*/float,
                                                                    /*ElementSource=*/Element,
                                                                    /*ElementScalar=*/float>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, float,
    /*ElementC=*/Element, LayoutC, kAlignment, /*ElementD=*/Element, LayoutD, kAlignment,
    EpilogueSchedule, ResidualFusion>::CollectiveOp;

// Explicit STAGES (not an automatic carve-out) so that the header's shared-memory bound holds.
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element,
    LayoutB, kAlignment, Accumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCount<STAGES>, MainloopSchedule>::CollectiveOp;

using ProblemShape = cute::Shape<int, int, int, int>;  // (M, N, K, batch = 1)
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                        CollectiveEpilogue, TileSchedulerTag>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

static_assert(GemmKernel::MaxThreadsPerBlock == 384, "the header's threads: line");
static_assert(GemmKernel::SharedStorageSize <= SMEM_BYTES, "the header's shared_bytes bound");

using StrideA = typename GemmKernel::StrideA;  // (M, K, batch): (K, 1, M * K)
using StrideB = typename GemmKernel::StrideB;  // (N, K, batch): (1, N, K * N)
using StrideC = typename GemmKernel::StrideC;  // (M, N, batch): (N, 1, M * N)
using StrideD = typename GemmKernel::StrideD;  // (M, N, batch): (N, 1, M * N)

// The plain path's residual: term(m, n) = R[m, n].
struct ResidualTerm {
  const kf_elem* r;  // r: [M, N]
  int64_t N;
  __device__ float operator()(int64_t m, int64_t n) const { return kf_to_float(r[m * N + n]); }
};

int run_wgmma(const kf_elem* a, const kf_elem* b, const kf_elem* r, kf_elem* c, int M, int N, int K,
              cudaStream_t stream) {
  typename Gemm::Arguments arguments{};
  arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  arguments.problem_shape = ProblemShape{M, N, K, 1};
  arguments.mainloop.ptr_A = reinterpret_cast<const Element*>(a);
  arguments.mainloop.dA = StrideA{int64_t(K), cute::_1{}, int64_t(M) * K};
  arguments.mainloop.ptr_B = reinterpret_cast<const Element*>(b);
  arguments.mainloop.dB = StrideB{cute::_1{}, int64_t(N), int64_t(K) * N};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 1.0f;
  arguments.epilogue.ptr_C = reinterpret_cast<const Element*>(r);
  arguments.epilogue.dC = StrideC{int64_t(N), cute::_1{}, int64_t(M) * N};
  arguments.epilogue.ptr_D = reinterpret_cast<Element*>(c);
  arguments.epilogue.dD = StrideD{int64_t(N), cute::_1{}, int64_t(M) * N};
  return kf::run_cutlass_gemm<Gemm, CLUSTER_M, CLUSTER_N>(arguments, RASTER, SWIZZLE, stream, [&] {
    return kf::run_plain_gemm(a, b, c, M, N, K, ResidualTerm{r, N}, stream);
  });
}

bool is_matrix(const kf_tensor& t, int64_t rows, int64_t cols) {
  return t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols && t.dtype == kf_elem_dtype;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& a = args->inputs[0];
  const kf_tensor& b = args->inputs[1];
  const kf_tensor& r = args->inputs[2];
  const kf_tensor& c = args->outputs[0];
  if (a.ndim != 2 || b.ndim != 2) return KF_ERR_UNSUPPORTED;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (!is_matrix(a, M, K) || !is_matrix(b, K, N) || !is_matrix(r, M, N) || !is_matrix(c, M, N)) {
    return KF_ERR_UNSUPPORTED;
  }
  // int indices with room for a tile past the end
  constexpr int64_t kMaxExtent = INT32_MAX / 2;
  if (M > kMaxExtent || N > kMaxExtent || K > kMaxExtent) return KF_ERR_UNSUPPORTED;
  if (M == 0 || N == 0) return KF_OK;

  const auto stream = static_cast<cudaStream_t>(args->stream);
  const auto* a_data = static_cast<const kf_elem*>(a.data);  // A: [M, K]
  const auto* b_data = static_cast<const kf_elem*>(b.data);  // B: [K, N]
  const auto* r_data = static_cast<const kf_elem*>(r.data);  // R: [M, N]
  auto* c_data = static_cast<kf_elem*>(c.data);              // C: [M, N]
  // K == 0: C is R; the mainloop would wait for a K tile that never comes.
  if (K == 0 || K % kAlignment != 0 || N % kAlignment != 0 || !kf::is_tma_aligned(a_data) ||
      !kf::is_tma_aligned(b_data) || !kf::is_tma_aligned(r_data) || !kf::is_tma_aligned(c_data)) {
    return kf::run_plain_gemm(a_data, b_data, c_data, int(M), int(N), int(K),
                              ResidualTerm{r_data, N}, stream);
  }

  return run_wgmma(a_data, b_data, r_data, c_data, int(M), int(N), int(K), stream);
}
