/* kforge
 * op: flash_attention
 * backend: cuda
 * dtypes: bf16, f16
 * param: BLOCK_N = 128 in {64, 96, 128, 176}
 * param: STAGES = 2 in {2, 3}
 * param: PINGPONG = 1 in {0, 1}
 * param: HEADS_PER_SECTION = 8 in {1, 2, 4, 8, 16}
 * param: PERSISTENT = 1 in {0, 1}
 * param: LAZY_RESCALE = 1 in {0, 1}
 * # two consumer warp groups of 64 query rows each
 * derive: BLOCK_M = 128
 * # shared memory at head_dim 128: the Q tile, STAGES K tiles and STAGES V tiles, barriers and
 * # the 1024-byte alignment of the swizzled tiles (a static_assert checks the bound)
 * derive: SMEM_BYTES = (BLOCK_M + 2 * STAGES * BLOCK_N) * 128 * elem_bytes + 1024
 * require: SMEM_BYTES <= max_shared_per_block
 * # registers per consumer thread at head_dim 128 (setmaxnreg gives them 240, or 232 beside the
 * # persistent producer's 40): O's accumulators (64), the scores of one key tile (BLOCK_N / 2,
 * # fp32), the probabilities of the tile before it (BLOCK_N / 4, two 16-bit values a register)
 * # while its P V product runs, addresses, coordinates and the softmax state (about 40)
 * derive: REGS_ESTIMATE = 64 + BLOCK_N / 2 + BLOCK_N / 4 + 40
 * require: REGS_ESTIMATE <= (PERSISTENT ? 232 : 240)
 * threads: 384
 * shared_bytes: SMEM_BYTES
 * # wgmma and the TMA: Hopper (sm_90a) alone
 * require: cc == 90
 * uses: cutlass
 */
// Flash attention forward on Hopper's asynchronous tensor cores (wgmma) with TMA loads, in the
// manner of FlashAttention-3: one pass over the keys with an online softmax; the scores and the
// output stay in registers; the softmax of one key tile runs while the tensor cores work on the
// products of the next.
//
// Idea: a block owns BLOCK_M = 128 query rows of one (batch, head) and reads the key/value head
// that query head maps to under grouped-query attention (head / group). Its three warp groups
// specialise:
//
//   - the producer (warp group 0; one thread issues everything) loads the Q tile once with TMA,
//     then streams the K and V tiles of BLOCK_N keys through two STAGES-deep rings of swizzled
//     shared-memory stages, each stage guarded by a pair of mbarriers (full: the TMA's bytes
//     have landed; empty: both consumers are done with it). K and V have rings of their own so
//     that S = Q K^T can start before V has arrived.
//   - two consumer warp groups own 64 query rows each. Per key tile j:
//       1. S_j = Q K_j^T: a wgmma with both operands in shared memory (64 x BLOCK_N x 16 per
//          instruction, fp32 accumulators);
//       2. O += P_{j-1} V_{j-1}: a wgmma whose A operand, the probabilities of the previous
//          tile, is in registers (the accumulator layout of S is, rounded to 16 bits, the
//          A-operand layout of a 64 x 16 x 16 wgmma), and whose B operand is V as it lies in
//          shared memory, read transposed (MN-major; wgmma reads 16-bit operands either way);
//       3. while that product runs, the softmax of S_j: mask, row maxima (a row's values sit in
//          the four threads of a quad), p = exp2(s * scale - m) in place, row sums;
//       4. once it has retired, O is rescaled by exp2(m_old - m_new) and S_j is rounded into
//          P_j (the registers the product read).
//     The first tile has no product before it and the last product has no tile after it.
//   - PINGPONG 1: the two consumers take turns issuing their wgmmas (two named barriers), so
//     that one warp group's softmax runs while the other's products occupy the tensor cores,
//     rather than both competing for them at once.
//
// Keys are walked from the last tile to the first, so that the only tiles that need a mask
// (the one holding seq_len's end, and under causal attention those crossing the diagonal) come
// first and the rest run unmasked. Under causal attention a block reads no key past its last
// row.
//
// Launch order: the heads are cut into sections of HEADS_PER_SECTION, launched one section
// after the other; within a section, blocks go last-rows-first across all its heads (every
// head's last 128 rows, then every head's rows before them, ...). Under causal attention the
// last rows have the most keys, so the blocks launched last are the lightest and no SM is left
// running a long block while the others idle (1 would launch a head's heaviest block just
// before the next head's lightest ones). A section's keys and values stay in L2 while its
// blocks run: 8 heads of 4096 x 128 bf16 keys and values are 16 MB.
//
// PERSISTENT 1: one block per SM (never more blocks than tiles) works through the tiles in
// that order, taking the next from a counter in global memory when it is done with one, so an
// SM that drew light tiles takes more of them. The producer loads the next tile's Q, keys and
// values while the consumers finish the tile before it (its last product and the epilogue),
// which a block launched for one tile leaves the SM to do alone. Q's buffer is handed back by
// a barrier of its own (q_empty) once both consumers' last Q K^T has retired; the tile's index
// travels in shared memory ahead of Q's bytes (q_full), -1 when none is left. The counter is a
// kf::Workspace zeroed in stream order before each launch, so calls of one module on two
// streams at once would share it.
//
// Stability: as in flash_attention_mma.cu. A row's reference point m (its running maximum,
// under LAZY_RESCALE 0) starts at -inf; scores are exponentiated only after it is subtracted;
// while every key a row has seen is masked it is 0, so masked scores give exp2(-inf) = 0, not
// NaN. P is rounded to the input type for the P V product (p in [0, 1], or [0, 2^8] below); l
// sums the unrounded p in fp32. O = o / l.
//
// LAZY_RESCALE 1: m moves only when a tile's maximum passes it by more than kRescaleMargin (8,
// in log2 units), so p lies in [0, 2^8]: far from overflow in fp32 and in either 16-bit type,
// and rounded to 16 bits with the same relative error as in [0, 1]. O and l carry the same
// reference, so o / l is unchanged. A warp whose 16 rows all kept theirs skips O's rescaling
// (head_dim / 2 multiplies a thread a tile), which after a row's first keys is nearly every
// tile. Scores so large that the two-step form below runs move m at every rise, as with 0.
//
// Edges: head_dim up to 128, instantiated for 64 and 128. TMA zero-fills what lies outside the
// tensors: rows past seq_len (never read across into the next head, the head being a mode of
// its own), and dimensions past a narrower head_dim, which add nothing to Q K^T and produce
// columns of O that are not written. TMA needs 16-byte aligned tensors and head_dim % 8 == 0,
// and the softmax a positive scale; any other call takes a plain path (a warp per query row on
// the CUDA cores; correct, slow).
//
// Tunables:
//   BLOCK_N   keys per tile: the N of S's wgmma and the K of P V's.
//   STAGES    depth of the K and V rings.
//   PINGPONG  1: the consumer warp groups alternate their wgmma issue; 0: each issues freely.
//   HEADS_PER_SECTION  heads whose blocks are interleaved in the launch order (above).
//   PERSISTENT  1: a block per SM takes tiles from a counter; 0: a block per tile.
//   LAZY_RESCALE  1: the reference point moves only past a margin (above); 0: at every rise.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "flash_attention_common.cuh"
// First among the CUTLASS headers: it enables wgmma shapes of every N that is a multiple of 8
// (BLOCK_N 176 among them).
#include "kforge/cutlass_gemm.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

// A named namespace: `using namespace cute` inside an anonymous one makes its name ambiguous
// with CuTe's own anonymous namespace in nvcc's generated host stubs. Its functions are static
// instead: a standalone export links several variants of this file into one library.
namespace kf_attention_wgmma {

using namespace cute;

using Element = kf::CutlassElement;
constexpr int kBlockM = BLOCK_M;
constexpr int kConsumers = 2;  // consumer warp groups, 64 query rows each
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kMaxHeadDim = 128;
// LAZY_RESCALE: how far (log2 units) a tile's maximum may pass a row's reference point before
// the point moves; p <= 2^8 then.
constexpr float kRescaleMargin = LAZY_RESCALE ? 8.0f : 0.0f;
// setmaxnreg: the producer keeps what issuing copies needs, the consumers take the rest. The
// registers move within the block's own allocation: __launch_bounds__(384, 1) gives each thread
// 168 (65536 / 384, down to a multiple of 8), so the three warp groups' counts may sum to at
// most 3 x 168 = 504; asking for more leaves the consumers' setmaxnreg.inc waiting forever. The
// persistent producer's tile loop spills at 24; 40 and 232 fill the allocation without spills.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr int kProducerRegisters = PERSISTENT ? 40 : 24;
constexpr int kConsumerRegisters = PERSISTENT ? 232 : 240;
static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <=
                  (1 + kConsumers) * kLaunchRegisters,
              "setmaxnreg moves registers within the block's allocation");

static_assert(kBlockM == 64 * kConsumers, "one 64-row wgmma atom per consumer warp group");
static_assert(BLOCK_N % 16 == 0, "P V takes keys 16 at a time");

// Everything that depends on the instantiated head dimension.
template <int kDim>
struct Tiles {
  using TileQ = Shape<Int<kBlockM>, Int<kDim>>;
  using TileKV = Shape<Int<BLOCK_N>, Int<kDim>>;
  // Shared memory: rows of 64 16-bit elements (128 bytes) under the 128-byte swizzle that
  // wgmma and TMA agree on. Q is (BLOCK_M, kDim); K and V are (BLOCK_N, kDim, STAGES), the
  // head dimension contiguous, as in global memory.
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, TileQ{}));
  using SmemLayoutKV =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                             make_shape(Int<BLOCK_N>{}, Int<kDim>{}, Int<STAGES>{})));
  // V seen as P V's B operand, (kDim, BLOCK_N, STAGES): the same bytes, the head dimension
  // (wgmma's N) contiguous.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(make_shape(Int<kDim>{}, Int<BLOCK_N>{}, Int<STAGES>{}),
                                          Step<_2, _1, _3>{})));

  // S = Q K^T: (BLOCK_M, BLOCK_N, kDim), both operands K-major in shared memory; the two
  // consumer warp groups side by side along M.
  using MmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<BLOCK_N>, Int<kDim>>>(),
      Layout<Shape<Int<kConsumers>, _1, _1>>{}));
  // O += P V: (BLOCK_M, kDim, BLOCK_N), P from registers, V MN-major.
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kDim>, Int<BLOCK_N>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<Int<kConsumers>, _1, _1>>{}));

  // q, k, v and o in global memory: (seq_len, head_dim, heads), rows of head_dim elements.
  using GmemLayout = Layout<Shape<int, int, int>, Stride<int64_t, _1, int64_t>>;
  using GmemTensor =
      decltype(make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, std::declval<GmemTensor>(), SmemLayoutQ{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, std::declval<GmemTensor>(),
                                       take<0, 2>(SmemLayoutKV{})));

  static constexpr uint32_t kQBytes = kBlockM * kDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = BLOCK_N * kDim * sizeof(Element);

  using Pipeline = cutlass::PipelineTmaAsync<STAGES>;
  using PipelineState = typename Pipeline::PipelineState;

  struct Shared {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKV>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKV>> v;
    typename Pipeline::SharedStorage k_pipeline;
    typename Pipeline::SharedStorage v_pipeline;
    alignas(8) uint64_t q_full;   // Q's bytes have landed (and `tile` is set)
    alignas(8) uint64_t q_empty;  // both consumers' last Q K^T of the tile has retired
    int tile;                     // the tile Q holds; -1: none left
  };
  static_assert(sizeof(Shared) <= (kBlockM + 2 * STAGES * BLOCK_N) * 128 * sizeof(Element) + 1024,
                "the header's SMEM_BYTES bound");

  struct Params {
    TmaQ tma_q;
    TmaKV tma_k;
    TmaKV tma_v;
    Element* o;      // o: [heads, seq_len, head_dim]
    int* next_tile;  // PERSISTENT: tiles taken past the first gridDim.x (zeroed per launch)
    int tiles;       // (query blocks, head) pairs
    int heads;       // batch * query heads
    int seq_len;
    int head_dim;
    int group;         // query heads per key/value head
    float scale_log2;  // sm_scale * log2(e)
    bool causal;
  };
};

// 2^v in one MUFU instruction for v <= kRescaleMargin (a score minus its row's reference point);
// 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float v) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v));
  return e;
}

// The largest of a row's values across the four threads of a quad, which hold the row between
// them in a wgmma accumulator.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// In a 64 x N wgmma accumulator each thread holds values of two rows, g and g + 8 of its warp's
// 16: value i is in row half (i / 2) % 2 (and column 8 (i / 4) + 2 (thread % 4) + i % 2).
// tests/unit/test_attention_wgmma_layouts.cu checks this against CuTe's layouts.
CUTE_HOST_DEVICE int row_half(int i) {
  return (i / 2) % 2;
}

// A compiler barrier. CUTLASS issues mbarrier waits and arrivals as asm without a memory clobber,
// so the tile index that travels in shared memory beside them is fenced in by these.
__device__ __forceinline__ void compiler_fence() {
  asm volatile("" ::: "memory");
}

// The consumers' turns at the tensor cores under PINGPONG: named barriers 0 and 1 (after
// CUTLASS's reserved ones), one per consumer warp group. A warp group waits on its own before
// issuing and, once it has issued, lets the other go.
__device__ __forceinline__ void wait_for_turn(int consumer) {
  if constexpr (PINGPONG) cutlass::arch::NamedBarrier::sync(kConsumerThreads, consumer);
}
__device__ __forceinline__ void pass_turn(int consumer) {
  if constexpr (PINGPONG) cutlass::arch::NamedBarrier::arrive(kConsumerThreads, 1 - consumer);
}

// Issues `mma` over every k-block of the operands into `acc` (zeroed first when asked) as one
// wgmma group, and returns without waiting for it. The fence orders earlier register writes
// to `acc` before the wgmmas read it.
template <bool kZeroFirst, typename TiledMma, typename A, typename B, typename C>
__device__ __forceinline__ void issue_gemm(TiledMma& mma, const A& a, const B& b, C& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  if constexpr (kZeroFirst) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// Waits until at most kPending wgmma groups are in flight, then fences the registers the
// retired groups wrote or read, so that no later use of them is moved above the wait.
template <int kPending, typename... Fragments>
__device__ __forceinline__ void wait_for_gemms(Fragments&... fragments) {
  warpgroup_wait<kPending>();
  (warpgroup_fence_operand(fragments), ...);
}

// The (query block, head) of tile `tile` in the launch order described at the top; `head` is
// batch * heads + query head.
__device__ __forceinline__ void locate_tile(int tile, int m_blocks, int heads, int& m_block,
                                            int& head) {
  const int first_head = tile / (HEADS_PER_SECTION * m_blocks) * HEADS_PER_SECTION;
  const int section_heads = min(HEADS_PER_SECTION, heads - first_head);
  const int in_section = tile - first_head * m_blocks;
  m_block = m_blocks - 1 - in_section / section_heads;  // last rows first
  head = first_head + in_section % section_heads;
}

template <int kDim>
static __global__ void __launch_bounds__(kThreads, 1)
    flash_attention_wgmma(const __grid_constant__ typename Tiles<kDim>::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = Tiles<kDim>;
  using Pipeline = typename T::Pipeline;
  using PipelineState = typename T::PipelineState;
  extern __shared__ char smem[];
  typename T::Shared& shared = *reinterpret_cast<typename T::Shared*>(smem);

  const int warp_group = cutlass::canonical_warp_group_idx();
  const int m_blocks = (p.seq_len + kBlockM - 1) / kBlockM;
  // Key tiles a block of rows m_block reads: up to its last row under causal attention.
  const auto key_tiles = [&](int m_block) {
    const int key_end = p.causal ? min(p.seq_len, (m_block + 1) * kBlockM) : p.seq_len;
    return (key_end + BLOCK_N - 1) / BLOCK_N;
  };

  // Barriers: K and V's rings (their constructors initialise them, warp 0 doing it), and Q's.
  typename Pipeline::Params pipeline_params;
  pipeline_params.transaction_bytes = T::kKVBytes;
  pipeline_params.role =
      warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;
  pipeline_params.num_consumers = kConsumerThreads;
  Pipeline k_pipeline(shared.k_pipeline, pipeline_params, Shape<_1, _1, _1>{});
  Pipeline v_pipeline(shared.v_pipeline, pipeline_params, Shape<_1, _1, _1>{});
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterTransactionBarrier::init(&shared.q_full, 1);
    cutlass::arch::ClusterBarrier::init(&shared.q_empty, kConsumerThreads);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (warp_group == 0) {
    // ---- producer ------------------------------------------------------------------------------
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename T::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename T::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename T::SmemLayoutKV{});
    // TMA's view of the tensors: coordinates (seq_len, head_dim, heads).
    Tensor mQ = p.tma_q.get_tma_tensor(make_shape(p.seq_len, p.head_dim, p.heads));
    Tensor mK = p.tma_k.get_tma_tensor(make_shape(p.seq_len, p.head_dim, p.heads / p.group));
    Tensor mV = p.tma_v.get_tma_tensor(make_shape(p.seq_len, p.head_dim, p.heads / p.group));
    PipelineState write = cutlass::make_producer_start_state<Pipeline>();
    int tile = int(blockIdx.x);
    for (int round = 0;; ++round) {
      if (round > 0) {
        // Q's buffer (and `tile`) are free once both consumers' last Q K^T of the tile before
        // has retired; the next tile comes from the counter.
        cutlass::arch::ClusterBarrier::wait(&shared.q_empty, (round - 1) % 2);
        compiler_fence();
        tile = int(gridDim.x) + atomicAdd(p.next_tile, 1);
      }
      if (tile >= p.tiles) {
        shared.tile = -1;
        compiler_fence();
        cutlass::arch::ClusterBarrier::arrive(&shared.q_full);
        return;
      }
      int m_block, head;
      locate_tile(tile, m_blocks, p.heads, m_block, head);
      const int kv_head = head / p.group;
      Tensor gQ = local_tile(mQ(_, _, head), typename T::TileQ{}, make_coord(m_block, 0));
      Tensor gK = local_tile(mK(_, _, kv_head), typename T::TileKV{}, make_coord(_, 0));  // (.., n)
      Tensor gV = local_tile(mV(_, _, kv_head), typename T::TileKV{}, make_coord(_, 0));
      auto [q_src, q_dst] = tma_partition(p.tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                          group_modes<0, 2>(gQ));
      auto [k_src, k_dst] = tma_partition(p.tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                          group_modes<0, 2>(gK));
      auto [v_src, v_dst] = tma_partition(p.tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                          group_modes<0, 2>(gV));

      // The tile's index is written before the arrival that Q's bytes complete (an mbarrier
      // arrival releases the thread's earlier writes to whoever waits on the phase).
      shared.tile = tile;
      compiler_fence();
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&shared.q_full, T::kQBytes);
      copy(p.tma_q.with(shared.q_full), q_src, q_dst);
      for (int n = key_tiles(m_block) - 1; n >= 0; --n) {
        k_pipeline.producer_acquire(write);
        copy(p.tma_k.with(*k_pipeline.producer_get_barrier(write)), k_src(_, n),
             k_dst(_, write.index()));
        v_pipeline.producer_acquire(write);
        copy(p.tma_v.with(*v_pipeline.producer_get_barrier(write)), v_src(_, n),
             v_dst(_, write.index()));
        ++write;
      }
      if constexpr (!PERSISTENT) return;
    }
  }

  // ---- consumers -------------------------------------------------------------------------------
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  const int thread = int(threadIdx.x) - 128;  // among the consumers
  const int consumer = warp_group - 1;

  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename T::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename T::SmemLayoutVt{});
  typename T::MmaQK mma_qk;
  typename T::MmaPV mma_pv;
  auto thread_qk = mma_qk.get_thread_slice(thread);
  auto thread_pv = mma_pv.get_thread_slice(thread);
  Tensor q_operand = thread_qk.partition_fragment_A(sQ);   // (mma, 1, kDim / 16)
  Tensor k_operand = thread_qk.partition_fragment_B(sK);   // (mma, 1, kDim / 16, STAGES)
  Tensor v_operand = thread_pv.partition_fragment_B(sVt);  // (mma, 1, BLOCK_N / 16, STAGES)
  Tensor s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<BLOCK_N>>{});  // fp32
  Tensor o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kDim>>{});     // fp32
  // P: S rounded to the input type, as P V's A operand (the same values in the same order).
  Tensor prob =
      make_tensor<Element>(partition_shape_A(mma_pv, Shape<Int<kBlockM>, Int<BLOCK_N>>{}));
  static_assert(decltype(size(prob))::value == decltype(size(s))::value);
  // Each score's (row, key) within the block's tile, for masking.
  Tensor s_coord = thread_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<BLOCK_N>>{}));

  int m_block = 0, head = 0;     // the tile's, set at its start
  float row_max[2];              // log2 units, rows g and g + 8 of the thread's warp: the reference
  float row_sum[2];              // this thread's share of the running sums
  float rescale[2];              // exp2(m_old - m_new) of the last softmax
  bool o_needs_rescale = false;  // some row of the warp moved its reference in the last softmax

  // The softmax of tile n's scores in s: masked where asked, maxima, p in place, sums. The
  // scores stay unscaled: a row's maximum is taken of them and scaled once (the scale is
  // positive: kforge_run sends any other to the plain path), and each p = exp2(s * scale - m)
  // is one FFMA ahead of the MUFU instead of a multiply and a subtraction. That needs the
  // scaled maximum rounded up (every difference then <= the margin, <= 0 where m moves) and
  // small: at 2^e its rounding is off by up to 2^(e - 23), and every p, the largest one
  // included, would be scaled by exp2 of that (0 once it is large). Where a warp sees a scaled
  // maximum of magnitude 2^24 or more (scores no model produces, but a caller may pass), it
  // takes the two-step form: scores rounded to their scaled values and the maximum one of them,
  // so that the largest score's difference is exactly 0 and every difference that gives a
  // nonzero p is exact.
  const auto softmax = [&](int n, bool masked) {
    if (masked) {
      const int row0 = m_block * kBlockM, key0 = n * BLOCK_N;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(s); ++i) {
        const int row = row0 + get<0>(s_coord(i)), key = key0 + get<1>(s_coord(i));
        if (key >= p.seq_len || (p.causal && key > row)) s(i) = -INFINITY;
      }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(s); ++i)
      tile_max[row_half(i)] = fmaxf(tile_max[row_half(i)], s(i));
    constexpr float kLargestFoldedMax = 0x1p24f;  // past it the round-up's offset reaches 2
    float row_top[2], scaled_max[2];
    bool huge = false;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      row_top[h] = quad_max(tile_max[h]);
      scaled_max[h] = __fmul_ru(row_top[h], p.scale_log2);
      // Either sign; -inf (every key of the row masked in this tile) is not huge.
      huge = huge || (fabsf(scaled_max[h]) >= kLargestFoldedMax && scaled_max[h] != -INFINITY);
    }
    const bool two_step = __any_sync(0xffffffffu, huge);
    const float margin = two_step ? 0.0f : kRescaleMargin;
    float base[2];
    bool moved = false;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      if (two_step) scaled_max[h] = __fmul_rn(row_top[h], p.scale_log2);
      // -inf + margin is -inf: a row's first unmasked keys always move it.
      const float new_max = scaled_max[h] > row_max[h] + margin ? scaled_max[h] : row_max[h];
      base[h] = new_max == -INFINITY ? 0.0f : new_max;  // 0 while every key so far is masked
      // Exactly 1 where the point stays (the skip below relies on it); 0 on a row's first keys.
      const bool row_moved = new_max != row_max[h];
      rescale[h] = row_moved ? exp2_approx(row_max[h] - base[h]) : 1.0f;
      moved = moved || row_moved;
      row_max[h] = new_max;
      row_sum[h] *= rescale[h];
    }
    o_needs_rescale = __any_sync(0xffffffffu, moved);
    if (two_step) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(s); ++i)
        s(i) = exp2_approx(__fmul_rn(s(i), p.scale_log2) - base[row_half(i)]);
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(s); ++i)
        s(i) = exp2_approx(fmaf(s(i), p.scale_log2, -base[row_half(i)]));
    }
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(s); ++i)
      row_sum[row_half(i)] += s(i);
  };
  // O *= exp2(m_old - m_new), once the products that wrote O have retired; nothing to do where
  // no row of the warp moved its reference (rescale is then exactly 1).
  const auto rescale_o = [&]() {
    if (!o_needs_rescale) return;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(o); ++i)
      o(i) *= rescale[row_half(i)];
  };
  // P = S rounded to the input type, pairs at a time.
  const auto round_s_into_p = [&]() {
    constexpr int kValues = decltype(size(s))::value;
    using Converter = cutlass::NumericArrayConverter<Element, float, kValues>;
    *reinterpret_cast<cutlass::Array<Element, kValues>*>(prob.data()) =
        Converter{}(*reinterpret_cast<const cutlass::Array<float, kValues>*>(s.data()));
  };
  // Tiles that need a mask: the one holding seq_len's end, and under causal attention those
  // with a key past the block's first row.
  const auto needs_mask = [&](int n) {
    return (n + 1) * BLOCK_N > p.seq_len || (p.causal && (n + 1) * BLOCK_N - 1 > m_block * kBlockM);
  };

  // The two products, each issued once its tile has landed, and the release of a tile once
  // the product that read it has retired.
  PipelineState read_k, read_v;
  const auto issue_scores = [&]() {  // S = Q K^T
    k_pipeline.consumer_wait(read_k);
    issue_gemm<true>(mma_qk, q_operand, k_operand(_, _, _, read_k.index()), s);
  };
  const auto issue_product = [&]() {  // O += P V
    v_pipeline.consumer_wait(read_v);
    warpgroup_fence_operand(prob);
    issue_gemm<false>(mma_pv, prob, v_operand(_, _, _, read_v.index()), o);
  };
  const auto release_k = [&]() {
    k_pipeline.consumer_release(read_k);
    ++read_k;
  };
  const auto release_v = [&]() {
    v_pipeline.consumer_release(read_v);
    ++read_v;
  };

  // Q's buffer goes back to the producer once the tile's last Q K^T has retired.
  const auto release_q = [&]() {
    compiler_fence();
    cutlass::arch::ClusterBarrier::arrive(&shared.q_empty);
  };

  // Under PINGPONG the consumers' turns alternate through every tile of the block, consumer 0
  // first.
  if constexpr (PINGPONG) {
    if (consumer == 1) pass_turn(consumer);
  }
  for (int round = 0;; ++round) {
    cutlass::arch::ClusterTransactionBarrier::wait(&shared.q_full, round % 2);
    compiler_fence();
    const int tile = shared.tile;
    if (tile < 0) break;
    locate_tile(tile, m_blocks, p.heads, m_block, head);
    for (int h = 0; h < 2; ++h) {
      row_max[h] = -INFINITY;
      row_sum[h] = 0.0f;
      rescale[h] = 1.0f;
    }

    // First tile (the last keys): S alone.
    int n = key_tiles(m_block) - 1;
    wait_for_turn(consumer);
    issue_scores();
    pass_turn(consumer);
    wait_for_gemms<0>(s);
    release_k();
    if (n == 0) release_q();
    clear(o);
    softmax(n, needs_mask(n));
    round_s_into_p();

    // Every further tile: S_n and the previous tile's P V in flight together, then S_n's
    // softmax while P V runs.
    for (--n; n >= 0; --n) {
      wait_for_turn(consumer);
      issue_scores();
      issue_product();
      pass_turn(consumer);
      wait_for_gemms<1>(s);  // S_n is in; P V may still run
      release_k();
      if (n == 0) release_q();
      softmax(n, needs_mask(n));
      wait_for_gemms<0>(o, prob);  // prob may now be overwritten
      release_v();
      rescale_o();
      round_s_into_p();
    }

    // The last product.
    wait_for_turn(consumer);
    issue_product();
    pass_turn(consumer);
    wait_for_gemms<0>(o, prob);
    release_v();

    // O = o / l, l summed over the quad (a valid row always saw key 0, so l > 0), written as
    // pairs of neighbouring columns.
    float inverse_sum[2];
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h)
      inverse_sum[h] = 1.0f / quad_sum(row_sum[h]);
    Tensor o_coord = thread_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kDim>>{}));
    Element* o_head = p.o + int64_t(head) * p.seq_len * p.head_dim;  // o_head: [seq_len, head_dim]
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(o); i += 2) {
      const int row = m_block * kBlockM + get<0>(o_coord(i));
      const int col = get<1>(o_coord(i));  // col + 1 at i + 1
      if (row >= p.seq_len || col >= p.head_dim) continue;
      const float scale = inverse_sum[row_half(i)];
      cutlass::AlignedArray<Element, 2> pair;
      pair[0] = Element(o(i) * scale);
      pair[1] = Element(o(i + 1) * scale);
      // head_dim is a multiple of 8 and col even: the pair is 4-byte aligned, within the row.
      *reinterpret_cast<cutlass::AlignedArray<Element, 2>*>(o_head + int64_t(row) * p.head_dim +
                                                            col) = pair;
    }
    if constexpr (!PERSISTENT) break;
  }
  // Consumer 1's first pass_turn left consumer 0's barrier one arrival ahead: take it.
  if constexpr (PINGPONG) {
    if (consumer == 0) wait_for_turn(consumer);
  }
#else
  // Built for an architecture without wgmma (anything but sm_90a): fail loudly rather than
  // return with O unwritten.
  __trap();
#endif
}

// ---- the plain path for calls TMA cannot take --------------------------------------------------

constexpr int kPlainWarps = 4;

// One warp per query row: lane l holds dimensions l, l + 32, l + 64 and l + 96 of q and of the
// output; each score is a warp-wide sum. An online softmax over the keys in fp32.
static __global__ void __launch_bounds__(32 * kPlainWarps)
    plain_attention(const kf_elem* __restrict__ q, const kf_elem* __restrict__ k,
                    const kf_elem* __restrict__ v, kf_elem* __restrict__ o, int seq_len,
                    int head_dim, int group, float scale_log2, bool causal) {
  constexpr int kPer = kMaxHeadDim / 32;
  const int lane = int(threadIdx.x) % 32;
  const int row = int(blockIdx.x) * kPlainWarps + int(threadIdx.x) / 32;
  if (row >= seq_len) return;
  const int64_t head = blockIdx.y;
  const kf_elem* q_row = q + (head * seq_len + row) * head_dim;
  const kf_elem* k_head = k + head / group * seq_len * head_dim;
  const kf_elem* v_head = v + head / group * seq_len * head_dim;
  float qv[kPer], acc[kPer];
  for (int j = 0; j < kPer; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < head_dim ? kf_to_float(q_row[d]) : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last = causal ? row : seq_len - 1;
  for (int key = 0; key <= last; ++key) {
    float dot = 0.0f;
    for (int j = 0; j < kPer; ++j) {
      const int d = lane + 32 * j;
      if (d < head_dim) dot = fmaf(qv[j], kf_to_float(k_head[int64_t(key) * head_dim + d]), dot);
    }
    for (int offset = 16; offset > 0; offset /= 2)
      dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float score = dot * scale_log2;
    const float new_max = fmaxf(m, score);
    const float r = exp2f(m - new_max), e = exp2f(score - new_max);
    l = l * r + e;
    for (int j = 0; j < kPer; ++j) {
      const int d = lane + 32 * j;
      const float vv = d < head_dim ? kf_to_float(v_head[int64_t(key) * head_dim + d]) : 0.0f;
      acc[j] = fmaf(e, vv, acc[j] * r);
    }
    m = new_max;
  }
  kf_elem* o_row = o + (head * seq_len + row) * head_dim;
  for (int j = 0; j < kPer; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) o_row[d] = kf_from_float<kf_elem>(acc[j] / l);
  }
}

static int run_plain(const kf_attention::Problem& p) {
  const dim3 grid(unsigned((p.seq_len + kPlainWarps - 1) / kPlainWarps), unsigned(p.heads));
  plain_attention<<<grid, 32 * kPlainWarps, 0, p.stream>>>(
      p.q, p.k, p.v, p.o, int(p.seq_len), int(p.head_dim), int(p.group), p.scale_log2, p.causal);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

// ---- host side ---------------------------------------------------------------------------------

template <int kDim>
static int run_wgmma(const kf_attention::Problem& p) {
  using T = Tiles<kDim>;
  const int seq_len = int(p.seq_len), head_dim = int(p.head_dim);
  const int heads = int(p.heads), kv_heads = int(p.heads / p.group);
  const int tiles = (seq_len + kBlockM - 1) / kBlockM * heads;
  // A block per tile, or under PERSISTENT a block per SM and the counter they take tiles from.
  int blocks = tiles;
  int* next_tile = nullptr;
  if constexpr (PERSISTENT) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return KF_ERR_LAUNCH;
    }
    static kf::Workspace counter;  // one per device
    next_tile = static_cast<int*>(counter.get(sizeof(int), p.stream));
    if (next_tile == nullptr) return KF_ERR_OUT_OF_MEMORY;
    if (cudaMemsetAsync(next_tile, 0, sizeof(int), p.stream) != cudaSuccess) return KF_ERR_LAUNCH;
    blocks = std::min(tiles, sms);
  }
  const auto tensor = [&](const kf_elem* data, int count) {
    return make_tensor(
        make_gmem_ptr(reinterpret_cast<const Element*>(data)),
        typename T::GmemLayout{make_shape(seq_len, head_dim, count),
                               make_stride(int64_t(head_dim), _1{}, int64_t(seq_len) * head_dim)});
  };
  const typename T::Params params{
      make_tma_copy(SM90_TMA_LOAD{}, tensor(p.q, heads), typename T::SmemLayoutQ{}),
      make_tma_copy(SM90_TMA_LOAD{}, tensor(p.k, kv_heads), take<0, 2>(typename T::SmemLayoutKV{})),
      make_tma_copy(SM90_TMA_LOAD{}, tensor(p.v, kv_heads), take<0, 2>(typename T::SmemLayoutKV{})),
      reinterpret_cast<Element*>(p.o),
      next_tile,
      tiles,
      heads,
      seq_len,
      head_dim,
      int(p.group),
      p.scale_log2,
      p.causal};
  constexpr int kSmemBytes = int(sizeof(typename T::Shared));
  const auto kernel = flash_attention_wgmma<kDim>;
  // A host-side attribute, not stream work (no sync; allowed during graph capture).
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
      cudaSuccess) {
    return KF_ERR_LAUNCH;
  }
  kernel<<<unsigned(blocks), kThreads, kSmemBytes, p.stream>>>(params);
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}

}  // namespace kf_attention_wgmma

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  using namespace kf_attention_wgmma;
  kf_attention::Problem problem;
  if (const int status = kf_attention::read_problem(args, kMaxHeadDim, &problem); status != KF_OK)
    return status;
  if (problem.heads == 0 || problem.seq_len == 0) return KF_OK;
  const bool tma_ok = problem.head_dim % 8 == 0 && kf_is_aligned(problem.q, 16) &&
                      kf_is_aligned(problem.k, 16) && kf_is_aligned(problem.v, 16) &&
                      kf_is_aligned(problem.o, 16);
  // The softmax scales each row's maximum of the raw scores, which takes a positive scale.
  if (!tma_ok || !(problem.scale_log2 > 0.0f)) return run_plain(problem);
  return problem.head_dim <= 64 ? run_wgmma<64>(problem) : run_wgmma<128>(problem);
}
