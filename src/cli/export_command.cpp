#include "cli/export_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/run_info.h"
#include "core/temp_directory.h"
#include "device/ceilings.h"
#include "export/export_target.h"
#include "loop/workspace.h"
#include "ops/op_spec.h"
#include "run/worker_client.h"
#include "tune/library.h"
#include "tune/results_db.h"

namespace kforge {
namespace fs = std::filesystem;

CLI::App* add_export_command(CLI::App& app, ExportFlags& flags, DeviceFlags& device) {
  auto* cmd = app.add_subcommand(
      "export", "Write the library's tuned kernels for a device out of kforge (docs/export.md)");
  cmd->add_option("ops", flags.ops,
                  "Ops (see `kforge ops`), or 'all': every op with a tuned table for the device");
  std::vector<std::string> names;
  for (const ExportTarget* t : export_targets())
    names.push_back(std::string(t->name()));
  cmd->add_option("--target", flags.target, "Export target")
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  cmd->add_option("--dtype", flags.dtypes, "f16, bf16 or f32 (repeatable; default: bf16)");
  cmd->add_option("--plan", flags.plan_path,
                  "A plan (`kforge plan PROFILE --json FILE`): export its ops at the shapes the "
                  "model runs, besides the tables' sizes");
  cmd->add_option("--shape", flags.shapes, "OP:SHAPE, e.g. rmsnorm:4096x4096 (repeatable)");
  cmd->add_flag("--no-table-sizes", flags.no_table_sizes,
                "Only the sizes of --plan and --shape, not every size of the tuned tables");
  cmd->add_option("--workspace", flags.workspace,
                  "A `kforge loop` workspace: each task with a kept experiment exports its best "
                  "kernel file at the task's size, unless the library's variant tuned at that "
                  "size was faster");
  cmd->add_option("--ceilings", flags.ceilings_path,
                  "The device to export for, from `kforge ceilings --json FILE` on it (default: "
                  "this machine's GPU)");
  cmd->add_option("--arch", flags.arch, "GPU architecture, e.g. sm_90a (default: the device's)");
  cmd->add_option("--out", flags.out, "Directory to write (must not exist, or be empty)")
      ->required();
  add_device_flags(cmd, device);
  return cmd;
}

namespace {

// The device an export is for: the ceilings file's, else this machine's GPU.
DeviceInfo export_device(const ExportFlags& flags, const DeviceFlags& device) {
  if (!flags.ceilings_path.empty()) {
    const Ceilings c = read_ceilings_file(flags.ceilings_path);
    if (!c.raw.contains("device") || !c.raw.at("device").is_object()) {
      throw UsageError(fmt::format("{} names no device", flags.ceilings_path));
    }
    return c.raw.at("device").get<DeviceInfo>();
  }
  WorkerClient worker({"cuda", device.device});
  return worker.device();
}

std::vector<const OpSpec*> requested_ops(const ExportFlags& flags, const DeviceInfo& device,
                                         const std::vector<DType>& dtypes) {
  std::vector<const OpSpec*> ops;
  for (const std::string& item : flags.ops) {
    if (item == "all") {
      for (const OpSpec* op : all_ops()) {
        const bool tuned = std::any_of(dtypes.begin(), dtypes.end(), [&](DType d) {
          return find_tuned_table(std::string(op->name()), d, device_key(device)).has_value();
        });
        if (tuned && std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
      }
      continue;
    }
    const std::vector<const OpSpec*> named = ops_named(item);
    if (named.empty())
      throw UsageError(fmt::format("unknown op in '{}' (known: {})", item, op_names()));
    for (const OpSpec* op : named) {
      if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
    }
  }
  return ops;
}

// A folder of copies of loop tasks' best files, named after their tasks (two tasks of one op
// may both have changed the same starter) beside their op's library headers; removed at exit.
class LoopKernelStage {
 public:
  fs::path add(const TaskBest& best) {
    const std::string op(best.task.op->name());
    const fs::path folder = dir_.path() / op;
    if (!fs::exists(folder)) {
      fs::create_directories(folder);
      for (const auto& entry : fs::directory_iterator(library_kernels_dir() / op)) {
        const std::string ext = entry.path().extension().string();
        if (ext == ".cuh" || ext == ".h")
          fs::copy_file(entry.path(), folder / entry.path().filename());
      }
    }
    const fs::path copy =
        folder / fmt::format("loop_{}_{}", best.name, best.kernel.filename().string());
    fs::copy_file(best.kernel, copy, fs::copy_options::overwrite_existing);
    return copy;
  }

 private:
  TempDirectory dir_{"kforge-loop-export"};
};

// The loop's bests worth exporting: tasks with a kept experiment in a CUDA kernel file, faster
// than the library's variant tuned at the same size when there is one. Says what it chose.
void add_loop_overrides(const std::string& workspace, const DeviceInfo& device,
                        LoopKernelStage& stage, ExportRequest& request) {
  for (const TaskBest& best : workspace_bests(workspace)) {
    const std::string shape = best.task.op->format_shape(best.task.sizes);
    const auto skip = [&](const std::string& why) {
      progress_line(
          fmt::format("--workspace: {} ({} {}): {}", best.name, best.task.op->name(), shape, why));
    };
    if (best.kept == 0 || best.kernel.empty()) {
      skip("nothing kept; the library's variant runs there");
      continue;
    }
    if (best.kernel.extension() != ".cu") {
      skip("its kernel file is not CUDA (a CPU-backend workspace)");
      continue;
    }
    if (!dispatchable(*best.task.op)) {
      skip("the op cannot be dispatched on its tensors' shapes");
      continue;
    }
    const LibraryChoice library =
        library_choice(*best.task.op, best.task.sizes, best.task.dtype, device);
    if (library.source == LibraryChoice::Source::exact_size && library.tuned_median_us &&
        *library.tuned_median_us <= best.best_us) {
      skip(
          fmt::format("the library's variant tuned there ({:.2f} us) is as fast as the loop's "
                      "best ({:.2f} us)",
                      *library.tuned_median_us, best.best_us));
      continue;
    }
    ExportOverride o;
    o.op = best.task.op;
    o.dtype = best.task.dtype;
    o.sizes = best.task.sizes;
    o.file = stage.add(best);
    o.reason =
        fmt::format("loop {}: {:.2f} us, {:.2f}x its start", best.name, best.best_us, best.speedup);
    progress_line(fmt::format("--workspace: {} ({} {}): its best ({})", best.name,
                              best.task.op->name(), shape, o.reason));
    if (std::find(request.ops.begin(), request.ops.end(), o.op) == request.ops.end())
      request.ops.push_back(o.op);
    if (std::find(request.dtypes.begin(), request.dtypes.end(), o.dtype) == request.dtypes.end())
      request.dtypes.push_back(o.dtype);
    request.overrides.push_back(std::move(o));
  }
}

}  // namespace

int cmd_export(const ExportFlags& flags, const DeviceFlags& device,
               const std::vector<std::string>& argv) {
  const ExportTarget* target = find_export_target(flags.target);
  if (!target) throw UsageError(fmt::format("no export target '{}'", flags.target));
  if (fs::exists(flags.out) && !fs::is_empty(flags.out)) {
    throw UsageError(
        fmt::format("--out {}: exists and is not empty (an export never writes over "
                    "files it did not write)",
                    flags.out));
  }
  const DeviceInfo info = export_device(flags, device);

  ExportRequest request;
  request.arch = flags.arch;
  request.table_sizes = !flags.no_table_sizes;
  request.dtypes = parse_dtypes(flags.dtypes);
  nlohmann::json plan_json;
  if (!flags.plan_path.empty()) plan_json = read_json_file(flags.plan_path);
  std::vector<DType> plan_dtypes;
  if (!flags.plan_path.empty() && flags.ops.empty()) {
    // The plan's ops that an export can dispatch, in the plan's order.
    std::vector<const OpSpec*> dispatchable;
    for (const OpSpec* op : all_ops()) {
      if (kforge::dispatchable(*op)) dispatchable.push_back(op);
    }
    auto sizes = plan_sizes(plan_json, dispatchable, &plan_dtypes);
    for (const auto& [op, s] : sizes) {
      if (std::find(request.ops.begin(), request.ops.end(), op) == request.ops.end())
        request.ops.push_back(op);
    }
    request.extra_sizes = std::move(sizes);
  } else {
    if (flags.ops.empty() && flags.workspace.empty())
      throw UsageError("name the ops to export, or pass --plan or --workspace");
    if (request.dtypes.empty()) request.dtypes = {DType::bf16};
    request.ops = requested_ops(flags, info, request.dtypes);
    if (!flags.plan_path.empty())
      request.extra_sizes = plan_sizes(plan_json, request.ops, &plan_dtypes);
  }
  if (request.dtypes.empty())
    request.dtypes = plan_dtypes.empty() ? std::vector{DType::bf16} : plan_dtypes;
  for (const std::string& item : flags.shapes) {
    const size_t colon = item.find(':');
    const OpSpec* op = colon == std::string::npos ? nullptr : find_op(item.substr(0, colon));
    if (!op)
      throw UsageError(fmt::format("--shape {}: expected OP:SHAPE, e.g. rmsnorm:4096x4096", item));
    if (std::find(request.ops.begin(), request.ops.end(), op) == request.ops.end())
      request.ops.push_back(op);
    request.extra_sizes.emplace_back(op, op->parse_shape(item.substr(colon + 1)));
  }
  LoopKernelStage stage;
  if (!flags.workspace.empty()) add_loop_overrides(flags.workspace, info, stage, request);
  // Ops that `all`, a plan or a workspace brought but the target cannot carry (the torch
  // target's attention), or whose calls cannot be dispatched (a size no input has), are left to
  // the model's own op, and said; an op named on the command line must be carried.
  std::erase_if(request.ops, [&](const OpSpec* op) {
    const bool named = std::any_of(flags.ops.begin(), flags.ops.end(), [&](const std::string& s) {
      const auto ops = ops_named(s);
      return std::find(ops.begin(), ops.end(), op) != ops.end();
    });
    if (!target->serves(*op)) {
      if (named)
        throw UsageError(fmt::format("the {} target has no op {} yet", target->name(), op->name()));
      progress_line(
          fmt::format("{}: not exported (the {} target has no such op yet; the model's "
                      "own op runs there)",
                      op->name(), target->name()));
      return true;
    }
    if (!named && !dispatchable(*op)) {
      progress_line(fmt::format(
          "{}: not exported (a call's tensors do not say which variant to run; the model's "
          "own op runs there)",
          op->name()));
      return true;
    }
    return false;
  });
  if (request.ops.empty()) throw UsageError("nothing to export: no op named or found in the plan");

  const ExportPlan plan = make_export_plan(request, info);
  for (const ExportOp& op : plan.ops) {
    if (op.untuned_device) {
      progress_line(untuned_offer(*op.op, op.dtype, info,
                                  library_choice(*op.op, op.rows.front().sizes, op.dtype, info)));
    }
  }
  ExportContext context;
  context.run = run_metadata(argv);
  context.include_dir = default_include_dir();
  if (const fs::path cutlass = default_cutlass_include_dir(); !cutlass.empty())
    context.cutlass_include_dir = fs::absolute(cutlass);
  const auto written = target->write(plan, context, flags.out);

  fmt::print("{:<22} {:<6} {:<20} {:<28} {}\n", "op", "dtype", "size", "variant", "choice");
  for (const ExportOp& op : plan.ops) {
    for (const ExportRow& r : op.rows) {
      const ExportVariant& v = op.variants[r.variant];
      fmt::print("{:<22} {:<6} {:<20} {:<28} {}{}\n", op.op->name(), dtype_name(op.dtype),
                 op.op->format_shape(r.sizes), v.symbol, r.choice,
                 r.source == "table" ? "" : fmt::format(" [{}]", r.source));
    }
  }
  // Sizes that run another size's row: each is one tune from a row of its own.
  for (const ExportOp& op : plan.ops) {
    std::vector<std::string> shapes;
    for (const ExportRow& r : op.rows) {
      if (!r.untuned_shape.empty()) shapes.push_back(r.untuned_shape);
    }
    if (shapes.empty()) continue;
    fmt::print(
        "{} {} at {} size(s) runs other sizes' table rows; a row of its own (the table's "
        "variants timed there; without --strategy and --all-rows, a search), then export again:\n",
        op.op->name(), dtype_name(op.dtype), shapes.size());
    for (const std::string& shape : shapes) {
      fmt::print(
          "  kforge tune {} --shape {} --dtype {} --strategy given --all-rows --update-table\n",
          op.op->name(), shape, dtype_name(op.dtype));
    }
  }
  fmt::print("{} export for {}: {} files in {}\n", target->name(), plan.device_key, written.size(),
             flags.out);
  return 0;
}

namespace {

void add_torch_export_option(CLI::App* cmd, std::string& export_dir) {
  cmd->add_option("--export", export_dir, "A `kforge export --target torch` directory")->required();
}

}  // namespace

CLI::App* add_verify_command(CLI::App& app, VerifyFlags& flags) {
  auto* cmd = app.add_subcommand(
      "verify",
      "Run a model as built, patched with an export's kforge ops, and both torch.compile'd: "
      "outputs compared, step times measured (docs/export.md)");
  add_torch_export_option(cmd, flags.export_dir);
  cmd->add_option("args", flags.args,
                  "kforge_ops.verify's arguments after --: --model hf:llama|hf:qwen2|"
                  "example:llama, --plan PLAN.json, --json OUT, --layers, --batch, --seq, --iters");
  return cmd;
}

namespace {

// The `kforge export --target torch` directory named by --export, made absolute.
fs::path torch_export_dir(const std::string& flag) {
  const fs::path dir = fs::absolute(flag);
  if (!fs::exists(dir / "kforge_ops" / "manifest.json")) {
    throw UsageError(
        fmt::format("--export {}: not a `kforge export --target torch` directory", flag));
  }
  return dir;
}

// Replaces this process with `command`, run with `python_path` before PYTHONPATH and the
// variables `env` ("NAME=VALUE") set.
[[noreturn]] void exec_with_python_path(const std::vector<fs::path>& python_path,
                                        std::vector<std::string> env,
                                        const std::vector<std::string>& command) {
  std::string path;
  for (const fs::path& p : python_path)
    path += (path.empty() ? "" : ":") + p.string();
  if (const char* existing = std::getenv("PYTHONPATH"); existing && *existing)
    path += ":" + std::string(existing);
  std::vector<std::string> full = {"env", "PYTHONPATH=" + path};
  full.insert(full.end(), env.begin(), env.end());
  full.insert(full.end(), command.begin(), command.end());
  std::vector<char*> argv;
  for (auto& a : full)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  throw Error(fmt::format("cannot run {}: {}", command.front(), std::strerror(errno)));
}

}  // namespace

int cmd_verify(const VerifyFlags& flags) {
  // The package from the export directory; the example models from this source tree.
  const fs::path dir = torch_export_dir(flags.export_dir);
  const fs::path examples = default_include_dir().parent_path() / "python" / "examples";
  std::vector<std::string> command = {"python3", "-m", "kforge_ops.verify"};
  command.insert(command.end(), flags.args.begin(), flags.args.end());
  exec_with_python_path({dir}, {"KFORGE_EXAMPLES_DIR=" + examples.string()}, command);
}

CLI::App* add_patch_command(CLI::App& app, PatchFlags& flags) {
  auto* cmd = app.add_subcommand(
      "patch",
      "Run a Python program with its models patched with an export's kforge ops, its source "
      "unchanged: what was swapped, where, and the calls per op are printed (docs/export.md)");
  add_torch_export_option(cmd, flags.export_dir);
  cmd->add_option("--ops", flags.ops,
                  "Swap only these ops (comma-separated), e.g. those `kforge verify` found "
                  "faster in a compiled model");
  cmd->add_option("command", flags.command, "The program and its arguments, after --")->required();
  return cmd;
}

int cmd_patch(const PatchFlags& flags) {
  const fs::path dir = torch_export_dir(flags.export_dir);
  const fs::path autopatch = dir / "kforge_ops" / "_autopatch";
  if (!fs::exists(autopatch / "sitecustomize.py")) {
    throw UsageError(fmt::format("--export {}: written by an older kforge (no {}); export again",
                                 flags.export_dir, autopatch.string()));
  }
  std::vector<std::string> env;
  if (!flags.ops.empty()) env.push_back("KFORGE_PATCH_OPS=" + flags.ops);
  exec_with_python_path({autopatch, dir}, env, flags.command);
}

}  // namespace kforge
