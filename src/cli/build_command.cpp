#include "cli/build_command.h"

#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/run_info.h"
#include "tune/library.h"

namespace kforge {
namespace {

struct BuildJob {
  const OpSpec* op = nullptr;
  Sizes sizes;
  LibraryChoice choice;
  CompileResult result;
  Verdict verdict = Verdict::ok;
};

// The op's default size (the size its performance targets are stated at), completed.
Sizes completed_default_size(const OpSpec& op) {
  Sizes sizes = op.default_size();
  op.complete_sizes(sizes);
  return sizes;
}

nlohmann::json tensor_json(const OpSpec& op, const TensorSpec& t, const Sizes& sizes, DType dtype) {
  return {{"name", t.name},
          {"dtype", dtype_name(op.dtype_of(t, dtype))},
          {"shape", op.shape_of(t, sizes)}};
}

// What a caller needs to run the module through its C entry point (include/kforge/kernel.h).
nlohmann::json describe_job(const BuildJob& job, DType dtype) {
  const OpSpec& op = *job.op;
  nlohmann::json j = {{"op", op.name()},
                      {"shape", op.format_shape(job.sizes)},
                      {"sizes", job.sizes},
                      {"default_size", job.sizes == completed_default_size(op)},
                      {"dtype", dtype_name(dtype)},
                      {"library", job.choice.to_json()},
                      {"variant", job.result.variant.params_text()},
                      {"verdict", verdict_name(job.verdict)}};
  if (job.verdict != Verdict::ok) {
    j["log"] = job.result.log;
    return j;
  }
  const Cost cost = op.cost(job.sizes, dtype);
  j["module"] = job.result.module.string();
  j["entry"] = KFORGE_ENTRY_SYMBOL;
  j["abi_version"] = KFORGE_ABI_VERSION;
  j["resources"] = job.result.resources.summary();
  const Tolerance tol = op.tolerance(dtype);
  j["tolerance"] = {{"atol", tol.atol},
                    {"rtol", tol.rtol},
                    {"relative_to_magnitude", op.tolerance_relative_to_magnitude()}};
  j["bytes"] = cost.bytes;
  j["flops"] = cost.flops;
  j["inputs"] = nlohmann::json::array();
  for (const auto& t : op.inputs())
    j["inputs"].push_back(tensor_json(op, t, job.sizes, dtype));
  j["outputs"] = nlohmann::json::array();
  for (const auto& t : op.outputs())
    j["outputs"].push_back(tensor_json(op, t, job.sizes, dtype));
  j["scalars"] = nlohmann::json::array();
  const std::vector<double> values = op.scalar_values(job.sizes);
  const std::vector<ScalarSpec> names = op.scalars();
  for (size_t i = 0; i < values.size(); ++i) {
    j["scalars"].push_back(
        {{"name", i < names.size() ? names[i].name : fmt::format("s{}", i)}, {"value", values[i]}});
  }
  return j;
}

}  // namespace

CLI::App* add_build_command(CLI::App& app, BuildFlags& flags, DeviceFlags& device) {
  auto* build = app.add_subcommand(
      "build", "Compile the library's kernel for problems and describe how to call it");
  build->add_option("ops", flags.ops, "Ops (see `kforge ops`)")->required();
  auto* shape = build->add_option("--shape", flags.shape, "Problem sizes, e.g. 8192x8192");
  build->add_option("--sizes", flags.sizes, "'all': every size of each op's benchmark sweep")
      ->check(CLI::IsMember({"all"}))
      ->excludes(shape);
  build->add_option("--dtype", flags.dtype, "f16, bf16 or f32")->capture_default_str();
  build->add_option("--arch", flags.arch, "GPU architecture, e.g. sm_90a");
  build->add_option("--json", flags.json_path, "Write the modules as JSON to FILE ('-': stdout)");
  add_device_flags(build, device);
  return build;
}

int cmd_build(const BuildFlags& flags, const DeviceFlags& device,
              const std::vector<std::string>& argv) {
  const DType dtype = parse_dtypes({flags.dtype}).front();
  if (!flags.shape.empty() && flags.ops.size() != 1) {
    throw UsageError("--shape needs exactly one op; use --sizes all for several");
  }
  std::vector<BuildJob> jobs;
  for (const auto& name : flags.ops) {
    const OpSpec* op = find_op(name);
    if (!op) throw UsageError(fmt::format("unknown op '{}' (known: {})", name, op_names()));
    if (!op->supports(dtype)) {
      throw UsageError(fmt::format("{} does not support {}", name, dtype_name(dtype)));
    }
    std::vector<Sizes> problems;
    if (flags.sizes == "all") {
      for (const auto& c : op->bench_sizes())
        problems.push_back(c.sizes);
    } else {
      problems.push_back(flags.shape.empty() ? op->default_size() : op->parse_shape(flags.shape));
    }
    for (auto& sizes : problems) {
      op->complete_sizes(sizes);
      jobs.push_back({op, sizes, {}, {}, Verdict::ok});
    }
  }

  WorkerClient worker({pick_backend(device, nullptr), device.device});
  Compiler compiler;
  Checker checker(compiler, worker);
  // A device without a table is said once per op, with what to do about it; every module of it
  // carries `untuned_device`, so no caller takes its time for the library's.
  nlohmann::json offers = nlohmann::json::object();
  for (auto& job : jobs) {
    job.choice = library_choice(*job.op, job.sizes, dtype, worker.device());
    const std::string name(job.op->name());
    if (job.choice.untuned_device() && !offers.contains(name)) {
      offers[name] = untuned_offer(*job.op, dtype, worker.device(), job.choice);
      progress_line(offers[name].get<std::string>());
    }
  }

  const std::string arch = flags.arch.empty() ? worker.device().default_arch() : flags.arch;
  std::map<std::filesystem::path, KernelFile> files;  // each file parsed once
  // Every distinct variant is compiled first, all at once; the builds below, one per job, then
  // come from the module cache.
  std::vector<Checker::BuildRequest> requests;
  for (const BuildJob& job : jobs) {
    auto loaded = files.find(job.choice.file);
    if (loaded == files.end())
      loaded = files.emplace(job.choice.file, KernelFile::load(job.choice.file)).first;
    const KernelFile& file = loaded->second;
    requests.push_back({&file, file.resolve_params(dtype, job.choice.params), dtype, &job.sizes});
  }
  if (requests.size() >= 2) {
    progress_line(fmt::format("compiling the {} problems' variants at once", requests.size()));
    checker.prebuild(requests, arch);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    BuildJob& job = jobs[i];
    job.result =
        checker.build(*requests[i].file, requests[i].params, dtype, arch, &job.sizes, &job.verdict);
    progress_line(
        fmt::format("[{}/{}] {} {} {}: {}{}", i + 1, jobs.size(), job.op->name(),
                    job.op->format_shape(job.sizes), dtype_name(dtype),
                    job.verdict == Verdict::ok ? job.choice.describe() : verdict_name(job.verdict),
                    job.result.from_cache ? " (cached)" : ""));
  }

  nlohmann::json modules = nlohmann::json::array();
  bool all_ok = true;
  const bool json_on_stdout = flags.json_path == "-";
  std::FILE* table = json_on_stdout ? stderr : stdout;
  fmt::print(table, "{:<22} {:<18} {:<26} {}\n", "op", "size", "file", "variant (library choice)");
  for (const auto& job : jobs) {
    all_ok = all_ok && job.verdict == Verdict::ok;
    modules.push_back(describe_job(job, dtype));
    fmt::print(table, "{:<22} {:<18} {:<26} {} ({})\n", job.op->name(),
               job.op->format_shape(job.sizes), job.choice.file.filename().string(),
               job.result.variant.params_text(),
               job.verdict == Verdict::ok
                   ? job.choice.describe()
                   : fmt::format("{}: {}", verdict_name(job.verdict), job.result.log));
  }
  nlohmann::json j = {{"device", worker.device()},
                      {"run", run_metadata(argv)},
                      {"modules", modules},
                      {"untuned_offers", offers}};
  write_json(j, flags.json_path);
  return all_ok ? 0 : 1;
}

}  // namespace kforge
