/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: sets aside as much L2 as the device allows for persisting accesses, then launches
// its (correct) kernel with an access policy window that marks x persisting. Lines in that part
// of L2 outlast any flush of normal writes, so x would be read from L2 in every timed sample
// (on an H100, a 16 MB buffer read that way took 7.78 us after the flush against 12.83 cold).
// The set-aside is refused, and the worker that made it is replaced.
// expect: check=OK|INVALID bench=INVALID tune=loses
#include <algorithm>

#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static cudaDeviceProp props;
  static bool set_aside = false;
  if (!set_aside) {
    int device = 0;
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&props, device);
    cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, props.persistingL2CacheMaxSize);
    set_aside = true;
  }
  const kf_tensor& x = args->inputs[0];
  const int64_t n = x.shape[x.ndim - 1];
  if (n == 0 || kf_numel(&x) == 0) return KF_OK;
  const size_t x_bytes = size_t(kf_numel(&x)) * sizeof(kf_elem);
  const size_t window = std::min<size_t>(x_bytes, props.accessPolicyMaxWindowSize);

  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeAccessPolicyWindow;
  attr.val.accessPolicyWindow.base_ptr = x.data;
  attr.val.accessPolicyWindow.num_bytes = window;
  attr.val.accessPolicyWindow.hitRatio =
      std::min(1.0f, float(props.persistingL2CacheMaxSize) / float(window));
  attr.val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attr.val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(kf_numel(&x) / n));
  config.blockDim = dim3(kHonestThreads);
  config.stream = static_cast<cudaStream_t>(args->stream);
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(
      &config, honest_rmsnorm_rows, static_cast<const kf_elem*>(x.data),
      static_cast<const kf_elem*>(args->inputs[1].data),
      static_cast<kf_elem*>(args->outputs[0].data), int(n), float(args->scalars[0]));
  return err == cudaSuccess ? KF_OK : KF_ERR_LAUNCH;
}
