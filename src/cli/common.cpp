#include "cli/common.h"

#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/run_info.h"

namespace kforge {

void progress_line(const std::string& line) {
  fmt::print(stderr, "{}\n", line);
}

void add_device_flags(CLI::App* cmd, DeviceFlags& flags) {
  cmd->add_option("--backend", flags.backend, "cuda, cpu or auto")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  cmd->add_option("--device", flags.device, "CUDA device index")->check(CLI::NonNegativeNumber);
}

std::string pick_backend(const DeviceFlags& flags, const KernelFile* file) {
  std::string backend = flags.backend;
  if (file) {
    const std::string needed(backend_name(file->backend));
    if (backend != "auto" && backend != needed) {
      throw UsageError(fmt::format("{} is a {} kernel file; it cannot run on --backend {}",
                                   file->path.string(), needed, backend));
    }
    backend = needed;
  } else if (backend == "auto") {
    backend = list_cuda_devices().empty() ? "cpu" : "cuda";
  }
  if (backend == "cuda") {
    const auto devices = list_cuda_devices();
    if (devices.empty()) {
      throw UsageError(
          "no CUDA device is visible on this machine; CUDA kernel files (.cu) need one. Use a "
          "CPU kernel file (kernels/<op>/<op>_cpu.cpp) to run on the CPU backend");
    }
    if (flags.device >= static_cast<int>(devices.size())) {
      throw UsageError(
          fmt::format("--device {}: only {} CUDA device(s) present", flags.device, devices.size()));
    }
  }
  return backend;
}

DeviceInfo device_info_for(const DeviceFlags& flags, const std::string& backend) {
  return backend == "cuda" ? list_cuda_devices().at(static_cast<size_t>(flags.device))
                           : cpu_device_info();
}

std::vector<DType> parse_dtypes(const std::vector<std::string>& names) {
  std::vector<DType> out;
  for (const auto& n : names) {
    const auto d = parse_dtype(n);
    if (!d) throw UsageError(fmt::format("dtype '{}' is not one of f16, bf16, f32", n));
    out.push_back(*d);
  }
  return out;
}

std::vector<const OpSpec*> ops_named(const std::string& text) {
  std::vector<const OpSpec*> ops;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const OpSpec* op = find_op(text.substr(begin, end - begin));
    if (!op) return {};
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
    begin = end + 1;
  }
  return ops;
}

ParamValues parse_params(const std::vector<std::string>& items) {
  ParamValues out;
  for (const auto& item : items) {
    const auto [name, value] = parse_param_assignment(item);
    out[name] = value;
  }
  return out;
}

std::string device_line(const DeviceInfo& d) {
  if (d.backend == "cpu") {
    return fmt::format("cpu: {} ({} cores, LLC {} MiB)", d.name, d.sm_count, d.l2_bytes >> 20);
  }
  return fmt::format("cuda:{} {} (cc {}.{}, {} SMs, {:.1f} GiB, L2 {} MiB, driver {}, runtime {})",
                     d.index, d.name, d.cc_major, d.cc_minor, d.sm_count,
                     static_cast<double>(d.total_memory) / (1 << 30), d.l2_bytes >> 20,
                     d.driver_version, d.runtime_version);
}

void print_candidate_output(const std::string& output) {
  if (output.empty()) return;
  fmt::print("\nthe kernel printed (stdout and stderr, truncated):\n");
  size_t start = 0;
  while (start < output.size()) {
    const size_t end = std::min(output.find('\n', start), output.size());
    fmt::print("  | {}\n", output.substr(start, end - start));
    start = end + 1;
  }
}

void write_json(const nlohmann::json& j, const std::string& path) {
  if (path.empty()) return;
  if (path == "-") {
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw Error(fmt::format("cannot write {}", path));
}

KernelSession::KernelSession(const std::string& path, const DeviceFlags& device,
                             bool keep_intermediates)
    : file(KernelFile::load(path)),
      op(op_of(file)),
      worker({pick_backend(device, &file), device.device}),
      compiler(CompilerOptions{.keep_intermediates = keep_intermediates}),
      checker(compiler, worker) {}

const OpSpec& KernelSession::op_of(const KernelFile& file) {
  const OpSpec* spec = find_op(file.op);
  if (!spec) {
    throw UsageError(
        fmt::format("{}: unknown op '{}' (known: {})", file.path.string(), file.op, op_names()));
  }
  return *spec;
}

void KernelSession::describe_run(nlohmann::json& j, const std::vector<std::string>& argv) {
  j["device"] = worker.device();
  j["run"] = run_metadata(argv);
  j["run"]["toolkit"] = compiler.toolkit_version(file.backend);
}

}  // namespace kforge
