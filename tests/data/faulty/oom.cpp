/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Planted fault: asks for far more memory than any machine has, and reports the failure.
//
// A fixture for kforge's checks: the entry point's own allocation fails, so it returns
// KF_ERR_OUT_OF_MEMORY, which kforge must record as OOM.
#include <cstdlib>

#include "kforge/elem_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  (void)args;
  // 2^60 bytes: no allocator can satisfy this.
  void* scratch = std::malloc(size_t{1} << 60);
  if (!scratch) return KF_ERR_OUT_OF_MEMORY;
  std::free(scratch);
  return KF_OK;
}
