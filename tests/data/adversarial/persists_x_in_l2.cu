/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 * param: SET_ASIDE = 1 in {0, 1}
 * param: WINDOW = 1 in {0, 1}
 */
// Adversarial: marks x persisting with an access policy window, so that its lines stay in the
// L2 set aside for persisting accesses, which no flush of normal writes reaches. With SET_ASIDE
// it first sets aside as much L2 as the device allows: refused, and the worker that did it is
// replaced. Without it, the window uses what the device set aside on its own (an H100 here came
// up with 9600 KB). Before kforge reset persisting lines ahead of every sample, `kforge bench`
// timed SET_ASIDE=0 at 4096x1024 in 9.92 us with the window against 12.26 without; with the
// reset, 12.61-12.77 against 12.70-12.77. The GPU test L2Policy.PersistingWindowGainsNothing
// times both. A tune may time SET_ASIDE=0 variants as honest kernels: their window, per launch,
// gains nothing once kforge resets persisting lines before each sample (an H200, 2026-11-28:
// 27.17 us at 4096x4096, slower than the library's rmsnorm).
// expect: check=OK|INVALID bench=INVALID tune=not-best
#include <algorithm>

#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static cudaDeviceProp props;
  static bool first = true;
  if (first) {
    int device = 0;
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&props, device);
    if (SET_ASIDE)
      cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, props.persistingL2CacheMaxSize);
    first = false;
  }
  size_t set_aside = 0;
  cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize);
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  const size_t x_bytes = size_t(kf_numel(&x)) * sizeof(kf_elem);
  const size_t window = std::min<size_t>(x_bytes, props.accessPolicyMaxWindowSize);

  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeAccessPolicyWindow;
  attr.val.accessPolicyWindow.base_ptr = x.data;
  attr.val.accessPolicyWindow.num_bytes = window;
  attr.val.accessPolicyWindow.hitRatio = std::min(1.0f, float(set_aside) / float(window));
  attr.val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attr.val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(kf_numel(&x) / n));
  config.blockDim = dim3(kHonestThreads);
  config.stream = static_cast<cudaStream_t>(args->stream);
  config.attrs = WINDOW && set_aside > 0 ? &attr : nullptr;
  config.numAttrs = WINDOW && set_aside > 0 ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(
      &config, honest_rmsnorm_rows, static_cast<const kf_elem*>(x.data),
      static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), int(n), float(args->scalars[0]));
  return err == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
