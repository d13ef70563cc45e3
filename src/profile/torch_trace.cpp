#include "profile/torch_trace.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace kforge {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What kforge does with an event, by its "cat". Kineto has written these categories in
// lower case since PyTorch 1.9 ("kernel", "cuda_runtime"); earlier traces used "Kernel",
// "Runtime", "Memcpy", "Operator", so the comparison ignores case.
enum class EventRole { ignored, kernel, memcpy, memset, launch, op, annotation };

EventRole role_of(std::string cat) {
  std::transform(cat.begin(), cat.end(), cat.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (cat == "kernel") return EventRole::kernel;
  if (cat == "gpu_memcpy" || cat == "memcpy") return EventRole::memcpy;
  if (cat == "gpu_memset" || cat == "memset") return EventRole::memset;
  if (cat == "cuda_runtime" || cat == "cuda_driver" || cat == "runtime" || cat == "driver")
    return EventRole::launch;
  if (cat == "cpu_op" || cat == "operator") return EventRole::op;
  if (cat == "user_annotation") return EventRole::annotation;
  // python_function events (nn.Module and Python frames) are left out: they would bury the
  // ATen ops and module ranges under interpreter frames without adding shapes. So are
  // gpu_user_annotation (a GPU-side copy of a user annotation, not a kernel), Trace spans and
  // profiler overhead.
  return EventRole::ignored;
}

bool is_context(EventRole role) {
  return role == EventRole::op || role == EventRole::annotation;
}

// An integer from a number or a numeric string (some producers quote ids).
std::optional<int64_t> integer_of(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d)) return static_cast<int64_t>(d);
    return std::nullopt;
  }
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    try {
      size_t used = 0;
      const long long value = std::stoll(s, &used);
      if (used == s.size()) return value;
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

std::optional<int64_t> integer_arg(const json* args, const char* key) {
  if (args == nullptr || !args->contains(key)) return std::nullopt;
  return integer_of(args->at(key));
}

// Microseconds (possibly fractional, e.g. 1234.567) to integral nanoseconds.
std::optional<int64_t> microseconds_to_ns(const json& v) {
  double us = 0;
  if (v.is_number()) {
    us = v.get<double>();
  } else if (v.is_string()) {
    try {
      us = std::stod(v.get<std::string>());
    } catch (const std::exception&) {
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  if (!std::isfinite(us)) return std::nullopt;
  // Whole microseconds and the fraction apart: timestamps near 2^42 us (an uptime-based clock)
  // leave a double no spare bits for `us * 1000` to land on the written nanosecond.
  const double whole = std::floor(us);
  return static_cast<int64_t>(whole) * 1000 + std::llround((us - whole) * 1000.0);
}

// A string field, or "" when absent or not a string (json::value would throw on the latter).
std::string text_of(const json& object, const char* key) {
  if (!object.contains(key) || !object.at(key).is_string()) return "";
  return object.at(key).get<std::string>();
}

// pid and tid are integers in Kineto's events, but strings in a few ("Spans", "stream 7" in
// old traces); the text of either identifies a track.
std::string id_text(const json& event, const char* key) {
  if (!event.contains(key)) return "";
  const json& v = event.at(key);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The trailing number of a track id: 7 for 7 and for "stream 7"; 0 for "Spans".
int64_t track_number(const std::string& text) {
  size_t begin = text.size();
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1])))
    --begin;
  if (begin == text.size()) return 0;
  try {
    return std::stoll(text.substr(begin));
  } catch (const std::exception&) {
    return 0;  // out of range
  }
}

struct TraceEvent {
  EventRole role = EventRole::ignored;
  std::string name;
  std::string pid;  // as text (see id_text)
  std::string tid;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  const json* args = nullptr;  // null when the event has none
  size_t order = 0;            // position in the file: the tie-breaker for equal intervals
};

using TrackKey = std::pair<std::string, std::string>;  // (pid, tid)

// "Input Dims": one entry per input. A tensor gives its sizes ([8, 512]); a scalar or None
// gives []; a tensor list gives a list of sizes, which has no place in one dims vector and is
// kept as [] (its "Input type" says "TensorList").
std::vector<std::vector<int64_t>> input_dims_of(const json& dims) {
  std::vector<std::vector<int64_t>> out;
  if (!dims.is_array()) return out;
  for (const json& entry : dims) {
    std::vector<int64_t> sizes;
    bool flat = entry.is_array();
    if (flat) {
      for (const json& d : entry) {
        const auto value = integer_of(d);
        if (!value) {
          flat = false;
          break;
        }
        sizes.push_back(*value);
      }
    }
    out.push_back(flat ? std::move(sizes) : std::vector<int64_t>{});
  }
  return out;
}

// "Input type" and "Concrete Inputs": one string per input ("" where the trace has none).
std::vector<std::string> strings_of(const json& items) {
  std::vector<std::string> out;
  if (!items.is_array()) return out;
  for (const json& t : items)
    out.push_back(t.is_string() ? t.get<std::string>() : std::string());
  return out;
}

OpContext context_of(const TraceEvent& e) {
  OpContext c;
  c.name = e.name;
  if (e.args != nullptr) {
    if (e.args->contains("Input Dims")) c.input_dims = input_dims_of(e.args->at("Input Dims"));
    if (e.args->contains("Input type")) c.input_types = strings_of(e.args->at("Input type"));
    if (e.args->contains("Concrete Inputs"))
      c.input_values = strings_of(e.args->at("Concrete Inputs"));
  }
  return c;
}

// The context events of one thread as a nesting forest: sorted by start (longer first on
// ties), each with the event that was open when it began. Every event still open at a time t
// lies on the parent chain of the last event that began at or before t, so the events
// enclosing an interval are found by walking that chain, even where two events overlap
// without nesting.
class ThreadNesting {
 public:
  void add(size_t event) { events_.push_back(event); }

  void build(const std::vector<TraceEvent>& all) {
    std::sort(events_.begin(), events_.end(), [&](size_t a, size_t b) {
      const TraceEvent& x = all[a];
      const TraceEvent& y = all[b];
      return std::tie(x.start_ns, y.end_ns, x.order) < std::tie(y.start_ns, x.end_ns, y.order);
    });
    starts_.clear();
    parent_.assign(events_.size(), kNone);
    std::vector<size_t> open;  // positions in events_
    for (size_t i = 0; i < events_.size(); ++i) {
      const TraceEvent& e = all[events_[i]];
      while (!open.empty() && all[events_[open.back()]].end_ns <= e.start_ns)
        open.pop_back();
      if (!open.empty()) parent_[i] = open.back();
      open.push_back(i);
      starts_.push_back(e.start_ns);
    }
  }

  // The events that contain [start, end], outermost first.
  std::vector<size_t> enclosing(const std::vector<TraceEvent>& all, int64_t start,
                                int64_t end) const {
    std::vector<size_t> out;
    const auto after = std::upper_bound(starts_.begin(), starts_.end(), start);
    if (after == starts_.begin()) return out;
    for (size_t i = static_cast<size_t>(after - starts_.begin()) - 1; i != kNone; i = parent_[i]) {
      if (all[events_[i]].end_ns >= end) out.push_back(events_[i]);
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

  // Nesting depth of each event among this thread's events (0 = outermost).
  std::vector<std::pair<size_t, int>> depths() const {
    std::vector<std::pair<size_t, int>> out;
    std::vector<int> depth(events_.size(), 0);
    for (size_t i = 0; i < events_.size(); ++i) {
      if (parent_[i] != kNone) depth[i] = depth[parent_[i]] + 1;
      out.emplace_back(events_[i], depth[i]);
    }
    return out;
  }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> events_;  // indices into the trace's events
  std::vector<int64_t> starts_;
  std::vector<size_t> parent_;
};

// "Memcpy HtoD (Pageable -> Device)" -> "HtoD".
std::string copy_kind(const std::string& name) {
  static const std::string prefix = "Memcpy ";
  if (name.rfind(prefix, 0) != 0) return "copy";
  const size_t end = name.find(' ', prefix.size());
  return name.substr(prefix.size(),
                     end == std::string::npos ? std::string::npos : end - prefix.size());
}

std::array<int64_t, 3> dim3_arg(const json* args, const char* key) {
  std::array<int64_t, 3> out = {1, 1, 1};
  if (args == nullptr || !args->contains(key) || !args->at(key).is_array()) return out;
  const json& v = args->at(key);
  for (size_t i = 0; i < 3 && i < v.size(); ++i)
    out[i] = integer_of(v[i]).value_or(1);
  return out;
}

const json& events_of(const json& trace) {
  if (trace.is_array()) return trace;
  if (!trace.is_object())
    throw UsageError("not a Chrome trace: expected a JSON object with \"traceEvents\"");
  if (text_of(trace, "format") == "kforge-profile")
    throw UsageError("this is a kforge profile already, not a torch.profiler trace");
  if (!trace.contains("traceEvents"))
    throw UsageError(
        "not a Chrome trace: no \"traceEvents\" (export one with "
        "prof.export_chrome_trace(path))");
  const json& events = trace.at("traceEvents");
  if (!events.is_array())
    throw UsageError("not a Chrome trace: \"traceEvents\" is not a list of events");
  return events;
}

std::vector<DeviceRecord> devices_of(const json& trace) {
  std::vector<DeviceRecord> out;
  if (!trace.is_object() || !trace.contains("deviceProperties")) return out;
  const json& props = trace.at("deviceProperties");
  if (!props.is_array()) return out;
  for (const json& p : props) {
    if (!p.is_object()) continue;
    DeviceRecord d;
    d.id = p.contains("id") ? integer_of(p.at("id")).value_or(0) : 0;
    d.name = text_of(p, "name");
    d.compute_major = static_cast<int>(
        p.contains("computeMajor") ? integer_of(p.at("computeMajor")).value_or(0) : 0);
    d.compute_minor = static_cast<int>(
        p.contains("computeMinor") ? integer_of(p.at("computeMinor")).value_or(0) : 0);
    d.sm_count = p.contains("numSms") ? integer_of(p.at("numSms")).value_or(0) : 0;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

TorchTraceImport import_torch_trace(const json& trace) {
  const json& raw_events = events_of(trace);
  TorchTraceImport result;
  Profile& profile = result.profile;
  profile.source = "torch-trace";
  profile.region = "all";
  profile.devices = devices_of(trace);

  // One pass over the file: slices by role, flow ends ("ac2g" links a launch to its GPU
  // activity by correlation id), and the launch call of every correlation id.
  std::vector<TraceEvent> events;
  std::map<std::tuple<std::string, std::string, int64_t>, int64_t> flow_at;  // track, ts -> id
  int64_t skipped = 0;
  for (const json& e : raw_events) {
    if (!e.is_object()) {
      ++skipped;
      continue;
    }
    const std::string phase = text_of(e, "ph");
    if (phase == "s" || phase == "f") {
      // Only ac2g flows link a launch to its GPU work; fwdbwd flows link forward and backward
      // ops and must not be read as correlation ids.
      const bool launch_flow = text_of(e, "cat") == "ac2g";
      if (!launch_flow || !e.contains("id") || !e.contains("ts")) continue;
      const auto id = integer_of(e.at("id"));
      const auto ts = microseconds_to_ns(e.at("ts"));
      if (id && ts) flow_at[{id_text(e, "pid"), id_text(e, "tid"), *ts}] = *id;
      continue;
    }
    if (phase != "X") continue;
    const EventRole role = role_of(text_of(e, "cat"));
    if (role == EventRole::ignored) continue;
    const auto start = e.contains("ts") ? microseconds_to_ns(e.at("ts")) : std::nullopt;
    if (!start) {
      ++skipped;
      continue;
    }
    const auto duration = e.contains("dur") ? microseconds_to_ns(e.at("dur")) : std::nullopt;
    TraceEvent event;
    event.role = role;
    event.name = text_of(e, "name");
    event.pid = id_text(e, "pid");
    event.tid = id_text(e, "tid");
    event.start_ns = *start;
    event.end_ns = *start + std::max<int64_t>(0, duration.value_or(0));
    event.args = e.contains("args") && e.at("args").is_object() ? &e.at("args") : nullptr;
    event.order = events.size();
    events.push_back(std::move(event));
  }

  // The correlation id of a launch or GPU event: its args, else the flow bound to it.
  const auto correlation_of = [&](const TraceEvent& e) -> std::optional<int64_t> {
    if (auto c = integer_arg(e.args, "correlation")) return c;
    const auto flow = flow_at.find({e.pid, e.tid, e.start_ns});
    if (flow != flow_at.end()) return flow->second;
    return std::nullopt;
  };

  std::unordered_map<int64_t, size_t> launch_by_correlation;
  std::unordered_map<int64_t, size_t> context_by_external_id;
  std::map<TrackKey, ThreadNesting> contexts;     // cpu_op and user_annotation, per thread
  std::map<TrackKey, ThreadNesting> annotations;  // user_annotation only: the ranges
  std::vector<OpContext> context_entry(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    if (e.role == EventRole::launch) {
      if (const auto c = correlation_of(e)) launch_by_correlation.emplace(*c, i);
    } else if (is_context(e.role)) {
      contexts[{e.pid, e.tid}].add(i);
      context_entry[i] = context_of(e);
      if (const auto x = integer_arg(e.args, "External id")) context_by_external_id.emplace(*x, i);
      if (e.role == EventRole::annotation) {
        annotations[{e.pid, e.tid}].add(i);
        ++result.user_annotations;
      } else {
        ++result.cpu_ops;
      }
    }
  }
  for (auto& [track, nesting] : contexts)
    nesting.build(events);
  for (auto& [track, nesting] : annotations)
    nesting.build(events);

  // The CPU-side place a GPU activity came from: its launch call, found by correlation id;
  // without one, the CPU event Kineto linked it to ("External id"). Returns the thread, the
  // interval to find enclosing events for, and the launching process.
  struct Origin {
    TrackKey track;
    int64_t start_ns = 0;
    int64_t end_ns = 0;
    std::string pid;
  };
  const auto origin_of = [&](const TraceEvent& gpu, bool* by_external) -> std::optional<Origin> {
    *by_external = false;
    if (const auto c = correlation_of(gpu)) {
      const auto launch = launch_by_correlation.find(*c);
      if (launch != launch_by_correlation.end()) {
        const TraceEvent& l = events[launch->second];
        return Origin{{l.pid, l.tid}, l.start_ns, l.end_ns, l.pid};
      }
    }
    // Kineto's own writer spells it "external id" in a few versions.
    auto external = integer_arg(gpu.args, "External id");
    if (!external) external = integer_arg(gpu.args, "external id");
    if (external && *external != 0) {
      const auto op = context_by_external_id.find(*external);
      if (op != context_by_external_id.end()) {
        const TraceEvent& o = events[op->second];
        *by_external = true;
        return Origin{{o.pid, o.tid}, o.start_ns, o.end_ns, o.pid};
      }
    }
    return std::nullopt;
  };

  for (const TraceEvent& e : events) {
    if (e.role != EventRole::kernel && e.role != EventRole::memcpy && e.role != EventRole::memset) {
      continue;
    }
    bool by_external = false;
    const std::optional<Origin> origin = origin_of(e, &by_external);
    const int64_t device =
        integer_arg(e.args, "device")
            .value_or(integer_arg(e.args, "inDevice").value_or(track_number(e.pid)));
    const int64_t stream = integer_arg(e.args, "stream").value_or(track_number(e.tid));
    const int64_t pid = origin ? track_number(origin->pid) : 0;

    if (e.role != EventRole::kernel) {
      TransferRecord t;
      t.kind = e.role == EventRole::memset ? "memset" : copy_kind(e.name);
      t.bytes = integer_arg(e.args, "bytes").value_or(0);
      t.start_ns = e.start_ns;
      t.end_ns = e.end_ns;
      t.stream = stream;
      t.device = device;
      t.pid = pid;
      profile.transfers.push_back(std::move(t));
      continue;
    }

    KernelRecord k;
    k.name = e.name;
    k.demangled = e.name;  // Kineto writes kernel names demangled
    k.grid = dim3_arg(e.args, "grid");
    k.block = dim3_arg(e.args, "block");
    k.registers = integer_arg(e.args, "registers per thread").value_or(0);
    // The trace gives static + dynamic shared memory as one number; kept whole as dynamic so
    // that their sum (what occupancy depends on) stays right.
    k.dynamic_smem = integer_arg(e.args, "shared memory").value_or(0);
    k.start_ns = e.start_ns;
    k.end_ns = e.end_ns;
    k.stream = stream;
    k.device = device;
    k.pid = pid;
    k.correlation = correlation_of(e).value_or(0);
    if (origin) {
      const auto nesting = contexts.find(origin->track);
      if (nesting != contexts.end()) {
        for (const size_t i : nesting->second.enclosing(events, origin->start_ns, origin->end_ns)) {
          k.context.push_back(context_entry[i]);
          k.context.back().call = static_cast<int64_t>(i) + 1;
        }
      }
      ++(by_external ? result.linked_by_external_id : result.linked_by_correlation);
    } else {
      ++result.unlinked;
    }
    profile.kernels.push_back(std::move(k));
  }

  for (const auto& [track, nesting] : annotations) {
    for (const auto& [i, depth] : nesting.depths()) {
      const TraceEvent& e = events[i];
      profile.ranges.push_back(
          {e.name, e.start_ns, e.end_ns, track_number(e.tid), track_number(e.pid), depth});
    }
  }

  const auto by_start = [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; };
  std::stable_sort(profile.kernels.begin(), profile.kernels.end(), by_start);
  std::stable_sort(profile.transfers.begin(), profile.transfers.end(), by_start);
  std::stable_sort(profile.ranges.begin(), profile.ranges.end(), by_start);

  json meta = json::object();
  if (trace.is_object()) {
    if (trace.contains("schemaVersion")) meta["trace_schema_version"] = trace.at("schemaVersion");
    if (trace.contains("baseTimeNanoseconds"))
      meta["trace_base_time_ns"] = trace.at("baseTimeNanoseconds");
  }
  meta["kernels_linked_by_correlation"] = result.linked_by_correlation;
  meta["kernels_linked_by_external_id"] = result.linked_by_external_id;
  meta["kernels_unlinked"] = result.unlinked;
  meta["skipped_events"] = skipped;
  profile.metadata["torch_trace"] = std::move(meta);
  return result;
}

TorchTraceImport read_torch_trace(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read trace {}", path.string()));
  const int first = in.peek();
  if (first == 0x1f) {
    throw UsageError(fmt::format("{} is compressed (gzip); decompress it first (gunzip -k {})",
                                 path.string(), path.string()));
  }
  json trace;
  try {
    in >> trace;
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{} is not JSON: {}", path.string(), e.what()));
  }
  try {
    TorchTraceImport result = import_torch_trace(trace);
    result.profile.metadata["torch_trace"]["file"] = path.string();
    return result;
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: {}", path.string(), e.what()));
  }
}

}  // namespace kforge
