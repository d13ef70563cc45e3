/* kforge
 * op: cross_entropy
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: PACK_BYTES = 16 in {4, 8, 16}
 * param: UNROLL = 4 in {1, 2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8}
 * param: CACHE_HINTS = 0 in {0, 1}
 * param: STAGES = 3 in {0, 2, 3, 4}
 * derive: VEC = PACK_BYTES / elem_bytes
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: BLOCK_THREADS <= max_threads_per_block
 * threads: BLOCK_THREADS
 * shared_bytes: STAGES * UNROLL * BLOCK_THREADS * PACK_BYTES
 */
// Mean cross-entropy over the rows whose target is not -100, in one launch.
//
// Idea: each row goes to a group of whole warps (ROWS_PER_BLOCK groups per block), which reads
// it once. A thread takes UNROLL packs of PACK_BYTES at a time (a batch), finds the batch's
// largest element first, and only then computes exponentials, so every element costs one exp
// (MUFU.EX2) and the running sum is rescaled once per batch, not per element:
//
//   state (m, c, s): m = largest element so far, c = m * log2(e) rounded to fp32,
//                    s = sum of 2^(x * log2(e) - c) over the elements so far.
//   batch: m' = max(m, batch max), c' = m' * log2(e), s = s * 2^(c - c') if m grew,
//          then s += 2^fma(x, log2(e), -c') per element (one FFMA and one MUFU.EX2).
//
// The fma rounds only its small result, so each term is as exact as the MUFU (about 2^-22
// relative), whatever c is. c needs no exactness: the loss is taken relative to it,
// loss = (c - x[target] * log2(e) + log2(s)) * ln(2), the first difference again in one fma.
// The states of the group's threads merge as (max m, sum of s_t * 2^(c_t - c)), over a warp
// with shuffles and across warps through shared memory.
//
// That needs 2^(x * log2(e) - c) not to overflow, i.e. c within a few units of m * log2(e):
// true for |m| < 2^23, where c's spacing is at most 1. A thread whose largest element is
// beyond that (logits near the fp32 maximum, which bf16 and f32 allow), or whose sum is not
// finite (inf or NaN logits), marks its sum NaN; the merge carries the NaN to the whole row,
// and the row is summed again as sum(exp(x - max)) with the row's max known (right for any
// finite logits, NaN where the reference is NaN). The block decides this together
// (__syncthreads_or), so its barriers stay uniform. Ordinary logits never take that path.
//
// Loads in flight: with STAGES = 0 a thread loads a batch into registers and waits for it.
// With STAGES = k >= 2 each thread streams its packs through a private ring of k batches in
// shared memory with cp.async, keeping the next k - 1 batches in flight while it works on
// one, without holding them in registers. Each thread reads back only the slots it filled,
// so cp.async.wait_group alone orders the copies before the reads: no barrier. A slot is
// refilled one batch after it was read, when the values read have already been used.
//
// The mean: each row's loss goes to a per-row fp32 workspace (0 for an ignored row, which is
// not read at all). Then each block bumps a counter; the block that finds itself last adds
// the losses of the counted rows in a fixed order (each thread a fixed stride of rows, in
// fp64, then a fixed tree), writes the mean, or NaN when no row counts, and sets the counter
// back to 0 for the next launch. Launches on one stream run one after another, so one counter
// (and one workspace, kept for the module's life: kforge/workspace.cuh) serves them all;
// calls of one module on two streams at once would share both. No atomic touches a value, so
// results are bit-reproducible.
//
// Rows need not start on a pack boundary (vocab = 50257 is common): each row is split into a
// scalar head up to the first pack-aligned element, a body of packs and a scalar tail; any
// element-aligned base works. A target outside [0, vocab) that is not -100 makes its row's
// loss NaN instead of reading out of bounds.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   PACK_BYTES      bytes per vector load (VEC = PACK_BYTES / elem_bytes elements); 16 is one
//                   128-bit load.
//   UNROLL          packs per batch: loads a thread issues together, and the span over which
//                   the max is taken before the exps.
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows from leaving most of a
//                   large block idle.
//   CACHE_HINTS     1: logits are read with an evict-first hint (__ldcs, or an L2 evict-first
//                   policy on cp.async): each byte is read once. 0: no hint.
//   STAGES          0: batches load into registers. k >= 2: a cp.async ring of k batches per
//                   thread in shared memory (k * UNROLL * BLOCK_THREADS * PACK_BYTES bytes).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kforge/elem_cuda.cuh"
#include "kforge/workspace.cuh"

namespace {

constexpr int kRowThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row

}  // namespace

// After kRowThreads, which it reads.
#include "cross_entropy_common.cuh"

namespace {

// Blocks of the running launch that have finished their rows. The last one resets it to 0.
__device__ unsigned int g_blocks_done = 0;

// row_loss[r] = logsumexp(logits[r, :]) - logits[r, targets[r]] (0 for an ignored row), then,
// in the last block to finish, loss = the mean over the counted rows.
//
// Launch bounds: registers stay within what one block of BLOCK_THREADS may hold, so every
// variant can launch. The explicit minimum of one block per SM keeps ptxas from picking a
// lower register target of its own (and spilling) to raise occupancy.
__global__ void __launch_bounds__(BLOCK_THREADS, 1)
    cross_entropy_rowblock(const kf_elem* __restrict__ logits,   // logits: [batch, vocab]
                           const int64_t* __restrict__ targets,  // targets: [batch]
                           float* row_loss,                      // row_loss: [batch]
                           kf_elem* __restrict__ loss,           // loss: [] (one element)
                           int64_t batch, int vocab) {
  constexpr int kPackBytes = int(sizeof(Pack));
  extern __shared__ __align__(16) unsigned char dynamic_shared[];
  Pack* ring = reinterpret_cast<Pack*>(dynamic_shared);  // STAGES >= 2: the cp.async ring

  const int group = threadIdx.x / kRowThreads;
  const int thread_in_group = threadIdx.x % kRowThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  const int64_t target = row < batch ? targets[row] : kIgnoreIndex;
  // The last block can hold fewer than ROWS_PER_BLOCK rows, and some rows are ignored; those
  // groups still take part in the barriers, so they cannot return early.
  const bool has_row = row < batch && target != kIgnoreIndex;
  const bool target_in_range = target >= 0 && target < vocab;

  const kf_elem* x_row = logits + row * vocab;  // x_row: [vocab]

  // The target's logit, loaded early so that its latency hides behind the row's.
  float target_logit = NAN;
  if (has_row && thread_in_group == 0 && target_in_range) {
    target_logit = kf_to_float(x_row[target]);
  }

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` packs, [tail_start, vocab)
  // scalar. head and the tail are shorter than VEC <= kRowThreads, so each thread reads at
  // most one element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(vocab, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (vocab - head) / VEC;
  const int tail_start = head + packs * VEC;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < vocab
  const bool has_head = has_row && thread_in_group < head;
  const bool has_tail = has_row && tail_index < vocab;
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]

  ScaledSum acc;
  if (has_row) add_row_packs(acc, x_packs, packs, thread_in_group, ring);
  if (has_head) add_element(acc, kf_to_float(x_row[thread_in_group]));
  if (has_tail) add_element(acc, kf_to_float(x_row[tail_index]));
  // A state that cannot be trusted (see the top) poisons the merge. The empty state (m = -inf,
  // s = 0) is fine.
  if (!(fabsf(acc.max) < kFastMaxMagnitude) && acc.max != -INFINITY) acc.sum = NAN;

  const ScaledSum row_acc = group_merge(acc, group);
  const bool fast_ok = isfinite(row_acc.sum);
  float row_value = 0.0f;  // the row's loss; 0 for an ignored row
  if (has_row && fast_ok) {
    row_value = (fmaf(-target_logit, kLog2e, row_acc.scaled_max) + log2f(row_acc.sum)) * kLn2;
  }

  // Rows whose fast state was not trusted, summed again as sum(exp(x - max)) with the row's
  // exact max (every term <= 1, the max's term 1). The whole block enters or skips this
  // together, since group_sum holds a barrier.
  const bool redo = has_row && !fast_ok;
  if (__syncthreads_or(redo)) {
    const float max = row_acc.max;
    float sum = 0.0f;
    if (redo) {
      for (int p = thread_in_group; p < packs; p += kRowThreads) {
        const Pack pack = load_pack(x_packs + p);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          sum += expf(kf_to_float(pack.v[k]) - max);
        }
      }
      if (has_head) sum += expf(kf_to_float(x_row[thread_in_group]) - max);
      if (has_tail) sum += expf(kf_to_float(x_row[tail_index]) - max);
    }
    const float row_sum = group_sum(sum, group);
    // max - x[target] first: both may be near the fp32 maximum, their difference is not.
    if (redo) row_value = (max - target_logit) + logf(row_sum);
  }

  // Publish the row's loss, then count this block as done: the barrier orders every group's
  // store before thread 0's release and increment.
  if (row < batch && thread_in_group == 0) row_loss[row] = row_value;
  __shared__ bool is_last_block;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_gpu();
    const bool last = atomicAdd(&g_blocks_done, 1u) == gridDim.x - 1;
    if (last) fence_acq_rel_gpu();
    is_last_block = last;
  }
  __syncthreads();
  if (!is_last_block) return;
  // Every block has published its rows and counted itself; nothing else touches the counter in
  // this launch.
  if (threadIdx.x == 0) g_blocks_done = 0;
  write_mean(row_loss, targets, loss, batch);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  CrossEntropyCall call;
  if (!read_call(args, call)) return KF_ERR_UNSUPPORTED;
  // At least one block, so that an empty batch still writes its NaN.
  const int64_t blocks = call.batch > 0 ? (call.batch + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK : 1;
  if (blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  // Per-row losses in the module's workspace (allocated once, grown in stream order).
  static kf::Workspace workspace;
  float* row_loss = nullptr;
  if (call.batch > 0) {
    row_loss = static_cast<float*>(workspace.get(size_t(call.batch) * sizeof(float), call.stream));
    if (row_loss == nullptr) return KF_ERR_OUT_OF_MEMORY;
  }
  // The cp.async ring may take the block past the default 48 KB of shared memory (static
  // shared memory counts too), so any ring opts in; set once per process (the module lives in one
  // process, on one device).
  constexpr size_t kRingBytes = size_t(kStages) * UNROLL * BLOCK_THREADS * sizeof(Pack);
  static const bool ring_allowed =
      kRingBytes == 0 ||
      cudaFuncSetAttribute(cross_entropy_rowblock, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kRingBytes)) == cudaSuccess;
  if (!ring_allowed) return KF_ERR_LAUNCH;
  cross_entropy_rowblock<<<dim3(static_cast<unsigned>(blocks)), BLOCK_THREADS, kRingBytes,
                           call.stream>>>(call.logits, call.targets, row_loss, call.loss,
                                          call.batch, int(call.vocab));
  const bool launched = cudaGetLastError() == cudaSuccess;
  return launched ? KF_OK : KF_ERR_LAUNCH;
}
