// A profile: what ran on the GPU during one workload, kernel by kernel, with the CPU-side
// context each kernel was launched in (NVTX ranges, PyTorch ops and their input shapes).
//
// Two sources fill it: `kforge profile -- COMMAND` (CUPTI activity records gathered by an
// injection library in every CUDA process of the command) and `kforge profile --torch-trace`
// (a torch.profiler Chrome trace). Both write the same JSON file, which `kforge plan` reads.
//
// Times are nanoseconds on the GPU's timestamp clock (CUPTI) or the trace's clock; only
// differences within one profile mean anything.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge {

// One level of CPU-side context around a kernel launch, outermost first in a kernel's list:
// an NVTX range ("aten::addmm, seq = 12, sizes = [[8, 512], [512, 512]]", "Attention") or a
// torch.profiler CPU op. Shapes and dtypes are filled where the source records them.
struct OpContext {
  std::string name;                              // "aten::addmm", or the range's text
  std::vector<std::vector<int64_t>> input_dims;  // one entry per input; empty dims for scalars
  std::vector<std::string> input_types;          // "c10::BFloat16", "float", ... where known
  // Scalar arguments as a torch.profiler trace records them ("Concrete Inputs": "True", "0.",
  // "" for tensors); one entry per input where known.
  std::vector<std::string> input_values;
  // Which call this entry was: entries of two kernels with the same number (within one profile)
  // are one call, whose kernels all ran inside it. 0 when the source does not say.
  int64_t call = 0;
  bool operator==(const OpContext&) const = default;
};

struct KernelRecord {
  std::string name;       // as the driver reports it (mangled for C++ kernels)
  std::string demangled;  // readable name; equal to `name` when it is not a mangled name
  std::array<int64_t, 3> grid = {1, 1, 1};
  std::array<int64_t, 3> block = {1, 1, 1};
  int64_t registers = 0;     // per thread
  int64_t static_smem = 0;   // bytes per block
  int64_t dynamic_smem = 0;  // bytes per block
  int64_t cluster_size = 0;  // blocks per cluster (0: not a cluster launch)
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t stream = 0;
  int64_t device = 0;
  int64_t pid = 0;                 // process that launched it
  int64_t correlation = 0;         // links the kernel to its launch call within one process
  std::vector<OpContext> context;  // outermost first
  int64_t duration_ns() const { return end_ns - start_ns; }
};

// A copy or a fill done by the GPU (not a kernel).
struct TransferRecord {
  std::string kind;  // "HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "memset"
  int64_t bytes = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t stream = 0;
  int64_t device = 0;
  int64_t pid = 0;
  int64_t duration_ns() const { return end_ns - start_ns; }
};

// An NVTX range as the CPU saw it (push/pop or start/end), kept so that regions can be selected
// after the run.
struct RangeRecord {
  std::string name;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t thread = 0;
  int64_t pid = 0;
  int depth = 0;  // nesting depth on its thread, 0 = outermost
};

struct DeviceRecord {
  int64_t id = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int64_t sm_count = 0;
  bool operator==(const DeviceRecord&) const = default;
};

struct Profile {
  static constexpr int kFormatVersion = 1;

  std::string source;  // "cupti" or "torch-trace"
  std::vector<std::string> command;
  std::optional<int> exit_code;  // of the profiled command, when kforge ran it
  std::string region;            // how kernels were selected ("all", "nvtx range step #3..", ...)
  int64_t dropped_records = 0;   // activity records CUPTI could not deliver (0 = complete)
  std::vector<DeviceRecord> devices;
  std::vector<KernelRecord> kernels;
  std::vector<TransferRecord> transfers;
  std::vector<RangeRecord> ranges;
  nlohmann::json metadata = nlohmann::json::object();  // git SHA, date, host (run_metadata)

  // Sum of kernel durations (kernels on concurrent streams each count in full).
  int64_t kernel_time_ns() const;
  // Time at least one kernel or transfer was running: the union of their intervals, per
  // device, summed over devices.
  int64_t busy_time_ns() const;
};

void to_json(nlohmann::json& j, const OpContext& c);
void from_json(const nlohmann::json& j, OpContext& c);
void to_json(nlohmann::json& j, const KernelRecord& k);
void from_json(const nlohmann::json& j, KernelRecord& k);
void to_json(nlohmann::json& j, const TransferRecord& t);
void from_json(const nlohmann::json& j, TransferRecord& t);
void to_json(nlohmann::json& j, const RangeRecord& r);
void from_json(const nlohmann::json& j, RangeRecord& r);
void to_json(nlohmann::json& j, const DeviceRecord& d);
void from_json(const nlohmann::json& j, DeviceRecord& d);
void to_json(nlohmann::json& j, const Profile& p);
// Throws ParseError naming the field when the file is not a kforge profile of a known version.
void from_json(const nlohmann::json& j, Profile& p);

Profile read_profile(const std::filesystem::path& path);
// Writes atomically (temporary file, then rename), so a reader never sees half a profile.
void write_profile(const Profile& profile, const std::filesystem::path& path);

}  // namespace kforge
