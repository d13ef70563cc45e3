#include "profile/profile.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"

namespace kforge {
namespace fs = std::filesystem;

namespace {

// Reads a required field, naming it when it is missing or of the wrong type.
template <typename T>
T field(const nlohmann::json& j, const char* key, const char* what) {
  if (!j.contains(key)) throw Error(fmt::format("profile: {} without \"{}\"", what, key));
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("profile: {} \"{}\": {}", what, key, e.what()));
  }
}

// Length of the union of [start, end) intervals.
int64_t union_length(std::vector<std::pair<int64_t, int64_t>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  int64_t total = 0;
  int64_t open_start = 0;
  int64_t open_end = 0;
  bool open = false;
  for (const auto& [start, end] : intervals) {
    if (open && start <= open_end) {
      open_end = std::max(open_end, end);
      continue;
    }
    if (open) total += open_end - open_start;
    open_start = start;
    open_end = end;
    open = true;
  }
  if (open) total += open_end - open_start;
  return total;
}

}  // namespace

int64_t Profile::kernel_time_ns() const {
  int64_t total = 0;
  for (const auto& k : kernels)
    total += k.duration_ns();
  return total;
}

int64_t Profile::busy_time_ns() const {
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_device;
  for (const auto& k : kernels)
    by_device[k.device].emplace_back(k.start_ns, k.end_ns);
  for (const auto& t : transfers)
    by_device[t.device].emplace_back(t.start_ns, t.end_ns);
  int64_t total = 0;
  for (auto& [device, intervals] : by_device)
    total += union_length(std::move(intervals));
  return total;
}

void to_json(nlohmann::json& j, const OpContext& c) {
  j = {{"name", c.name}};
  if (!c.input_dims.empty()) j["input_dims"] = c.input_dims;
  if (!c.input_types.empty()) j["input_types"] = c.input_types;
  if (!c.input_values.empty()) j["input_values"] = c.input_values;
  if (c.call != 0) j["call"] = c.call;
}

void from_json(const nlohmann::json& j, OpContext& c) {
  c.name = field<std::string>(j, "name", "context entry");
  c.input_dims = j.value("input_dims", std::vector<std::vector<int64_t>>{});
  c.input_types = j.value("input_types", std::vector<std::string>{});
  c.input_values = j.value("input_values", std::vector<std::string>{});
  c.call = j.value("call", int64_t{0});
}

void to_json(nlohmann::json& j, const KernelRecord& k) {
  j = {{"name", k.name},
       {"demangled", k.demangled},
       {"grid", k.grid},
       {"block", k.block},
       {"registers", k.registers},
       {"static_smem", k.static_smem},
       {"dynamic_smem", k.dynamic_smem},
       {"cluster_size", k.cluster_size},
       {"start_ns", k.start_ns},
       {"end_ns", k.end_ns},
       {"stream", k.stream},
       {"device", k.device},
       {"pid", k.pid},
       {"correlation", k.correlation},
       {"context", k.context}};
}

void from_json(const nlohmann::json& j, KernelRecord& k) {
  k.name = field<std::string>(j, "name", "kernel");
  k.demangled = j.value("demangled", k.name);
  k.grid = j.value("grid", k.grid);
  k.block = j.value("block", k.block);
  k.registers = j.value("registers", int64_t{0});
  k.static_smem = j.value("static_smem", int64_t{0});
  k.dynamic_smem = j.value("dynamic_smem", int64_t{0});
  k.cluster_size = j.value("cluster_size", int64_t{0});
  k.start_ns = field<int64_t>(j, "start_ns", "kernel");
  k.end_ns = field<int64_t>(j, "end_ns", "kernel");
  k.stream = j.value("stream", int64_t{0});
  k.device = j.value("device", int64_t{0});
  k.pid = j.value("pid", int64_t{0});
  k.correlation = j.value("correlation", int64_t{0});
  k.context = j.value("context", std::vector<OpContext>{});
}

void to_json(nlohmann::json& j, const TransferRecord& t) {
  j = {{"kind", t.kind},     {"bytes", t.bytes},   {"start_ns", t.start_ns},
       {"end_ns", t.end_ns}, {"stream", t.stream}, {"device", t.device},
       {"pid", t.pid}};
}

void from_json(const nlohmann::json& j, TransferRecord& t) {
  t.kind = field<std::string>(j, "kind", "transfer");
  t.bytes = j.value("bytes", int64_t{0});
  t.start_ns = field<int64_t>(j, "start_ns", "transfer");
  t.end_ns = field<int64_t>(j, "end_ns", "transfer");
  t.stream = j.value("stream", int64_t{0});
  t.device = j.value("device", int64_t{0});
  t.pid = j.value("pid", int64_t{0});
}

void to_json(nlohmann::json& j, const RangeRecord& r) {
  j = {{"name", r.name},     {"start_ns", r.start_ns}, {"end_ns", r.end_ns},
       {"thread", r.thread}, {"pid", r.pid},           {"depth", r.depth}};
}

void from_json(const nlohmann::json& j, RangeRecord& r) {
  r.name = field<std::string>(j, "name", "range");
  r.start_ns = field<int64_t>(j, "start_ns", "range");
  r.end_ns = field<int64_t>(j, "end_ns", "range");
  r.thread = j.value("thread", int64_t{0});
  r.pid = j.value("pid", int64_t{0});
  r.depth = j.value("depth", 0);
}

void to_json(nlohmann::json& j, const DeviceRecord& d) {
  j = {{"id", d.id},
       {"name", d.name},
       {"compute_capability", fmt::format("{}.{}", d.compute_major, d.compute_minor)},
       {"sm_count", d.sm_count}};
}

void from_json(const nlohmann::json& j, DeviceRecord& d) {
  d.id = j.value("id", int64_t{0});
  d.name = j.value("name", std::string());
  const std::string cc = j.value("compute_capability", std::string("0.0"));
  if (std::sscanf(cc.c_str(), "%d.%d", &d.compute_major, &d.compute_minor) != 2)
    throw Error(fmt::format("profile: device compute_capability \"{}\" is not MAJOR.MINOR", cc));
  d.sm_count = j.value("sm_count", int64_t{0});
}

void to_json(nlohmann::json& j, const Profile& p) {
  j = {{"format", "kforge-profile"},
       {"version", Profile::kFormatVersion},
       {"source", p.source},
       {"command", p.command},
       {"exit_code", p.exit_code ? nlohmann::json(*p.exit_code) : nlohmann::json()},
       {"region", p.region},
       {"dropped_records", p.dropped_records},
       {"kernel_time_ns", p.kernel_time_ns()},
       {"busy_time_ns", p.busy_time_ns()},
       {"metadata", p.metadata},
       {"devices", p.devices},
       {"kernels", p.kernels},
       {"transfers", p.transfers},
       {"ranges", p.ranges}};
}

void from_json(const nlohmann::json& j, Profile& p) {
  if (!j.is_object() || j.value("format", std::string()) != "kforge-profile")
    throw Error("not a kforge profile (no \"format\": \"kforge-profile\")");
  const int version = j.value("version", 0);
  if (version != Profile::kFormatVersion) {
    throw Error(fmt::format("kforge profile version {} is not supported (this kforge reads {})",
                            version, Profile::kFormatVersion));
  }
  p.source = j.value("source", std::string());
  p.command = j.value("command", std::vector<std::string>{});
  p.exit_code.reset();
  if (j.contains("exit_code") && !j.at("exit_code").is_null())
    p.exit_code = j.at("exit_code").get<int>();
  p.region = j.value("region", std::string("all"));
  p.dropped_records = j.value("dropped_records", int64_t{0});
  p.metadata = j.value("metadata", nlohmann::json::object());
  p.devices = j.value("devices", std::vector<DeviceRecord>{});
  p.kernels = j.value("kernels", std::vector<KernelRecord>{});
  p.transfers = j.value("transfers", std::vector<TransferRecord>{});
  p.ranges = j.value("ranges", std::vector<RangeRecord>{});
}

Profile read_profile(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read profile {}", path.string()));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{} is not JSON: {}", path.string(), e.what()));
  }
  try {
    return j.get<Profile>();
  } catch (const Error& e) {
    throw UsageError(fmt::format("{}: {}", path.string(), e.what()));
  }
}

void write_profile(const Profile& profile, const fs::path& path) {
  write_json_atomically(path, profile, 1);
}

}  // namespace kforge
