/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: writes a forged reply (a worker's answer with a tiny time) to every descriptor
// it can, hoping to hit the worker's channel to kforge. A reply that kforge did not ask for
// ends the worker with a CRASH verdict; kforge itself carries on.
// expect: check=CRASH bench=CRASH tune=loses
#include <unistd.h>
#include <cstring>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  const char forged[] =
      "{\"ok\":true,\"seq\":1,\"samples\":[],\"guard_violations\":[],\"inputs_modified\":[]}\n";
  for (int fd = 3; fd < 1024; ++fd)
    (void)!write(fd, forged, std::strlen(forged));
  return honest_rmsnorm(args);
}
