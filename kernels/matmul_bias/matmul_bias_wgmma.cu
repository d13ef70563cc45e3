/* kforge
 * op: matmul_bias
 * backend: cuda
 * dtypes: bf16, f16
 * param: TILE_M = 128 in {64, 128, 256}
 * param: TILE_N = 256 in {64, 128, 192, 256}
 * param: TILE_K = 64 in {32, 64, 128}
 * param: CLUSTER_M = 2 in {1, 2}
 * param: CLUSTER_N = 1 in {1, 2, 4}
 * param: STAGES = 4 in {2, 3, 4, 5, 6, 7, 8}
 * param: SCHEDULE = 0 in {0, 1}
 * param: EPILOGUE = 0 in {0, 1}
 * param: RASTER = 0 in {0, 1, 2}
 * param: SWIZZLE = 1 in {1, 2, 4, 8}
 * param: SPLIT = 0 in {0, 1}
 * param: BIAS_PREFETCH = 0 in {0, 1}
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
 * # The prefetch is the TMA epilogue's (EPILOGUE 1 reads the bias as its source).
 * require: EPILOGUE == 0 || BIAS_PREFETCH == 0
 * # shared memory: the STAGES-deep ring of A and B tiles; the TMA epilogue's two C staging
 * # buffers of one epilogue sub-tile (min(TILE_M, 128 or 64) x 32) and its copy of the tile's
 * # TILE_N bias values; the pipelines' barriers and the 1024-byte alignment of swizzled tiles
 * # (an upper bound, checked by a static_assert).
 * derive: EPI_ROWS = min(TILE_M, SCHEDULE == 0 ? 128 : 64)
 * derive: EPI_BYTES = EPILOGUE == 0 ? (2 * EPI_ROWS * 32 + TILE_N) * elem_bytes : 0
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
// Hopper tensor-core GEMM with a fused bias on CUTLASS 3 / CuTe: C[M, N] = A[M, K] @ B[K, N] +
// bias[N], all row-major, bf16 or f16 in and out, fp32 accumulation; the bias is added in fp32
// and each element rounded once. nn.Linear with a bias (Qwen2's q, k and v projections).
//
// Idea: matmul_wgmma.cu's kernel (the same mainloop, schedules, clusters, tile scheduler and
// tunables; see that file for the design) with the bias added in the epilogue, where the
// accumulators are still in registers, instead of a second pass over C:
//
//   - EPILOGUE 0 (TMA epilogue) takes CUTLASS's fusion operation LinCombPerColBias:
//     D = alpha * acc + beta * C + bias[n], with alpha = 1 and no C (ElementC = void, so nothing
//     is loaded for it). The epilogue reads the tile's TILE_N bias values once into shared
//     memory and broadcasts each down its column; D is staged through shared memory and stored
//     with TMA as in matmul_wgmma.cu.
//     With BIAS_PREFETCH 1 the same sum is an explicit fusion tree whose bias node also
//     prefetches the tile's bias into L2 ahead of the epilogue (L2PrefetchedBias).
//   - EPILOGUE 1 (direct register stores) has no fusion operations in CUTLASS, only the linear
//     combination D = alpha * acc + beta * C. The bias is passed as that C with a row stride of
//     0, so that every row reads the same N values (from L1/L2), with beta = 1.
//
// TMA needs 16-byte aligned base pointers and row strides: K % 8 == 0, N % 8 == 0 and the bias
// aligned too (CUTLASS loads it in 16-byte vectors). Any other shape (and K == 0, which CUTLASS's
// mainloop does not handle) takes the plain path of kforge/gemm_epilogue.cuh: a bounds-checked
// shared-memory tiled FFMA kernel that adds the bias before its one rounding. M needs nothing:
// TMA clips rows past M on load and store.
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
//                    CLUSTER_N 4 was meant for narrow outputs (N = 256 at TILE_N 64), whose
//                    blocks each read the same rows of A from L2. On an H100 only 30 clusters
//                    of 4 one-block-per-SM blocks fit at once (120 of 132 SMs), so 32 clusters
//                    take two waves; at 4096x256x1536 no cluster at all measured fastest.
//   STAGES           depth of the shared-memory ring; more stages hide more load latency.
//   SCHEDULE         0 = KernelTmaWarpSpecializedCooperative, 1 = KernelTmaWarpSpecializedPingpong.
//   EPILOGUE         0 = TMA-store epilogue with LinCombPerColBias, 1 = direct register stores
//                    with the bias as a row-broadcast source.
//   RASTER           tile order: 1 = along M, 2 = along N, 0 = CUTLASS's heuristic.
//   SWIZZLE          width of the raster bands, in tiles (CUTLASS's max_swizzle_size).
//   SPLIT            0 = persistent data-parallel scheduler, 1 = stream-K scheduler.
//   BIAS_PREFETCH    1 = the epilogue's producer warp prefetches the tile's bias into L2
//                    ahead of the tile's epilogue (EPILOGUE 0). CUTLASS's row broadcast reads
//                    the bias only when the epilogue begins, with the tile's result held in
//                    registers, so on a cold call every tile waits for DRAM there. At
//                    4096x256x1536 (one tile per SM, 12 us) the prefetch saved 0.21-0.26 us on
//                    the H200.
#include <cstdint>
#include <type_traits>

#include "kforge/cutlass_gemm.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/gemm_epilogue.cuh"

namespace {

using Element = kf::CutlassElement;

using LayoutA = cutlass::layout::RowMajor;  // A: [M, K], K contiguous
using LayoutB = cutlass::layout::RowMajor;  // B: [K, N], N contiguous (MN-major for wgmma)
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
using TileSchedulerTag = std::conditional_t<SPLIT == 0, cutlass::gemm::PersistentScheduler,
                                            cutlass::gemm::StreamKScheduler>;
static_assert(SPLIT == 0 || SCHEDULE == 0, "the ping-pong kernel has no stream-K scheduler");

// EPILOGUE 0: D = acc + bias[n] (alpha = 1, beta = 0), bias in Element, computed in fp32.
// ElementC = void: no source operand, nothing read from C.
using BiasFusion = cutlass::epilogue::fusion::LinCombPerColBias</*ElementOutput=*/Element,
                                                                /*ElementCompute=*/float,
                                                                /*ElementBias=*/Element>;
// BIAS_PREFETCH 1: D = acc + bias[n] in fp32, rounded once, as BiasFusion; the bias is CUTLASS's
// row broadcast that also asks for the epilogue's producer warp, which runs each tile's
// producer-load callbacks ahead of the tile's epilogue (for a block's first tile, as the kernel
// starts; for the next, once the epilogue has taken the last one's). Its only load is an L2
// prefetch of the tile's bias lines: nothing lands in shared memory, so no barrier orders it,
// and a prefetch cannot fault or change a result.
using BiasBroadcast =
    cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, float,
                                                cute::Stride<cute::_0, cute::_1, int64_t>>;
struct L2PrefetchedBias : BiasBroadcast {
  using BiasBroadcast::BiasBroadcast;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return true; }

  struct Prefetch : cutlass::epilogue::fusion::EmptyProducerLoadCallbacks {
    const Element* tile_bias;  // the tile's first bias value
    int count;                 // its bias values inside N
    int lane;

    CUTLASS_DEVICE void begin() {
      constexpr int kPerLine = 128 / int(sizeof(Element));
      for (int i = lane * kPerLine; i < count; i += 32 * kPerLine) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(tile_bias + i));
      }
    }
  };

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const& args) {
    const int n0 = int(cute::get<1>(args.tile_coord_mnkl)) * TILE_N;
    const int n_total = int(cute::get<1>(args.problem_shape_mnkl));
    const int count = params.ptr_row == nullptr ? 0 : cute::min(TILE_N, n_total - n0);
    return Prefetch{{}, params.ptr_row + (count > 0 ? n0 : 0), count, args.thread_idx % 32};
  }
};
using PrefetchedBiasFusion = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, Element, float,
                                           cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch, L2PrefetchedBias>;

// EPILOGUE 1: D = acc + 1 * C, where C is the bias with a row stride of 0.
using BroadcastFusion = cutlass::epilogue::fusion::LinearCombination</*ElementOutput=*/Element,
                                                                     /*ElementCompute=*/float,
                                                                     /*ElementSource=*/Element,
                                                                     /*ElementScalar=*/float>;

template <int kEpilogue>
struct EpilogueChoice;
template <>
struct EpilogueChoice<0> {
  using Op = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, float,
      /*ElementC=*/void, LayoutD, kAlignment, /*ElementD=*/Element, LayoutD, kAlignment,
      TmaEpilogueSchedule,
      std::conditional_t<BIAS_PREFETCH == 1, PrefetchedBiasFusion, BiasFusion>>::CollectiveOp;
};
template <>
struct EpilogueChoice<1> {
  using Op = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, float,
      /*ElementC=*/Element, LayoutD, /*AlignmentC=*/1, /*ElementD=*/Element, LayoutD, kAlignment,
      cutlass::epilogue::NoSmemWarpSpecialized, BroadcastFusion>::CollectiveOp;
};
using CollectiveEpilogue = typename EpilogueChoice<EPILOGUE>::Op;

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
using StrideC = typename GemmKernel::StrideC;  // (M, N, batch)
using StrideD = typename GemmKernel::StrideD;  // (M, N, batch): (N, 1, M * N)

// The plain path's bias: term(m, n) = bias[n].
struct BiasTerm {
  const kf_elem* bias;  // bias: [N]
  __device__ float operator()(int64_t, int64_t n) const { return kf_to_float(bias[n]); }
};

// Fills the epilogue's arguments of the bias for the chosen EPILOGUE (a template, so that only
// that epilogue's members are named).
template <class EpilogueArguments>
void add_bias(EpilogueArguments& epilogue, const kf_elem* bias, int M, int N) {
  if constexpr (EPILOGUE == 0) {
    if constexpr (BIAS_PREFETCH == 1) {
      // the tree's arguments: the accumulator's (none), the bias's, the sum's (none)
      epilogue.thread = {{},
                         {reinterpret_cast<const Element*>(bias),
                          Element(0),
                          {cute::_0{}, cute::_1{}, int64_t(0)}},
                         {}};
    } else {
      epilogue.thread.alpha = 1.0f;
      epilogue.thread.beta = 0.0f;
      epilogue.thread.bias_ptr = reinterpret_cast<const Element*>(bias);
    }
    epilogue.ptr_C = nullptr;
    epilogue.dC = StrideC{int64_t(N), cute::_1{}, int64_t(M) * N};
  } else {
    // bias as a source [M, N] whose rows all start at bias[0]: strides (0, 1, 0).
    epilogue.thread.alpha = 1.0f;
    epilogue.thread.beta = 1.0f;
    epilogue.ptr_C = reinterpret_cast<const Element*>(bias);
    epilogue.dC = StrideC{int64_t(0), cute::_1{}, int64_t(0)};
  }
}

int run_wgmma(const kf_elem* a, const kf_elem* b, const kf_elem* bias, kf_elem* c, int M, int N,
              int K, cudaStream_t stream) {
  typename Gemm::Arguments arguments{};
  arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  arguments.problem_shape = ProblemShape{M, N, K, 1};
  arguments.mainloop.ptr_A = reinterpret_cast<const Element*>(a);
  arguments.mainloop.dA = StrideA{int64_t(K), cute::_1{}, int64_t(M) * K};
  arguments.mainloop.ptr_B = reinterpret_cast<const Element*>(b);
  arguments.mainloop.dB = StrideB{cute::_1{}, int64_t(N), int64_t(K) * N};
  add_bias(arguments.epilogue, bias, M, N);
  arguments.epilogue.ptr_D = reinterpret_cast<Element*>(c);
  arguments.epilogue.dD = StrideD{int64_t(N), cute::_1{}, int64_t(M) * N};
  return kf::run_cutlass_gemm<Gemm, CLUSTER_M, CLUSTER_N>(arguments, RASTER, SWIZZLE, stream, [&] {
    return kf::run_plain_gemm(a, b, c, M, N, K, BiasTerm{bias}, stream);
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
  const kf_tensor& bias = args->inputs[2];
  const kf_tensor& c = args->outputs[0];
  if (a.ndim != 2 || b.ndim != 2) return KF_ERR_UNSUPPORTED;
  const int64_t M = a.shape[0], K = a.shape[1], N = b.shape[1];
  if (!is_matrix(a, M, K) || !is_matrix(b, K, N) || !is_matrix(c, M, N)) {
    return KF_ERR_UNSUPPORTED;
  }
  if (bias.ndim != 1 || bias.shape[0] != N || bias.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  // int indices with room for a tile past the end
  constexpr int64_t kMaxExtent = INT32_MAX / 2;
  if (M > kMaxExtent || N > kMaxExtent || K > kMaxExtent) return KF_ERR_UNSUPPORTED;
  if (M == 0 || N == 0) return KF_OK;

  const auto stream = static_cast<cudaStream_t>(args->stream);
  const auto* a_data = static_cast<const kf_elem*>(a.data);        // A: [M, K]
  const auto* b_data = static_cast<const kf_elem*>(b.data);        // B: [K, N]
  const auto* bias_data = static_cast<const kf_elem*>(bias.data);  // bias: [N]
  auto* c_data = static_cast<kf_elem*>(c.data);                    // C: [M, N]
  // K == 0: C is the bias on every row; the mainloop would wait for a K tile that never comes.
  if (K == 0 || K % kAlignment != 0 || N % kAlignment != 0 || !kf::is_tma_aligned(a_data) ||
      !kf::is_tma_aligned(b_data) || !kf::is_tma_aligned(bias_data) ||
      !kf::is_tma_aligned(c_data)) {
    return kf::run_plain_gemm(a_data, b_data, c_data, int(M), int(N), int(K), BiasTerm{bias_data},
                              stream);
  }

  return run_wgmma(a_data, b_data, bias_data, c_data, int(M), int(N), int(K), stream);
}
