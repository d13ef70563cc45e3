/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: sets an access policy window that marks x persisting on the stream kforge passes
// it, and leaves it there. A stream's window applies to every kernel launched on it afterwards,
// kforge's own redraw of the inputs included, so x would be written into the persisting set-aside
// before each flush. The window on the given stream is refused, and the worker replaced.
// expect: check=OK|INVALID bench=INVALID tune=loses
#include <algorithm>

#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_tensor& x = args->inputs[0];
  int device = 0;
  cudaGetDevice(&device);
  int max_window = 0;
  cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  cudaStreamAttrValue window{};
  window.accessPolicyWindow.base_ptr = x.data;
  window.accessPolicyWindow.num_bytes =
      std::min<size_t>(size_t(kf_numel(&x)) * sizeof(kf_elem), size_t(max_window));
  window.accessPolicyWindow.hitRatio = 1.0f;
  window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  cudaStreamSetAttribute(static_cast<cudaStream_t>(args->stream),
                         cudaStreamAttributeAccessPolicyWindow, &window);
  return honest_rmsnorm(args);
}
