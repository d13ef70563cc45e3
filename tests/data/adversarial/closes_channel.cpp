/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: closes every descriptor above stderr, the worker's channel to kforge among them.
// kforge sees the channel close, ends the worker and gives a CRASH verdict.
// expect: check=CRASH bench=CRASH tune=loses
#include <unistd.h>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  for (int fd = 3; fd < 1024; ++fd)
    close(fd);
  return honest_rmsnorm(args);
}
