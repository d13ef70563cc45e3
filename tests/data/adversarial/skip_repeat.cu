/* kforge
 * op: rmsnorm
 * backend: cuda
 * dtypes: f16, bf16, f32
 */
// Adversarial: does nothing when called again with the same buffers. kforge calls each case
// twice (the second from poisoned outputs), and poisons the outputs of every timed sample.
// expect: check=WRONG bench=WRONG tune=loses
#include "honest_rmsnorm.cuh"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static const void* last_x = nullptr;
  static const void* last_y = nullptr;
  if (args->inputs[0].data == last_x && args->outputs[0].data == last_y) return KF_OK;
  last_x = args->inputs[0].data;
  last_y = args->outputs[0].data;
  return honest_rmsnorm(args);
}
