/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f32
 * param: UNROLL = 2 in {1, 2, 4}
 * require: UNROLL % 2 == 0 || UNROLL == 1
 */
// Fixture: a variant that breaks a `require:` line must be REJECTED before it is compiled.
// The body is never run by the tests.
#include "kforge/elem_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  (void)args;
  return KF_ERR_UNSUPPORTED;
}
