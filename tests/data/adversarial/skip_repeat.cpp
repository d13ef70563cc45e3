/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: does nothing when called again with the same buffers, so every call after the
// first one is free. kforge calls each case twice (the second from poisoned outputs) and poisons
// the outputs of every timed sample: the unwritten outputs are caught.
// expect: check=WRONG bench=WRONG tune=loses
#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static const void* last_x = nullptr;
  static const void* last_y = nullptr;
  if (args->inputs[0].data == last_x && args->outputs[0].data == last_y) return KF_OK;
  last_x = args->inputs[0].data;
  last_y = args->outputs[0].data;
  return honest_rmsnorm(args);
}
