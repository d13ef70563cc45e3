/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: correct for its first few calls in a process (long enough to pass a one-off
// correctness gate), then fast and wrong: it copies x to y. Timed samples are taken again after
// the fact and checked against the reference; the fastest always is. Its memcpy of a
// cache-resident tensor can also beat the physical limit where the measured copy ceiling is low
// (a loaded 2-core machine): then the limit refuses it first.
// expect: check=WRONG bench=WRONG|INVALID tune=loses
#include <cstring>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static int calls = 0;
  if (++calls <= 2) return honest_rmsnorm(args);
  const kf_tensor& x = args->inputs[0];
  std::memcpy(args->outputs[0].data, x.data,
              static_cast<size_t>(kf_numel(&x)) * (x.dtype == KF_DTYPE_F32 ? 4 : 2));
  return KF_OK;
}
