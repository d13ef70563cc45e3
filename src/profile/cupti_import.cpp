#include "profile/cupti_import.h"

#include <cxxabi.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace kforge {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kRawFormatVersion = 1;

// Reads a required field, naming the process and field when it is missing or mistyped.
template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw Error(fmt::format("raw profile {}: no \"{}\"", where, key));
  }
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw Error(fmt::format("raw profile {}: \"{}\": {}", where, key, e.what()));
  }
}

template <typename T>
T optional_field(const json& j, const char* key, T fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  return field<T>(j, key, where);
}

const json& array_field(const json& j, const char* key, const std::string& where) {
  static const json empty = json::array();
  if (!j.contains(key)) return empty;
  const json& a = j.at(key);
  if (!a.is_array()) throw Error(fmt::format("raw profile {}: \"{}\" is not an array", where, key));
  return a;
}

// The CPU side of a launch: when and on which thread the call that launched GPU work ran.
struct Launch {
  int64_t start = 0;
  int64_t thread = 0;
};

// Kernels and transfers are linked and selected the same way.
struct Work {
  int64_t correlation = 0;
  const Launch* launch = nullptr;  // null: no launch call recorded
  std::vector<size_t> context;     // indices into the profile's ranges, outermost first
};

struct Process {
  int64_t pid = 0;
  std::string written_at;
  int64_t dropped = 0;
  std::vector<std::string> errors;
  std::vector<KernelRecord> kernels;
  std::vector<TransferRecord> transfers;
  std::vector<Work> kernel_work;                 // parallel to kernels
  std::vector<Work> transfer_work;               // parallel to transfers
  std::unordered_map<int64_t, Launch> launches;  // by correlation id
  std::vector<size_t> ranges;                    // indices into the profile's ranges
  int64_t untimed_kernels = 0;
  int64_t last_time = 0;                     // the latest timestamp seen, where unclosed ranges end
  std::map<std::string, int64_t> api_calls;  // every recorded API call, by name
};

std::array<int64_t, 3> triple(const json& j, const char* key, std::array<int64_t, 3> fallback,
                              const std::string& where) {
  return optional_field<std::array<int64_t, 3>>(j, key, fallback, where);
}

void read_devices(const json& raw, const std::string& where, std::vector<DeviceRecord>& devices) {
  for (const json& d : array_field(raw, "devices", where)) {
    DeviceRecord device;
    device.id = field<int64_t>(d, "id", where);
    device.name = optional_field<std::string>(d, "name", "", where);
    const auto cc = optional_field<std::array<int, 2>>(d, "compute_capability", {0, 0}, where);
    device.compute_major = cc[0];
    device.compute_minor = cc[1];
    device.sm_count = optional_field<int64_t>(d, "sm_count", 0, where);
    const auto same = std::find_if(devices.begin(), devices.end(),
                                   [&](const DeviceRecord& o) { return o.id == device.id; });
    if (same == devices.end()) {
      devices.push_back(device);
    } else if (same->name.empty()) {
      *same = device;
    }
  }
}

void read_kernels(const json& raw, const std::string& where, Process& p) {
  const auto names = optional_field<std::vector<std::string>>(raw, "kernel_names", {}, where);
  for (const json& k : array_field(raw, "kernels", where)) {
    KernelRecord kernel;
    const auto name_index = field<size_t>(k, "name", where);
    if (name_index >= names.size()) {
      throw Error(fmt::format("raw profile {}: kernel name index {} is past kernel_names ({})",
                              where, name_index, names.size()));
    }
    kernel.name = names[name_index];
    kernel.demangled = demangle_kernel_name(kernel.name);
    kernel.grid = triple(k, "grid", kernel.grid, where);
    kernel.block = triple(k, "block", kernel.block, where);
    const auto cluster = triple(k, "cluster", {0, 0, 0}, where);
    kernel.cluster_size = std::max<int64_t>(0, cluster[0] * cluster[1] * cluster[2]);
    kernel.registers = optional_field<int64_t>(k, "registers", 0, where);
    kernel.static_smem = optional_field<int64_t>(k, "static_smem", 0, where);
    kernel.dynamic_smem = optional_field<int64_t>(k, "dynamic_smem", 0, where);
    kernel.start_ns = field<int64_t>(k, "start", where);
    kernel.end_ns = field<int64_t>(k, "end", where);
    kernel.stream = optional_field<int64_t>(k, "stream", 0, where);
    kernel.device = optional_field<int64_t>(k, "device", 0, where);
    kernel.pid = p.pid;
    kernel.correlation = optional_field<int64_t>(k, "correlation", 0, where);
    // CUPTI gives a kernel no times when it could not collect them (e.g. still running when
    // the process ended); such a kernel has no place on the timeline.
    if (kernel.start_ns == 0 && kernel.end_ns == 0) {
      ++p.untimed_kernels;
      continue;
    }
    p.last_time = std::max(p.last_time, kernel.end_ns);
    p.kernel_work.push_back({kernel.correlation, nullptr, {}});
    p.kernels.push_back(std::move(kernel));
  }
}

void read_transfers(const json& raw, const std::string& where, Process& p) {
  for (const json& t : array_field(raw, "transfers", where)) {
    TransferRecord transfer;
    transfer.kind = field<std::string>(t, "kind", where);
    transfer.bytes = optional_field<int64_t>(t, "bytes", 0, where);
    transfer.start_ns = field<int64_t>(t, "start", where);
    transfer.end_ns = field<int64_t>(t, "end", where);
    transfer.stream = optional_field<int64_t>(t, "stream", 0, where);
    transfer.device = optional_field<int64_t>(t, "device", 0, where);
    transfer.pid = p.pid;
    p.last_time = std::max(p.last_time, transfer.end_ns);
    p.transfer_work.push_back({optional_field<int64_t>(t, "correlation", 0, where), nullptr, {}});
    p.transfers.push_back(std::move(transfer));
  }
}

void read_launches(const json& raw, const std::string& where, Process& p) {
  for (const json& a : array_field(raw, "api_calls", where)) {
    const auto correlation = field<int64_t>(a, "correlation", where);
    const Launch launch{field<int64_t>(a, "start", where), field<int64_t>(a, "thread", where)};
    p.last_time = std::max(p.last_time, optional_field<int64_t>(a, "end", launch.start, where));
    // A runtime call and the driver call it makes may share an id: the outer (earlier) one is
    // the launch as the program saw it.
    const auto [it, inserted] = p.launches.try_emplace(correlation, launch);
    if (!inserted && launch.start < it->second.start) it->second = launch;
  }
}

// Pairs start and end markers into ranges. A range still open when the process ended closes
// at the process's last timestamp; an end whose start was never seen (CUPTI enabled mid-range)
// is ignored.
void read_ranges(const json& raw, const std::string& where, Process& p,
                 std::vector<RangeRecord>& ranges) {
  struct Marker {
    int64_t id;
    std::string kind;
    int64_t time;
    int64_t thread;
    std::string name;
  };
  std::vector<Marker> markers;
  for (const json& m : array_field(raw, "markers", where)) {
    markers.push_back({field<int64_t>(m, "id", where), field<std::string>(m, "kind", where),
                       field<int64_t>(m, "time", where),
                       optional_field<int64_t>(m, "thread", 0, where),
                       optional_field<std::string>(m, "name", "", where)});
    p.last_time = std::max(p.last_time, markers.back().time);
  }
  std::stable_sort(markers.begin(), markers.end(),
                   [](const Marker& a, const Marker& b) { return a.time < b.time; });
  std::unordered_map<int64_t, size_t> open;  // marker id -> index into ranges
  for (Marker& m : markers) {
    if (m.kind == "start") {
      open[m.id] = ranges.size();
      p.ranges.push_back(ranges.size());
      ranges.push_back({std::move(m.name), m.time, -1, m.thread, p.pid, 0});
    } else if (m.kind == "end") {
      const auto it = open.find(m.id);
      if (it == open.end()) continue;
      ranges[it->second].end_ns = m.time;
      open.erase(it);
    }
  }
  for (const auto& [id, index] : open)
    ranges[index].end_ns = std::max(p.last_time, ranges[index].start_ns);
}

// Nesting depth of each range among the ranges of its thread: the number of ranges that
// enclose it.
void assign_depths(const Process& p, std::vector<RangeRecord>& ranges) {
  std::map<int64_t, std::vector<size_t>> by_thread;
  for (const size_t r : p.ranges)
    by_thread[ranges[r].thread].push_back(r);
  for (auto& [thread, indices] : by_thread) {
    std::sort(indices.begin(), indices.end(), [&](size_t a, size_t b) {
      return std::tie(ranges[a].start_ns, ranges[b].end_ns) <
             std::tie(ranges[b].start_ns, ranges[a].end_ns);
    });
    std::vector<int64_t> open_ends;
    for (const size_t r : indices) {
      while (!open_ends.empty() && open_ends.back() <= ranges[r].start_ns)
        open_ends.pop_back();
      ranges[r].depth = static_cast<int>(open_ends.size());
      open_ends.push_back(ranges[r].end_ns);
    }
  }
}

// For each piece of work with a launch call: the ranges open on the launching thread when the
// call started ([start, end) contains the launch time), outermost first. One sweep per thread
// over range starts, range ends and launch times.
void link_contexts(Process& p, const std::vector<RangeRecord>& ranges) {
  enum Order { kClose = 0, kOpen = 1, kLaunch = 2 };  // at one time: close, then open, then launch
  struct Event {
    int64_t time;
    Order order;
    size_t index;  // a range, or a Work
    Work* work;
  };
  std::map<int64_t, std::vector<Event>> by_thread;
  for (const size_t r : p.ranges) {
    const RangeRecord& range = ranges[r];
    if (range.end_ns <= range.start_ns) continue;  // contains no instant
    by_thread[range.thread].push_back({range.start_ns, kOpen, r, nullptr});
    by_thread[range.thread].push_back({range.end_ns, kClose, r, nullptr});
  }
  for (auto* works : {&p.kernel_work, &p.transfer_work}) {
    for (Work& w : *works) {
      const auto it = p.launches.find(w.correlation);
      if (it == p.launches.end()) continue;
      w.launch = &it->second;
      by_thread[w.launch->thread].push_back({w.launch->start, kLaunch, 0, &w});
    }
  }
  for (auto& [thread, events] : by_thread) {
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      return std::tie(a.time, a.order) < std::tie(b.time, b.order);
    });
    std::set<std::tuple<int, int64_t, size_t>> open;  // (depth, start, range): outermost first
    for (const Event& e : events) {
      if (e.order == kLaunch) {
        for (const auto& [depth, start, range] : open)
          e.work->context.push_back(range);
        continue;
      }
      const auto key = std::make_tuple(ranges[e.index].depth, ranges[e.index].start_ns, e.index);
      if (e.order == kOpen) {
        open.insert(key);
      } else {
        open.erase(key);
      }
    }
  }
}

Process read_process(const json& raw, size_t file_index, std::vector<DeviceRecord>& devices,
                     std::vector<RangeRecord>& ranges) {
  std::string where = fmt::format("#{}", file_index + 1);
  if (!raw.is_object() || raw.value("format", std::string()) != "kforge-cupti-raw") {
    throw Error(fmt::format("raw profile {}: not a kforge CUPTI raw file", where));
  }
  if (raw.value("version", 0) != kRawFormatVersion) {
    throw Error(fmt::format("raw profile {}: version {} is not supported (this kforge reads {})",
                            where, raw.value("version", 0), kRawFormatVersion));
  }
  Process p;
  p.pid = field<int64_t>(raw, "pid", where);
  where = fmt::format("of process {}", p.pid);
  p.written_at = optional_field<std::string>(raw, "written_at", "", where);
  p.dropped = optional_field<int64_t>(raw, "dropped_records", 0, where);
  p.errors = optional_field<std::vector<std::string>>(raw, "errors", {}, where);
  if (raw.contains("api_counts")) {
    for (const json& c : array_field(raw, "api_counts", where)) {
      std::string name = optional_field<std::string>(c, "name", "", where);
      if (name.empty()) {
        name = fmt::format("{} {}", optional_field<std::string>(c, "api", "runtime", where),
                           field<int64_t>(c, "cbid", where));
      }
      p.api_calls[name] += field<int64_t>(c, "calls", where);
    }
  }
  read_devices(raw, where, devices);
  read_kernels(raw, where, p);
  read_transfers(raw, where, p);
  read_launches(raw, where, p);
  read_ranges(raw, where, p, ranges);
  assign_depths(p, ranges);
  link_contexts(p, ranges);
  return p;
}

// Marks the occurrences of the region's range that are kept: each process's occurrences in
// start order, after its first `skip`. Returns the region's description.
std::string select_region(const std::vector<Process>& processes,
                          const std::vector<RangeRecord>& ranges, const AssembleOptions& options,
                          std::vector<bool>& kept) {
  kept.assign(ranges.size(), false);
  int64_t total = 0;
  int64_t kept_count = 0;
  int64_t most_in_a_process = 0;
  for (const Process& p : processes) {
    std::vector<size_t> occurrences;
    for (const size_t r : p.ranges) {
      if (ranges[r].name == options.range) occurrences.push_back(r);
    }
    std::sort(occurrences.begin(), occurrences.end(), [&](size_t a, size_t b) {
      return std::tie(ranges[a].start_ns, a) < std::tie(ranges[b].start_ns, b);
    });
    total += static_cast<int64_t>(occurrences.size());
    most_in_a_process = std::max(most_in_a_process, static_cast<int64_t>(occurrences.size()));
    for (size_t i = static_cast<size_t>(std::max<int64_t>(options.skip, 0)); i < occurrences.size();
         ++i) {
      kept[occurrences[i]] = true;
      ++kept_count;
    }
  }
  if (total == 0) {
    std::set<std::string> seen;
    for (const RangeRecord& r : ranges)
      seen.insert(r.name);
    if (seen.empty()) {
      throw UsageError(fmt::format(
          "--range {}: the command recorded no NVTX ranges (the program must mark its regions "
          "with NVTX, e.g. nvtxRangePushA or torch.cuda.nvtx.range_push)",
          options.range));
    }
    std::vector<std::string> names(seen.begin(), seen.end());
    constexpr size_t kShown = 20;
    const size_t more = names.size() > kShown ? names.size() - kShown : 0;
    names.resize(std::min(names.size(), kShown));
    throw UsageError(fmt::format(
        "--range {}: no NVTX range of that name was recorded; ranges "
        "seen: \"{}\"{}",
        options.range, fmt::join(names, "\", \""), more ? fmt::format(" and {} more", more) : ""));
  }
  if (kept_count == 0) {
    throw UsageError(fmt::format(
        "--range {} --skip {}: the range occurs at most {} time(s) in a process; nothing is left",
        options.range, options.skip, most_in_a_process));
  }
  return fmt::format(
      "nvtx range \"{}\", skipping the first {} occurrence(s) per process: {} of {} occurrences",
      options.range, options.skip, kept_count, total);
}

bool in_region(const Work& w, const std::vector<bool>& kept) {
  return std::any_of(w.context.begin(), w.context.end(), [&](size_t r) { return kept[r]; });
}

std::vector<OpContext> context_of(const Work& w, const std::vector<RangeRecord>& ranges) {
  std::vector<OpContext> context;
  for (const size_t r : w.context)
    context.push_back({.name = ranges[r].name, .call = static_cast<int64_t>(r) + 1});
  return context;
}

}  // namespace

std::vector<json> read_raw_files(const fs::path& directory) {
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.starts_with("raw-") && name.ends_with(".json")) {
      paths.push_back(entry.path());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<json> raws;
  for (const auto& path : paths) {
    std::ifstream in(path);
    if (!in) throw Error(fmt::format("cannot read {}", path.string()));
    try {
      raws.push_back(json::parse(in));
    } catch (const json::exception& e) {
      throw Error(fmt::format("{} is not JSON: {}", path.string(), e.what()));
    }
  }
  return raws;
}

Profile assemble_profile(const std::vector<json>& raw_files, const AssembleOptions& options) {
  Profile profile;
  profile.source = "cupti";
  profile.command = options.command;
  profile.exit_code = options.exit_code;
  std::vector<Process> processes;
  for (size_t i = 0; i < raw_files.size(); ++i)
    processes.push_back(read_process(raw_files[i], i, profile.devices, profile.ranges));

  std::vector<bool> kept;
  profile.region =
      options.range.empty() ? "all" : select_region(processes, profile.ranges, options, kept);
  const bool select = !options.range.empty();

  int64_t without_launch = 0;
  int64_t outside_region = 0;
  int64_t untimed = 0;
  json process_notes = json::array();
  std::map<std::string, int64_t> api_calls;
  for (Process& p : processes) {
    for (const auto& [name, calls] : p.api_calls)
      api_calls[name] += calls;
    profile.dropped_records += p.dropped;
    untimed += p.untimed_kernels;
    int64_t kept_kernels = 0;
    for (size_t i = 0; i < p.kernels.size(); ++i) {
      const Work& w = p.kernel_work[i];
      if (!w.launch) ++without_launch;
      if (select && !in_region(w, kept)) {
        ++outside_region;
        continue;
      }
      p.kernels[i].context = context_of(w, profile.ranges);
      profile.kernels.push_back(std::move(p.kernels[i]));
      ++kept_kernels;
    }
    for (size_t i = 0; i < p.transfers.size(); ++i) {
      if (select && !in_region(p.transfer_work[i], kept)) continue;
      profile.transfers.push_back(std::move(p.transfers[i]));
    }
    process_notes.push_back({{"pid", p.pid},
                             {"written_at", p.written_at},
                             {"kernels", kept_kernels},
                             {"dropped_records", p.dropped},
                             {"errors", p.errors}});
  }
  std::sort(profile.kernels.begin(), profile.kernels.end(), [](const auto& a, const auto& b) {
    return std::tie(a.start_ns, a.pid, a.correlation) < std::tie(b.start_ns, b.pid, b.correlation);
  });
  std::sort(profile.transfers.begin(), profile.transfers.end(), [](const auto& a, const auto& b) {
    return std::tie(a.start_ns, a.pid) < std::tie(b.start_ns, b.pid);
  });
  std::sort(profile.ranges.begin(), profile.ranges.end(), [](const auto& a, const auto& b) {
    return std::tie(a.pid, a.start_ns, a.depth) < std::tie(b.pid, b.start_ns, b.depth);
  });
  std::sort(profile.devices.begin(), profile.devices.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  // The API calls the program made, most frequent first: each cost the profiler a record.
  std::vector<std::pair<std::string, int64_t>> by_calls(api_calls.begin(), api_calls.end());
  std::stable_sort(by_calls.begin(), by_calls.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  json api = json::array();
  int64_t api_total = 0;
  for (const auto& [name, calls] : by_calls) {
    api.push_back({{"name", name}, {"calls", calls}});
    api_total += calls;
  }
  profile.metadata["cupti"] = {{"processes", process_notes},
                               {"kernels_without_launch_call", without_launch},
                               {"kernels_without_timestamps", untimed},
                               {"kernels_outside_region", outside_region},
                               {"api_calls_recorded", api_total},
                               {"api_calls_by_name", api}};
  return profile;
}

std::string demangle_kernel_name(const std::string& name) {
  if (!name.starts_with("_Z")) return name;
  int status = 0;
  char* readable = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  if (status != 0 || !readable) {
    std::free(readable);
    return name;
  }
  std::string out(readable);
  std::free(readable);
  return out;
}

std::string short_kernel_name(const std::string& demangled, size_t width) {
  static const std::string kAnonymous = "(anonymous namespace)";
  std::string out;
  int angle_depth = 0;
  for (size_t i = 0; i < demangled.size(); ++i) {
    const char c = demangled[i];
    if (c == '(' && demangled.compare(i, kAnonymous.size(), kAnonymous) == 0) {
      if (angle_depth == 0) out += kAnonymous;
      i += kAnonymous.size() - 1;
      continue;
    }
    if (c == '<') {
      if (angle_depth == 0) out += "<...>";
      ++angle_depth;
      continue;
    }
    if (c == '>' && angle_depth > 0) {
      --angle_depth;
      continue;
    }
    if (angle_depth > 0) continue;
    if (c == '(') break;  // the parameter list
    out += c;
  }
  if (out.starts_with("void ")) out.erase(0, 5);
  if (out.size() > width && width > 3) out = out.substr(0, width - 3) + "...";
  return out;
}

}  // namespace kforge
