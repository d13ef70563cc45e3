// `kforge build OP...`: compiles the library's variant for each problem and describes how to
// call it. What a program outside kforge (bench/peers, a PyTorch extension) needs to run the
// same kernel kforge checked and timed: the module, its entry point's tensors and scalars.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/common.h"

namespace kforge {

struct BuildFlags {
  std::vector<std::string> ops;
  std::string shape;
  std::string sizes;  // "all": every size of each op's benchmark sweep
  std::string dtype = "bf16";
  std::string arch;
  std::string json_path;
};

CLI::App* add_build_command(CLI::App& app, BuildFlags& flags, DeviceFlags& device);
int cmd_build(const BuildFlags& flags, const DeviceFlags& device,
              const std::vector<std::string>& argv);

}  // namespace kforge
