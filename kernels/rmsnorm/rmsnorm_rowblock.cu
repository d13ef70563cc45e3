/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: BLOCK_THREADS = 256 in {64, 128, 256, 512, 1024}
 * param: VEC = 4 in {1, 2, 4, 8}
 * param: ROWS_PER_BLOCK = 1 in {1, 2, 4, 8}
 * require: BLOCK_THREADS >= 32 * ROWS_PER_BLOCK
 * require: (BLOCK_THREADS / ROWS_PER_BLOCK) % 32 == 0
 * require: VEC * elem_bytes <= 16
 * require: BLOCK_THREADS <= max_threads_per_block
 */
// RMSNorm with one group of whole warps per row.
//
// Idea: a block of BLOCK_THREADS threads is split into ROWS_PER_BLOCK groups, and each group
// owns one row. The group reads its row once to sum x^2 in fp32 (per-thread partial sums, a
// warp shuffle, one float per warp through shared memory, a second shuffle), and a second
// time to write y = x * rsqrt(mean + eps) * weight. The second read usually hits L2 because
// the row was just read.
//
// x and y move in VEC-element vector accesses. A row need not start on a vector boundary
// (N = 50257, say): it is split into a scalar head up to the first aligned element, a vector
// body and a scalar tail. Weight is read in vectors only when every row starts aligned
// (N % VEC == 0); otherwise element by element, which is cheap since weight stays in cache.
// When the x and y bases are not both vector-aligned, the whole row is read with scalar
// accesses.
//
// Tunables:
//   BLOCK_THREADS   threads per block.
//   VEC             elements per vector load/store (VEC * elem_bytes <= 16).
//   ROWS_PER_BLOCK  rows per block; more than one keeps short rows (N ~ 128) from leaving
//                   most of a large block idle.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = BLOCK_THREADS / kWarpSize;
constexpr int kGroupThreads = BLOCK_THREADS / ROWS_PER_BLOCK;  // threads that share one row
constexpr int kWarpsPerGroup = kGroupThreads / kWarpSize;
// 64 registers x 1024 threads fill an SM's register file, so any BLOCK_THREADS can launch.
// (__launch_bounds__ would also guarantee that, but then ptxas squeezes some variants into 32
// registers and spills.)
constexpr int kMaxRegisters = 64;

static_assert(kGroupThreads % kWarpSize == 0, "each row must be owned by whole warps");
static_assert(VEC * sizeof(kf_elem) <= 16, "a vector access moves at most 16 bytes");
static_assert(VEC <= kGroupThreads, "a row's scalar head and tail take one pass of its group");

// kVec consecutive elements, aligned so that one instruction loads or stores all of them.
template <int kVec>
struct alignas(kVec * sizeof(kf_elem)) ElemPack {
  kf_elem v[kVec];
};

__device__ __forceinline__ float warp_sum(float value) {
  // Butterfly: every lane adds the same pairs (a + b == b + a), so all lanes end with
  // bit-identical sums.
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// Sum over the kWarpsPerGroup warps of this thread's group; every thread of the group gets the
// same value. Contains a __syncthreads(), so every thread of the block must call it.
__device__ __forceinline__ float group_sum(float value, int group) {
  __shared__ float warp_sums[kWarps];
  const int lane = threadIdx.x % kWarpSize;
  value = warp_sum(value);
  if (lane == 0) warp_sums[threadIdx.x / kWarpSize] = value;
  __syncthreads();
  value = lane < kWarpsPerGroup ? warp_sums[group * kWarpsPerGroup + lane] : 0.0f;
  return warp_sum(value);
}

// Packs of kVec elements; kVec == 1 is the scalar path, for bases that are not vector-aligned.
// kWeightInPacks: every row starts on a pack boundary (N % kVec == 0, aligned bases), so weight
// packs line up with x packs; otherwise weight is read element by element (it is small and
// stays in cache).
template <int kVec, bool kWeightInPacks>
__global__ void __maxnreg__(kMaxRegisters)
    rmsnorm_rowblock(const kf_elem* __restrict__ x,       // x: [M, N]
                     const kf_elem* __restrict__ weight,  // weight: [N]
                     kf_elem* __restrict__ y,             // y: [M, N]
                     int64_t M, int N, float eps) {
  using Pack = ElemPack<kVec>;
  constexpr int kPackBytes = int(sizeof(Pack));

  const int group = threadIdx.x / kGroupThreads;
  const int thread_in_group = threadIdx.x % kGroupThreads;
  const int64_t row = int64_t(blockIdx.x) * ROWS_PER_BLOCK + group;
  // The last block can hold fewer than ROWS_PER_BLOCK rows; its idle groups still take part
  // in the barrier in group_sum, so they cannot return early.
  const bool has_row = row < M;

  const kf_elem* x_row = x + row * N;  // x_row: [N]
  kf_elem* y_row = y + row * N;        // y_row: [N]

  // Row layout: [0, head) scalar, [head, tail_start) as `packs` vectors, [tail_start, N)
  // scalar. x and y rows are equally misaligned (the host checks both bases), so one split
  // serves both. head and the tail are shorter than kVec, so each thread handles at most one
  // element of each.
  const int misalignment = int(reinterpret_cast<uintptr_t>(x_row) % kPackBytes);
  const int head = min(N, (kPackBytes - misalignment) % kPackBytes / int(sizeof(kf_elem)));
  const int packs = (N - head) / kVec;
  const int tail_start = head + packs * kVec;
  const int tail_index = tail_start + thread_in_group;  // this thread's tail element, if < N
  const Pack* x_packs = reinterpret_cast<const Pack*>(x_row + head);  // [packs]
  Pack* y_packs = reinterpret_cast<Pack*>(y_row + head);              // [packs]

  // Pass 1: sum of x^2 over the row.
  float sum_sq = 0.0f;
  if (has_row) {
    for (int p = thread_in_group; p < packs; p += kGroupThreads) {
      const Pack pack = x_packs[p];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float v = kf_to_float(pack.v[k]);
        sum_sq = fmaf(v, v, sum_sq);
      }
    }
    if (thread_in_group < head) {
      const float v = kf_to_float(x_row[thread_in_group]);
      sum_sq = fmaf(v, v, sum_sq);
    }
    if (tail_index < N) {
      const float v = kf_to_float(x_row[tail_index]);
      sum_sq = fmaf(v, v, sum_sq);
    }
  }
  const float row_sum_sq = group_sum(sum_sq, group);
  if (!has_row) return;
  const float inv_rms = rsqrtf(row_sum_sq / float(N) + eps);

  // Pass 2: y = x * inv_rms * weight.
  for (int p = thread_in_group; p < packs; p += kGroupThreads) {
    const Pack xp = x_packs[p];
    float w[kVec];
    if constexpr (kWeightInPacks) {
      const Pack wp = reinterpret_cast<const Pack*>(weight)[p];  // head == 0 here
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        w[k] = kf_to_float(wp.v[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        w[k] = kf_to_float(weight[head + p * kVec + k]);
      }
    }
    Pack yp;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      yp.v[k] = kf_from_float<kf_elem>(kf_to_float(xp.v[k]) * inv_rms * w[k]);
    }
    y_packs[p] = yp;
  }
  if (thread_in_group < head) {
    const int j = thread_in_group;
    y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
  }
  if (tail_index < N) {
    const int j = tail_index;
    y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
  }
}

bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

bool same_shape(const kf_tensor& a, const kf_tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int32_t i = 0; i < a.ndim; ++i) {
    if (a.shape[i] != b.shape[i]) return false;
  }
  return true;
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
  if (x.ndim < 1 || !same_shape(x, y)) return KF_ERR_UNSUPPORTED;

  // Leading dimensions are rows: M = shape[0] for the [M, N] case.
  const int64_t N = x.shape[x.ndim - 1];
  if (kf_numel(&weight) != N) return KF_ERR_UNSUPPORTED;
  if (N == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t M = kf_numel(&x) / N;
  const int64_t blocks = (M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
  if (N > INT32_MAX || blocks > INT32_MAX) return KF_ERR_UNSUPPORTED;

  const auto* x_data = static_cast<const kf_elem*>(x.data);
  const auto* w_data = static_cast<const kf_elem*>(weight.data);
  auto* y_data = static_cast<kf_elem*>(y.data);
  const float eps = float(args->scalars[0]);
  const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);

  // Vector accesses need x and y equally misaligned, which holds when both bases are aligned.
  constexpr size_t kPackBytes = sizeof(ElemPack<VEC>);
  const bool vectorized = is_aligned(x_data, kPackBytes) && is_aligned(y_data, kPackBytes);
  const bool weight_in_packs = vectorized && N % VEC == 0 && is_aligned(w_data, kPackBytes);
  const dim3 grid(static_cast<unsigned>(blocks));
  if (weight_in_packs) {
    rmsnorm_rowblock<VEC, true>
        <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, w_data, y_data, M, int(N), eps);
  } else if (vectorized) {
    rmsnorm_rowblock<VEC, false>
        <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, w_data, y_data, M, int(N), eps);
  } else {
    rmsnorm_rowblock<1, true>
        <<<grid, BLOCK_THREADS, 0, stream>>>(x_data, w_data, y_data, M, int(N), eps);
  }
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
