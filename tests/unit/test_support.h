// Helpers shared by the test suites. Paths are found at run time from the test binary's
// location, so a build directory carried to another machine (the GPU machine) still works.
#pragma once

#include <filesystem>
#include <string>

#include <unistd.h>

#include "compile/compiler.h"

namespace kforge::test {

// The source tree: the directory holding include/kforge/kernel.h above the binary.
inline std::filesystem::path source_root() {
  return default_include_dir().parent_path();
}
inline std::string kernels_dir() {
  return (source_root() / "kernels").string();
}
inline std::string test_data_dir() {
  return (source_root() / "tests" / "data").string();
}
// The kforge binary sits at the top of the build directory; tests live one level below.
inline std::string kforge_binary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "kforge")
      .string();
}

// A fresh directory under the system temp dir, unique to this process and name.
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kforge-test-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace kforge::test
