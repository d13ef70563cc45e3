/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 */
// Adversarial: remembers its last inputs and answer exactly. When x and weight are byte for
// byte the last call's, it copies the stored outputs instead of computing; otherwise it computes
// (each row eight times over, as a kernel with much to save would) and stores a copy. Its
// outputs are always right, so the checks pass; only timing sees it: a repeat of the previous
// inputs costs two compares and a copy, far under a fresh call.
// expect: check=OK bench=INVALID tune=loses
#include <cstring>
#include <vector>

#include "honest_rmsnorm_cpu.h"

namespace {

bool same_bytes(const std::vector<unsigned char>& stored, const void* data, size_t bytes) {
  return stored.size() == bytes && std::memcmp(stored.data(), data, bytes) == 0;
}

void store(std::vector<unsigned char>& stored, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  stored.assign(p, p + bytes);
}

}  // namespace

KFORGE_ENTRY int kforge_run(const kf_args* args) {
  static std::vector<unsigned char> last_x, last_weight, last_y;
  const kf_tensor& x = args->inputs[0];
  const kf_tensor& weight = args->inputs[1];
  const size_t elem = x.dtype == KF_DTYPE_F32 ? 4 : 2;
  const size_t x_bytes = static_cast<size_t>(kf_numel(&x)) * elem;
  const size_t weight_bytes = static_cast<size_t>(kf_numel(&weight)) * elem;
  if (same_bytes(last_x, x.data, x_bytes) && same_bytes(last_weight, weight.data, weight_bytes) &&
      last_y.size() == x_bytes) {
    std::memcpy(args->outputs[0].data, last_y.data(), x_bytes);
    return KF_OK;
  }
  int status = KF_OK;
  for (int pass = 0; pass < 8 && status == KF_OK; ++pass)
    status = honest_rmsnorm(args);
  store(last_x, x.data, x_bytes);
  store(last_weight, weight.data, weight_bytes);
  store(last_y, args->outputs[0].data, x_bytes);
  return status;
}
