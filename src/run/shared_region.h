// A POSIX shared-memory region that kforge and a worker both map. Inputs are written into it by
// kforge, outputs by the worker, so large tensors never travel through a pipe.
#pragma once

#include <cstddef>
#include <string>

namespace kforge {

class SharedRegion {
 public:
  // Creates a new region of `bytes` (owner: unlinks it on destruction).
  static SharedRegion create(size_t bytes);
  // Maps an existing region by name (worker side).
  static SharedRegion open(const std::string& name, size_t bytes);
  // Unlinks regions left behind by kforge processes that no longer exist (killed mid-run).
  static void remove_stale();

  SharedRegion() = default;
  ~SharedRegion();
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  const std::string& name() const { return name_; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset() noexcept;
  std::string name_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;
};

}  // namespace kforge
