// What the kforge subcommands share: device flags, parsing of dtypes and parameters, progress
// output, JSON files, and a session around one kernel file.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "check/checker.h"
#include "compile/compiler.h"
#include "compile/kernel_file.h"
#include "device/backend.h"
#include "ops/op_spec.h"
#include "run/worker_client.h"

namespace kforge {

// Where people read progress: stderr, so that --json output on stdout stays clean.
void progress_line(const std::string& line);

struct DeviceFlags {
  std::string backend = "auto";  // auto: what the kernel file needs, else cuda if present
  int device = 0;
};

void add_device_flags(CLI::App* cmd, DeviceFlags& flags);
// The backend to run on: the one `file` needs (when given), else the flag, else cuda when a
// GPU is visible. Throws UsageError when it cannot run here.
std::string pick_backend(const DeviceFlags& flags, const KernelFile* file);
// The device `backend` (pick_backend's answer) runs on: the flags' CUDA device, or the CPU.
DeviceInfo device_info_for(const DeviceFlags& flags, const std::string& backend);
std::vector<DType> parse_dtypes(const std::vector<std::string>& names);
// The ops named in "rmsnorm" or "rmsnorm,softmax", in order, each once; empty when any name is
// not an op (the text may be a file instead).
std::vector<const OpSpec*> ops_named(const std::string& text);
ParamValues parse_params(const std::vector<std::string>& items);
std::string device_line(const DeviceInfo& d);
// What a candidate printed (captured by its worker), indented under a heading; nothing when
// it printed nothing.
void print_candidate_output(const std::string& output);
// Writes to `path`, or stdout for "-", or nowhere for "".
void write_json(const nlohmann::json& j, const std::string& path);

// What check and bench both need: the kernel file, its op, a worker on the backend the file
// names, a compiler and a checker.
struct KernelSession {
  KernelSession(const std::string& path, const DeviceFlags& device, bool keep_intermediates);

  static const OpSpec& op_of(const KernelFile& file);
  // Device and run metadata every record carries.
  void describe_run(nlohmann::json& j, const std::vector<std::string>& argv);

  KernelFile file;
  const OpSpec& op;
  WorkerClient worker;
  Compiler compiler;
  Checker checker;
};

}  // namespace kforge
