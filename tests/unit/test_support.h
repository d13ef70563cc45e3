// Helpers shared by the test suites. Paths are found at run time from the test binary's
// location, so a build directory carried to another machine (the GPU machine) still works.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "compile/compiler.h"
#include "device/backend.h"

namespace kforge::test {

// A Hopper GPU's limits as the CUDA runtime reports them for an H100 or H200 (132 SMs), under
// `name`: for choices and pruning tested without a GPU.
inline DeviceInfo hopper_device(const std::string& name = "Test Hopper") {
  return DeviceInfo{.backend = "cuda",
                    .name = name,
                    .cc_major = 9,
                    .cc_minor = 0,
                    .sm_count = 132,
                    .max_threads_per_block = 1024,
                    .max_shared_per_block = 232448,
                    .max_shared_per_sm = 233472,
                    .regs_per_sm = 65536,
                    .regs_per_block = 65536,
                    .max_threads_per_sm = 2048,
                    .max_blocks_per_sm = 32,
                    .reserved_shared_per_block = 1024,
                    .warp_size = 32};
}

// The source tree: the directory holding include/kforge/kernel.h above the binary.
inline std::filesystem::path source_root() {
  return default_include_dir().parent_path();
}
inline std::string kernels_dir() {
  return library_kernels_dir().string();
}
inline std::string test_data_dir() {
  return (source_root() / "tests" / "data").string();
}
// A file's whole text ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}
// The kforge binary sits at the top of the build directory; tests live one level below.
inline std::string kforge_binary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "kforge")
      .string();
}

// A fresh directory under the system temp dir, removed when the test process exits.
inline std::filesystem::path temp_dir(const std::string& name) {
  struct Registry {
    std::vector<std::filesystem::path> dirs;
    ~Registry() {
      std::error_code ec;
      for (const auto& d : dirs)
        std::filesystem::remove_all(d, ec);
    }
  };
  static Registry registry;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kforge-test-" + std::to_string(getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  registry.dirs.push_back(dir);
  return dir;
}

// A module cache shared by the test processes of one build directory. Entries are
// content-addressed and written atomically, so concurrent tests can share it safely.
inline std::filesystem::path shared_module_cache() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / "module-cache";
}

}  // namespace kforge::test
