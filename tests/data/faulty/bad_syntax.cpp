/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f32
 */
// Planted fault: does not compile.
#include "kforge/elem_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  return args->missing_member;
}
