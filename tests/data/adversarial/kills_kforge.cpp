/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: tries to end kforge itself (its parent), and kforge's process group. A worker
// may signal only itself: kforge lives on, and the attempt alone makes the (otherwise honest)
// kernel INVALID.
// expect: check=INVALID bench=INVALID tune=loses
#include <signal.h>
#include <unistd.h>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  kill(getppid(), SIGKILL);
  kill(-getpgid(getppid()), SIGKILL);
  return honest_rmsnorm(args);
}
