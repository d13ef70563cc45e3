// The kforge command line.
//
//   kforge devices                 GPUs (and the CPU backend) kforge can run on
//   kforge ops                     the op specs kforge knows
//   kforge ceilings                measured copy / matmul ceilings of a device (cached)
//   kforge check FILE              five-stage correctness of one kernel file
//   kforge bench FILE              timing at one problem, against the measured ceilings
//   kforge tune OP|FILE            search a template's parameters under the device's limits
//   kforge profile -- COMMAND      every kernel a CUDA program runs, with its NVTX context
//   kforge plan PROFILE            rank a profile's kernels by the whole-run gain (Amdahl)
//   kforge profile --torch-trace F a torch.profiler Chrome trace as a kforge profile
//
// Exit codes: 0 success, 1 the kernel failed (a verdict other than OK), 2 bad usage,
// 3 an internal error.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "bench/bencher.h"
#include "check/checker.h"
#include "check/sanitizer.h"
#include "cli/build_command.h"
#include "cli/common.h"
#include "cli/export_command.h"
#include "cli/import_command.h"
#include "cli/kernelbench_command.h"
#include "cli/loop_command.h"
#include "cli/plan_command.h"
#include "cli/profile_command.h"
#include "cli/report_command.h"
#include "cli/table_check.h"
#include "cli/tune_command.h"
#include "compile/compiler.h"
#include "core/error.h"
#include "core/run_info.h"
#include "device/backend.h"
#include "device/ceilings.h"
#include "kernelbench/kernelbench_op.h"
#include "ops/op_spec.h"
#include "run/protocol.h"
#include "run/worker_client.h"
#include "tune/library.h"

namespace kforge {
namespace {

int cmd_devices(bool json) {
  const auto cuda = list_cuda_devices();
  const DeviceInfo cpu = cpu_device_info();
  if (json) {
    nlohmann::json j = {{"cuda", cuda}, {"cpu", cpu}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  if (cuda.empty()) fmt::print("no CUDA device visible\n");
  for (const auto& d : cuda)
    fmt::print("{}\n", device_line(d));
  fmt::print("{}\n", device_line(cpu));
  return 0;
}

int cmd_ops() {
  for (const OpSpec* op : all_ops()) {
    std::vector<std::string_view> dtypes;
    for (const DType d : op->dtypes())
      dtypes.push_back(dtype_name(d));
    fmt::print("{:<10} {}  ({})  dtypes {}  default {}\n", op->name(), op->signature(),
               op->formula(), fmt::join(dtypes, ","), op->format_shape(op->default_size()));
  }
  return 0;
}

int cmd_ceilings(const DeviceFlags& flags, bool refresh, const std::string& json_path) {
  WorkerClient worker({pick_backend(flags, nullptr), flags.device});
  const Ceilings c = device_ceilings(worker, default_cache_dir(), refresh, progress_line);
  fmt::print("{}\n", device_line(worker.device()));
  fmt::print("copy    {:.0f} GB/s (bytes read + written, device-to-device)\n", c.copy_gbps);
  if (c.matmul_tflops) {
    fmt::print("matmul  {:.0f} TFLOP/s ({})\n", *c.matmul_tflops,
               c.raw.at("ceilings").value("matmul_shape", ""));
  } else {
    fmt::print("matmul  n/a ({})\n", c.raw.at("ceilings").value("matmul_note", ""));
  }
  fmt::print("measured {}{}\n", c.measured_at,
             c.from_cache ? " (cached; --refresh to measure again)" : "");
  write_json(c.raw, json_path);
  return 0;
}

void print_check_report(const CheckReport& report) {
  fmt::print("\n{:<12} {:>6} {:>8} {:>14} {:>14}\n", "stage", "cases", "result", "worst abs err",
             "worst rel err");
  for (const auto& s : report.stages) {
    const std::string result = !s.ran ? "-" : s.passed ? "PASS" : "FAIL";
    fmt::print("{:<12} {:>6} {:>8} {:>14.3g} {:>14.3g}{}\n", s.name, s.cases, result,
               s.worst_abs_error, s.worst_rel_error,
               s.skipped ? fmt::format("  ({} skipped)", s.skipped) : "");
  }
  fmt::print("\nverdict: {}  (seed {})\n", verdict_name(report.verdict), report.seed);
  if (!report.passed()) fmt::print("  {}\n", report.detail);
  print_candidate_output(report.output);
}

struct CheckFlags {
  std::string file;
  std::vector<std::string> dtypes;
  std::vector<std::string> params;
  std::vector<std::string> stages;
  uint64_t seed = 0;
  std::string arch;
  int64_t max_elements = 0;
  double timeout_seconds = 0;
  bool keep = false;
  bool sanitize = false;
  std::string json_path;
  std::string table;
  bool compile_only = false;
};

int cmd_check_table(const CheckFlags& flags, const DeviceFlags& device) {
  if (flags.dtypes.empty()) throw UsageError("--table needs the dtypes to check (--dtype D)");
  TableCheckOptions options;
  options.seed = flags.seed;
  options.arch = flags.arch;
  options.timeout_seconds = flags.timeout_seconds;
  options.keep = flags.keep;
  options.compile_only = flags.compile_only;
  return check_table_variants(flags.table, parse_dtypes(flags.dtypes), device, options) == 0 ? 0
                                                                                             : 1;
}

int cmd_check(const CheckFlags& flags, const DeviceFlags& device,
              const std::vector<std::string>& argv) {
  KernelSession session(flags.file, device, flags.keep);
  const KernelFile& file = session.file;
  WorkerClient& worker = session.worker;
  CheckOptions options;
  options.seed = flags.seed;
  options.dtypes = parse_dtypes(flags.dtypes);
  options.params = parse_params(flags.params);
  options.arch = flags.arch;
  options.max_elements = flags.max_elements;
  options.timeout = std::chrono::milliseconds(static_cast<long long>(flags.timeout_seconds * 1000));
  options.stages = flags.stages;
  if (flags.sanitize) options.sanitizer_tools = all_sanitizer_tools();
  progress_line(
      fmt::format("kforge check {} ({}) on {}", flags.file, file.op, device_line(worker.device())));
  const CheckReport report = session.checker.check(file, options, progress_line);
  print_check_report(report);
  nlohmann::json j = report.to_json(session.op);
  session.describe_run(j, argv);
  write_json(j, flags.json_path);
  return report.passed() ? 0 : 1;
}

struct BenchFlags {
  std::string file;
  std::string shape;
  std::string dtype = "bf16";
  std::vector<std::string> params;
  uint64_t seed = 0;
  std::string arch;
  double max_seconds = 3.0;
  double target_stderr = 0.002;
  bool warm_cache = false;
  bool keep = false;
  bool no_baseline = false;
  std::string ceilings_path;
  std::string json_path;
};

int cmd_bench(const BenchFlags& flags, const DeviceFlags& device,
              const std::vector<std::string>& argv) {
  const DType dtype = parse_dtypes({flags.dtype}).front();
  // An op name (rather than a file) runs the library's choice for the problem: the tuned
  // variant for this size, dtype and device when there is one.
  std::string path = flags.file;
  std::optional<LibraryChoice> choice;
  if (const OpSpec* named = find_op(flags.file); named && !std::filesystem::exists(flags.file)) {
    const std::string backend = pick_backend(device, nullptr);
    const DeviceInfo info = device_info_for(device, backend);
    Sizes sizes = flags.shape.empty() ? named->default_size() : named->parse_shape(flags.shape);
    named->complete_sizes(sizes);
    choice = library_choice(*named, sizes, dtype, info);
    path = choice->file.string();
    progress_line(fmt::format("library: {} {}", path, choice->describe()));
    if (choice->untuned_device()) progress_line(untuned_offer(*named, dtype, info, *choice));
  }
  KernelSession session(path, device, flags.keep);
  const KernelFile& file = session.file;
  const OpSpec* op = &session.op;
  WorkerClient& worker = session.worker;
  BenchOptions options;
  options.sizes = flags.shape.empty() ? op->default_size() : op->parse_shape(flags.shape);
  options.dtype = dtype;
  options.params = choice ? choice->params : ParamValues{};
  for (const auto& [name, value] : parse_params(flags.params))
    options.params[name] = value;  // --param overrides the library's choice
  options.arch = flags.arch;
  options.seed = flags.seed;
  options.settings.max_seconds = flags.max_seconds;
  options.settings.target_rel_stderr = flags.target_stderr;
  options.settings.cold_cache = !flags.warm_cache;
  options.baseline = !flags.no_baseline;
  const Ceilings ceilings = flags.ceilings_path.empty()
                                ? device_ceilings(worker, default_cache_dir(), false, progress_line)
                                : read_ceilings_file(flags.ceilings_path);
  progress_line(fmt::format("kforge bench {} {} {} {}", flags.file, op->name(),
                            op->format_shape(options.sizes), dtype_name(options.dtype)));
  const BenchResult r = bench_kernel(session.checker, worker, file, *op, options, ceilings);

  const DeviceInfo& d = worker.device();
  fmt::print("\n{:<9} {} {} {}  [{}]\n", "problem", op->name(), op->format_shape(r.sizes),
             dtype_name(r.dtype), r.build.variant.params_text());
  fmt::print("{:<9} {}\n", "device", device_line(d));
  if (choice) {
    fmt::print("{:<9} {}{}\n", "library", choice->describe(),
               choice->untuned_device() ? ": this time is not the library's tuned kernel's" : "");
  }
  fmt::print("{:<9} {}\n", "build", r.build.resources.summary());
  if (r.verdict != Verdict::ok) {
    fmt::print("{:<9} {} - not timed: {}\n", "verdict", verdict_name(r.verdict), r.detail);
  } else {
    const Measurement& m = r.measurement;
    fmt::print(
        "{:<9} OK: {} samples on fresh inputs and {} probes (repeats of the previous "
        "inputs: {:.2f} us median); {} warm-up runs{}\n",
        "verdict", m.samples_taken - m.probes, m.probes, m.repeat_stats.median * 1e3, m.warmup_runs,
        d.backend == "cuda" ? "; all its work on the given stream" : "");
    for (const auto& c : m.checks)
      fmt::print("{:<9} {}\n", "checked", c);
    const double us = 1e3;
    fmt::print(
        "{:<9} {:.2f} us median  (p10 {:.2f}, p90 {:.2f}; noise {:.2f}%; {} samples, {}{})\n",
        "time", r.stats.median * us, r.stats.p10 * us, r.stats.p90 * us, 100 * r.stats.rel_noise,
        r.stats.count, r.stop_reason,
        r.throttled_samples ? fmt::format(", {} throttled samples discarded", r.throttled_samples)
                            : "");
    fmt::print("{:<9} {:.1f} GB/s = {:.1f}% of the measured copy ceiling ({:.0f} GB/s)\n", "memory",
               r.gbps, r.pct_of_copy, ceilings.copy_gbps);
    fmt::print("{:<9} {:.3f} TFLOP/s{}\n", "compute", r.tflops,
               std::isnan(r.pct_of_matmul)
                   ? std::string()
                   : fmt::format(" = {:.2f}% of the measured matmul ceiling", r.pct_of_matmul));
    if (r.baseline && r.baseline->ok) {
      const auto& b = *r.baseline;
      fmt::print("{:<9} {:.2f} us median (p10 {:.2f}, p90 {:.2f}) for {}\n", "baseline",
                 b.stats.median * us, b.stats.p10 * us, b.stats.p90 * us, b.what);
      fmt::print("{:<9} {:.3f}x the baseline: {}\n", "speedup", b.speedup,
                 comparison_name(b.comparison));
    } else if (r.baseline) {
      fmt::print("{:<9} not timed ({}): {}\n", "baseline", r.baseline->what, r.baseline->detail);
    }
    fmt::print("{:<9} {}{}, L2 {}\n", "method",
               d.backend == "cuda" ? "device events" : "steady clock",
               r.clock_monitored ? fmt::format(", SM clock {} MHz (monitored)", r.sm_clock_mhz)
                                 : ", clocks not monitored",
               options.settings.cold_cache ? "flushed before every sample" : "warm");
  }
  print_candidate_output(r.measurement.output);
  nlohmann::json j = r.to_json(*op);
  j["device"] = d;
  j["ceilings"] = ceilings.raw.at("ceilings");
  session.describe_run(j, argv);
  if (!r.build.module.empty()) j["module"] = r.build.module.string();
  if (choice) {
    j["library"] = choice->to_json();
    if (choice->untuned_device()) j["untuned_offer"] = untuned_offer(*op, dtype, d, *choice);
  }
  write_json(j, flags.json_path);
  return r.verdict == Verdict::ok ? 0 : 1;
}

}  // namespace
}  // namespace kforge

int main(int argc, char** argv) {
  using namespace kforge;
  // Line by line into a log file too: a long run (a tune, a loop, a score) that is killed keeps
  // every line it printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::vector<std::string> args(argv, argv + argc);
  install_kernelbench_resolver();  // ops named kb:NAME load KernelBench problems
  CLI::App app{"kforge: profile, check, time and tune GPU kernels"};
  app.require_subcommand(1);

  bool devices_json = false;
  auto* devices = app.add_subcommand("devices", "List the devices kforge can run on");
  devices->add_flag("--json", devices_json, "Print JSON");

  app.add_subcommand("ops", "List the op specs");

  DeviceFlags device_flags;
  bool refresh = false;
  std::string ceilings_json;
  auto* ceilings = app.add_subcommand("ceilings", "Measure (or show cached) device ceilings");
  add_device_flags(ceilings, device_flags);
  ceilings->add_flag("--refresh", refresh, "Measure again even if cached");
  ceilings->add_option("--json", ceilings_json, "Write JSON to FILE ('-' for stdout)");

  CheckFlags check_flags;
  auto* check = app.add_subcommand("check", "Five-stage correctness check of a kernel file");
  check->add_option("file", check_flags.file, "Kernel file (.cu or .cpp)");
  check->add_option("--table", check_flags.table,
                    "Check every variant of this tuned table in the --dtype dtypes and record "
                    "the results in its rows (instead of FILE)");
  check->add_flag("--compile-only", check_flags.compile_only,
                  "With --table: compile every variant of the table (CUDA files, for --arch or "
                  "sm_90a) and report what does not compile; needs no GPU, records nothing");
  check->add_option("--dtype", check_flags.dtypes, "Only these dtypes (repeatable)");
  check->add_option("--param", check_flags.params, "NAME=VALUE (repeatable)");
  check->add_option("--stage", check_flags.stages, "Only these stages (repeatable)")
      ->check(CLI::IsMember({"smoke", "shape_sweep", "stability", "determinism", "edge_cases"}));
  check->add_option("--seed", check_flags.seed, "Input seed (default: fresh, recorded)");
  check->add_option("--arch", check_flags.arch, "GPU architecture, e.g. sm_90a");
  check->add_option("--max-elements", check_flags.max_elements,
                    "Skip problems with a tensor larger than this");
  check->add_option("--timeout", check_flags.timeout_seconds, "Per-run time limit in seconds");
  check->add_flag("--keep", check_flags.keep, "Keep PTX, cubin and SASS beside cached modules");
  check->add_flag("--sanitize", check_flags.sanitize,
                  "After the five stages, run small problems under compute-sanitizer (memcheck, "
                  "racecheck, synccheck, initcheck); findings fail the check");
  check->add_option("--json", check_flags.json_path,
                    "Write the report as JSON to FILE ('-' for stdout)");
  add_device_flags(check, device_flags);

  BenchFlags bench_flags;
  auto* bench =
      app.add_subcommand("bench", "Time a kernel file (or an op's library variant) at one problem");
  bench
      ->add_option("target", bench_flags.file,
                   "Kernel file (.cu or .cpp), or an op: the library's variant for the problem")
      ->required();
  bench->add_option("--shape", bench_flags.shape,
                    "Problem sizes, e.g. 8192x8192 (default: the op's)");
  bench->add_option("--dtype", bench_flags.dtype, "f16, bf16 or f32")->capture_default_str();
  bench->add_option("--param", bench_flags.params, "NAME=VALUE (repeatable)");
  bench->add_option("--seed", bench_flags.seed, "Input seed (default: fresh, recorded)");
  bench->add_option("--arch", bench_flags.arch, "GPU architecture, e.g. sm_90a");
  bench->add_option("--max-time", bench_flags.max_seconds, "Sampling time cap in seconds")
      ->capture_default_str();
  bench
      ->add_option("--target-stderr", bench_flags.target_stderr,
                   "Stop once the median's relative standard error is below this")
      ->capture_default_str();
  bench->add_flag("--warm-cache", bench_flags.warm_cache, "Do not flush the cache between samples");
  bench->add_flag("--no-baseline", bench_flags.no_baseline,
                  "Do not time the baseline (cuBLAS, or the op's starter kernel)");
  bench->add_flag("--keep", bench_flags.keep, "Keep PTX, cubin and SASS beside cached modules");
  bench->add_option("--ceilings", bench_flags.ceilings_path,
                    "Ceilings to judge against, from `kforge ceilings --json FILE` (default: "
                    "this device's, measured once and cached)");
  bench->add_option("--json", bench_flags.json_path,
                    "Write the result as JSON to FILE ('-' for stdout)");
  add_device_flags(bench, device_flags);

  TuneFlags tune_flags;
  auto* tune = add_tune_command(app, tune_flags, device_flags);

  BuildFlags build_flags;
  auto* build = add_build_command(app, build_flags, device_flags);
  ExportFlags export_flags;
  auto* export_cmd = add_export_command(app, export_flags, device_flags);
  VerifyFlags verify_flags;
  auto* verify = add_verify_command(app, verify_flags);
  PatchFlags patch_flags;
  auto* patch = add_patch_command(app, patch_flags);
  LoopFlags loop_flags;
  auto* loop = add_loop_command(app, loop_flags, device_flags);
  TaskFlags task_flags;
  auto* task = add_task_command(app, task_flags, device_flags);
  KernelBenchFlags kernelbench_flags;
  auto* kernelbench = add_kernelbench_command(app, kernelbench_flags, device_flags);

  ProfileFlags profile_flags;
  auto* profile = add_profile_command(app, profile_flags);
  PlanFlags plan_flags;
  auto* plan = add_plan_command(app, plan_flags);
  ReportFlags report_flags;
  auto* report = add_report_command(app, report_flags);
  // Standalone until `kforge profile --torch-trace` (add_torch_trace_options) takes it over.
  TorchTraceFlags torch_trace_flags;
  auto* import_torch_trace = add_import_torch_trace_command(app, torch_trace_flags);

  WorkerFlags worker_flags;
  auto* worker = app.add_subcommand("__worker", "Internal: runs candidate code for kforge");
  worker->group("");  // hidden
  worker->add_option("--backend", worker_flags.backend)->required();
  worker->add_option("--device", worker_flags.device);
  worker->add_option("--channel", worker_flags.channel)->required();
  worker->add_option("--parent", worker_flags.parent)->required();
  worker->add_option("--cpu-core", worker_flags.cpu_core);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    if (*worker) return run_worker(worker_flags);
    if (*devices) return cmd_devices(devices_json);
    if (app.got_subcommand("ops")) return cmd_ops();
    if (*ceilings) return cmd_ceilings(device_flags, refresh, ceilings_json);
    if (*check && !check_flags.table.empty()) return cmd_check_table(check_flags, device_flags);
    if (*check && check_flags.file.empty())
      throw UsageError("check: give a kernel FILE or --table");
    if (*check && check_flags.compile_only)
      throw UsageError("check: --compile-only compiles a table's variants: give --table");
    if (*check) return cmd_check(check_flags, device_flags, args);
    if (*bench) return cmd_bench(bench_flags, device_flags, args);
    if (*tune) return cmd_tune(tune_flags, device_flags, args);
    if (*build) return cmd_build(build_flags, device_flags, args);
    if (*export_cmd) return cmd_export(export_flags, device_flags, args);
    if (*verify) return cmd_verify(verify_flags);
    if (*patch) return cmd_patch(patch_flags);
    if (*loop) return cmd_loop(loop_flags, device_flags);
    if (*task) return cmd_task(task_flags, device_flags);
    if (*kernelbench) return cmd_kernelbench(kernelbench_flags, device_flags, args);
    if (*profile) return cmd_profile(profile_flags, args);
    if (*plan) return cmd_plan(plan_flags, args);
    if (*report) return cmd_report(report_flags, args);
    if (*import_torch_trace) return cmd_import_torch_trace(torch_trace_flags, args);
  } catch (const UsageError& e) {
    fmt::print(stderr, "kforge: {}\n", e.what());
    return 2;
  } catch (const ParseError& e) {
    fmt::print(stderr, "kforge: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kforge: error: {}\n", e.what());
    return 3;
  }
  return 0;
}
