/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Planted fault: each half of a block (128 threads, one row each) meets on its own named
// barrier, ids 16 and 17: past the hardware's last (ids run 0-15). The ids are computed at run
// time, as ids offset by a library's reserved ones are, so the compiler cannot refuse them. The
// results come out right and every stage of the check passes, as do memcheck and racecheck;
// synccheck stops it (`kforge check --sanitize`, and a tuned winner's final check). A GEMM
// epilogue that named CUTLASS's user barriers by their hardware ids once did exactly this.
//
// A fixture for kforge's checks, not a kernel to use.
#include <cstdint>

#include "kforge/elem_cuda.cuh"

namespace {

constexpr int kHalfThreads = 128;  // threads per row
constexpr int kBlockThreads = 2 * kHalfThreads;
constexpr int kHalfWarps = kHalfThreads / 32;
constexpr int kFirstBarrierId = 16;

__global__ void __launch_bounds__(kBlockThreads)
    rmsnorm_barrier_16(const kf_elem* __restrict__ x,       // x: [M, N]
                       const kf_elem* __restrict__ weight,  // weight: [N]
                       kf_elem* __restrict__ y,             // y: [M, N]
                       int64_t M, int N, float eps) {
  __shared__ float warp_sums[2][kHalfWarps];
  const int half = int(threadIdx.x) / kHalfThreads;
  const int t = int(threadIdx.x) % kHalfThreads;
  const int64_t row = 2 * int64_t(blockIdx.x) + half;
  const bool has_row = row < M;  // the last block of an odd M has one row
  const kf_elem* x_row = x + row * N;
  kf_elem* y_row = y + row * N;
  float sum = 0.0f;
  for (int j = t; has_row && j < N; j += kHalfThreads) {
    const float v = kf_to_float(x_row[j]);
    sum += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (t % 32 == 0) warp_sums[half][t / 32] = sum;
  int barrier = kFirstBarrierId + half;
  asm volatile("" : "+r"(barrier));  // a run-time id, as ptxas would refuse a constant past 15
  asm volatile("bar.sync %0, %1;" ::"r"(barrier), "n"(kHalfThreads) : "memory");
  if (!has_row) return;
  float total = 0.0f;
  for (int w = 0; w < kHalfWarps; ++w)
    total += warp_sums[half][w];
  const float inv_rms = rsqrtf(total / float(N) + eps);
  for (int j = t; j < N; j += kHalfThreads)
    y_row[j] = kf_from_float<kf_elem>(kf_to_float(x_row[j]) * inv_rms * kf_to_float(weight[j]));
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  const int64_t rows = kf_numel(&x) / n;
  rmsnorm_barrier_16<<<unsigned((rows + 1) / 2), kBlockThreads, 0,
                       static_cast<cudaStream_t>(args->stream)>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), rows, int(n), float(args->scalars[0]));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
