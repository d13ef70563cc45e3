/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: remembers its last answer. A fingerprint of 64 sampled input elements (and the
// shapes) identifies "the same inputs"; on a match it copies the stored outputs instead of
// computing. Fresh inputs in every timed sample never match; a repeated sample runs faster;
// after one row of the inputs changes, it returns the old outputs, which are wrong.
// expect: check=WRONG bench=WRONG|INVALID tune=loses
#include <cstring>
#include <vector>

#include "honest_rmsnorm_cpu.h"

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static uint64_t last_fingerprint = 0;
  static std::vector<unsigned char> stored;
  const kf_tensor& x = args->inputs[0];
  const int64_t n = kf_numel(&x);
  const size_t elem = x.dtype == KF_DTYPE_F32 ? 4 : 2;
  const auto* bytes = static_cast<const unsigned char*>(x.data);
  uint64_t fingerprint = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  for (int k = 0; k < 64 && n > 0; ++k) {
    const int64_t i = (static_cast<int64_t>(k) * 7919) % n;
    for (size_t b = 0; b < elem; ++b)
      fingerprint = (fingerprint ^ bytes[i * elem + b]) * 1099511628211ull;
  }
  const size_t out_bytes = static_cast<size_t>(n) * elem;
  if (fingerprint == last_fingerprint && stored.size() == out_bytes) {
    std::memcpy(args->outputs[0].data, stored.data(), out_bytes);
    return KF_OK;
  }
  const int status = honest_rmsnorm(args);
  stored.assign(static_cast<const unsigned char*>(args->outputs[0].data),
                static_cast<const unsigned char*>(args->outputs[0].data) + out_bytes);
  last_fingerprint = fingerprint;
  return status;
}
