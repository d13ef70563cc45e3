/* kforge
 * op: fused_mlp
 * backend: cuda
 * dtypes: bf16, f16
 * param: TILE_M = 128 in {128, 256}
 * param: TILE_N = 128 in {64, 80, 96, 128}
 * param: STAGES = 4 in {2, 3, 4, 5, 6}
 * param: CLUSTER_M = 2 in {1, 2}
 * param: DOWN_TILE_N = 256 in {128, 256}
 * param: DOWN_STAGES = 4 in {3, 4, 5}
 * param: DOWN_CLUSTER_M = 2 in {1, 2}
 * param: DOWN_SWIZZLE = 1 in {1, 2, 4, 8}
 * param: DOWN_SPLIT = 0 in {0, 1}
 * param: PERSISTENT = 0 in {0, 1}
 * # gate-up: each consumer warp group holds a TILE_M / 2 x 2 TILE_N fp32 accumulator,
 * # [gate | up] (a consumer gets 232 registers by setmaxnreg; 192 accumulators fit, 256
 * # spill). Down: a 128 x DOWN_TILE_N cooperative tile, 64 x DOWN_TILE_N per warp group.
 * derive: ACC_REGS = 2 * TILE_M * TILE_N / 256
 * require: ACC_REGS <= 192
 * # Each block of a cluster loads its share of a weight slice, TILE_N / CLUSTER_M rows; CuTe's
 * # TMA partition of the half stage wants that share in 16-row pairs of swizzle atoms (80 and
 * # 88 at CLUSTER_M 2, and 88 at 1, do not compile).
 * require: TILE_N % (16 * CLUSTER_M) == 0
 * # shared memory: each kernel's ring of A and B stages (gate-up's B stage holds both weights'
 * # slices), plus (down) the TMA epilogue's two 128 x 32 staging buffers, barriers and
 * # alignment (static_asserts check both bounds).
 * derive: GATE_UP_SMEM = STAGES * (TILE_M + 2 * TILE_N) * 64 * elem_bytes + 1024
 * derive: DOWN_EPI_SMEM = 2 * 128 * 32 * elem_bytes
 * derive: DOWN_SMEM = DOWN_STAGES * (128 + DOWN_TILE_N) * 64 * elem_bytes + DOWN_EPI_SMEM + 1024
 * derive: SMEM_BYTES = max(GATE_UP_SMEM, DOWN_SMEM)
 * require: SMEM_BYTES <= max_shared_per_block
 * threads: 384
 * shared_bytes: SMEM_BYTES
 * cluster: max(CLUSTER_M, DOWN_CLUSTER_M)
 * let: GATE_UP_BLOCKS_M = ceil_div(ceil_div(batch, TILE_M), CLUSTER_M) * CLUSTER_M
 * busy: ceil_div(GATE_UP_BLOCKS_M * ceil_div(hidden, TILE_N), sm_count) * TILE_M * 2 * TILE_N * dim
 * let: DOWN_TILES_M = ceil_div(batch, 128)
 * let: DOWN_TILES_N = ceil_div(dim, DOWN_TILE_N)
 * let: SHORT_SIDE = min(ceil_div(DOWN_TILES_M, DOWN_CLUSTER_M) * DOWN_CLUSTER_M, DOWN_TILES_N)
 * let: WIDEST_BAND = SHORT_SIDE >= 6 ? 8 : (SHORT_SIDE >= 3 ? 4 : (SHORT_SIDE >= 2 ? 2 : 1))
 * let: BAND = min(DOWN_SWIZZLE, WIDEST_BAND)
 * let: DOWN_SLOTS_M = ceil_div(DOWN_TILES_M, BAND * DOWN_CLUSTER_M) * BAND * DOWN_CLUSTER_M
 * let: DOWN_SLOTS_N = ceil_div(DOWN_TILES_N, BAND) * BAND
 * busy: ceil_div(DOWN_SLOTS_M * DOWN_SLOTS_N, sm_count) * 128 * DOWN_TILE_N * hidden
 * # wgmma and the TMA: Hopper (sm_90a) alone
 * require: cc == 90
 * uses: cutlass
 */
// SwiGLU MLP on Hopper tensor cores: y = (silu(x W_gate^T) * (x W_up^T)) W_down^T, bf16 or f16
// in and out, fp32 accumulation, h = silu(gate) * up rounded once to the element type (as
// PyTorch's eager MLP stores it).
//
// Idea: two kernels instead of eager's five (gate GEMM, up GEMM, silu, mul, down GEMM).
//
//   1. gate-up (a kernel written here on CUTLASS's warp-specialized TMA + wgmma mainloop):
//      one block owns a TILE_M x TILE_N tile of h. Its producer thread loads, per K slice,
//      x's TILE_M x 64 slice and TILE_N rows of w_gate and of w_up stacked into one 2 TILE_N x 64
//      operand in the same ring stage. The two consumer warp groups multiply x by the stacked
//      operand with 64 x 2 TILE_N wgmmas (256 wide at TILE_N 128: the widest, most efficient
//      shape) into one accumulator holding [gate | up] for the same columns of h, so x is
//      loaded once for both products and neither product is ever written. The epilogue
//      computes silu(gate) * up in fp32 (each thread holds both halves of its columns) and
//      writes h once. Blocks along M are launched next to each other, so a wave shares the
//      weight tiles in L2; a cluster of CLUSTER_M blocks along M multicasts each weight slice
//      to all of them (one L2 read for CLUSTER_M blocks).
//   2. down: y = h W_down^T, CUTLASS's persistent cooperative GEMM (as in matmul_wgmma.cu).
//
// Eager PyTorch writes gate and up (2 * batch * hidden elements), reads them back for silu
// and mul, and writes silu's output and h: about 7 batch x hidden tensors of traffic against 2
// here (h written and read). The GEMM work is the same, so the gain is that traffic plus three
// launches, and it is bounded by it.
//
// h lives in a kf::Workspace (kept between calls, grown in stream order): batch * hidden
// elements. Both weight operands are K-major ([out, in], as nn.Linear stores them), the layout
// wgmma reads best. TMA needs 16-byte aligned bases and rows (dim % 8 == 0, hidden % 8 == 0);
// other shapes take a plain path (one thread per output, fp32 sums; correct, slow).
//
// The header's two busy: lines add up to the multiply-adds of the SM with the most work, kernel
// by kernel, in waves of one block per SM: gate-up's TILE_M x TILE_N tiles of h, each a GEMM 2
// TILE_N wide (gate and up), over whole clusters along M (a block past the last row still runs
// its K loop); then down's 128 x DOWN_TILE_N tiles of y, counted in the slots of CUTLASS's
// scheduler (whole bands of DOWN_SWIZZLE clusters, as in matmul_wgmma.cu: at batch 1024 an
// H200 row with DOWN_SWIZZLE 8 took 518 us against 390 for the row that differs from it only in
// DOWN_SWIZZLE 1). The library scales a table row's time by them to a size without a row.
//
// Tunables:
//   TILE_M            rows of h per gate-up block: 128 (each consumer warp group one 64-row
//                     wgmma atom) or 256 (two each, so a weight slice in shared memory serves
//                     twice the rows).
//   TILE_N            columns of h per gate-up block. With TILE_M 256 the accumulators cap it
//                     at 96; the widths between 64 and 128 let the tile count fill the last
//                     wave (2048 x 11008 in 256 x 96 tiles: 920 tiles, 6.97 waves of 132 SMs;
//                     in 128 x 128 tiles, 1376 tiles, 10.42 waves, the last 42% busy).
//   STAGES            depth of the gate-up ring (48 KB a stage at TILE_N 128; one block per
//                     SM either way, as 384 threads take the whole register file).
//   CLUSTER_M         gate-up blocks per cluster along M, sharing weight slices by multicast.
//   DOWN_TILE_N       columns of y per down tile (rows: 128).
//   DOWN_STAGES       depth of the down GEMM's ring.
//   DOWN_CLUSTER_M    down blocks per cluster along M.
//   DOWN_SWIZZLE      width, in tiles, of the bands the down GEMM's scheduler walks its tiles in
//                     (as SWIZZLE in matmul_wgmma.cu; raster order by CUTLASS's heuristic).
//   DOWN_SPLIT        the down GEMM's scheduler: 0, persistent data-parallel; 1, stream-K (the
//                     K loops of some tiles split over blocks where whole tiles would leave the
//                     last wave part-empty; partial sums through a kept workspace). On the
//                     H100, neither this nor DOWN_SWIZZLE paid at the headline or Llama's MLP
//                     (256 down tiles on 132 SMs: no thin last wave; bench/results/
//                     2026-11-27-H100-ffma-softmax-schedulers).
//   PERSISTENT        gate-up's grid: 0, a block per tile of h; 1, as many blocks (clusters) as
//                     fit at once, each walking tiles in the same order (m fastest, so the tiles
//                     in flight share weight slices in L2). Its producer goes on loading the
//                     next tile's first slices while the consumers run this tile's epilogue,
//                     and no block pays a launch and a barrier set-up per tile.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fused_mlp_common.cuh"
#include "kforge/cutlass_gemm.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

namespace {

using Element = kf::CutlassElement;

using Accumulator = float;
using LayoutActivations = cutlass::layout::RowMajor;  // x [batch, dim], h [batch, hidden]
// A weight [out, in] row-major is the GEMM's B operand (K = in, N = out) stored column-major.
using LayoutWeights = cutlass::layout::ColumnMajor;
constexpr int kAlignment = 16 / int(sizeof(Element));  // TMA's 16-byte rule, in elements

// ---- 1. gate-up --------------------------------------------------------------------------------

constexpr int kTileM = TILE_M;  // rows of h per block, over two consumer warp groups
constexpr int kTileK = 64;      // 64 16-bit elements: one 128-byte swizzle row
// What the consumers multiply: x's TILE_M x 64 slice by the stacked [w_gate rows; w_up rows]
// slice, 2 * TILE_N x 64, into one TILE_M x 2 TILE_N accumulator: [gate | up].
using StackedTile = cute::Shape<cute::Int<kTileM>, cute::Int<2 * TILE_N>, cute::Int<kTileK>>;
// What one weight's TMA loads: TILE_N rows of w_gate or of w_up.
using HalfTile = cute::Shape<cute::Int<kTileM>, cute::Int<TILE_N>, cute::Int<kTileK>>;
using GateUpCluster = cute::Shape<cute::Int<CLUSTER_M>, cute::_1, cute::_1>;

template <typename Tile>
using CooperativeMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutActivations, kAlignment,
    Element, LayoutWeights, kAlignment, Accumulator, Tile, GateUpCluster,
    cutlass::gemm::collective::StageCount<STAGES>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
// The mainloop of CUTLASS's cooperative kernel (wgmma consumers, mbarrier ring) on the stacked
// tile; the TMA descriptors and shared-memory layouts of the half tile, for the loads.
using GateUpMainloop = CooperativeMainloop<StackedTile>;
using HalfMainloop = CooperativeMainloop<HalfTile>;
using GateUpPipeline = typename GateUpMainloop::MainloopPipeline;
using GateUpPipelineState = typename GateUpMainloop::PipelineState;
using GateUpTiledMma = typename GateUpMainloop::TiledMma;

// The stacked B stage is the two half stages one after the other: rows [0, TILE_N) at offset
// 0 and rows [TILE_N, 2 TILE_N) at TILE_N * kTileK (swizzle atoms of 8 rows are stacked along
// N first), each laid out as the half tile's stage, a multiple of the 1024-byte swizzle period.
constexpr int kHalfStageElements = TILE_N * kTileK;
static_assert(cute::cosize_v<typename HalfMainloop::SmemLayoutB> == STAGES * kHalfStageElements);
static_assert(cute::cosize_v<typename GateUpMainloop::SmemLayoutB> ==
              2 * STAGES * kHalfStageElements);
static_assert(kHalfStageElements * sizeof(Element) % 1024 == 0, "whole swizzle periods");
static_assert(
    std::is_same_v<typename HalfMainloop::SmemLayoutA, typename GateUpMainloop::SmemLayoutA>,
    "the A ring is the same in both");

constexpr int kProducerThreads = 128;  // one warp group; its first warp issues the TMA loads
constexpr int kConsumerThreads = 256;  // two warp groups
constexpr int kGateUpThreads = kProducerThreads + kConsumerThreads;
// setmaxnreg: what the producer gives up and the consumers take (as CUTLASS's cooperative
// kernel does: 40 + 2 x 232 per thread fits the 64K-register file at 384 threads).
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
static_assert(cute::size(GateUpTiledMma{}) == kConsumerThreads, "two consumer warp groups");

struct GateUpShared {
  typename GateUpMainloop::TensorStorage tensors;  // first: the swizzled tiles want alignment
  alignas(16) typename GateUpMainloop::PipelineStorage pipeline;
};
static_assert(sizeof(GateUpShared) <= STAGES * (kTileM + 2 * TILE_N) * 64 * sizeof(Element) + 1024,
              "the header's GATE_UP_SMEM bound");

struct GateUpParams {
  typename HalfMainloop::Params gate;       // TMA descriptors of x and w_gate
  typename HalfMainloop::Params up;         // of x (unused) and w_up
  typename GateUpMainloop::Params stacked;  // what the consumers' mma() takes (it reads none)
  Element* h;                               // h: [batch, hidden]
  int batch, hidden, dim;
  int m_blocks;  // tiles of h along M, rounded up to whole clusters
  int n_tiles;   // tiles of h along N
};

// Calls f(m, n) for each tile of h this block computes, in order. A block per tile, or
// (PERSISTENT) a grid of whole clusters walking the tiles: cluster c takes cluster tiles c,
// c + clusters, ..., each CLUSTER_M tiles along M that share a weight slice (so both blocks of a
// cluster walk the same n, as the multicast needs), numbered m fastest.
template <typename F>
__device__ void for_each_tile(const GateUpParams& p, F&& f) {
  if constexpr (!PERSISTENT) {
    f(int(blockIdx.x), int(blockIdx.y));
  } else {
    const int rank = int(blockIdx.x) % CLUSTER_M;
    const int clusters = int(gridDim.x) / CLUSTER_M;
    const int m_groups = p.m_blocks / CLUSTER_M;
    const int64_t tiles = int64_t(m_groups) * p.n_tiles;
    for (int64_t t = int(blockIdx.x) / CLUSTER_M; t < tiles; t += clusters)
      f(int(t % m_groups) * CLUSTER_M + rank, int(t / m_groups));
  }
}

// silu(v) = v * sigmoid(v) in two MUFU instructions and no branch: e = 2^(-v log2 e) by
// ex2.approx and 1 / (1 + e) by rcp.approx, relative errors about 2^-22, far below h's one
// rounding to 16 bits. `v / (1 + __expf(-v))` compiles to an IEEE division, a range check and
// a slow-path branch per value; against that epilogue, with bounds checks on every store, this
// one cut the headline's time by 2.7% and Llama's MLP's by 6.4% (H200). Very negative v:
// e = inf, its reciprocal 0, silu -0.
__device__ __forceinline__ float silu(float v) {
  constexpr float kMinusLog2e = -1.4426950408889634f;
  float e, sigmoid;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * kMinusLog2e));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(sigmoid) : "f"(1.0f + e));
  return v * sigmoid;
}

// The producer's loop over tile (m, n): per K slice, x's slice and both weights' slices into
// one ring stage, all counted by the stage's "full" barrier. Weight slices are multicast to the
// cluster's CLUSTER_M blocks (each issues its share), x's are not (no two blocks share rows).
// `write` carries on from tile to tile.
__device__ void load_gate_up(const GateUpParams& p, GateUpPipeline& pipeline, GateUpShared& shared,
                             int k_tiles, int m, int n, GateUpPipelineState& write) {
  using namespace cute;
  const auto problem = make_shape(p.batch, p.hidden, p.dim, 1);
  HalfMainloop half;
  const auto gate_inputs = half.load_init(problem, p.gate);
  const auto up_inputs = half.load_init(problem, p.up);
  const uint32_t rank = block_rank_in_cluster();  // = its m within the cluster
  auto x_copy = p.gate.tma_load_a.get_slice(0);
  auto gate_copy = p.gate.tma_load_b.get_slice(rank);
  auto up_copy = p.up.tma_load_b.get_slice(rank);
  Tensor x_dst = x_copy.partition_D(make_tensor(make_smem_ptr(shared.tensors.smem_A.data()),
                                                typename HalfMainloop::SmemLayoutA{}));
  const auto b_half = [&](int stage, int which) {
    Element* base = shared.tensors.smem_B.data() + (2 * stage + which) * kHalfStageElements;
    return make_tensor(make_smem_ptr(base), typename HalfMainloop::SmemLayoutB{}(_, _, 0));
  };
  const uint16_t weight_mask = uint16_t((1u << CLUSTER_M) - 1);  // every block of the cluster

  Tensor x_src = x_copy.partition_S(get<0>(gate_inputs)(_, _, m, _, 0));  // (.., k)
  Tensor gate_src = gate_copy.partition_S(get<1>(gate_inputs)(_, _, n, _, 0));
  Tensor up_src = up_copy.partition_S(get<1>(up_inputs)(_, _, n, _, 0));
  for (int k = 0; k < k_tiles; ++k) {
    pipeline.producer_acquire(write);
    auto* full = pipeline.producer_get_barrier(write);
    const int stage = write.index();
    copy(p.gate.tma_load_a.with(*full, 0), x_src(_, _, _, k), x_dst(_, _, _, stage));
    copy(p.gate.tma_load_b.with(*full, weight_mask), gate_src(_, _, _, k),
         gate_copy.partition_D(b_half(stage, 0)));
    copy(p.up.tma_load_b.with(*full, weight_mask), up_src(_, _, _, k),
         up_copy.partition_D(b_half(stage, 1)));
    ++write;
  }
}

__global__ void __launch_bounds__(kGateUpThreads, 1)
    gate_up_kernel(const __grid_constant__ GateUpParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  extern __shared__ char smem[];
  GateUpShared& shared = *reinterpret_cast<GateUpShared*>(smem);

  const int thread_idx = int(threadIdx.x);
  const int warp_group = cutlass::canonical_warp_group_idx();
  const int warp_in_group = cutlass::canonical_warp_idx_sync() % 4;
  const bool is_producer = warp_group == 0;
  const bool is_loader = is_producer && warp_in_group == 0;
  if (is_loader && elect_one_sync()) {
    HalfMainloop::prefetch_tma_descriptors(p.gate);
    HalfMainloop::prefetch_tma_descriptors(p.up);
  }

  typename GateUpPipeline::Params pipeline_params;
  if (is_loader) pipeline_params.role = GateUpPipeline::ThreadCategory::Producer;
  if (!is_producer) pipeline_params.role = GateUpPipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = thread_idx % 128 == 0;
  pipeline_params.num_consumers = kConsumerThreads;
  pipeline_params.transaction_bytes = GateUpMainloop::TmaTransactionBytes;  // x + both weights
  GateUpPipeline pipeline(shared.pipeline, pipeline_params, GateUpCluster{});

  // The barriers' initialisation must be visible to every block of the cluster before any
  // multicast arrives.
  if constexpr (CLUSTER_M > 1) {
    cluster_arrive_relaxed();
    cluster_wait();
  } else {
    __syncthreads();
  }

  const int k_tiles = (p.dim + kTileK - 1) / kTileK;
  if (is_producer) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (is_loader && elect_one_sync()) {
      auto write = cutlass::make_producer_start_state<GateUpPipeline>();
      for_each_tile(p,
                    [&](int m, int n) { load_gate_up(p, pipeline, shared, k_tiles, m, n, write); });
      // Blocks of a cluster must not exit while their multicasts may still land in a peer.
      pipeline.producer_tail(write);
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  const int consumer_idx = thread_idx - kProducerThreads;
  GateUpTiledMma tiled_mma;
  GateUpMainloop mainloop;
  GateUpPipelineState read;
  for_each_tile(p, [&](int m, int n) {
    Tensor acc = partition_fragment_C(tiled_mma, take<0, 2>(StackedTile{}));  // [gate | up]
    mainloop.mma(pipeline, read, acc, k_tiles, consumer_idx, shared.tensors, p.stacked);
    mainloop.mma_tail(pipeline, read, k_tiles);  // every wgmma retired, every stage released
    read.advance(k_tiles);

    // A thread's (row, column) in the stacked tile for each accumulator value, worked out
    // after the mainloop from an index the compiler cannot see through: hoisted out of the
    // tile loop, these coordinates were held through the mainloop and, beside 192
    // accumulators (256 x 96), spilled.
    int thread = consumer_idx;
    asm volatile("" : "+r"(thread));
    Tensor coords = tiled_mma.get_thread_slice(thread).partition_C(
        make_identity_tensor(take<0, 2>(StackedTile{})));

    // h = silu(gate) * up. A wgmma atom is 64 rows x 2 TILE_N; each warp group holds one atom
    // (TILE_M 128) or two, 128 rows apart (TILE_M 256). In an atom a thread holds column pairs
    // (c, c + 1) every 8 columns, so the first half of its values there are gate columns and
    // the second half the same columns of up, TILE_N / 2 values later.
    static_assert(decltype(size<2>(acc))::value == 1, "one wgmma atom across 2 TILE_N");
    constexpr int kAtomsM = decltype(size<1>(acc))::value;
    static_assert(kAtomsM * 128 == kTileM, "two warp groups of 64-row atoms along M");
    constexpr int kHalf = decltype(size<0>(acc))::value / 2;
    static_assert(kHalf == TILE_N / 2, "TILE_N / 2 gate values per thread and atom");
    const auto write_h = [&](auto bounds_checked) {
      CUTLASS_PRAGMA_UNROLL
      for (int a = 0; a < kAtomsM; ++a) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kHalf; i += 2) {
          const auto [r, c] = coords(i, a, 0);  // c + 1 at i + 1
          const int64_t row = int64_t(m) * kTileM + r;
          const int64_t col = int64_t(n) * TILE_N + c;
          if constexpr (decltype(bounds_checked)::value) {
            if (row >= p.batch || col >= p.hidden) continue;
          }
          cutlass::AlignedArray<Element, 2> pair;
          pair[0] = Element(silu(acc(i, a, 0)) * acc(i + kHalf, a, 0));
          pair[1] = Element(silu(acc(i + 1, a, 0)) * acc(i + 1 + kHalf, a, 0));
          // hidden is a multiple of 8 and col even: the pair is 4-byte aligned, within the row.
          *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(p.h + row * p.hidden + col) = pair;
        }
      }
    };
    // Bounds are checked only in the tiles that cross an edge; elsewhere the stores go without
    // a branch per pair.
    if (int64_t(m + 1) * kTileM <= p.batch && int64_t(n + 1) * TILE_N <= p.hidden) {
      write_h(std::false_type{});
    } else {
      write_h(std::true_type{});
    }
  });
#endif
}

// ---- 2. down -----------------------------------------------------------------------------------

using DownTile = cute::Shape<cute::_128, cute::Int<DOWN_TILE_N>, cute::Int<kTileK>>;
using DownCluster = cute::Shape<cute::Int<DOWN_CLUSTER_M>, cute::_1, cute::_1>;
using DownEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, DownTile, DownCluster,
    cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
    /*ElementC=*/void, LayoutActivations, kAlignment, /*ElementD=*/Element, LayoutActivations,
    kAlignment, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
using DownMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutActivations, kAlignment,
    Element, LayoutWeights, kAlignment, Accumulator, DownTile, DownCluster,
    cutlass::gemm::collective::StageCount<DOWN_STAGES>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
using ProblemShape = cute::Shape<int, int, int, int>;  // (M, N, K, batch = 1)
using DownScheduler = std::conditional_t<DOWN_SPLIT == 0, cutlass::gemm::PersistentScheduler,
                                         cutlass::gemm::StreamKScheduler>;
using DownKernel =
    cutlass::gemm::kernel::GemmUniversal<ProblemShape, DownMainloop, DownEpilogue, DownScheduler>;
using DownGemm = cutlass::gemm::device::GemmUniversalAdapter<DownKernel>;
static_assert(DownKernel::MaxThreadsPerBlock == 384, "the header's threads: line");
static_assert(DownKernel::SharedStorageSize <=
                  DOWN_STAGES * (128 + DOWN_TILE_N) * 64 * sizeof(Element) +
                      2 * 128 * 32 * sizeof(Element) + 1024,
              "the header's DOWN_SMEM bound");

// ---- the plain path for shapes TMA cannot address ----------------------------------------------

constexpr int kPlainThreads = 256;

// One thread per h element: h[r, j] = silu(x[r] . w_gate[j]) * (x[r] . w_up[j]).
__global__ void __launch_bounds__(kPlainThreads)
    plain_gate_up(const kf_elem* __restrict__ x, const kf_elem* __restrict__ w_gate,
                  const kf_elem* __restrict__ w_up, kf_elem* __restrict__ h, int batch, int dim,
                  int hidden) {
  const int64_t index = int64_t(blockIdx.x) * kPlainThreads + threadIdx.x;
  if (index >= int64_t(batch) * hidden) return;
  const int64_t r = index / hidden, j = index % hidden;
  float g = 0, u = 0;
  for (int t = 0; t < dim; ++t) {
    const float xv = kf_to_float(x[r * dim + t]);
    g = fmaf(xv, kf_to_float(w_gate[j * dim + t]), g);
    u = fmaf(xv, kf_to_float(w_up[j * dim + t]), u);
  }
  h[index] = kf_from_float<kf_elem>(silu(g) * u);
}

// One thread per y element: y[r, c] = h[r] . w_down[c].
__global__ void __launch_bounds__(kPlainThreads)
    plain_down(const kf_elem* __restrict__ h, const kf_elem* __restrict__ w_down,
               kf_elem* __restrict__ y, int batch, int dim, int hidden) {
  const int64_t index = int64_t(blockIdx.x) * kPlainThreads + threadIdx.x;
  if (index >= int64_t(batch) * dim) return;
  const int64_t r = index / dim, c = index % dim;
  float acc = 0;
  for (int j = 0; j < hidden; ++j)
    acc = fmaf(kf_to_float(h[r * hidden + j]), kf_to_float(w_down[c * hidden + j]), acc);
  y[index] = kf_from_float<kf_elem>(acc);
}

unsigned plain_blocks(int64_t elements) {
  return static_cast<unsigned>((elements + kPlainThreads - 1) / kPlainThreads);
}

// ---- host side ---------------------------------------------------------------------------------

int run_plain(const MlpCall& c, kf_elem* h) {
  plain_gate_up<<<plain_blocks(int64_t(c.batch) * c.hidden), kPlainThreads, 0, c.stream>>>(
      c.x, c.w_gate, c.w_up, h, c.batch, c.dim, c.hidden);
  plain_down<<<plain_blocks(int64_t(c.batch) * c.dim), kPlainThreads, 0, c.stream>>>(
      h, c.w_down, c.y, c.batch, c.dim, c.hidden);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

// What gate-up's launch needs, found once per device (not stream work: outside any graph
// capture). The down GEMM's is kf::run_cutlass_gemm's business.
struct DeviceSetup {
  bool ready = false;
  int gate_up_clusters = 0;  // gate-up clusters that fit at once
};

bool setup_device(DeviceSetup& setup) {
  if (setup.ready) return true;
  if (cudaFuncSetAttribute(gate_up_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(sizeof(GateUpShared))) != cudaSuccess) {
    return false;
  }
  setup.gate_up_clusters =
      kf::clusters_that_fit(reinterpret_cast<const void*>(gate_up_kernel), CLUSTER_M, 1,
                            kGateUpThreads, int(sizeof(GateUpShared)));
  setup.ready = true;
  return true;
}

int run_gate_up(const MlpCall& c, Element* h, const DeviceSetup& setup) {
  const auto problem = cute::make_shape(c.batch, c.hidden, c.dim, 1);
  using StrideX = typename HalfMainloop::StrideA;  // (M, K, L)
  using StrideW = typename HalfMainloop::StrideB;  // (N, K, L)
  const StrideX x_stride{int64_t(c.dim), cute::_1{}, int64_t(c.batch) * c.dim};
  const StrideW w_stride{int64_t(c.dim), cute::_1{}, int64_t(c.hidden) * c.dim};
  const auto* x = reinterpret_cast<const Element*>(c.x);
  const auto* w_gate = reinterpret_cast<const Element*>(c.w_gate);
  const auto* w_up = reinterpret_cast<const Element*>(c.w_up);
  const int64_t m_tiles = (int64_t(c.batch) + kTileM - 1) / kTileM;
  const int64_t n_tiles = (int64_t(c.hidden) + TILE_N - 1) / TILE_N;
  const int64_t m_blocks = (m_tiles + CLUSTER_M - 1) / CLUSTER_M * CLUSTER_M;
  if (m_blocks > INT32_MAX || n_tiles > 65535) return KF_ERR_UNSUPPORTED;
  const GateUpParams params{
      HalfMainloop::to_underlying_arguments(problem, {x, x_stride, w_gate, w_stride}, nullptr),
      HalfMainloop::to_underlying_arguments(problem, {x, x_stride, w_up, w_stride}, nullptr),
      GateUpMainloop::to_underlying_arguments(problem, {x, x_stride, w_gate, w_stride}, nullptr),
      h,
      c.batch,
      c.hidden,
      c.dim,
      int(m_blocks),
      int(n_tiles)};
  // A block per tile, or (PERSISTENT) as many whole clusters as fit at once, none idle.
  dim3 grid(unsigned(m_blocks), unsigned(n_tiles), 1);
  if constexpr (PERSISTENT) {
    // Where the device would not say how many clusters fit, each cluster takes one cluster tile
    // (a guess could ask for more than fit, and the extra ones would start only at the end).
    const int64_t cluster_tiles = m_blocks / CLUSTER_M * n_tiles;
    const int64_t clusters = setup.gate_up_clusters > 0
                                 ? std::min<int64_t>(cluster_tiles, setup.gate_up_clusters)
                                 : cluster_tiles;
    if (clusters * CLUSTER_M > INT32_MAX) return KF_ERR_UNSUPPORTED;
    grid = dim3(unsigned(clusters * CLUSTER_M), 1, 1);
  }
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim = {unsigned(CLUSTER_M), 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kGateUpThreads, 1, 1);
  config.dynamicSmemBytes = sizeof(GateUpShared);
  config.stream = c.stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, gate_up_kernel, params) == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

// The down GEMM through kf::run_cutlass_gemm, which does its own per-device setup.
int run_down(const MlpCall& c, const Element* h) {
  typename DownGemm::Arguments arguments{};
  arguments.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  arguments.problem_shape = ProblemShape{c.batch, c.dim, c.hidden, 1};
  arguments.mainloop.ptr_A = h;
  arguments.mainloop.dA =
      typename DownKernel::StrideA{int64_t(c.hidden), cute::_1{}, int64_t(c.batch) * c.hidden};
  arguments.mainloop.ptr_B = reinterpret_cast<const Element*>(c.w_down);
  arguments.mainloop.dB =
      typename DownKernel::StrideB{int64_t(c.hidden), cute::_1{}, int64_t(c.dim) * c.hidden};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  using StrideY = typename DownKernel::StrideD;
  const StrideY y_stride{int64_t(c.dim), cute::_1{}, int64_t(c.batch) * c.dim};
  arguments.epilogue.dC = y_stride;
  arguments.epilogue.ptr_D = reinterpret_cast<Element*>(c.y);
  arguments.epilogue.dD = y_stride;
  return kf::run_cutlass_gemm<DownGemm, DOWN_CLUSTER_M, 1>(
      arguments, /*raster=*/0, DOWN_SWIZZLE, c.stream, [] { return KF_ERR_UNSUPPORTED; });
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  MlpCall call;
  if (!read_mlp_call(args, call)) return KF_ERR_UNSUPPORTED;
  const int64_t batch = call.batch, dim = call.dim, hidden = call.hidden;
  if (batch == 0 || dim == 0) return KF_OK;
  if (hidden == 0) {  // an empty sum: y = 0
    const size_t bytes = size_t(batch) * size_t(dim) * sizeof(kf_elem);
    return cudaMemsetAsync(call.y, 0, bytes, call.stream) == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
  }

  static kf::Workspace workspace;  // h: [batch, hidden], one per device
  auto* h = static_cast<kf_elem*>(
      workspace.get(size_t(batch) * size_t(hidden) * sizeof(kf_elem), call.stream));
  if (h == nullptr) return KF_ERR_OUT_OF_MEMORY;

  const bool tma_ok = dim % kAlignment == 0 && hidden % kAlignment == 0 &&
                      kf::is_tma_aligned(call.x) && kf::is_tma_aligned(call.w_gate) &&
                      kf::is_tma_aligned(call.w_up) && kf::is_tma_aligned(call.w_down) &&
                      kf::is_tma_aligned(call.y);
  if (!tma_ok) return run_plain(call, h);

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return KF_ERR_LAUNCH;
  constexpr int kMaxDevices = 64;
  static DeviceSetup setups[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) return KF_ERR_UNSUPPORTED;
  if (!setup_device(setups[device])) {
    cudaGetLastError();
    return KF_ERR_LAUNCH;
  }
  auto* h_element = reinterpret_cast<Element*>(h);
  if (const int status = run_gate_up(call, h_element, setups[device]); status != KF_OK) {
    return status;
  }
  return run_down(call, h_element);
}
