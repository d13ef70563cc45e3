#include "core/temp_directory.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace kforge {
namespace fs = std::filesystem;

TempDirectory::TempDirectory(const std::string& prefix) {
  std::string pattern = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!mkdtemp(pattern.data())) {
    throw Error(fmt::format("cannot create a directory {}: {}", pattern, std::strerror(errno)));
  }
  path_ = pattern;
}

TempDirectory::~TempDirectory() {
  if (keep_) return;
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

}  // namespace kforge
