/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: a device-side call counter; the first few launches compute, later ones copy x
// to y (fast and wrong). Everything stays on the given stream, so it is captured and timed;
// the fastest timed sample is taken again and checked against the reference.
// expect: check=WRONG bench=WRONG tune=loses
#include "honest_rmsnorm.cuh"

__device__ unsigned int g_launches = 0;

__global__ void count_launch() {
  atomicAdd(&g_launches, 1u);
}

__global__ void rmsnorm_or_copy(const kf_elem* x, const kf_elem* w, kf_elem* y, int n, float eps) {
  if (*static_cast<volatile unsigned int*>(&g_launches) <= 3) {
    honest_rmsnorm_row(x + int64_t(blockIdx.x) * n, w, y + int64_t(blockIdx.x) * n, n, eps);
    return;
  }
  for (int j = threadIdx.x; j < n; j += kHonestThreads)
    y[int64_t(blockIdx.x) * n + j] = x[int64_t(blockIdx.x) * n + j];
}

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const auto stream = static_cast<cudaStream_t>(args->stream);
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  count_launch<<<1, 1, 0, stream>>>();
  rmsnorm_or_copy<<<unsigned(kf_numel(&x) / n), kHonestThreads, 0, stream>>>(
      static_cast<const kf_elem*>(x.data), static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), int(n), float(args->scalars[0]));
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
