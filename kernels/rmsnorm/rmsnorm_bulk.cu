// The shared_bytes line is longer than the column limit and must stay one line.
// clang-format off
/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {128, 256, 512, 1024}
 * param: WARPS_PER_ROW = 8 in {1, 2, 4, 8, 16, 32}
 * param: ROWS_PER_STAGE = 1 in {1, 2, 4, 8, 16, 32}
 * param: STAGES = 4 in {2, 3, 4, 6, 8}
 * param: CTAS_PER_SM = 2 in {1, 2, 3, 4}
 * param: VEC_BYTES = 16 in {4, 8, 16}
 * param: CACHE_HINTS = 1 in {0, 1}
 * derive: VEC = VEC_BYTES / elem_bytes
 * derive: ROW_GROUPS = BLOCK_THREADS / 32 / WARPS_PER_ROW
 * require: BLOCK_THREADS <= max_threads_per_block
 * require: WARPS_PER_ROW * 32 <= BLOCK_THREADS
 * require: BLOCK_THREADS / 32 % WARPS_PER_ROW == 0
 * # Groups of several warps synchronize on named barriers 1..15.
 * require: WARPS_PER_ROW == 1 || ROW_GROUPS <= 15
 * # Every group gets the same number of rows of a full stage.
 * require: ROWS_PER_STAGE % ROW_GROUPS == 0
 * threads: BLOCK_THREADS
 * shared_bytes: min(STAGES, (max_shared_per_block - 1024) / ((min(ROWS_PER_STAGE, M) * N * elem_bytes + 31) / 16 * 16)) * ((min(ROWS_PER_STAGE, M) * N * elem_bytes + 31) / 16 * 16)
 */
// clang-format on
// RMSNorm with rows staged in shared memory by bulk copies: y = x * rsqrt(mean(x^2) + eps) * w.
//
// Idea: a persistent grid (CTAS_PER_SM blocks per SM, or fewer when fewer fit) walks the
// tensor in tiles of ROWS_PER_STAGE consecutive rows; block b takes tiles b, b + grid, ...
// Thread 0 keeps STAGES tiles of the block in flight with one bulk copy each
// (kf_bulk::TileRing: cp.async.bulk into a ring of shared-memory stages, each completing on
// its own mbarrier), so x leaves HBM exactly once, without passing through registers, while
// the block computes on the oldest tile. Within a tile, each group of WARPS_PER_ROW warps
// owns rows group, group + ROW_GROUPS, ...: it sums x^2 from shared memory (16-byte reads,
// fp32), reduces with warp shuffles and, for groups of several warps, one exchange through
// shared memory on the group's own named barrier, then reads the row from shared memory
// again and writes y with VEC_BYTES-wide stores. A warp hands the stage back (one mbarrier
// arrival) when it is done with the tile; thread 0 refills the stage once every warp has.
//
// Rows of any length and alignment: the ring copies each tile's 16-byte aligned cover, so a
// row sits in shared memory at the same address modulo 16 as in x. When x and y are equally
// misaligned (their bases agree modulo the pack size), a row is split into a scalar head up
// to y's first pack boundary, a body of packs and a scalar tail, and the packs line up in
// both; otherwise the row is read and written element by element. Weight is read in packs
// when every row starts on a pack boundary (N % VEC == 0, aligned bases); otherwise element
// by element (it stays in L1). Rows too long for even one stage (N * elem_bytes over about
// 226 KB) take a plain kernel that reads x from global memory twice.
//
// The result is deterministic and does not depend on which block or stage handles a row:
// the thread-to-element mapping depends only on the row's own address, each thread adds its
// elements in a fixed order, and reductions combine fixed partners; no atomics.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   WARPS_PER_ROW   warps that share one row. 1: reductions are warp shuffles only; more:
//                   shorter rows per thread, one named-barrier exchange per reduction.
//   ROWS_PER_STAGE  rows per tile (one bulk copy), a multiple of the groups per block. More
//                   make short rows (N ~ 1024) large copies; the host uses fewer when the
//                   tensor has fewer rows.
//   STAGES          tiles in flight per block, at most; the host uses as many as fit in
//                   shared memory (227 KB per block, less 1 KB reserved for static shared
//                   memory), down to 1. Rows too long for one stage take the plain kernel.
//   CTAS_PER_SM     blocks per SM in the persistent grid, at most (fewer when they do not fit).
//                   Bytes in flight per SM ~ CTAS_PER_SM * (STAGES - 1) * tile bytes.
//   VEC_BYTES       bytes per vector access to shared memory, weight and y (VEC elements).
//   CACHE_HINTS     1: x is copied with an L2 evict-first policy and y is stored evict-first
//                   (__stcs): neither is read again here.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kforge/bulk_copy.cuh"
#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/row_group.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kRowGroups = kWarps / WARPS_PER_ROW;  // groups per block
constexpr int kGroupThreads = WARPS_PER_ROW * kWarpSize;
constexpr bool kStreamingHints = CACHE_HINTS != 0;

static_assert(kWarps % WARPS_PER_ROW == 0, "a block holds whole groups");
static_assert(WARPS_PER_ROW == 1 || kRowGroups <= 15, "named barriers 1..15, one per group");
static_assert(VEC >= 1 && VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kWarpSize, "a row's scalar head and tail take one pass of a group");
static_assert(2 * kWarps * sizeof(float) + 2 * STAGES * sizeof(uint64_t) <=
                  kf_bulk::kStaticSharedReserve,
              "static shared memory stays within the reserve the stage plan leaves");

using kf::ElemPack;
using kf::load_bits;
using kf::load_readonly;
using kf::store;
using kf_bulk::GroupReduce;
using kf_bulk::RowSplit;

template <int kVec>
__device__ __forceinline__ float add_squares(float sum_sq, const ElemPack<kVec>& pack) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float v = kf_to_float(pack.v[k]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  return sum_sq;
}

// y for the pack of x whose first element is row element `first`. kWeightInPacks: `first` is
// a multiple of kVec and weight is pack-aligned, so weight comes in one vector load.
template <int kVec, bool kWeightInPacks>
__device__ __forceinline__ ElemPack<kVec> normalize_pack(const ElemPack<kVec>& xp,
                                                         const kf_elem* __restrict__ weight,
                                                         int first, float inv_rms) {
  float w[kVec];
  if constexpr (kWeightInPacks) {
    const ElemPack<kVec> wp =
        load_readonly(reinterpret_cast<const ElemPack<kVec>*>(weight + first));
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      w[k] = kf_to_float(wp.v[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      w[k] = kf_to_float(weight[first + k]);
    }
  }
  ElemPack<kVec> yp;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    yp.v[k] = kf_from_float<kf_elem>(kf_to_float(xp.v[k]) * inv_rms * w[k]);
  }
  return yp;
}

__device__ __forceinline__ kf_elem normalize_element(float x, float inv_rms, kf_elem weight) {
  return kf_from_float<kf_elem>(x * inv_rms * kf_to_float(weight));
}

// One row by the kThreads threads of a group (this thread is `t` of them). x_row: [n], in
// shared memory (staged) or global memory (long rows); y_row: [n]. x_row and y_row agree
// modulo the pack size.
template <int kVec, bool kWeightInPacks, int kThreads, typename Reduce>
__device__ __forceinline__ void rmsnorm_row(const kf_elem* x_row,
                                            const kf_elem* __restrict__ weight, kf_elem* y_row,
                                            int n, float eps, Reduce& reduce, int t) {
  using Pack = ElemPack<kVec>;
  const RowSplit<kVec> split(y_row, n);
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + split.head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + split.head);              // [packs]
  const int tail = split.tail_start + t;

  float sum_sq = 0.0f;
#pragma unroll 4
  for (int p = t; p < split.packs; p += kThreads) {
    sum_sq = add_squares(sum_sq, load_bits(x_packs + p));
  }
  if (t < split.head) {
    const float v = kf_to_float(x_row[t]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  if (tail < n) {
    const float v = kf_to_float(x_row[tail]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float inv_rms = rsqrtf(reduce.sum(sum_sq) / float(n) + eps);

#pragma unroll 2
  for (int p = t; p < split.packs; p += kThreads) {
    store<kStreamingHints>(y_packs + p,
                           normalize_pack<kVec, kWeightInPacks>(load_bits(x_packs + p), weight,
                                                                split.head + p * kVec, inv_rms));
  }
  if (t < split.head) {
    store<kStreamingHints>(y_row + t, normalize_element(kf_to_float(x_row[t]), inv_rms, weight[t]));
  }
  if (tail < n) {
    store<kStreamingHints>(y_row + tail,
                           normalize_element(kf_to_float(x_row[tail]), inv_rms, weight[tail]));
  }
}

// Launch bounds: registers stay within what one block of BLOCK_THREADS may hold, and the
// explicit minimum of one block per SM keeps ptxas from picking a lower register target of
// its own (and spilling) to raise occupancy.
//
// kVec: elements per pack; 1 when x and y are not equally misaligned.
// kWeightInPacks: every row starts on a pack boundary and weight is pack-aligned.
template <int kVec, bool kWeightInPacks>
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    rmsnorm_bulk(const kf_elem* __restrict__ x,       // x: [M, N]
                 const kf_elem* __restrict__ weight,  // weight: [N]
                 kf_elem* __restrict__ y,             // y: [M, N]
                 int64_t M, int N, float eps, int rows_per_stage, int stage_bytes, int stages) {
  using Ring = kf_bulk::TileRing<kf_elem, STAGES>;
  extern __shared__ __align__(128) unsigned char stage_memory[];  // [stages][stage_bytes]
  __shared__ typename Ring::Barriers barriers;
  __shared__ float partials[2 * kWarps];  // GroupReduce's slots

  const int64_t tiles = (M + rows_per_stage - 1) / rows_per_stage;
  Ring ring(barriers, stage_memory, stage_bytes, stages, x, M * N, int64_t(rows_per_stage) * N,
            tiles, kStreamingHints);
  ring.start();

  const int group = threadIdx.x / kGroupThreads;
  const int t = threadIdx.x % kGroupThreads;
  GroupReduce<WARPS_PER_ROW> reduce(partials, group);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const kf_elem* rows = ring.acquire(tile);  // [rows_here, N], shared memory
    const int64_t first_row = tile * rows_per_stage;
    const int rows_here = int(min(int64_t(rows_per_stage), M - first_row));
    for (int r = group; r < rows_here; r += kRowGroups) {
      rmsnorm_row<kVec, kWeightInPacks, kGroupThreads>(rows + r * N, weight,
                                                       y + (first_row + r) * N, N, eps, reduce, t);
    }
    ring.release(tile);
  }
}

// Rows too long for one stage: the whole block on one row at a time, element by element, x
// read from global memory twice (the second time mostly from L2).
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    rmsnorm_long_rows(const kf_elem* __restrict__ x,       // x: [M, N]
                      const kf_elem* __restrict__ weight,  // weight: [N]
                      kf_elem* __restrict__ y,             // y: [M, N]
                      int64_t M, int N, float eps) {
  __shared__ float partials[2 * kWarps];
  GroupReduce<kWarps> block_reduce(partials, 0);
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    rmsnorm_row<1, true, BLOCK_THREADS>(x + row * N, weight, y + row * N, N, eps, block_reduce,
                                        threadIdx.x);
  }
}

template <int kVec, bool kWeightInPacks>
int launch_staged(const kf_bulk::StagePlan& plan, cudaStream_t stream, const kf_elem* x,
                  const kf_elem* weight, kf_elem* y, int64_t M, int N, float eps) {
  const auto kernel = rmsnorm_bulk<kVec, kWeightInPacks>;
  static const cudaError_t opted_in = kf_bulk::opt_in_stage_memory((const void*)kernel);
  if (opted_in != cudaSuccess) return KF_ERR_LAUNCH;
  const int blocks_per_sm = std::min(
      CTAS_PER_SM,
      kf_bulk::resident_blocks_per_sm((const void*)kernel, BLOCK_THREADS, plan.shared_bytes));
  const int64_t tiles = (M + plan.rows_per_stage - 1) / plan.rows_per_stage;
  const int64_t blocks = std::min(tiles, int64_t(blocks_per_sm) * kf_bulk::device_facts().sm_count);
  kernel<<<unsigned(blocks), BLOCK_THREADS, plan.shared_bytes, stream>>>(
      x, weight, y, M, N, eps, plan.rows_per_stage, plan.stage_bytes, plan.stages);
  return KF_OK;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 1) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || weight.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: M = shape[0] for the [M, N] case.
  const int64_t N = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != N) return KF_ERR_UNSUPPORTED;
  if (N == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t M = kf_numel(&x) / N;
  if (N > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  const kf_bulk::StagePlan plan =
      kf_bulk::plan_stages(M, N * int64_t(sizeof(kf_elem)), ROWS_PER_STAGE, STAGES);
  int status = KF_OK;
  if (plan.stages == 0) {
    const int64_t blocks = std::min(M, int64_t(4) * kf_bulk::device_facts().sm_count);
    rmsnorm_long_rows<<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(x_data, w_data, y_data, M,
                                                                      int(N), eps);
  } else {
    // A staged row lies at the same address modulo 16 as in x, so its packs line up with y's
    // when the bases agree modulo the pack size.
    constexpr uintptr_t kPackBytes = sizeof(ElemPack<VEC>);
    const uintptr_t x_base = reinterpret_cast<uintptr_t>(x_data);
    const uintptr_t y_base = reinterpret_cast<uintptr_t>(y_data);
    const bool vectorized = (x_base - y_base) % kPackBytes == 0;
    const bool weight_in_packs = vectorized && N % VEC == 0 && y_base % kPackBytes == 0 &&
                                 reinterpret_cast<uintptr_t>(w_data) % kPackBytes == 0;
    if (weight_in_packs) {
      status = launch_staged<VEC, true>(plan, stream, x_data, w_data, y_data, M, int(N), eps);
    } else if (vectorized) {
      status = launch_staged<VEC, false>(plan, stream, x_data, w_data, y_data, M, int(N), eps);
    } else {
      status = launch_staged<1, false>(plan, stream, x_data, w_data, y_data, M, int(N), eps);
    }
  }
  if (status != KF_OK) return status;
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
