/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: launches its work on the legacy default stream (stream 0), not the given one.
// While the given stream is captured, that is refused, and the call cannot be captured.
// expect: check=INVALID bench=INVALID tune=loses
#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  return honest_rmsnorm_on(args, nullptr);
}
