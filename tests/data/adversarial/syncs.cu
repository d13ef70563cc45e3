/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: synchronizes the device inside the call (the kernel ABI forbids it: it would
// time host round trips and hides work on other streams). Such a call cannot be captured.
// expect: check=INVALID bench=INVALID tune=loses
#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const int status = honest_rmsnorm(args);
  cudaDeviceSynchronize();
  return status;
}
