/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: exits the worker process from inside the call, with status 0.
// expect: check=CRASH bench=CRASH tune=loses
#include <cstdlib>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args*) {
  std::exit(0);
}
