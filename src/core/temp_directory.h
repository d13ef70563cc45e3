// A fresh directory under the system's temp directory (mkdtemp), removed with everything in it
// when its owner goes, unless kept.
#pragma once

#include <filesystem>
#include <string>

namespace kforge {

class TempDirectory {
 public:
  // Named PREFIX-XXXXXX; throws Error when it cannot be made.
  explicit TempDirectory(const std::string& prefix);
  ~TempDirectory();
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  void keep() { keep_ = true; }

 private:
  std::filesystem::path path_;
  bool keep_ = false;
};

}  // namespace kforge
