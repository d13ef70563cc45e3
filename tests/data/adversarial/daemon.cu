/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: on its first call it starts a persistent kernel on a private stream that never
// ends; each call only raises a flag in device memory (on the given stream, so it is captured)
// and the daemon does the work, outside the timed stream. The device stays busy after the
// call's stream is idle, which only work outside that stream can do.
// expect: check=INVALID bench=INVALID tune=loses
#include "honest_rmsnorm.cuh"

__device__ unsigned int g_requests = 0;

__global__ void daemon_kernel(const kf_elem* x, const kf_elem* w, kf_elem* y, int m, int n,
                              float eps) {
  unsigned int seen = 0;
  for (;;) {
    const unsigned int now = atomicAdd(&g_requests, 0u);
    if (now == seen) continue;
    seen = now;
    for (int row = 0; row < m; ++row) {  // slow, but the timer is not looking
      if (threadIdx.x == 0) {
        float sum = 0.f;
        for (int j = 0; j < n; ++j)
          sum += kf_to_float(x[int64_t(row) * n + j]) * kf_to_float(x[int64_t(row) * n + j]);
        const float inv = rsqrtf(sum / float(n) + eps);
        for (int j = 0; j < n; ++j)
          y[int64_t(row) * n + j] = kf_from_float<kf_elem>(kf_to_float(x[int64_t(row) * n + j]) *
                                                           inv * kf_to_float(w[j]));
      }
    }
    __threadfence_system();
  }
}

__global__ void raise_flag() {
  atomicAdd(&g_requests, 1u);
}

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static bool started = false;
  if (!started) {
    started = true;
    cudaStream_t side = nullptr;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    const kf_tensor& x = args->inputs[0];
    const int64_t n = x.shape[x.ndim - 1];
    daemon_kernel<<<1, 32, 0, side>>>(static_cast<const kf_elem*>(x.data),
                                      static_cast<const kf_elem*>(args->inputs[1].data),
                                      static_cast<kf_elem*>(args->outputs[0].data),
                                      int(kf_numel(&x) / n), int(n), float(args->scalars[0]));
    return honest_rmsnorm(args);
  }
  raise_flag<<<1, 1, 0, static_cast<cudaStream_t>(args->stream)>>>();
  return cudaGetLastError() == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
