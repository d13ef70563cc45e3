// Content hashing for cache keys: 128-bit XXH3, printed as 32 hex digits.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace kforge {

class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  // Each field is length-prefixed so that ("ab","c") and ("a","bc") hash differently.
  Hasher& add(std::string_view field);
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string hash_hex(std::string_view data);

}  // namespace kforge
