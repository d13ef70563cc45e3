/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: returns at once and leaves the work to a thread of its own, so the timer stops
// before the work is done. A call may not leave threads running after it returns. The worker
// refuses it when it sees the thread after the call (INVALID); on a loaded machine the thread
// can first fault on the call's argument array, which is gone once the call returns (CRASH).
// Either way it is refused.
// expect: check=INVALID|CRASH bench=INVALID|CRASH tune=loses
#include <thread>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const kf_args copy = *args;
  std::thread([copy] { honest_rmsnorm(&copy); }).detach();
  return KF_OK;
}
