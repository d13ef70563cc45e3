#include "cli/plan_command.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <regex>

#include <fmt/format.h>

#include "cli/common.h"
#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/run_info.h"
#include "device/backend.h"
#include "device/ceilings.h"
#include "profile/planner.h"
#include "run/worker_client.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

std::string clip(const std::string& text, size_t width) {
  if (text.size() <= width) return text;
  return text.substr(0, width - 2) + "..";
}

std::string number_or_dash(const std::optional<double>& v, const char* format) {
  return v ? fmt::format(fmt::runtime(format), *v) : "-";
}

// When a GPU of the profile's kind is visible here, its ceilings, measured now (and cached).
std::optional<Ceilings> measure_ceilings_here(const std::string& device, const fs::path& cache) {
  const auto devices = list_cuda_devices();
  const auto same = std::find_if(devices.begin(), devices.end(),
                                 [&](const DeviceInfo& d) { return d.name == device; });
  if (same == devices.end()) return std::nullopt;
  progress_line(fmt::format("no ceilings cached for {}: measuring them on cuda:{} (once)", device,
                            same->index));
  WorkerClient worker({"cuda", same->index});
  return device_ceilings(worker, cache, false, progress_line);
}

// The measured ceilings for the profile's GPU: a file, the cache by device name, or measured
// now when that GPU is here.
PlanOptions ceilings_for(const Profile& profile, const std::string& file) {
  PlanOptions options;
  const std::string device = main_device_name(profile);
  Ceilings c;
  if (!file.empty()) {
    c = read_ceilings_file(file);
    options.ceilings_source = file;
    const std::string measured_on = c.raw.contains("device") && c.raw.at("device").is_object()
                                        ? c.raw.at("device").value("name", "")
                                        : "";
    if (!device.empty() && !measured_on.empty() && measured_on != device) {
      progress_line(fmt::format("warning: ceilings measured on {}, profile taken on {}",
                                measured_on, device));
    }
  } else {
    if (device.empty()) {
      throw UsageError(
          "the profile names no device, so kforge cannot look up its ceilings: pass --ceilings "
          "FILE, written by `kforge ceilings --json FILE` on the GPU the profile was taken on");
    }
    const fs::path cache = default_cache_dir();
    auto cached = cached_ceilings_by_name(cache, device);
    if (!cached) cached = measure_ceilings_here(device, cache);
    if (!cached) {
      throw UsageError(fmt::format(
          "no measured ceilings for {} in {}, and no such GPU here to measure them on: run "
          "`kforge ceilings` on that GPU (it measures and caches them), or `kforge ceilings "
          "--json FILE` there and pass --ceilings FILE",
          device, (cache / "ceilings").string()));
    }
    c = std::move(*cached);
    options.ceilings_source = c.from_cache
                                  ? fmt::format("cache, measured {}", c.measured_at)
                                  : fmt::format("measured now on this machine ({})", c.measured_at);
  }
  options.copy_gbps = c.copy_gbps;
  options.matmul_tflops = c.matmul_tflops;
  return options;
}

void print_plan(const Plan& plan, size_t top) {
  const double ms = 1e-6;
  fmt::print("{} kernels, {:.3f} ms of kernel time (GPU busy {:.3f} ms, copies {:.3f} ms) on {}\n",
             plan.kernels, static_cast<double>(plan.kernel_time_ns) * ms,
             static_cast<double>(plan.busy_time_ns) * ms,
             static_cast<double>(plan.transfer_time_ns) * ms,
             plan.device.empty() ? "an unnamed device" : plan.device);
  fmt::print("ceilings: copy {:.0f} GB/s, matmul {} ({})\n", plan.options.copy_gbps,
             plan.options.matmul_tflops ? fmt::format("{:.0f} TFLOP/s", *plan.options.matmul_tflops)
                                        : "not measured",
             plan.options.ceilings_source);
  if (plan.raised_matmul_tflops) {
    fmt::print("matmul ceiling raised to {:.0f} TFLOP/s: the {} of this profile reached it\n",
               *plan.raised_matmul_tflops, plan.raised_by);
  }

  const size_t shown = std::min(top, plan.groups.size());
  size_t shape_width = 5;
  for (size_t i = 0; i < shown; ++i)
    shape_width = std::max(shape_width, std::min<size_t>(plan.groups[i].shape.size(), 40));
  fmt::print(
      "\n{:>4} {:<23} {:<{}} {:<5} {:>6} {:>9} {:>6} {:>9} {:>14} {:>9} {:>7} {:>6} {:>6}  {}\n",
      "rank", "op", "shape", shape_width, "dtype", "calls", "total ms", "share%", "us/call",
      "achieved", "best us", "s_max", "gain", "cum", "kernel");
  for (size_t i = 0; i < shown; ++i) {
    const PlanGroup& g = plan.groups[i];
    std::string achieved = "-";
    if (g.bound == "compute" && g.achieved_tflops()) {
      achieved = fmt::format("{:.1f} TFLOP/s", *g.achieved_tflops());
    } else if (g.achieved_gbps()) {
      achieved = fmt::format("{:.0f} GB/s", *g.achieved_gbps());
    }
    const std::string kernel =
        g.kernel_names.empty() ? "" : short_kernel_name(g.kernel_names.front().name);
    const std::string more =
        g.kernel_names.size() > 1 ? fmt::format(" +{}", g.kernel_names.size() - 1) : "";
    fmt::print(
        "{:>4} {:<23} {:<{}} {:<5} {:>6} {:>9.3f} {:>6.1f} {:>9.2f} {:>14} {:>9} {:>7} {:>6} {:>6} "
        " "
        "{}{}\n",
        g.rank, clip(g.name, 23), clip(g.shape, 40), shape_width,
        g.dtype ? std::string(dtype_name(*g.dtype)) : "-",
        fmt::format("{}{}", g.calls, g.calls_are_kernels ? "k" : ""),
        static_cast<double>(g.time_ns) * ms, 100 * g.share, g.ns_per_call() * 1e-3, achieved,
        g.best_ns_per_call ? fmt::format("{:.2f}", *g.best_ns_per_call * 1e-3) : "-",
        number_or_dash(g.s_max, "{:.2f}"), number_or_dash(g.gain, "{:.3f}"),
        number_or_dash(g.cumulative_gain, "{:.3f}"), clip(kernel, 48), more);
  }
  double rest = 0;
  for (size_t i = shown; i < plan.groups.size(); ++i)
    rest += plan.groups[i].share;
  if (shown < plan.groups.size()) {
    fmt::print("     ... {} more groups, {:.1f}% of kernel time (--top N shows more)\n",
               plan.groups.size() - shown, 100 * rest);
  }

  fmt::print(
      "\nkforge ops: {:.1f}% of kernel time ({:.1f}% with a known problem); named groups: "
      "{:.1f}%; other: {:.1f}%\n",
      100 * plan.op_share, 100 * plan.op_share_with_problem, 100 * plan.named_share,
      100 * plan.other_share);
  fmt::print("gain if every group with a roofline ran at it: {:.3f}x\n", plan.all_fixed_gain);
  fmt::print("calls: op calls as the context identified them; 'k': kernels\n");
  bool header = false;
  for (size_t i = 0; i < shown; ++i) {
    const PlanGroup& g = plan.groups[i];
    std::vector<std::string> lines = g.notes;
    for (const auto& why : g.unmapped)
      lines.push_back("shape unknown: " + why);
    for (const auto& line : lines) {
      if (!header) fmt::print("notes:\n");
      header = true;
      fmt::print("  [{}] {}\n", g.rank, line);
    }
  }
}

// "03-flash_attention-2x8x512x128_causal_1_scale_permille_0-bf16"
std::string task_folder(const PlanGroup& g, size_t index) {
  const std::string shape = std::regex_replace(g.shape, std::regex("[^A-Za-z0-9x]+"), "_");
  return fmt::format("{:02}-{}-{}-{}", index, g.op, shape, dtype_name(*g.dtype));
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanFlags& flags) {
  auto* plan = app.add_subcommand(
      "plan", "Rank a profile's kernels by the whole-run gain a faster kernel could bring");
  plan->add_option("profile", flags.profile, "A profile written by `kforge profile`")->required();
  plan->add_option("--ceilings", flags.ceilings,
                   "Ceilings file from `kforge ceilings --json FILE` (default: the cached "
                   "ceilings of the profile's device)");
  plan->add_option("--dtype", flags.dtype,
                   "dtype of ops whose inputs and kernel names do not say (f16, bf16, f32)")
      ->capture_default_str();
  plan->add_option("--top", flags.top, "Rows in the table")->capture_default_str();
  plan->add_option("--json", flags.json_path, "Write the plan as JSON to FILE ('-' for stdout)");
  auto* extract = plan->add_option(
      "--extract", flags.extract,
      "Write the N best groups that map to a kforge problem as tasks for `kforge tune --task`");
  plan->add_option("--workspace", flags.workspace, "Where --extract writes its tasks")
      ->needs(extract);
  plan->add_flag("--split-mlp", flags.split_mlp,
                 "Count the matmuls inside MLP modules as matmuls (default: the whole module is "
                 "one fused_mlp call)");
  return plan;
}

int cmd_plan(const PlanFlags& flags, const std::vector<std::string>& argv) {
  if (flags.extract > 0 && flags.workspace.empty())
    throw UsageError("--extract N needs --workspace DIR to write the tasks into");
  const Profile profile = read_profile(flags.profile);
  PlanOptions options = ceilings_for(profile, flags.ceilings);
  options.default_dtype = parse_dtypes({flags.dtype}).front();
  options.classify.split_mlp = flags.split_mlp;
  const Plan plan = make_plan(profile, options);
  print_plan(plan, flags.top);

  nlohmann::json j = plan_to_json(plan);
  j["profile"] = flags.profile;
  j["run"] = run_metadata(argv);
  if (flags.extract > 0) {
    const fs::path dir = flags.workspace;
    fs::create_directories(dir);
    nlohmann::json tasks = nlohmann::json::array();
    fmt::print("\n");
    for (const PlanGroup& g : plan.groups) {
      if (tasks.size() == flags.extract) break;
      if (!g.extractable()) continue;
      const fs::path folder = dir / task_folder(g, tasks.size() + 1);
      fs::create_directories(folder);
      write_json_atomically(folder / "task.json", task_to_json(plan, g, flags.profile));
      tasks.push_back((folder / "task.json").string());
      fmt::print("task {}: {}  (kforge tune --task {})\n", tasks.size(), folder.string(),
                 (folder / "task.json").string());
    }
    if (tasks.size() < flags.extract) {
      fmt::print("only {} group(s) map to a kforge problem; {} asked for\n", tasks.size(),
                 flags.extract);
    }
    j["tasks"] = tasks;
    write_json_atomically(dir / "plan.json", j);
  }
  write_json(j, flags.json_path);
  return 0;
}

}  // namespace kforge
