/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: launches its (correct) work on a private non-blocking stream, so the events on
// the given stream time nothing. The call is captured into a graph: the work ran while the
// given stream was being captured, which only work outside that stream can.
// expect: check=INVALID bench=INVALID tune=loses
#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static cudaStream_t side = nullptr;
  if (side == nullptr) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  return honest_rmsnorm_on(args, side);
}
