/* kforge
 * op: cross_entropy
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {128, 256, 512, 1024}
 * param: CLUSTER = 2 in {2, 4, 8}
 * param: PACK_BYTES = 16 in {4, 8, 16}
 * param: UNROLL = 4 in {1, 2, 4, 8}
 * param: CACHE_HINTS = 0 in {0, 1}
 * param: STAGES = 2 in {0, 2, 3, 4}
 * derive: VEC = PACK_BYTES / elem_bytes
 * require: BLOCK_THREADS <= max_threads_per_block
 * threads: BLOCK_THREADS
 * shared_bytes: STAGES * UNROLL * BLOCK_THREADS * PACK_BYTES
 * cluster: CLUSTER
 */
// Mean cross-entropy over the rows whose target is not -100, each row split across a
// thread-block cluster, in one launch.
//
// Idea: one cluster of CLUSTER blocks per row. Block r of the cluster reads the r-th of CLUSTER
// contiguous slices of the row, so a row's bytes are requested by CLUSTER SMs at once: few rows
// (batch 1 to a few hundred) still spread over the GPU, and each block's part of the work is
// short, so the grid drains in small steps. Each block reduces its slice to a state
// (max, sum), as below; the states meet in block 0's warp 0 through distributed shared memory
// (each block publishes its state in its own shared memory, cluster barrier, block 0 reads
// the CLUSTER states and merges them in rank order, cluster barrier so that no block leaves
// while its state may still be read). Block 0 then finishes the row. This keeps the split
// entirely on chip: no per-slice workspace, no second pass. (The alternative, slices written to
// global memory and combined in the final step, would make the last block read batch x
// CLUSTER states.)
//
// Per element, as in cross_entropy_rowblock.cu: a thread takes UNROLL packs of PACK_BYTES at a
// time (a batch), finds the batch's largest element first and only then computes exps, so
// every element costs one FFMA and one MUFU.EX2 and the running sum is rescaled once per batch:
//
//   state (m, c, s): m = largest element so far, c = m * log2(e) rounded to fp32,
//                    s = sum of 2^(x * log2(e) - c) over the elements so far.
//   batch: m' = max(m, batch max), c' = m' * log2(e), s = s * 2^(c - c') if m grew,
//          then s += 2^fma(x, log2(e), -c') per element.
//
// The fma rounds only its small result, so each term is as exact as the MUFU (about 2^-22
// relative), whatever c is; the loss is taken relative to c too,
// loss = (c - x[target] * log2(e) + log2(s)) * ln(2). States merge as
// (max m, sum of s_t * 2^(c_t - c)): over a warp with shuffles, across warps through shared
// memory, across the cluster as above. That needs 2^(x * log2(e) - c) not to overflow, true
// for |m| < 2^23; a thread whose largest element is beyond that, or whose sum is not finite
// (inf or NaN logits), marks its sum NaN, the merges carry it to the row, and block 0 sums the
// whole row again as sum(exp(x - max)) with the row's max known. Ordinary logits never take
// that path.
//
// Loads in flight: STAGES = 0 loads each batch into registers. STAGES = k >= 2 streams each
// thread's packs through a private ring of k batches in shared memory with cp.async (the next
// k - 1 batches in flight while one is used, no registers held for them). Each thread reads
// back only the slots it filled, so cp.async.wait_group alone orders copies before reads; a
// slot is refilled one batch after it was read, when its values have been used.
//
// The mean: block 0 of each cluster writes its row's loss to a per-row fp32 workspace (0 for an
// ignored row, which no block reads: the whole cluster skips it) and bumps a counter; the one
// that finds itself last adds the counted rows' losses in a fixed order (each thread a fixed
// stride of rows, in fp64, then a fixed tree), writes the mean, or NaN when no row counts, and
// sets the counter back to 0 for the next launch. Launches on one stream run one after
// another, so one counter serves them all. No atomic touches a value: bit-reproducible.
//
// Rows need not start on a pack boundary (vocab = 50257): each row is split into a scalar head
// up to the first pack-aligned element (block 0 reads it), a body of packs (split into the
// slices) and a scalar tail (block 0); any element-aligned base works. A target outside
// [0, vocab) that is not -100 makes its row's loss NaN instead of reading out of bounds. When
// the device cannot run the cluster launch, the same kernel runs with one block per row.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   CLUSTER         blocks per row (the cluster size).
//   PACK_BYTES      bytes per vector load (VEC = PACK_BYTES / elem_bytes elements); 16 is one
//                   128-bit load.
//   UNROLL          packs per batch: loads a thread issues together, and the span over which
//                   the max is taken before the exps.
//   CACHE_HINTS     1: logits are read with an evict-first hint (__ldcs, or an L2 evict-first
//                   policy on cp.async): each byte is read once. 0: no hint.
//   STAGES          0: batches load into registers. k >= 2: a cp.async ring of k batches per
//                   thread in shared memory (k * UNROLL * BLOCK_THREADS * PACK_BYTES bytes).
#include <cmath>
#include <cstdint>
#include <cstring>

#include <cooperative_groups.h>

#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

namespace {

constexpr int kRowThreads = BLOCK_THREADS;  // a row's slice belongs to one block

}  // namespace

// After kRowThreads, which it reads.
#include "cross_entropy_common.cuh"

namespace {

constexpr int kCluster = CLUSTER;

static_assert(kCluster >= 1 && kCluster <= kWarpSize, "one lane per block of a cluster");

// Rows (clusters) of the running launch that are finished. The last one resets it to 0.
__device__ unsigned int g_rows_done = 0;

// row_loss[r] = logsumexp(logits[r, :]) - logits[r, targets[r]] (0 for an ignored row), one
// cluster of kClusterBlocks blocks per row (1: a plain launch, one block per row); then, in the
// last row to finish, loss = the mean over the counted rows.
//
// Launch bounds: registers stay within what one block of BLOCK_THREADS may hold, so every
// variant can launch. The explicit minimum of one block per SM keeps ptxas from picking a
// lower register target of its own (and spilling) to raise occupancy.
template <int kClusterBlocks>
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    cross_entropy_split(const kf_elem* __restrict__ logits,   // logits: [batch, vocab]
                        const int64_t* __restrict__ targets,  // targets: [batch]
                        float* row_loss,                      // row_loss: [batch]
                        kf_elem* __restrict__ loss,           // loss: [] (one element)
                        int64_t batch, int vocab) {
  namespace cg = cooperative_groups;
  constexpr int kPackBytes = int(sizeof(Pack));
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  Pack* ring = reinterpret_cast<Pack*>(dynamic_shared);  // STAGES >= 2: the cp.async ring

  const int rank = kClusterBlocks > 1 ? int(cg::this_cluster().block_rank()) : 0;
  const int64_t row = int64_t(blockIdx.x) / kClusterBlocks;
  const int64_t target = row < batch ? targets[row] : kIgnoreIndex;
  // Uniform over the cluster: an ignored row (or the padding row of an empty batch) is left
  // to block 0 alone, which only records it.
  const bool has_row = row < batch && target != kIgnoreIndex;
  if (!has_row && rank != 0) return;
  const bool target_in_range = target >= 0 && target < vocab;

  const kf_elem* x_row = logits + row * vocab;  // x_row: [vocab]

  // The target's logit, loaded early so that its latency hides behind the row's.
  float target_logit = NAN;
  if (has_row && rank == 0 && threadIdx.x == 0 && target_in_range) {
    target_logit = kf_to_float(x_row[target]);
  }

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` packs, [tail_start, vocab)
  // scalar; head and the tail are shorter than VEC <= BLOCK_THREADS, so block 0 reads them in
  // one pass. The packs are split into kClusterBlocks contiguous slices, this block's being
  // [slice_begin, slice_end).
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(vocab, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (vocab - head) / VEC;
  const int tail_start = head + packs * VEC;
  const int tail_index = tail_start + threadIdx.x;  // this thread's tail element, if < vocab
  const bool has_head = has_row && rank == 0 && int(threadIdx.x) < head;
  const bool has_tail = has_row && rank == 0 && tail_index < vocab;
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  const int slice_begin = int(int64_t(packs) * rank / kClusterBlocks);
  const int slice_end = int(int64_t(packs) * (rank + 1) / kClusterBlocks);

  ScaledSum acc;
  if (has_row) {
    add_row_packs(acc, x_packs + slice_begin, slice_end - slice_begin, threadIdx.x, ring);
  }
  if (has_head) add_element(acc, kf_to_float(x_row[threadIdx.x]));
  if (has_tail) add_element(acc, kf_to_float(x_row[tail_index]));
  // A state that cannot be trusted (see the top) poisons the merge. The empty state (m = -inf,
  // s = 0) is fine.
  if (!(fabsf(acc.max) < kFastMaxMagnitude) && acc.max != -INFINITY) acc.sum = NAN;

  ScaledSum row_acc = group_merge(acc, 0);
  if constexpr (kClusterBlocks > 1) {
    if (has_row) {  // uniform over the cluster
      const cg::cluster_group cluster = cg::this_cluster();
      __shared__ float2 block_state;    // this block's (max, sum), read by block 0
      __shared__ float2 cluster_state;  // block 0: the row's (max, sum)
      if (threadIdx.x == 0) block_state = make_float2(row_acc.max, row_acc.sum);
      // Every block's state is written and visible cluster-wide (release / acquire).
      cluster.sync();
      if (rank == 0 && threadIdx.x < kWarpSize) {
        ScaledSum part;  // lanes past the cluster size hold the empty state
        if (int(threadIdx.x) < kClusterBlocks) {
          const float2 state = *cluster.map_shared_rank(&block_state, int(threadIdx.x));
          part.max = state.x;
          part.scaled_max = state.x * kLog2e;
          part.sum = state.y;
        }
        const ScaledSum merged = warp_merge(part);
        if (threadIdx.x == 0) cluster_state = make_float2(merged.max, merged.sum);
      }
      // Block 0 has read every state; the others may leave.
      cluster.sync();
      if (rank != 0) return;
      row_acc.max = cluster_state.x;  // written by thread 0 before the barrier
      row_acc.scaled_max = row_acc.max * kLog2e;
      row_acc.sum = cluster_state.y;
    }
  }

  // From here on only block 0 of the cluster runs, and everything is uniform over it.
  float row_value = 0.0f;  // the row's loss; 0 for an ignored row
  if (has_row && isfinite(row_acc.sum)) {
    row_value = (fmaf(-target_logit, kLog2e, row_acc.scaled_max) + log2f(row_acc.sum)) * kLn2;
  } else if (has_row) {
    // The fast state was not trusted: the whole row again, as sum(exp(x - max)) with the row's
    // exact max (every term <= 1, the max's term 1), by this block alone.
    const float max = row_acc.max;
    float sum = 0.0f;
    for (int p = threadIdx.x; p < packs; p += BLOCK_THREADS) {
      const Pack pack = load_pack(x_packs + p);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        sum += expf(kf_to_float(pack.v[k]) - max);
      }
    }
    if (int(threadIdx.x) < head) sum += expf(kf_to_float(x_row[threadIdx.x]) - max);
    if (tail_index < vocab) sum += expf(kf_to_float(x_row[tail_index]) - max);
    const float row_sum = group_sum(sum, 0);
    // max - x[target] first: both may be near the fp32 maximum, their difference is not.
    row_value = (max - target_logit) + logf(row_sum);
  }

  // Publish the row's loss, then count the row as done.
  __shared__ bool is_last_row;
  if (threadIdx.x == 0) {
    if (row < batch) row_loss[row] = row_value;
    fence_acq_rel_gpu();
    const unsigned rows_launched = gridDim.x / kClusterBlocks;
    const bool last = atomicAdd(&g_rows_done, 1u) == rows_launched - 1;
    if (last) fence_acq_rel_gpu();
    is_last_row = last;
  }
  __syncthreads();
  if (!is_last_row) return;
  // Every row's loss is published and counted; nothing else touches the counter in this
  // launch.
  if (threadIdx.x == 0) g_rows_done = 0;
  write_mean(row_loss, targets, loss, batch);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  CrossEntropyCall call;
  if (!read_call(args, call)) return KF_ERR_UNSUPPORTED;
  // At least one row, so that an empty batch still writes its NaN.
  const int64_t rows = call.batch > 0 ? call.batch : 1;
  if (rows * kCluster > INT32_MAX) return KF_ERR_UNSUPPORTED;

  // Launch setup, once per process (the module lives in one process, on one device): any ring
  // opts in past the default 48 KB of shared memory per block (static shared memory counts
  // too), and the cluster launch is used only where at least one cluster fits on the device.
  constexpr size_t kRingBytes = size_t(kStages) * UNROLL * BLOCK_THREADS * sizeof(Pack);
  const auto allow_ring = [](const void* kernel) {
    return kRingBytes == 0 ||
           cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(kRingBytes)) == cudaSuccess;
  };
  static const bool single_ready =
      allow_ring(reinterpret_cast<const void*>(cross_entropy_split<1>));
  static const bool cluster_ready = [&] {
    if (!allow_ring(reinterpret_cast<const void*>(cross_entropy_split<kCluster>))) return false;
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kCluster;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(kCluster);
    config.blockDim = dim3(BLOCK_THREADS);
    config.dynamicSmemBytes = kRingBytes;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    const bool fits = cudaOccupancyMaxActiveClusters(&clusters, cross_entropy_split<kCluster>,
                                                     &config) == cudaSuccess &&
                      clusters > 0;
    cudaGetLastError();  // a failed query must not stick to the launches
    return fits;
  }();

  // Per-row losses in the module's workspace (allocated once, grown in stream order).
  static kf::Workspace workspace;
  float* row_loss = nullptr;
  if (call.batch > 0) {
    row_loss = static_cast<float*>(workspace.get(size_t(call.batch) * sizeof(float), call.stream));
    if (row_loss == nullptr) return KF_ERR_OUT_OF_MEMORY;
  }

  bool launched = false;
  if (cluster_ready) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = kCluster;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(static_cast<unsigned>(rows * kCluster));
    config.blockDim = dim3(BLOCK_THREADS);
    config.dynamicSmemBytes = kRingBytes;
    config.stream = call.stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    launched = cudaLaunchKernelEx(&config, cross_entropy_split<kCluster>, call.logits, call.targets,
                                  row_loss, call.loss, call.batch, int(call.vocab)) == cudaSuccess;
    if (!launched) cudaGetLastError();  // a refused cluster launch falls back below
  }
  if (!launched && single_ready) {
    cross_entropy_split<1>
        <<<dim3(static_cast<unsigned>(rows)), BLOCK_THREADS, kRingBytes, call.stream>>>(
            call.logits, call.targets, row_loss, call.loss, call.batch, int(call.vocab));
    launched = cudaGetLastError() == cudaSuccess;
  }
  return launched ? KF_OK : KF_ERR_LAUNCH;
}
