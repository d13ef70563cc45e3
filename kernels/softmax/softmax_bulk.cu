// The shared_bytes line is longer than the column limit and must stay one line.
// clang-format off
/* kforge
 * op: softmax
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {128, 256, 512, 1024}
 * param: WARPS_PER_ROW = 8 in {1, 2, 4, 8, 16, 32}
 * param: ROWS_PER_STAGE = 1 in {1, 2, 4, 8, 16, 32}
 * param: STAGES = 4 in {2, 3, 4, 6, 8}
 * param: CTAS_PER_SM = 2 in {1, 2, 3, 4}
 * param: VEC_BYTES = 16 in {4, 8, 16}
 * param: EXP_PACKS = 4 in {0, 1, 2, 4, 8, 16}
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
 * # Registers: EXP_PACKS * VEC floats of exps per thread, plus about 48 others, within what
 * # a block of BLOCK_THREADS may hold (at most 255 per thread).
 * require: EXP_PACKS * VEC <= min(192, 65536 / BLOCK_THREADS - 48)
 * threads: BLOCK_THREADS
 * shared_bytes: min(STAGES, (max_shared_per_block - 1024) / ((min(ROWS_PER_STAGE, rows) * cols * elem_bytes + 31) / 16 * 16)) * ((min(ROWS_PER_STAGE, rows) * cols * elem_bytes + 31) / 16 * 16)
 */
// clang-format on
// Softmax over the last dim with rows staged in shared memory by bulk copies:
// y = exp(x - max) / sum(exp(x - max)).
//
// Idea: a persistent grid (CTAS_PER_SM blocks per SM, or fewer when fewer fit) walks the
// tensor in tiles of ROWS_PER_STAGE consecutive rows; block b takes tiles b, b + grid, ...
// Thread 0 keeps STAGES tiles of the block in flight with one bulk copy each
// (kf_bulk::TileRing: cp.async.bulk into a ring of shared-memory stages, each completing on
// its own mbarrier), so x leaves HBM exactly once, without passing through registers, while
// the block computes on the oldest tile. Within a tile, each group of WARPS_PER_ROW warps
// owns rows group, group + ROW_GROUPS, ... Everything is accumulated in fp32:
//
//   exps in registers (a row of at most EXP_PACKS * VEC * group threads elements): each thread
//     reads its packs from shared memory once into fp32 registers, the group reduces the max,
//     each thread turns its values into e = exp(x - max) in place and sums them, the group
//     reduces the sum, and y = e / sum is written. One exp per element, no rescaling.
//   longer rows (or EXP_PACKS = 0): three passes over the row in shared memory: max; sum of
//     e; y. In f32 the second pass stores e over x in shared memory, so the third reads it
//     back and each element still takes one exp; in f16 and bf16 there is no room for fp32
//     values, and the third pass computes e again (two exps per element).
//
// exp(v) is ex2.approx(v * log2(e)) with v = x - max <= 0 computed first: one MUFU op per exp,
// and no overflow for |x| near the type's maximum (x * log2(e) alone could overflow to inf).
// Reductions: warp shuffles and, for groups of several warps, one exchange through shared
// memory on the group's own named barrier. A warp hands the stage back (one mbarrier arrival)
// when it is done with the tile; thread 0 refills the stage once every warp has.
//
// Rows of any length and alignment: the ring copies each tile's 16-byte aligned cover, so a
// row sits in shared memory at the same address modulo 16 as in x. When x and y are equally
// misaligned (their bases agree modulo the pack size), a row is split into a scalar head up
// to y's first pack boundary, a body of packs and a scalar tail, and the packs line up in
// both; otherwise the row is read and written element by element. Rows too long for even one
// stage (cols * elem_bytes over about 226 KB) take a plain kernel that reads x from global
// memory three times.
//
// The result is deterministic and does not depend on which block or stage handles a row:
// the thread-to-element mapping depends only on the row's own address, each thread combines
// its elements in a fixed order, and reductions combine fixed partners; no atomics.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   WARPS_PER_ROW   warps that share one row. 1: reductions are warp shuffles only; more:
//                   shorter rows per thread, one named-barrier exchange per reduction.
//   ROWS_PER_STAGE  rows per tile (one bulk copy), a multiple of the groups per block. More
//                   make short rows (cols ~ 128) large copies; the host uses fewer when the
//                   tensor has fewer rows.
//   STAGES          tiles in flight per block, at most; the host uses as many as fit in
//                   shared memory (227 KB per block, less 1 KB reserved for static shared
//                   memory), down to 1. Rows too long for one stage take the plain kernel.
//   CTAS_PER_SM     blocks per SM in the persistent grid, at most (fewer when they do not fit).
//                   Bytes in flight per SM ~ CTAS_PER_SM * (STAGES - 1) * tile bytes.
//   VEC_BYTES       bytes per vector access to shared memory and y (VEC elements).
//   EXP_PACKS       packs of exps a thread holds in registers; rows up to EXP_PACKS * VEC *
//                   WARPS_PER_ROW * 32 elements compute each exp once from registers. 0: always
//                   the three-pass way.
//   CACHE_HINTS     1: x is copied with an L2 evict-first policy and y is stored evict-first
//                   (__stcs): neither is read again here.
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>

#include "kforge/bulk_copy.cuh"
#include "kforge/elem_access.cuh"
#include "kforge/elem_cuda.cuh"
#include "kforge/fast_exp.cuh"
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
using kf::exp_nonpositive;
using kf::load_bits;
using kf::store;
using kf::store_bits;
using kf_bulk::GroupReduce;
using kf_bulk::RowSplit;

// One row whose exps fit in registers: n <= kExpPacks * kVec * kThreads, so this thread's
// packs are p = t + i * kThreads for i < kExpPacks. By the kThreads threads of a group (this
// thread is `t` of them). x_row: [n] in shared memory; y_row: [n]; they agree modulo the pack
// size.
template <int kVec, int kExpPacks, int kThreads, typename Reduce>
__device__ __forceinline__ void softmax_row_in_registers(const kf_elem* x_row, kf_elem* y_row,
                                                         int n, Reduce& reduce, int t) {
  using Pack = ElemPack<kVec>;
  const RowSplit<kVec> split(y_row, n);
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + split.head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + split.head);              // [packs]
  const int tail = split.tail_start + t;
  const bool has_head = t < split.head;
  const bool has_tail = tail < n;

  // x, then e = exp(x - max), of this thread's packs; the loops over i unroll fully, so e[][]
  // lives in registers.
  float e[kExpPacks][kVec];
  float e_head = 0.0f;
  float e_tail = 0.0f;
  float local_max = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kExpPacks; ++i) {
    if (t + i * kThreads < split.packs) {
      const Pack xp = load_bits(x_packs + t + i * kThreads);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        e[i][k] = kf_to_float(xp.v[k]);
        local_max = fmaxf(local_max, e[i][k]);
      }
    }
  }
  if (has_head) {
    e_head = kf_to_float(x_row[t]);
    local_max = fmaxf(local_max, e_head);
  }
  if (has_tail) {
    e_tail = kf_to_float(x_row[tail]);
    local_max = fmaxf(local_max, e_tail);
  }
  const float row_max = reduce.max(local_max);

  float local_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kExpPacks; ++i) {
    if (t + i * kThreads < split.packs) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        e[i][k] = exp_nonpositive(e[i][k] - row_max);
        local_sum += e[i][k];
      }
    }
  }
  if (has_head) {
    e_head = exp_nonpositive(e_head - row_max);
    local_sum += e_head;
  }
  if (has_tail) {
    e_tail = exp_nonpositive(e_tail - row_max);
    local_sum += e_tail;
  }
  // The row's maximum contributes exp(0) = 1, so the sum is at least 1.
  const float inv_sum = 1.0f / reduce.sum(local_sum);

#pragma unroll
  for (int i = 0; i < kExpPacks; ++i) {
    if (t + i * kThreads < split.packs) {
      Pack yp;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        yp.v[k] = kf_from_float<kf_elem>(e[i][k] * inv_sum);
      }
      store<kStreamingHints>(y_packs + t + i * kThreads, yp);
    }
  }
  if (has_head) store<kStreamingHints>(y_row + t, kf_from_float<kf_elem>(e_head * inv_sum));
  if (has_tail) store<kStreamingHints>(y_row + tail, kf_from_float<kf_elem>(e_tail * inv_sum));
}

// One row of any length in three passes, by the kThreads threads of a group (this thread is
// `t` of them). x_row: [n], in shared memory (staged) or global memory (long rows); y_row:
// [n]; they agree modulo the pack size. kExpInPlace (f32 rows in shared memory only): the
// second pass stores e over x, so the third reads e instead of computing it again.
template <int kVec, bool kExpInPlace, int kThreads, typename Reduce>
__device__ __forceinline__ void softmax_row_three_pass(const kf_elem* x_row, kf_elem* y_row, int n,
                                                       Reduce& reduce, int t) {
  using Pack = ElemPack<kVec>;
  static_assert(!kExpInPlace || sizeof(kf_elem) == sizeof(float), "e is stored as fp32");
  const RowSplit<kVec> split(y_row, n);
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + split.head);  // [packs]
  Pack* e_packs = const_cast<Pack*>(x_packs);                   // written only when kExpInPlace
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + split.head);  // [packs]
  const int tail = split.tail_start + t;
  const bool has_head = t < split.head;
  const bool has_tail = tail < n;
  kf_elem* x_row_mutable = const_cast<kf_elem*>(x_row);  // written only when kExpInPlace

  // Pass 1: max.
  float local_max = -FLT_MAX;
#pragma unroll 4
  for (int p = t; p < split.packs; p += kThreads) {
    const Pack xp = load_bits(x_packs + p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      local_max = fmaxf(local_max, kf_to_float(xp.v[k]));
    }
  }
  if (has_head) local_max = fmaxf(local_max, kf_to_float(x_row[t]));
  if (has_tail) local_max = fmaxf(local_max, kf_to_float(x_row[tail]));
  const float row_max = reduce.max(local_max);

  // Pass 2: sum of e = exp(x - max); with kExpInPlace, e replaces x.
  float local_sum = 0.0f;
#pragma unroll 4
  for (int p = t; p < split.packs; p += kThreads) {
    Pack xp = load_bits(x_packs + p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float e = exp_nonpositive(kf_to_float(xp.v[k]) - row_max);
      local_sum += e;
      if constexpr (kExpInPlace) xp.v[k] = e;
    }
    if constexpr (kExpInPlace) store_bits(e_packs + p, xp);
  }
  if (has_head) {
    const float e = exp_nonpositive(kf_to_float(x_row[t]) - row_max);
    local_sum += e;
    if constexpr (kExpInPlace) x_row_mutable[t] = e;
  }
  if (has_tail) {
    const float e = exp_nonpositive(kf_to_float(x_row[tail]) - row_max);
    local_sum += e;
    if constexpr (kExpInPlace) x_row_mutable[tail] = e;
  }
  // The row's maximum contributes exp(0) = 1, so the sum is at least 1. The reduction's
  // barrier is not needed for the in-place values: each thread reads back only its own.
  const float inv_sum = 1.0f / reduce.sum(local_sum);

  // Pass 3: y = e / sum.
  const auto e_of = [&](kf_elem x) {
    return kExpInPlace ? kf_to_float(x) : exp_nonpositive(kf_to_float(x) - row_max);
  };
#pragma unroll 4
  for (int p = t; p < split.packs; p += kThreads) {
    const Pack xp = load_bits(x_packs + p);
    Pack yp;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      yp.v[k] = kf_from_float<kf_elem>(e_of(xp.v[k]) * inv_sum);
    }
    store<kStreamingHints>(y_packs + p, yp);
  }
  if (has_head) store<kStreamingHints>(y_row + t, kf_from_float<kf_elem>(e_of(x_row[t]) * inv_sum));
  if (has_tail)
    store<kStreamingHints>(y_row + tail, kf_from_float<kf_elem>(e_of(x_row[tail]) * inv_sum));
}

// Launch bounds: registers stay within what one block of BLOCK_THREADS may hold, and the
// explicit minimum of one block per SM keeps ptxas from picking a lower register target of
// its own (and spilling) to raise occupancy.
//
// kVec: elements per pack; 1 when x and y are not equally misaligned.
// kExpPacks: > 0 when every row's exps fit in registers (cols <= kExpPacks * kVec * group
// threads); 0 for the three-pass way.
template <int kVec, int kExpPacks>
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    softmax_bulk(const kf_elem* __restrict__ x,  // x: [rows, cols]
                 kf_elem* __restrict__ y,        // y: [rows, cols]
                 int64_t rows, int cols, int rows_per_stage, int stage_bytes, int stages) {
  using Ring = kf_bulk::TileRing<kf_elem, STAGES>;
  extern __shared__ __align__(128) unsigned char stage_memory[];  // [stages][stage_bytes]
  __shared__ typename Ring::Barriers barriers;
  __shared__ float partials[2 * kWarps];  // GroupReduce's slots

  const int64_t tiles = (rows + rows_per_stage - 1) / rows_per_stage;
  Ring ring(barriers, stage_memory, stage_bytes, stages, x, rows * cols,
            int64_t(rows_per_stage) * cols, tiles, kStreamingHints);
  ring.start();

  const int group = threadIdx.x / kGroupThreads;
  const int t = threadIdx.x % kGroupThreads;
  GroupReduce<WARPS_PER_ROW> reduce(partials, group);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const kf_elem* tile_rows = ring.acquire(tile);  // [rows_here, cols], shared memory
    const int64_t first_row = tile * rows_per_stage;
    const int rows_here = int(min(int64_t(rows_per_stage), rows - first_row));
    for (int r = group; r < rows_here; r += kRowGroups) {
      const kf_elem* x_row = tile_rows + r * cols;
      kf_elem* y_row = y + (first_row + r) * cols;
      if constexpr (kExpPacks > 0) {
        softmax_row_in_registers<kVec, kExpPacks, kGroupThreads>(x_row, y_row, cols, reduce, t);
      } else {
        constexpr bool kExpInPlace = sizeof(kf_elem) == sizeof(float);
        softmax_row_three_pass<kVec, kExpInPlace, kGroupThreads>(x_row, y_row, cols, reduce, t);
      }
    }
    ring.release(tile);
  }
}

// Rows too long for one stage: the whole block on one row at a time, element by element, x
// read from global memory three times (the later reads mostly from L2).
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    softmax_long_rows(const kf_elem* __restrict__ x,  // x: [rows, cols]
                      kf_elem* __restrict__ y,        // y: [rows, cols]
                      int64_t rows, int cols) {
  __shared__ float partials[2 * kWarps];
  GroupReduce<kWarps> reduce(partials, 0);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    softmax_row_three_pass<1, false, BLOCK_THREADS>(x + row * cols, y + row * cols, cols, reduce,
                                                    threadIdx.x);
  }
}

template <int kVec, int kExpPacks>
int launch_staged(const kf_bulk::StagePlan& plan, cudaStream_t stream, const kf_elem* x, kf_elem* y,
                  int64_t rows, int cols) {
  const auto kernel = softmax_bulk<kVec, kExpPacks>;
  static const cudaError_t opted_in = kf_bulk::opt_in_stage_memory((const void*)kernel);
  if (opted_in != cudaSuccess) return KF_ERR_LAUNCH;
  const int blocks_per_sm = std::min(
      CTAS_PER_SM,
      kf_bulk::resident_blocks_per_sm((const void*)kernel, BLOCK_THREADS, plan.shared_bytes));
  const int64_t tiles = (rows + plan.rows_per_stage - 1) / plan.rows_per_stage;
  const int64_t blocks = std::min(tiles, int64_t(blocks_per_sm) * kf_bulk::device_facts().sm_count);
  kernel<<<unsigned(blocks), BLOCK_THREADS, plan.shared_bytes, stream>>>(
      x, y, rows, cols, plan.rows_per_stage, plan.stage_bytes, plan.stages);
  return KF_OK;
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 1 || args->num_outputs != 1 || args->num_scalars != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || y.dtype != kf_elem_dtype) return KF_ERR_UNSUPPORTED;
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: rows = shape[0] for the [rows, cols] case.
  const int64_t cols = x.shape[x.ndim - 1];
  if (cols == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t rows = kf_numel(&x) / cols;
  if (cols > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  const kf_bulk::StagePlan plan =
      kf_bulk::plan_stages(rows, cols * int64_t(sizeof(kf_elem)), ROWS_PER_STAGE, STAGES);
  int status = KF_OK;
  if (plan.stages == 0) {
    const int64_t blocks = std::min(rows, int64_t(4) * kf_bulk::device_facts().sm_count);
    softmax_long_rows<<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(x_data, y_data, rows,
                                                                      int(cols));
  } else {
    // A staged row lies at the same address modulo 16 as in x, so its packs line up with y's
    // when the bases agree modulo the pack size.
    constexpr uintptr_t kPackBytes = sizeof(ElemPack<VEC>);
    const bool vectorized =
        (reinterpret_cast<uintptr_t>(x_data) - reinterpret_cast<uintptr_t>(y_data)) % kPackBytes ==
        0;
    // A row's packs number at most cols / VEC, so this bounds every row.
    const bool exps_fit = EXP_PACKS > 0 && cols <= int64_t(EXP_PACKS) * VEC * kGroupThreads;
    if (vectorized && exps_fit) {
      status = launch_staged<VEC, EXP_PACKS>(plan, stream, x_data, y_data, rows, int(cols));
    } else if (vectorized) {
      status = launch_staged<VEC, 0>(plan, stream, x_data, y_data, rows, int(cols));
    } else {
      status = launch_staged<1, 0>(plan, stream, x_data, y_data, rows, int(cols));
    }
  }
  if (status != KF_OK) return status;
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
