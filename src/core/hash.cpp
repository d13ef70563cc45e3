#include "core/hash.h"

#include <cstdint>

#include <fmt/format.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kforge {

struct Hasher::State {
  XXH3_state_t xxh;
};

Hasher::Hasher() : state_(std::make_unique<State>()) {
  XXH3_128bits_reset(&state_->xxh);
}
Hasher::~Hasher() = default;

Hasher& Hasher::add(std::string_view field) {
  const uint64_t size = field.size();
  XXH3_128bits_update(&state_->xxh, &size, sizeof size);
  XXH3_128bits_update(&state_->xxh, field.data(), field.size());
  return *this;
}

std::string Hasher::hex() const {
  const XXH128_hash_t h = XXH3_128bits_digest(&state_->xxh);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

std::string hash_hex(std::string_view data) {
  return Hasher().add(data).hex();
}

}  // namespace kforge
