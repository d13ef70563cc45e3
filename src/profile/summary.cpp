#include "profile/summary.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "profile/cupti_import.h"

namespace kforge {
namespace {

struct KernelTotal {
  std::string name;
  int64_t calls = 0;
  int64_t total_ns = 0;
  std::map<std::string, int64_t> launched_from;  // innermost context op -> calls
};

std::string shortened(const std::string& text, size_t width) {
  return text.size() <= width ? text : text.substr(0, width - 3) + "...";
}

// The op most calls of a kernel were launched from ("-" when none carried context): the
// innermost context's name up to its first comma ("aten::addmm, seq = 3, ..." -> "aten::addmm").
std::string usual_op(const KernelTotal& t) {
  std::string best = "-";
  int64_t most = 0;
  for (const auto& [name, calls] : t.launched_from) {
    if (calls > most) {
      best = name;
      most = calls;
    }
  }
  return best;
}

// What the recording says it could not capture (metadata["cupti"], written by
// assemble_profile).
void append_recording_notes(const Profile& profile, std::string& out) {
  if (profile.dropped_records > 0) {
    out += fmt::format(
        "warning: CUPTI dropped {} activity records; the profile is missing that work\n",
        profile.dropped_records);
  }
  if (!profile.metadata.contains("cupti")) return;
  const nlohmann::json& cupti = profile.metadata.at("cupti");
  const nlohmann::json processes = cupti.value("processes", nlohmann::json::array());
  for (const auto& p : processes) {
    const int64_t pid = p.value("pid", int64_t{0});
    const std::string written_at = p.value("written_at", std::string());
    if (written_at.starts_with("signal")) {
      out += fmt::format("warning: process {} ended by {}; its records were saved best-effort\n",
                         pid, written_at);
    }
    const std::vector<std::string> errors = p.value("errors", std::vector<std::string>{});
    for (const auto& e : errors)
      out += fmt::format("warning: process {}: {}\n", pid, e);
  }
  if (const int64_t n = cupti.value("kernels_without_timestamps", int64_t{0}); n > 0) {
    out += fmt::format(
        "warning: {} kernels came without timestamps (still running when their process "
        "ended?) and are left out\n",
        n);
  }
  if (const int64_t n = cupti.value("kernels_without_launch_call", int64_t{0}); n > 0) {
    out += fmt::format("note: {} kernels have no recorded launch call, so no NVTX context{}\n", n,
                       profile.region == "all" ? "" : " (and fall outside the region)");
  }
}

}  // namespace

std::string profile_summary(const Profile& profile, size_t top) {
  std::set<int64_t> pids;
  for (const auto& k : profile.kernels)
    pids.insert(k.pid);
  size_t processes = pids.size();
  if (profile.metadata.contains("cupti")) {
    processes = profile.metadata.at("cupti").value("processes", nlohmann::json::array()).size();
  }
  std::map<std::string, KernelTotal> by_name;
  for (const auto& k : profile.kernels) {
    KernelTotal& t = by_name[k.demangled];
    t.name = k.demangled;
    ++t.calls;
    t.total_ns += k.duration_ns();
    if (!k.context.empty()) {
      const std::string& op = k.context.back().name;
      ++t.launched_from[op.substr(0, op.find(','))];
    }
  }
  std::vector<KernelTotal> totals;
  for (auto& [name, total] : by_name)
    totals.push_back(std::move(total));
  std::sort(totals.begin(), totals.end(), [](const KernelTotal& a, const KernelTotal& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });

  const double kernel_ms = static_cast<double>(profile.kernel_time_ns()) * 1e-6;
  std::string out;
  out += fmt::format("{:<12} {}\n", "processes", processes);
  for (const auto& d : profile.devices) {
    out += fmt::format("{:<12} {}: {} (compute capability {}.{}, {} SMs)\n", "device", d.id, d.name,
                       d.compute_major, d.compute_minor, d.sm_count);
  }
  out += fmt::format("{:<12} {}\n", "region", profile.region);
  out += fmt::format("{:<12} {} ({} distinct)\n", "kernels", profile.kernels.size(), totals.size());
  out += fmt::format("{:<12} {:.3f} ms (sum of kernel durations)\n", "kernel time", kernel_ms);
  out += fmt::format("{:<12} {:.3f} ms (a kernel or transfer running, per device)\n", "GPU busy",
                     static_cast<double>(profile.busy_time_ns()) * 1e-6);
  out += fmt::format("{:<12} {}\n", "dropped", profile.dropped_records);
  append_recording_notes(profile, out);
  if (totals.empty()) return out;

  constexpr size_t kNameWidth = 60;
  constexpr size_t kOpWidth = 28;
  out += fmt::format("\n{:<{}} {:>7} {:>12} {:>7}  {}\n", "kernel", kNameWidth, "calls", "total us",
                     "share", "launched from");
  for (size_t i = 0; i < std::min(top, totals.size()); ++i) {
    const KernelTotal& t = totals[i];
    const double share = profile.kernel_time_ns() > 0
                             ? 100.0 * static_cast<double>(t.total_ns) /
                                   static_cast<double>(profile.kernel_time_ns())
                             : 0.0;
    out += fmt::format(
        "{:<{}} {:>7} {:>12.1f} {:>6.1f}%  {}\n", short_kernel_name(t.name, kNameWidth), kNameWidth,
        t.calls, static_cast<double>(t.total_ns) * 1e-3, share, shortened(usual_op(t), kOpWidth));
  }
  if (totals.size() > top) {
    out += fmt::format("({} more kernels in the profile)\n", totals.size() - top);
  }
  return out;
}

}  // namespace kforge
