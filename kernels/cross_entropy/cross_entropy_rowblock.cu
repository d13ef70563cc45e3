/* kforge
 * op: cross_entropy
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {1, 2, 4, 8}
 * param: UNROLL = 2 in {1, 2, 4}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8}
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 */
// Mean cross-entropy over the rows whose target is not -100, in two launches.
//
// Idea: kernel 1 gives each row to a group of whole warps. The group reads the row once and
// keeps, per thread, a running maximum m and s = sum(exp(x - m)) ("online" logsumexp: when m
// grows, s is rescaled by exp(m_old - m_new)), merged across the warp with shuffles, then
// across the group's warps through shared memory. The row's loss, (m - x[target]) + log(s),
// goes to a per-row fp32 workspace; ignored rows are not read at all and store 0. Kernel 2,
// one block, adds the per-row losses of the counted rows in a fixed order (in fp64: a batch
// of losses near the fp32 maximum must not overflow the sum) and writes the mean, or NaN
// when no row counts. Nothing is added atomically, so results are bit-reproducible.
//
// Rows need not start on a vector boundary (vocab = 50257 is common): each row is split into
// a scalar head up to the first VEC-aligned element, a vector body and a scalar tail. When
// the logits base is not vector-aligned, the whole row is read with scalar accesses. A target
// outside [0, vocab) that is not -100 makes its row's loss NaN instead of reading out of
// bounds.
//
// Tunables:
//   BLOCK_THREADS   threads per block of kernel 1.
//   VEC             elements per vector load (VEC * elem_bytes <= 16).
//   UNROLL          vector loads a thread issues back to back.
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows from leaving most of a
//                   large block idle.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;
// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
constexpr int kMaxRegisters = 64;
// Index arithmetic below runs up to this far past the row's end in int.
constexpr int kIndexSlack = UNROLL * 1024 + 16;
constexpr int64_t kIgnoreIndex = -100;
// Threads of the one block of kernel 2.
constexpr int kMeanThreads = 256;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");

// kVec consecutive elements, aligned so that one instruction loads all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};

// Running max and sum of exp(x - max) over the elements seen so far. The empty state uses
// -FLT_MAX rather than -inf so that exp(max_a - max_b) never sees (-inf) - (-inf) = NaN.
struct MaxSum {
  float max = -FLT_MAX;
  float sum = 0.0f;
};

__device__ __forceinline__ void add_element(MaxSum& acc, float v) {
  if (v > acc.max) {
    acc.sum *= expf(acc.max - v);
    acc.max = v;
  }
  acc.sum += expf(v - acc.max);
}

template <int kCount>
__device__ __forceinline__ void add_elements(MaxSum& acc, const float (&v)[kCount]) {
  // One rescale per pack instead of one per element.
  float pack_max = v[0];
#pragma unroll
  for (int k = 1; k < kCount; ++k) {
    pack_max = fmaxf(pack_max, v[k]);
  }
  if (pack_max > acc.max) {
    acc.sum *= expf(acc.max - pack_max);
    acc.max = pack_max;
  }
#pragma unroll
  for (int k = 0; k < kCount; ++k) {
    acc.sum += expf(v[k] - acc.max);
  }
}

// Merges the (max, sum) pairs of a warp's lanes: the warp's max, then each lane rescales its
// sum to it (one exp per lane) and the sums are added. The butterfly adds the same pairs in
// every lane (a + b == b + a), so all lanes end with bit-identical results.
__device__ __forceinline__ MaxSum warp_merge(MaxSum acc) {
  float max = acc.max;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, offset));
  }
  float sum = acc.sum * expf(acc.max - max);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return MaxSum{max, sum};
}

// Merges over the kWarpsPerGroup warps of this thread's group; every thread of the group gets
// the same result. Contains a __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ MaxSum group_merge(MaxSum acc, int group) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  acc = warp_merge(acc);
  if (lane == 0) {
    warp_max[threadIdx.x / kWarpSize] = acc.max;
    warp_sum[threadIdx.x / kWarpSize] = acc.sum;
  }
  __syncthreads();
  MaxSum part;  // lanes past the group's warp count hold the empty state
  if (lane < kWarpsPerGroup) {
    part.max = warp_max[group * kWarpsPerGroup + lane];
    part.sum = warp_sum[group * kWarpsPerGroup + lane];
  }
  return warp_merge(part);
}

// Kernel 1: row_loss[r] = logsumexp(logits[r, :]) - logits[r, targets[r]], or 0 for an
// ignored row. Packs of kVec elements; kVec == 1 is the scalar path, for a base that is not
// vector-aligned.
template <int kVec>
__global__ void __maxnreg__(kMaxRegisters)
    cross_entropy_row_loss(const kf_elem* __restrict__ logits,   // logits: [batch, vocab]
                           const int64_t* __restrict__ targets,  // targets: [batch]
                           float* __restrict__ row_loss,         // row_loss: [batch]
                           int64_t batch, int vocab) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  const int64_t target = row < batch ? targets[row] : kIgnoreIndex;
  // The last block can hold fewer than ROWS_PER_BLOCK rows, and some rows are ignored; those
  // groups still take part in the barrier in group_merge, so they cannot return early.
  const bool has_row = row < batch && target != kIgnoreIndex;
  const bool target_in_range = target >= 0 && target < vocab;

  const kf_elem* x_row = logits + row * vocab;  // x_row: [vocab]

  // The target's logit, loaded early so that its latency hides behind the row's.
  float target_logit = NAN;
  if (has_row && thread_in_group == 0 && target_in_range) {
    target_logit = kf_to_float(x_row[target]);
  }

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, vocab)
  // scalar. head and the tail are shorter than kVec, so each thread reads at most one
  // element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(vocab, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (vocab - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < vocab
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]

  MaxSum acc;
  if (has_row) {
    int p = thread_in_group;
    // Whole rounds of UNROLL packs: all loads first, then the exps.
    for (; p + (UNROLL - 1) * kGroupThreads < packs; p += UNROLL * kGroupThreads) {
      Pack buffer[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        buffer[u] = x_packs[p + u * kGroupThreads];
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        float v[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          v[k] = kf_to_float(buffer[u].v[k]);
        }
        add_elements(acc, v);
      }
    }
    // The remaining packs, fewer than UNROLL per thread.
    for (; p < packs; p += kGroupThreads) {
      const Pack pack = x_packs[p];
      float v[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        v[k] = kf_to_float(pack.v[k]);
      }
      add_elements(acc, v);
    }
    if (thread_in_group < head) add_element(acc, kf_to_float(x_row[thread_in_group]));
    if (tail_index < vocab) add_element(acc, kf_to_float(x_row[tail_index]));
  }

  const MaxSum row_acc = group_merge(acc, group);
  if (row >= batch || thread_in_group != 0) return;
  if (!has_row) {
    row_loss[row] = 0.0f;
    return;
  }
  // The row's maximum contributes exp(0) = 1, so the sum is at least 1 and its log finite.
  // max - x[target] first: both may be near the fp32 maximum, their difference is not.
  row_loss[row] = (row_acc.max - target_logit) + logf(row_acc.sum);
}

__device__ __forceinline__ double warp_sum(double value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

__device__ __forceinline__ int64_t warp_sum(int64_t value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Kernel 2, one block: loss = sum of the counted rows' losses / their count, NaN if none.
// Each thread adds a fixed stride of rows in order; the threads' sums then meet in a fixed
// tree.
__global__ void __launch_bounds__(kMeanThreads)
    cross_entropy_mean(const float* __restrict__ row_loss,   // row_loss: [batch]
                       const int64_t* __restrict__ targets,  // targets: [batch]
                       kf_elem* __restrict__ loss,           // loss: [] (one element)
                       int64_t batch) {
  constexpr int kMeanWarps = kMeanThreads / kWarpSize;
  __shared__ double warp_losses[kMeanWarps];
  __shared__ int64_t warp_counts[kMeanWarps];

  double total = 0.0;
  int64_t count = 0;
  for (int64_t r = threadIdx.x; r < batch; r += kMeanThreads) {
    if (targets[r] != kIgnoreIndex) {
      total += double(row_loss[r]);
      ++count;
    }
  }
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  total = warp_sum(total);
  count = warp_sum(count);
  if (lane == 0) {
    warp_losses[warp] = total;
    warp_counts[warp] = count;
  }
  __syncthreads();
  if (warp != 0) return;
  total = lane < kMeanWarps ? warp_losses[lane] : 0.0;
  count = lane < kMeanWarps ? warp_counts[lane] : 0;
  total = warp_sum(total);
  count = warp_sum(count);
  if (lane == 0) {
    loss[0] = kf_from_float<kf_elem>(count > 0 ? float(total / double(count)) : NAN);
  }
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  if (args == nullptr || args->abi_version != KFORGE_ABI_VERSION) return KF_ERR_UNSUPPORTED;
  if (args->num_inputs != 2 || args->num_outputs != 1 || args->num_scalars != 0) {
    return KF_ERR_UNSUPPORTED;
  }
  const kf_tensor& logits = args->inputs[0];
  const kf_tensor& targets = args->inputs[1];
  const kf_tensor& loss = args->outputs[0];
  if (logits.dtype != kf_elem_dtype || targets.dtype != KF_DTYPE_I64 ||
      loss.dtype != kf_elem_dtype) {
    return KF_ERR_UNSUPPORTED;
  }
  // logits: [batch, vocab] (leading dimensions are rows); targets: one per row; loss: one
  // element.
  if (logits.ndim < 1 || kf_numel(&loss) != 1) return KF_ERR_UNSUPPORTED;
  const int64_t vocab = logits.shape[logits.ndim - 1];
  const int64_t batch = kf_numel(&targets);
  if (targets.ndim != logits.ndim - 1) return KF_ERR_UNSUPPORTED;
  for (int32_t i = 0; i < targets.ndim; ++i) {
    if (targets.shape[i] != logits.shape[i]) return KF_ERR_UNSUPPORTED;
  }
  // A row without classes has no logsumexp.
  if (batch > 0 && vocab == 0) return KF_ERR_UNSUPPORTED;
  const int64_t blocks = (batch + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  if (vocab > INT32_MAX - kIndexSlack || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(logits.data);
  const auto* t_data = static_cast<const int64_t*>(targets.data);
  auto* loss_data = static_cast<kf_elem*>(loss.data);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  // Per-row losses, stream-ordered so that no synchronization is needed.
  float* row_loss = nullptr;
  if (batch > 0) {
    if (cudaMallocAsync(reinterpret_cast<void**>(&row_loss), size_t(batch) * sizeof(float),
                        stream) != cudaSuccess) {
      cudaGetLastError();  // clear the allocation error so it does not stick to later calls
      return KF_ERR_OUT_OF_MEMORY;
    }
    const dim3 grid(static_cast<unsigned>(blocks));
    if (reinterpret_cast<uintptr_t>(x_data) % sizeof(ElemPack<VEC>) == 0) {
      cross_entropy_row_loss<VEC>
          <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, t_data, row_loss, batch, int(vocab));
    } else {
      cross_entropy_row_loss<1>
          <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, t_data, row_loss, batch, int(vocab));
    }
  }
  cross_entropy_mean<<<1, kMeanThreads, 0, stream>>>(row_loss, t_data, loss_data, batch);
  const bool launched = cudaGetLastError() == cudaSuccess;
  if (row_loss != nullptr && cudaFreeAsync(row_loss, stream) != cudaSuccess) return KF_ERR_LAUNCH;
  return launched ? KF_OK : KF_ERR_LAUNCH;
}
