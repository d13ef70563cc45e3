// The shared_bytes line is longer than the column limit and must stay one line.
// clang-format off
/* kforge
 * op: layernorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {128, 256, 512, 1024}
 * param: WARPS_PER_ROW = 8 in {1, 2, 4, 8, 16, 32}
 * param: ROWS_PER_STAGE = 1 in {1, 2, 4, 8, 16, 32}
 * param: STAGES = 4 in {2, 3, 4, 6, 8}
 * param: CTAS_PER_SM = 2 in {1, 2, 3, 4}
 * param: VEC_BYTES = 16 in {4, 8, 16}
 * param: REG_PACKS = 4 in {0, 1, 2, 4, 8}
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
 * # Registers: REG_PACKS * VEC floats of the row per thread, plus about 48 others, within
 * # what a block of BLOCK_THREADS may hold (at most 255 per thread).
 * require: REG_PACKS * VEC <= min(176, 65536 / BLOCK_THREADS - 48)
 * threads: BLOCK_THREADS
 * shared_bytes: min(STAGES, (max_shared_per_block - 1024) / ((min(ROWS_PER_STAGE, batch) * dim * elem_bytes + 31) / 16 * 16)) * ((min(ROWS_PER_STAGE, batch) * dim * elem_bytes + 31) / 16 * 16)
 */
// clang-format on
// LayerNorm with rows staged in shared memory by bulk copies:
// y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance, over the last dim).
//
// Idea: a persistent grid (CTAS_PER_SM blocks per SM, or fewer when fewer fit) walks the
// tensor in tiles of ROWS_PER_STAGE consecutive rows; block b takes tiles b, b + grid, ...
// Thread 0 keeps STAGES tiles of the block in flight with one bulk copy each
// (kf_bulk::TileRing: cp.async.bulk into a ring of shared-memory stages, each completing on
// its own mbarrier), so x leaves HBM exactly once, without passing through registers, while
// the block computes on the oldest tile. Within a tile, each group of WARPS_PER_ROW warps
// owns rows group, group + ROW_GROUPS, ...
//
// Statistics are exact two-pass in fp32 on shifted values: d = x - K with K the row's first
// element (exact when x and K are within a factor of two, as in near-constant rows), mean =
// sum(d) / dim, then var = sum((d - mean)^2) / dim from the same values; no sum of squares is
// ever subtracted from a squared sum, so a row of |x| ~ 100 with variance ~ 1e-4 keeps its
// low bits. y = (d - mean) * rsqrt(var + eps) * weight + bias.
//
//   row in registers (at most REG_PACKS * VEC * group threads elements): each thread reads its
//     packs from shared memory once into fp32 registers (as d) and does both sums and y from
//     there.
//   longer rows (or REG_PACKS = 0): three passes over the row in shared memory.
//
// Reductions: warp shuffles and, for groups of several warps, one exchange through shared
// memory on the group's own named barrier. A warp hands the stage back (one mbarrier arrival)
// when it is done with the tile; thread 0 refills the stage once every warp has.
//
// Rows of any length and alignment: the ring copies each tile's 16-byte aligned cover, so a
// row sits in shared memory at the same address modulo 16 as in x. When x and y are equally
// misaligned (their bases agree modulo the pack size), a row is split into a scalar head up
// to y's first pack boundary, a body of packs and a scalar tail, and the packs line up in
// both; otherwise the row is read and written element by element. Weight and bias are read in
// packs when every row starts on a pack boundary (dim % VEC == 0, aligned bases); otherwise
// element by element (they stay in L1). Rows too long for even one stage (dim * elem_bytes
// over about 226 KB) take a plain kernel that reads x from global memory three times.
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
//                   make short rows (dim ~ 128) large copies; the host uses fewer when the
//                   tensor has fewer rows.
//   STAGES          tiles in flight per block, at most; the host uses as many as fit in
//                   shared memory (227 KB per block, less 1 KB reserved for static shared
//                   memory), down to 1. Rows too long for one stage take the plain kernel.
//   CTAS_PER_SM     blocks per SM in the persistent grid, at most (fewer when they do not fit).
//                   Bytes in flight per SM ~ CTAS_PER_SM * (STAGES - 1) * tile bytes.
//   VEC_BYTES       bytes per vector access to shared memory, weight, bias and y (VEC
//                   elements).
//   REG_PACKS       packs of the row a thread holds in registers; rows up to REG_PACKS * VEC *
//                   WARPS_PER_ROW * 32 elements read shared memory once. 0: always three
//                   passes.
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

// Weight and bias of row elements [first, first + kVec) as floats. kParamsInPacks: `first` is
// a multiple of kVec and both are pack-aligned, so each comes in one vector load.
template <int kVec, bool kParamsInPacks>
__device__ __forceinline__ void load_params(const kf_elem* __restrict__ weight,
                                            const kf_elem* __restrict__ bias, int first,
                                            float (&w)[kVec], float (&b)[kVec]) {
  if constexpr (kParamsInPacks) {
    using Pack = ElemPack<kVec>;
    const Pack wp = load_readonly(reinterpret_cast<const Pack*>(weight + first));
    const Pack bp = load_readonly(reinterpret_cast<const Pack*>(bias + first));
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      w[k] = kf_to_float(wp.v[k]);
      b[k] = kf_to_float(bp.v[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      w[k] = kf_to_float(weight[first + k]);
      b[k] = kf_to_float(bias[first + k]);
    }
  }
}

// y of one element from d = x - shift.
__device__ __forceinline__ kf_elem normalize(float d, float mean, float inv_std, float w, float b) {
  return kf_from_float<kf_elem>(fmaf((d - mean) * inv_std, w, b));
}

// One row held in registers: n <= kRegPacks * kVec * kThreads, so this thread's packs are
// p = t + i * kThreads for i < kRegPacks. By the kThreads threads of a group (this thread is
// `t` of them). x_row: [n] in shared memory; y_row: [n]; they agree modulo the pack size.
template <int kVec, bool kParamsInPacks, int kRegPacks, int kThreads, typename Reduce>
__device__ __forceinline__ void layernorm_row_in_registers(const kf_elem* x_row,
                                                           const kf_elem* __restrict__ weight,
                                                           const kf_elem* __restrict__ bias,
                                                           kf_elem* y_row, int n, float eps,
                                                           Reduce& reduce, int t) {
  using Pack = ElemPack<kVec>;
  const RowSplit<kVec> split(y_row, n);
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + split.head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + split.head);              // [packs]
  const int tail = split.tail_start + t;
  const bool has_head = t < split.head;
  const bool has_tail = tail < n;
  const float shift = kf_to_float(x_row[0]);

  // d = x - shift of this thread's packs; the loops over i unroll fully, so d[][] lives in
  // registers.
  float d[kRegPacks][kVec];
  float d_head = 0.0f;
  float d_tail = 0.0f;
  float local = 0.0f;
#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    if (t + i * kThreads < split.packs) {
      const Pack xp = load_bits(x_packs + t + i * kThreads);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        d[i][k] = kf_to_float(xp.v[k]) - shift;
        local += d[i][k];
      }
    }
  }
  if (has_head) {
    d_head = kf_to_float(x_row[t]) - shift;
    local += d_head;
  }
  if (has_tail) {
    d_tail = kf_to_float(x_row[tail]) - shift;
    local += d_tail;
  }
  const float mean = reduce.sum(local) / float(n);  // of d, not of x

  local = 0.0f;
#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    if (t + i * kThreads < split.packs) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float dev = d[i][k] - mean;
        local = fmaf(dev, dev, local);
      }
    }
  }
  if (has_head) local = fmaf(d_head - mean, d_head - mean, local);
  if (has_tail) local = fmaf(d_tail - mean, d_tail - mean, local);
  const float inv_std = rsqrtf(reduce.sum(local) / float(n) + eps);

#pragma unroll
  for (int i = 0; i < kRegPacks; ++i) {
    const int p = t + i * kThreads;
    if (p < split.packs) {
      float w[kVec], b[kVec];
      load_params<kVec, kParamsInPacks>(weight, bias, split.head + p * kVec, w, b);
      Pack yp;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        yp.v[k] = normalize(d[i][k], mean, inv_std, w[k], b[k]);
      }
      store<kStreamingHints>(y_packs + p, yp);
    }
  }
  if (has_head) {
    store<kStreamingHints>(
        y_row + t, normalize(d_head, mean, inv_std, kf_to_float(weight[t]), kf_to_float(bias[t])));
  }
  if (has_tail) {
    store<kStreamingHints>(y_row + tail, normalize(d_tail, mean, inv_std, kf_to_float(weight[tail]),
                                                   kf_to_float(bias[tail])));
  }
}

// One row of any length in three passes, by the kThreads threads of a group (this thread is
// `t` of them). x_row: [n], in shared memory (staged) or global memory (long rows); y_row:
// [n]; they agree modulo the pack size.
template <int kVec, bool kParamsInPacks, int kThreads, typename Reduce>
__device__ __forceinline__ void layernorm_row_three_pass(const kf_elem* x_row,
                                                         const kf_elem* __restrict__ weight,
                                                         const kf_elem* __restrict__ bias,
                                                         kf_elem* y_row, int n, float eps,
                                                         Reduce& reduce, int t) {
  using Pack = ElemPack<kVec>;
  const RowSplit<kVec> split(y_row, n);
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + split.head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + split.head);              // [packs]
  const int tail = split.tail_start + t;
  const bool has_head = t < split.head;
  const bool has_tail = tail < n;
  const float shift = kf_to_float(x_row[0]);

  // Pass 1: sum of d = x - shift.
  float local = 0.0f;
#pragma unroll 4
  for (int p = t; p < split.packs; p += kThreads) {
    const Pack xp = load_bits(x_packs + p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      local += kf_to_float(xp.v[k]) - shift;
    }
  }
  if (has_head) local += kf_to_float(x_row[t]) - shift;
  if (has_tail) local += kf_to_float(x_row[tail]) - shift;
  const float mean = reduce.sum(local) / float(n);  // of d, not of x

  // Pass 2: sum of (d - mean)^2.
  local = 0.0f;
#pragma unroll 4
  for (int p = t; p < split.packs; p += kThreads) {
    const Pack xp = load_bits(x_packs + p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float dev = (kf_to_float(xp.v[k]) - shift) - mean;
      local = fmaf(dev, dev, local);
    }
  }
  if (has_head) {
    const float dev = (kf_to_float(x_row[t]) - shift) - mean;
    local = fmaf(dev, dev, local);
  }
  if (has_tail) {
    const float dev = (kf_to_float(x_row[tail]) - shift) - mean;
    local = fmaf(dev, dev, local);
  }
  const float inv_std = rsqrtf(reduce.sum(local) / float(n) + eps);

  // Pass 3: y.
#pragma unroll 2
  for (int p = t; p < split.packs; p += kThreads) {
    const Pack xp = load_bits(x_packs + p);
    float w[kVec], b[kVec];
    load_params<kVec, kParamsInPacks>(weight, bias, split.head + p * kVec, w, b);
    Pack yp;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      yp.v[k] = normalize(kf_to_float(xp.v[k]) - shift, mean, inv_std, w[k], b[k]);
    }
    store<kStreamingHints>(y_packs + p, yp);
  }
  if (has_head) {
    store<kStreamingHints>(y_row + t, normalize(kf_to_float(x_row[t]) - shift, mean, inv_std,
                                                kf_to_float(weight[t]), kf_to_float(bias[t])));
  }
  if (has_tail) {
    store<kStreamingHints>(y_row + tail,
                           normalize(kf_to_float(x_row[tail]) - shift, mean, inv_std,
                                     kf_to_float(weight[tail]), kf_to_float(bias[tail])));
  }
}

// Launch bounds: registers stay within what one block of BLOCK_THREADS may hold, and the
// explicit minimum of one block per SM keeps ptxas from picking a lower register target of
// its own (and spilling) to raise occupancy.
//
// kVec: elements per pack; 1 when x and y are not equally misaligned.
// kParamsInPacks: every row starts on a pack boundary; weight and bias are pack-aligned.
// kRegPacks: > 0 when every row fits in registers (dim <= kRegPacks * kVec * group threads);
// 0 for three passes.
template <int kVec, bool kParamsInPacks, int kRegPacks>
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    layernorm_bulk(const kf_elem* __restrict__ x,       // x: [batch, dim]
                   const kf_elem* __restrict__ weight,  // weight: [dim]
                   const kf_elem* __restrict__ bias,    // bias: [dim]
                   kf_elem* __restrict__ y,             // y: [batch, dim]
                   int64_t batch, int dim, float eps, int rows_per_stage, int stage_bytes,
                   int stages) {
  using Ring = kf_bulk::TileRing<kf_elem, STAGES>;
  extern __shared__ __align__(128) unsigned char stage_memory[];  // [stages][stage_bytes]
  __shared__ typename Ring::Barriers barriers;
  __shared__ float partials[2 * kWarps];  // GroupReduce's slots

  const int64_t tiles = (batch + rows_per_stage - 1) / rows_per_stage;
  Ring ring(barriers, stage_memory, stage_bytes, stages, x, batch * dim,
            int64_t(rows_per_stage) * dim, tiles, kStreamingHints);
  ring.start();

  const int group = threadIdx.x / kGroupThreads;
  const int t = threadIdx.x % kGroupThreads;
  GroupReduce<WARPS_PER_ROW> reduce(partials, group);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const kf_elem* rows = ring.acquire(tile);  // [rows_here, dim], shared memory
    const int64_t first_row = tile * rows_per_stage;
    const int rows_here = int(min(int64_t(rows_per_stage), batch - first_row));
    for (int r = group; r < rows_here; r += kRowGroups) {
      const kf_elem* x_row = rows + r * dim;
      kf_elem* y_row = y + (first_row + r) * dim;
      if constexpr (kRegPacks > 0) {
        layernorm_row_in_registers<kVec, kParamsInPacks, kRegPacks, kGroupThreads>(
            x_row, weight, bias, y_row, dim, eps, reduce, t);
      } else {
        layernorm_row_three_pass<kVec, kParamsInPacks, kGroupThreads>(x_row, weight, bias, y_row,
                                                                      dim, eps, reduce, t);
      }
    }
    ring.release(tile);
  }
}

// Rows too long for one stage: the whole block on one row at a time, element by element, x
// read from global memory three times (the later reads mostly from L2).
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    layernorm_long_rows(const kf_elem* __restrict__ x,       // x: [batch, dim]
                        const kf_elem* __restrict__ weight,  // weight: [dim]
                        const kf_elem* __restrict__ bias,    // bias: [dim]
                        kf_elem* __restrict__ y,             // y: [batch, dim]
                        int64_t batch, int dim, float eps) {
  __shared__ float partials[2 * kWarps];
  GroupReduce<kWarps> block_reduce(partials, 0);
  for (int64_t row = blockIdx.x; row < batch; row += gridDim.x) {
    layernorm_row_three_pass<1, true, BLOCK_THREADS>(x + row * dim, weight, bias, y + row * dim,
                                                     dim, eps, block_reduce, threadIdx.x);
  }
}

template <int kVec, bool kParamsInPacks, int kRegPacks>
int launch_staged(const kf_bulk::StagePlan& plan, cudaStream_t stream, const kf_elem* x,
                  const kf_elem* weight, const kf_elem* bias, kf_elem* y, int64_t batch, int dim,
                  float eps) {
  const auto kernel = layernorm_bulk<kVec, kParamsInPacks, kRegPacks>;
  static const cudaError_t opted_in = kf_bulk::opt_in_stage_memory((const void*)kernel);
  if (opted_in != cudaSuccess) return KF_ERR_LAUNCH;
  const int blocks_per_sm = std::min(
      CTAS_PER_SM,
      kf_bulk::resident_blocks_per_sm((const void*)kernel, BLOCK_THREADS, plan.shared_bytes));
  const int64_t tiles = (batch + plan.rows_per_stage - 1) / plan.rows_per_stage;
  const int64_t blocks = std::min(tiles, int64_t(blocks_per_sm) * kf_bulk::device_facts().sm_count);
  kernel<<<unsigned(blocks), BLOCK_THREADS, plan.shared_bytes, stream>>>(
      x, weight, bias, y, batch, dim, eps, plan.rows_per_stage, plan.stage_bytes, plan.stages);
  return KF_OK;
}

// The staged kernel for this row layout: registers when every row fits.
template <int kVec, bool kParamsInPacks>
int launch_staged_layout(bool rows_fit_registers, const kf_bulk::StagePlan& plan,
                         cudaStream_t stream, const kf_elem* x, const kf_elem* weight,
                         const kf_elem* bias, kf_elem* y, int64_t batch, int dim, float eps) {
  if (rows_fit_registers) {
    return launch_staged<kVec, kParamsInPacks, REG_PACKS>(plan, stream, x, weight, bias, y, batch,
                                                          dim, eps);
  }
  return launch_staged<kVec, kParamsInPacks, 0>(plan, stream, x, weight, bias, y, batch, dim, eps);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 3 || args->num_outputs != 1 || args->num_scalars != 1) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const kf_tensor& bias = args->inputs[2];
  const kf_tensor& y = args->outputs[0];
  if (x.dtype != kf_elem_dtype || weight.dtype != kf_elem_dtype || bias.dtype != kf_elem_dtype ||
      y.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  if (x.ndim < 1 || !kf_same_shape(&x, &y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: batch = shape[0] for the [batch, dim] case.
  const int64_t dim = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != dim || kf_numel(&bias) != dim) return KF_ERR_UNSUPPORTED;
  if (dim == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t batch = kf_numel(&x) / dim;
  if (dim > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  const auto* b_data = static_cast<const kf_elem*>(bias.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  const kf_bulk::StagePlan plan =
      kf_bulk::plan_stages(batch, dim * int64_t(sizeof(kf_elem)), ROWS_PER_STAGE, STAGES);
  int status = KF_OK;
  if (plan.stages == 0) {
    const int64_t blocks = std::min(batch, int64_t(4) * kf_bulk::device_facts().sm_count);
    layernorm_long_rows<<<unsigned(blocks), BLOCK_THREADS, 0, stream>>>(
        x_data, w_data, b_data, y_data, batch, int(dim), eps);
  } else {
    // A staged row lies at the same address modulo 16 as in x, so its packs line up with y's
    // when the bases agree modulo the pack size.
    constexpr uintptr_t kPackBytes = sizeof(ElemPack<VEC>);
    const uintptr_t x_base = reinterpret_cast<uintptr_t>(x_data);
    const uintptr_t y_base = reinterpret_cast<uintptr_t>(y_data);
    const bool vectorized = (x_base - y_base) % kPackBytes == 0;
    const bool params_in_packs = vectorized && dim % VEC == 0 && y_base % kPackBytes == 0 &&
                                 reinterpret_cast<uintptr_t>(w_data) % kPackBytes == 0 &&
                                 reinterpret_cast<uintptr_t>(b_data) % kPackBytes == 0;
    // A row's packs number at most dim / VEC, so this bounds every row.
    const bool rows_fit_registers =
        REG_PACKS > 0 && dim <= int64_t(REG_PACKS) * VEC * kGroupThreads;
    if (params_in_packs) {
      status = launch_staged_layout<VEC, true>(rows_fit_registers, plan, stream, x_data, w_data,
                                               b_data, y_data, batch, int(dim), eps);
    } else if (vectorized) {
      status = launch_staged_layout<VEC, false>(rows_fit_registers, plan, stream, x_data, w_data,
                                                b_data, y_data, batch, int(dim), eps);
    } else {
      status = launch_staged<1, false, 0>(plan, stream, x_data, w_data, b_data, y_data, batch,
                                          int(dim), eps);
    }
  }
  if (status != KF_OK) return status;
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
