#include "cli/tune_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/table_check.h"
#include "core/error.h"
#include "core/run_info.h"
#include "device/ceilings.h"
#include "profile/planner.h"
#include "tune/library.h"
#include "tune/strategy.h"
#include "tune/tuner.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;

// The tunables of a record, without derived values: what a person passes back with --param.
nlohmann::json tunables_of(const KernelFile& file, const nlohmann::json& params) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& p : file.params) {
    if (params.contains(p.name)) out[p.name] = params.at(p.name);
  }
  return out;
}

// The same, as NAME=VALUE in the file's declaration order.
std::string tunables_text(const KernelFile& file, const nlohmann::json& params) {
  std::vector<std::string> parts;
  for (const auto& p : file.params) {
    if (params.contains(p.name))
      parts.push_back(fmt::format("{}={}", p.name, params.at(p.name).get<long long>()));
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

// --fix NAME=VALUE: the search keeps NAME at VALUE (its only candidate, and the start) in every
// file that declares it.
void fix_params(std::vector<KernelFile>& files, const ParamValues& fixed) {
  for (const auto& [name, value] : fixed) {
    bool declared = false;
    for (auto& file : files) {
      for (auto& p : file.params) {
        if (p.name != name) continue;
        if (std::find(p.candidates.begin(), p.candidates.end(), value) == p.candidates.end()) {
          throw UsageError(fmt::format("--fix {}={}: not a candidate in {}", name, value,
                                       file.path.filename().string()));
        }
        p.candidates = {value};
        p.default_value = value;
        p.default_expression.reset();
        declared = true;
      }
    }
    if (!declared) throw UsageError(fmt::format("--fix {}: no tuned file declares it", name));
  }
}

// --start FILE:NAME=V,NAME=V: FILE is one of the tuned files (its name or path) and every NAME one
// of its tunables, so that a typo is an error here rather than a start skipped later.
std::vector<TuneStart> given_starts(const std::vector<std::string>& items,
                                    const std::vector<KernelFile>& files) {
  std::vector<TuneStart> starts;
  for (const auto& item : items) {
    const size_t colon = item.find(':');
    TuneStart s;
    // FILE as a name or as a path (as the tuned file was given): the tuned files are told
    // apart by name.
    s.file = std::filesystem::path(item.substr(0, colon)).filename().string();
    const auto file = std::find_if(files.begin(), files.end(), [&](const KernelFile& f) {
      return f.path.filename().string() == s.file;
    });
    if (colon == std::string::npos || file == files.end()) {
      throw UsageError(fmt::format(
          "--start {}: expected FILE:NAME=VALUE,... with FILE one of the tuned files", item));
    }
    std::vector<std::string> assignments;
    for (size_t begin = colon + 1; begin <= item.size();) {
      const size_t end = std::min(item.find(',', begin), item.size());
      if (end > begin) assignments.push_back(item.substr(begin, end - begin));
      begin = end + 1;
    }
    s.tunables = parse_params(assignments);
    for (const auto& [name, value] : s.tunables) {
      const bool declared = std::any_of(file->params.begin(), file->params.end(),
                                        [&](const auto& p) { return p.name == name; });
      if (!declared) {
        throw UsageError(fmt::format("--start {}: {} has no tunable {}", item, s.file, name));
      }
    }
    s.origin = fmt::format("--start {}", item);
    starts.push_back(std::move(s));
  }
  return starts;
}

const KernelFile* file_of(const std::vector<KernelFile>& files, const std::string& name) {
  for (const auto& f : files) {
    if (f.path.filename().string() == name) return &f;
  }
  return files.empty() ? nullptr : &files.front();
}

// One line that is rewritten in place on a terminal, or a line per evaluation in a log.
class ProgressBar {
 public:
  ProgressBar() : tty_(isatty(STDERR_FILENO) != 0) {}
  ~ProgressBar() { finish(); }

  void update(const TuneProgress& p) {
    const auto& r = p.last->record;
    const std::string total = p.budget ? fmt::format("/{}", p.budget) : "";
    const std::string what = r.timed() ? fmt::format("{:.2f} us", r.stats.median * 1e3)
                                       : fmt::format("{} at {}", verdict_name(r.verdict), r.stage);
    const std::string line =
        fmt::format("[{:>4}{}] valid {:>4}  best {:>10}  last {} {}{}", p.evaluated, total, p.valid,
                    p.best_ms ? fmt::format("{:.2f} us", *p.best_ms * 1e3) : "-", r.variant, what,
                    p.last->from_database ? " (db)" : "");
    if (tty_) {
      fmt::print(stderr, "\r\033[K{}", line.substr(0, 160));
      open_ = true;
    } else {
      fmt::print(stderr, "{}\n", line);
    }
  }
  void finish() {
    if (open_) fmt::print(stderr, "\n");
    open_ = false;
  }

 private:
  bool tty_;
  bool open_ = false;
};

// An estimated count to the three significant digits its sample supports.
double significant_digits(double count) {
  if (count <= 0) return 0;
  const double unit = std::pow(10.0, std::floor(std::log10(count)) - 2);
  return std::round(count / unit) * unit;
}

void print_report(const TuneReport& report, const std::vector<KernelFile>& files, const OpSpec& op,
                  const std::optional<Ceilings>& ceilings, size_t top) {
  const Cost cost = op.cost(report.problem.sizes, report.problem.dtype);
  const std::vector<size_t> ranked = report.ranked();
  const double baseline_ms = report.baseline && report.evaluations[*report.baseline].record.timed()
                                 ? report.evaluations[*report.baseline].record.stats.median
                                 : NAN;

  fmt::print("\ntune {} on {}{}  strategy {} (seed {})\n", report.problem.key(), report.device,
             report.replay ? " (replay)" : "", report.strategy, report.seed);
  fmt::print("\n{:>4} {:>10} {:>17} {:>8} {:>9} {:>7} {:>5} {:>5}  {}\n", "rank", "median us",
             "p10-p90 us", "vs base", "GB/s", "% copy", "regs", "occ", "variant");
  const auto row = [&](const std::string& rank, const TuneEvaluation& e) {
    const auto& r = e.record;
    const double us = r.stats.median * 1e3;
    const double gbps = cost.bytes / (r.stats.median * 1e-3) / 1e9;
    const KernelFile* f = file_of(files, r.file);
    fmt::print("{:>4} {:>10.2f} {:>17} {:>7.3f}x {:>9.1f} {:>7} {:>5} {:>5}  {}{}\n", rank, us,
               fmt::format("{:.2f}-{:.2f}", r.stats.p10 * 1e3, r.stats.p90 * 1e3),
               std::isnan(baseline_ms) ? NAN : baseline_ms / r.stats.median, gbps,
               ceilings && ceilings->copy_gbps > 0
                   ? fmt::format("{:.1f}", 100 * gbps / ceilings->copy_gbps)
                   : "-",
               r.registers ? std::to_string(r.registers) : "-",
               r.occupancy >= 0 ? fmt::format("{:.0f}%", 100 * r.occupancy) : "-",
               files.size() > 1 ? r.file + " " : "", f ? tunables_text(*f, r.params) : "");
  };
  for (size_t i = 0; i < std::min(top, ranked.size()); ++i)
    row(std::to_string(i + 1), report.evaluations[ranked[i]]);
  if (report.baseline) {
    const auto& b = report.evaluations[*report.baseline];
    if (b.record.timed()) {
      row("base", b);
    } else {
      fmt::print("base  {} at {}: {}\n", verdict_name(b.record.verdict), b.record.stage,
                 b.record.detail);
    }
  }

  if (report.counts_estimated()) {
    fmt::print(
        "\nspace      {:.0f} raw combinations, about {:.0f} feasible after pruning (estimated from "
        "{} random samples; {:.1f} ms)\n",
        report.raw_size, significant_digits(static_cast<double>(report.feasible)),
        report.estimate_samples, report.solve_seconds * 1e3);
  } else {
    fmt::print("\nspace      {:.0f} raw combinations, {} feasible after pruning ({:.1f} ms)\n",
               report.raw_size, report.feasible, report.solve_seconds * 1e3);
  }
  std::vector<std::pair<std::string, double>> pruned(report.pruned_before_compile.begin(),
                                                     report.pruned_before_compile.end());
  std::sort(pruned.begin(), pruned.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [why, count] : pruned) {
    if (report.counts_estimated()) {
      fmt::print("  pruned  ≈ {:>10.0f}  {}\n", significant_digits(count), why);
    } else {
      fmt::print("  pruned   {:>10.0f}  {}\n", count, why);
    }
  }
  for (const auto& [why, count] : report.rejected_after_compile)
    fmt::print("  rejected {:>10}  {} (after compiling)\n", count, why);
  for (const auto& [why, count] : report.failed)
    fmt::print("  failed   {:>10}  {}\n", count, why);
  fmt::print(
      "evaluated  {} ({} valid, {} from the results database{}); stopped: {}\n",
      report.evaluations.size(), ranked.size(), report.from_database_count(),
      report.missing_in_replay ? fmt::format(", {} not recorded", report.missing_in_replay) : "",
      report.stop_reason);
  if (!report.replay) {
    fmt::print(
        "compile    {} variants, {:.2f} s each on {} threads: capacity {:.1f} variants/s; "
        "achieved {:.2f}/s over {:.1f} s busy; the device waited {:.1f} s for compiles\n",
        report.compiled, report.compile_seconds_per_variant(), report.compile_jobs,
        report.compile_capacity(), report.compile_throughput(), report.compile_busy_seconds,
        report.device_wait_seconds);
  }
  if (report.best) {
    const auto& b = report.evaluations[*report.best].record;
    const KernelFile* f = file_of(files, b.file);
    fmt::print("best       {} {}  {:.2f} us{}\n", b.file, f ? tunables_text(*f, b.params) : "",
               b.stats.median * 1e3,
               std::isnan(baseline_ms)
                   ? ""
                   : fmt::format(" = {:.3f}x the defaults", baseline_ms / b.stats.median));
    fmt::print("check      {}\n", report.final_check.empty() ? "not run" : report.final_check);
  } else {
    fmt::print("best       none: no variant passed\n");
  }
  fmt::print("time       {:.1f} s\n", report.wall_seconds);
}

// "40" evaluations or "25%" of the feasible space.
void parse_budget(const std::string& text, TuneOptions& options) {
  if (text.empty()) return;
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    const std::string rest = text.substr(used);
    if (rest == "%" && value > 0 && value <= 100) {
      options.max_fraction = value / 100;
      return;
    }
    if (rest.empty() && value >= 1 && value == std::floor(value)) {
      options.max_evaluations = static_cast<size_t>(value);
      return;
    }
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("--budget '{}': expected a count (40) or a percentage (25%)", text));
}

// Fills target, shape and dtype from --task; what the command line also gives must agree.
TuneFlags resolve_task(TuneFlags flags) {
  if (flags.task.empty()) {
    if (flags.target.empty())
      throw UsageError("kforge tune needs an op, a kernel file, or --task FILE");
    if (flags.dtype.empty()) flags.dtype = "bf16";
    return flags;
  }
  const PlanTask task = read_task_file(flags.task);
  if (!flags.sizes.empty())
    throw UsageError("--task names one problem; it does not combine with --sizes");
  if (!flags.shape.empty() && flags.shape != task.shape) {
    throw UsageError(fmt::format("--shape {} differs from the task's shape {} ({})", flags.shape,
                                 task.shape, flags.task));
  }
  if (!flags.dtype.empty() &&
      parse_dtypes({flags.dtype}).front() != parse_dtypes({task.dtype}).front()) {
    throw UsageError(fmt::format("--dtype {} differs from the task's dtype {} ({})", flags.dtype,
                                 task.dtype, flags.task));
  }
  if (!flags.target.empty()) {
    const std::string op =
        fs::is_regular_file(flags.target) ? KernelFile::load(flags.target).op : flags.target;
    if (op != task.op) {
      throw UsageError(fmt::format("{} is for op {}, the task ({}) for {}", flags.target, op,
                                   flags.task, task.op));
    }
  } else {
    flags.target = task.op;
  }
  flags.shape = task.shape;
  flags.dtype = task.dtype;
  return flags;
}

}  // namespace

CLI::App* add_tune_command(CLI::App& app, TuneFlags& flags, DeviceFlags& device) {
  auto* tune = app.add_subcommand(
      "tune", "Search a kernel file's parameters for the fastest correct variant at a problem");
  tune->add_option("target", flags.target,
                   "An op (tunes its library kernel files), ops joined by commas, 'all' (every op "
                   "with library files), or a kernel file");
  tune->add_option("--also", flags.also,
                   "Another kernel file of the same op to search together with the target "
                   "(repeatable): e.g. a candidate against the library's files");
  tune->add_option("--task", flags.task,
                   "A task file from `kforge plan --extract`: its op, shape and dtype");
  auto* shape =
      tune->add_option("--shape", flags.shape, "Problem sizes, e.g. 8192x8192 (default: the op's)");
  tune->add_option("--sizes", flags.sizes,
                   "'all': tune every size of the op's benchmark sweep and write a size -> "
                   "variant table")
      ->check(CLI::IsMember({"all"}))
      ->excludes(shape);
  tune->add_option("--dtype", flags.dtype, "f16, bf16 or f32 (default: bf16, or the task's)");
  std::vector<std::string> names;
  for (const auto& s : strategies())
    names.push_back(s.name);
  tune->add_option("--strategy", flags.strategy, fmt::format("{}", fmt::join(names, ", ")))
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  tune->add_option("--budget", flags.budget,
                   "At most N evaluations, or P% of the feasible space (default: no limit)");
  tune->add_option("--time", flags.max_seconds, "Wall-clock budget in seconds (0: no limit)");
  tune->add_option("--fix", flags.fixed, "NAME=VALUE: keep a tunable at one value (repeatable)");
  tune->add_option("--seed", flags.seed, "Strategy seed (default: derived from the problem)");
  tune->add_option("--lookahead", flags.lookahead, "Proposals in flight (compiling ahead)")
      ->capture_default_str();
  tune->add_option("--jobs", flags.jobs, "Parallel compiles (default: one per CPU core)");
  tune->add_option("--devices", flags.devices,
                   "Devices to evaluate on, one worker each: indices (0,1,3) or 'all' (every GPU; "
                   "with --backend cpu, CPU slots pinned to cores). Default: --device alone");
  tune->add_option("--arch", flags.arch, "GPU architecture, e.g. sm_90a");
  tune->add_option("--db", flags.db,
                   "Results database (default: $KFORGE_RESULTS_DB or "
                   "~/.cache/kforge/results.sqlite)");
  tune->add_flag("--replay", flags.replay,
                 "Run the strategy over recorded results only: no compiler, no device");
  tune->add_option("--replay-device", flags.replay_device,
                   "Device whose records to replay (default: the one with most records)");
  tune->add_flag("--fresh", flags.fresh, "Evaluate again even when the database has a result");
  tune->add_flag("--no-final-check", flags.no_final_check,
                 "Skip the five-stage check of the winner");
  tune->add_option("--top", flags.top, "Rows in the final table")->capture_default_str();
  tune->add_option("--json", flags.json_path, "Write the report as JSON to FILE ('-' for stdout)");
  tune->add_flag("--update-table", flags.update_table,
                 "With --shape: replace (or add) this size's row in the size -> variant table");
  tune->add_option("--table", flags.table_path,
                   "With --sizes all or --update-table: the size -> variant table (default: the "
                   "library's, kernels/OP/tuned/DTYPE-DEVICE.json, which kforge then runs)");
  tune->add_option("--adopt", flags.adopt,
                   "DEVICE or TABLE: evaluate only that table's variant for each size (checked "
                   "and timed here against the defaults) and write this device's table from it");
  tune->add_flag("--no-starts", flags.no_starts,
                 "Start from the files' defaults, not from the rows of this device's table and "
                 "of same-architecture devices' tables");
  tune->add_flag("--all-rows", flags.all_rows,
                 "Start from every row of those tables, not only the nearest: with --strategy "
                 "given, the tables' variants timed at this size (cheap where they are compiled "
                 "already), the fastest written with --update-table");
  tune->add_option("--start", flags.starts,
                   "FILE:NAME=VALUE,NAME=VALUE: a variant every strategy evaluates first (the "
                   "other tunables take the file's defaults; repeatable), e.g. a point someone "
                   "found by hand; with --strategy given, only these and the defaults");
  tune->add_option("--check-dtypes", flags.check_dtypes,
                   "With --sizes all or --update-table: check the written table's variants "
                   "in these dtypes too (five stages each; a variant checked before in its "
                   "present code is not checked again), so that they may borrow it");
  add_device_flags(tune, device);
  return tune;
}

namespace {

// The table `--adopt` names: a table file, or the library's table of a device key in `dtype`
// (or the dtype of the same width).
fs::path adopted_table_path(const std::string& adopt, const OpSpec& op, DType dtype) {
  if (fs::is_regular_file(adopt)) return adopt;
  const std::string name(op.name());
  if (const auto location = find_tuned_table(name, dtype, adopt)) return location->path;
  throw UsageError(fmt::format("--adopt {}: no such table file, and no {} table for {} at {}",
                               adopt, dtype_name(dtype), name,
                               tuned_table_path(name, dtype, adopt).string()));
}

// A table a tune starts from, read once per op, and what to call it.
struct StartTable {
  nlohmann::json table;
  std::string label;  // "this device's table", "the NVIDIA H200 (cc 9.0) table"
};

// The tables a tune of `op` starts from: with --adopt, the adopted table alone; otherwise this
// device's own table and the tables of devices with the same architecture (a re-tune climbs
// from the current row; a new device from its sibling's).
std::vector<StartTable> start_tables(const TuneFlags& flags, const OpSpec& op, DType dtype,
                                     const DeviceInfo* device) {
  std::vector<StartTable> tables;
  if (!flags.adopt.empty()) {
    const fs::path path = adopted_table_path(flags.adopt, op, dtype);
    nlohmann::json table = read_tuned_table(path);
    const std::string label =
        fmt::format("the {} table", table.value("device", path.filename().string()));
    tables.push_back({std::move(table), label});
  } else if (!flags.no_starts && device) {
    const std::string name(op.name());
    if (const fs::path own = tuned_table_path(name, dtype, device_key(*device)); fs::exists(own))
      tables.push_back({read_tuned_table(own), "this device's table"});
    for (auto& t : same_architecture_tables(name, dtype, *device))
      tables.push_back({std::move(t.table), fmt::format("the {} table", t.device)});
  }
  return tables;
}

// Appends `start` unless `starts` holds its variant (file and tunables) already.
void add_new_start(std::vector<TuneStart>& starts, TuneStart start) {
  const bool held = std::any_of(starts.begin(), starts.end(), [&](const TuneStart& s) {
    return s.file == start.file && s.tunables == start.tunables;
  });
  if (!held) starts.push_back(std::move(start));
}

// A table row as a start point.
TuneStart row_start(const nlohmann::json& row, const std::string& label) {
  TuneStart s;
  s.file = row.at("file").get<std::string>();
  const nlohmann::json params = row.value("params", nlohmann::json::object());
  for (const auto& [name, value] : params.items())
    s.tunables[name] = value.get<long long>();
  s.origin = fmt::format("row {} of {}", row.value("shape", "?"), label);
  return s;
}

// The nearest row of each start table to `sizes`, as a start point; with `all_rows`, then every
// other row of each table whose variant is not a start already.
std::vector<TuneStart> starts_at(const std::vector<StartTable>& tables, const Sizes& sizes,
                                 bool all_rows) {
  std::vector<TuneStart> starts;
  for (const auto& [table, label] : tables) {
    if (const nlohmann::json* nearest = nearest_table_row(table, sizes))
      starts.push_back(row_start(*nearest, label));
  }
  if (!all_rows) return starts;
  for (const auto& [table, label] : tables) {
    for (const auto& row : table.at("sizes")) {
      if (row.contains("file") && row.at("file").is_string())
        add_new_start(starts, row_start(row, label));
    }
  }
  return starts;
}

// The row the library runs at `sizes` on `device`, where its files' busy: lines chose one other
// than the nearest (library_choice): a search at a size without a row starts there too, as it
// would have from the nearest row.
std::optional<TuneStart> library_row_start(const OpSpec& op, const Sizes& sizes, DType dtype,
                                           const DeviceInfo& device) {
  const LibraryChoice choice = library_choice(op, sizes, dtype, device);
  // weighed holds the rows nearest first, and is filled only where busy: lines chose the row.
  if (!choice.predicted_us || choice.weighed.front().tuned_shape == choice.tuned_shape)
    return std::nullopt;
  return TuneStart{choice.file.filename().string(), choice.params,
                   fmt::format("row {} of this device's table, which the library runs here "
                               "(predicted {:.1f} us by its file's busy: lines)",
                               choice.tuned_shape, *choice.predicted_us)};
}

// Progress across a tune of several ops and sizes: how far, and about how long is left at the
// pace of the sizes done so far.
class SweepProgress {
 public:
  explicit SweepProgress(size_t total) : total_(total), start_(std::chrono::steady_clock::now()) {}

  std::string begin(const std::string& what) const {
    return fmt::format("[{}/{}] {}{}", done_ + 1, total_, what, eta());
  }
  void finish_one() { ++done_; }

 private:
  std::string eta() const {
    if (done_ == 0 || total_ <= 1) return "";
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double left = elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_);
    return fmt::format("  ({:.1f} min so far, about {:.1f} min left)", elapsed / 60, left / 60);
  }

  size_t total_;
  size_t done_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

int cmd_tune(const TuneFlags& given, const DeviceFlags& device,
             const std::vector<std::string>& argv) {
  const TuneFlags flags = resolve_task(given);
  const bool all_sizes = flags.sizes == "all";
  ResultsDb db(flags.db.empty() ? default_results_db() : fs::path(flags.db));

  // The target: one kernel file, or ops whose library files are each tuned together.
  std::optional<KernelFile> single;
  if (fs::is_regular_file(flags.target)) single = KernelFile::load(flags.target);
  const std::vector<const OpSpec*> ops =
      single ? std::vector<const OpSpec*>{&KernelSession::op_of(*single)}
             : (flags.target == "all" ? all_ops() : ops_named(flags.target));
  if (ops.empty()) {
    throw UsageError(fmt::format(
        "'{}' is neither a kernel file, an op, ops joined by commas nor 'all' (known ops: {})",
        flags.target, op_names()));
  }
  if (ops.size() > 1) {
    for (const auto& [set, what] :
         std::vector<std::pair<bool, const char*>>{{!flags.shape.empty(), "--shape"},
                                                   {!flags.also.empty(), "--also"},
                                                   {!flags.table_path.empty(), "--table"},
                                                   {flags.update_table, "--update-table"},
                                                   {flags.replay, "--replay"},
                                                   {!flags.fixed.empty(), "--fix"}}) {
      if (set)
        throw UsageError(
            fmt::format("{} applies to one op; '{}' names several", what, flags.target));
    }
  }
  if (!flags.check_dtypes.empty() && !all_sizes && !flags.update_table)
    throw UsageError("--check-dtypes checks the table that --sizes all or --update-table writes");
  if (!flags.adopt.empty() && flags.strategy != "local" && flags.strategy != "given")
    throw UsageError("--adopt evaluates the adopted rows only: it takes no --strategy");
  const DType dtype = parse_dtypes({flags.dtype}).front();
  if (!flags.devices.empty() && device.device != 0)
    throw UsageError("--devices names every device to use; it does not combine with --device");

  TuneOptions options;
  options.strategy = flags.adopt.empty() ? flags.strategy : "given";
  options.seed = flags.seed;
  parse_budget(flags.budget, options);
  options.max_seconds = flags.max_seconds;
  options.lookahead = flags.lookahead;
  options.compile_jobs = flags.jobs;
  options.arch = flags.arch;
  options.final_check = !flags.no_final_check;
  options.use_database = !flags.fresh;

  std::unique_ptr<Compiler> compiler;
  std::unique_ptr<DevicePool> devices;
  std::optional<Ceilings> ceilings;
  std::string replay_device;
  // The backend: the kernel file's, the recorded device's for a replay, or the flags'.
  std::string backend = single ? std::string(backend_name(single->backend)) : "";
  if (flags.replay) {
    const Sizes first_sizes = all_sizes
                                  ? ops.front()->bench_sizes().front().sizes
                                  : (flags.shape.empty() ? ops.front()->default_size()
                                                         : ops.front()->parse_shape(flags.shape));
    const TuneProblem first{ops.front(), first_sizes, dtype};
    replay_device = flags.replay_device;
    if (replay_device.empty()) {
      const auto recorded = db.devices_for(first.key());
      if (recorded.empty()) {
        throw UsageError(
            fmt::format("nothing recorded for {} in {}", first.key(), db.path().string()));
      }
      replay_device = recorded.front();
    }
    if (backend.empty()) backend = replay_device.rfind("cpu:", 0) == 0 ? "cpu" : "cuda";
  } else {
    backend = pick_backend(device, single ? &*single : nullptr);
    compiler = std::make_unique<Compiler>();
    const std::vector<int> indices = flags.devices.empty()
                                         ? std::vector<int>{device.device}
                                         : parse_device_list(flags.devices, backend);
    devices = std::make_unique<DevicePool>(backend, indices, *compiler);
    progress_line(fmt::format("kforge tune {} on {}{}", flags.target,
                              device_line(devices->device()),
                              indices.size() > 1 ? fmt::format(" x {}", indices.size()) : ""));
    ceilings =
        device_ceilings(*devices->first_live().worker, default_cache_dir(), false, progress_line);
    options.ceilings = &*ceilings;
  }

  // Each op's files and problems; "all" skips ops without library files for this backend.
  struct OpTune {
    const OpSpec* op;
    std::vector<KernelFile> files;
    std::vector<Sizes> problems;
  };
  std::vector<OpTune> tunes;
  size_t total_problems = 0;
  for (const OpSpec* op : ops) {
    OpTune t{op, {}, {}};
    if (single) {
      t.files.push_back(std::move(*single));
    } else if (flags.target == "all") {
      try {
        t.files = library_files(std::string(op->name()), backend);
      } catch (const UsageError&) {
        continue;
      }
    } else {
      t.files = library_files(std::string(op->name()), backend);
    }
    for (const auto& path : flags.also) {
      KernelFile extra = KernelFile::load(path);
      if (extra.op != op->name() || backend_name(extra.backend) != backend) {
        throw UsageError(fmt::format("--also {}: a {} kernel file for {}, not a {} one for {}",
                                     path, backend_name(extra.backend), extra.op, backend,
                                     op->name()));
      }
      t.files.push_back(std::move(extra));
    }
    fix_params(t.files, parse_params(flags.fixed));
    if (all_sizes) {
      for (const auto& s : op->bench_sizes())
        t.problems.push_back(s.sizes);
    } else {
      t.problems.push_back(flags.shape.empty() ? op->default_size() : op->parse_shape(flags.shape));
    }
    total_problems += t.problems.size();
    tunes.push_back(std::move(t));
  }

  Tuner tuner(db, compiler.get(), devices.get());
  nlohmann::json reports = nlohmann::json::array();
  bool all_found = true;
  int failed_checks = 0;
  SweepProgress sweep(total_problems);
  for (OpTune& t : tunes) {
    const OpSpec& op = *t.op;
    std::vector<const KernelFile*> file_ptrs;
    for (const auto& f : t.files)
      file_ptrs.push_back(&f);
    nlohmann::json table = nlohmann::json::array();
    const std::vector<StartTable> tables =
        start_tables(flags, op, dtype, devices ? &devices->device() : nullptr);
    const std::string adopted_device =
        flags.adopt.empty() ? std::string() : tables.front().table.value("device", "?");
    for (const Sizes& sizes : t.problems) {
      const TuneProblem problem{&op, sizes, dtype};
      TuneOptions problem_options = options;
      problem_options.starts = given_starts(flags.starts, t.files);
      for (TuneStart& s : starts_at(tables, sizes, flags.all_rows))
        problem_options.starts.push_back(std::move(s));
      if (flags.adopt.empty() && !flags.no_starts && devices) {
        if (auto s = library_row_start(op, sizes, dtype, devices->device()))
          add_new_start(problem_options.starts, std::move(*s));
      }
      progress_line(sweep.begin(fmt::format(
          "tuning {} over {} file(s), strategy {}{}", problem.key(), t.files.size(),
          problem_options.strategy,
          problem_options.starts.empty()
              ? std::string()
              : fmt::format(", {} start(s) given or from tables", problem_options.starts.size()))));
      TuneReport report;
      {
        ProgressBar bar;
        const auto on_progress = [&](const TuneProgress& p) { bar.update(p); };
        report = flags.replay
                     ? tuner.replay(file_ptrs, problem, replay_device, problem_options, on_progress)
                     : tuner.tune(file_ptrs, problem, problem_options, on_progress,
                                  [&](const std::string& s) {
                                    bar.finish();
                                    progress_line(s);
                                  });
      }
      sweep.finish_one();
      print_report(report, t.files, op, ceilings, flags.top);
      for (const auto& used : report.starts_used)
        fmt::print("start      {}\n", used);
      for (const auto& skipped : report.starts_skipped)
        fmt::print("start      skipped: {}\n", skipped);
      nlohmann::json j = report.to_json(flags.top);
      j["files"] = nlohmann::json::array();
      for (const auto& f : t.files)
        j["files"].push_back(f.path.string());
      if (devices) j["device_info"] = devices->device();
      if (ceilings) j["ceilings"] = ceilings->raw.at("ceilings");
      j["run"] = run_metadata(argv);
      reports.push_back(j);
      if (report.best) {
        const auto& b = report.evaluations[*report.best].record;
        const KernelFile* f = file_of(t.files, b.file);
        table.push_back({{"shape", op.format_shape(sizes)},
                         {"sizes", sizes},
                         {"file", f->path.filename().string()},
                         {"params", tunables_of(*f, b.params)},
                         {"variant_key", b.variant_key},
                         {"time_us", b.stats.median * 1e3},
                         // Rows timed under older rules say so (docs/integrity.md): a row
                         // without this field predates integrity-2's flush.
                         {"timing_method", b.method},
                         {"final_check", report.final_check},
                         {"tune_seconds", report.wall_seconds},
                         {"evaluations", report.evaluations.size()},
                         {"git_sha", git_state().sha},
                         {"recorded_at", utc_timestamp()}});
        if (!flags.adopt.empty()) table.back()["adopted_from"] = adopted_device;
      } else {
        all_found = false;
        table.push_back({{"shape", op.format_shape(sizes)}, {"sizes", sizes}, {"file", nullptr}});
      }
    }

    if (all_sizes || flags.update_table) {
      const std::string device_name = flags.replay ? replay_device : device_key(devices->device());
      const fs::path path = flags.table_path.empty()
                                ? tuned_table_path(std::string(op.name()), dtype, device_name)
                                : fs::path(flags.table_path);
      table = write_tuned_table(path, op, dtype, device_name, options.strategy, table, !all_sizes);
      fmt::print("\n{:<22} {:>10}  {}\n", "size", "median us", "variant");
      for (const auto& row : table) {
        if (row.at("file").is_null()) {
          fmt::print("{:<22} {:>10}  none passed\n", row.at("shape").get<std::string>(), "-");
          continue;
        }
        fmt::print("{:<22} {:>10.2f}  {} {}\n", row.at("shape").get<std::string>(),
                   row.at("time_us").get<double>(), row.at("file").get<std::string>(),
                   row.at("params").dump());
      }
      fmt::print("size -> variant table written to {}\n", path.string());
      if (!flags.check_dtypes.empty() && !flags.replay) {
        TableCheckOptions check;
        check.arch = flags.arch;
        failed_checks +=
            check_table_variants(path, parse_dtypes(flags.check_dtypes), device, check);
      }
    }
  }
  write_json(reports.size() == 1 ? reports.front() : reports, flags.json_path);
  return all_found && failed_checks == 0 ? 0 : 1;
}

}  // namespace kforge
