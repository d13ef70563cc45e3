#include "check/checker.h"

#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "check/sanitizer.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/random.h"
#include "device/cublas_ops.h"
#include "device/launch_limits.h"

namespace kforge {
namespace {

// Why a case was skipped when this backend has no reference for its size.
constexpr const char* kNoReferenceHere =
    "no reference at this size on this backend (needs the GPU reference)";
const std::vector<std::string> kStageNames = {"smoke", "shape_sweep", "stability", "determinism",
                                              "edge_cases"};

// Of what a kernel prints, a check report keeps about this much (the start).
constexpr size_t kKeptOutputBytes = 8192;

// Stability inputs are extreme by design; the reference is exact, the kernel rounds in its
// dtype, so those cases get ten times the usual tolerance.
constexpr double kStabilityToleranceScale = 10.0;

std::string describe_case(const OpSpec& op, const std::string& label, const Sizes& sizes,
                          DType dtype, InputKind kind) {
  std::string s = fmt::format("{} {} {}", label, op.format_shape(sizes), dtype_name(dtype));
  if (kind != InputKind::normal) s += fmt::format(" {}", input_kind_name(kind));
  return s;
}

}  // namespace

uint64_t fresh_seed() {
  std::random_device rd;
  const auto now =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return ((uint64_t{rd()} << 32) ^ rd() ^ now) & 0x7fffffffffffffffull;
}

uint64_t derive_seed(uint64_t base, std::string_view purpose, uint64_t index) {
  const std::string h =
      Hasher().add(std::to_string(base)).add(purpose).add(std::to_string(index)).hex();
  return std::stoull(h.substr(0, 15), nullptr, 16);
}

std::chrono::milliseconds default_timeout(const OpSpec& op, const Sizes& sizes, DType dtype) {
  // Generous: 20 s plus 1 s per 50 MB the problem moves (a slow CPU kernel at 50 MB/s).
  const double bytes = op.cost(sizes, dtype).bytes;
  return std::chrono::milliseconds(20000 + static_cast<long long>(bytes / 50e3));
}

std::pair<Variant, std::string> Checker::resolve(const KernelFile& file, const ParamValues& params,
                                                 DType dtype, const std::string& arch,
                                                 const Sizes* sizes) {
  Bindings bindings = problem_bindings(worker_.device(), dtype, sizes);
  const ParamValues all = file.with_derived(params, bindings);
  for (const auto& [name, value] : all)
    bindings[name] = value;
  return {Variant::make(file, all, dtype, arch), first_violation(file, bindings, worker_.device())};
}

CompileResult Checker::build(const KernelFile& file, const ParamValues& params, DType dtype,
                             const std::string& arch, const Sizes* sizes, Verdict* verdict) {
  auto [variant, why] = resolve(file, params, dtype, arch, sizes);
  if (!why.empty()) {
    *verdict = Verdict::rejected;
    CompileResult r;
    r.variant = std::move(variant);
    r.log = why;
    return r;
  }
  CompileResult r = compiler_.compile(file, variant);
  *verdict = r.ok ? Verdict::ok : Verdict::compile_error;
  return r;
}

std::string Checker::target_arch(const std::string& arch) {
  return arch.empty() ? worker_.device().default_arch() : arch;
}

void Checker::prebuild(const std::vector<BuildRequest>& requests, const std::string& arch) {
  const std::string target = target_arch(arch);
  std::vector<std::pair<const KernelFile*, Variant>> work;
  std::set<std::string> keys;
  for (const BuildRequest& r : requests) {
    auto [variant, why] = resolve(*r.file, r.params, r.dtype, target, r.sizes);
    if (why.empty() && keys.insert(compiler_.cache_key(*r.file, variant)).second)
      work.emplace_back(r.file, std::move(variant));
  }
  compiler_.compile_all(work);  // a failure comes back again from build(), which reports it
}

std::vector<std::vector<double>> gpu_reference(WorkerClient& reference_worker, const OpSpec& op,
                                               const Sizes& sizes, const CaseTensors& tensors) {
  // A region of its own: the inputs as the kernel saw them, and f32 outputs.
  std::vector<TensorRef> refs;
  size_t offset = 0;
  const auto place = [&](const HostTensor& t, bool output) {
    TensorRef r{t.name, output ? DType::f32 : t.dtype, t.shape, offset, 0, output};
    r.bytes = static_cast<size_t>(t.numel()) * dtype_size(r.dtype);
    offset += (r.bytes + 255) / 256 * 256;
    refs.push_back(r);
  };
  for (const auto& t : tensors.inputs())
    place(t, false);
  for (const auto& t : tensors.outputs())
    place(t, true);
  if (op.tolerance_relative_to_magnitude()) {
    for (const auto& t : tensors.outputs())
      place(t, true);  // the magnitudes
  }
  const SharedRegion region = SharedRegion::create(offset);
  for (size_t i = 0; i < tensors.inputs().size(); ++i) {
    std::memcpy(region.data() + refs[i].offset, tensors.inputs()[i].data, refs[i].bytes);
  }
  const nlohmann::json request = {{"op", "reference"},       {"op_name", op.name()},
                                  {"sizes", sizes},          {"scalars", op.scalar_values(sizes)},
                                  {"region", region.name()}, {"region_bytes", region.size()},
                                  {"tensors", refs}};
  const WorkerReply reply = reference_worker.request(request, std::chrono::minutes(5));
  if (!reply.ok())
    throw Error(fmt::format("GPU reference for {} failed: {}", op.name(), reply.detail));
  std::vector<std::vector<double>> out;
  for (size_t i = tensors.inputs().size(); i < refs.size(); ++i) {
    std::vector<double> v(refs[i].bytes / 4);
    widen_to_double(region.data() + refs[i].offset, DType::f32, v);
    out.push_back(std::move(v));
  }
  return out;
}

CompareResult compare_outputs(const OpSpec& op, DType dtype, const CaseTensors& tensors,
                              const std::vector<std::vector<double>>& expected,
                              double tolerance_scale) {
  const size_t outputs = tensors.outputs().size();
  Tolerance tol = op.tolerance(dtype);
  tol.atol *= tolerance_scale;
  tol.rtol *= tolerance_scale;
  CompareResult result;
  for (size_t i = 0; i < outputs; ++i) {
    const std::span<const double> magnitude =
        op.tolerance_relative_to_magnitude() && expected.size() > outputs
            ? std::span<const double>(expected[outputs + i])
            : std::span<const double>();
    CompareResult c = compare_output(tensors.outputs()[i], expected[i], tol, magnitude);
    if (i == 0 || !c.pass) result = std::move(c);
    if (!result.pass) break;
  }
  return result;
}

WorkerClient& Checker::clean_worker() {
  if (!clean_worker_) {
    WorkerOptions options = worker_.options();
    options.log_dir.clear();
    options.launcher.clear();
    clean_worker_ = std::make_unique<WorkerClient>(options);
  }
  return *clean_worker_;
}

bool has_reference(const OpSpec& op, const Sizes& sizes, std::string_view backend) {
  return op.reference_flops(sizes) <= kHostReferenceFlopLimit ||
         (backend == "cuda" && has_gpu_reference(op.name()));
}

bool Checker::has_reference(const OpSpec& checked_op, const Sizes& sizes, InputKind kind) const {
  return kforge::has_reference(checked_op.reference_spec(kind, sizes), sizes,
                               worker_.options().backend);
}

std::vector<std::vector<double>> Checker::reference_outputs(const OpSpec& checked_op,
                                                            const Sizes& sizes,
                                                            const CaseTensors& tensors,
                                                            const std::vector<double>& scalars) {
  if (!has_reference(checked_op, sizes, tensors.kind())) return {};
  const OpSpec& op = checked_op.reference_spec(tensors.kind(), sizes);
  if (op.reference_flops(sizes) > kHostReferenceFlopLimit) {
    return gpu_reference(clean_worker(), op, sizes, tensors);
  }
  std::vector<std::vector<double>> expected;
  for (const auto& t : tensors.outputs())
    expected.emplace_back(static_cast<size_t>(t.numel()));
  if (op.tolerance_relative_to_magnitude()) {
    for (const auto& t : tensors.outputs())
      expected.emplace_back(static_cast<size_t>(t.numel()));
  }
  op.reference(sizes, tensors.inputs_as_double(), scalars, expected);
  return expected;
}

CaseResult Checker::run_case(const OpSpec& op, const CompileResult& build, const std::string& stage,
                             const std::string& label, const Sizes& sizes, InputKind kind,
                             uint64_t seed, double tolerance_scale,
                             std::chrono::milliseconds timeout) {
  CaseTensors tensors(op, sizes, build.variant.dtype);
  tensors.generate_inputs(kind, seed);
  std::vector<std::vector<double>> expected;
  return run_prepared(op, build, tensors, expected,
                      CaseResult{stage, label, sizes, build.variant.dtype, kind, seed},
                      tolerance_scale, timeout);
}

CaseResult Checker::run_prepared(const OpSpec& op, const CompileResult& build, CaseTensors& tensors,
                                 std::vector<std::vector<double>>& expected, CaseResult result,
                                 double tolerance_scale, std::chrono::milliseconds timeout) {
  const DType dtype = build.variant.dtype;
  const Sizes& sizes = result.sizes;
  tensors.poison_outputs();
  const std::vector<double> scalars = op.scalar_values(sizes);

  const WorkerReply reply = worker_.request(tensors.request("run", build.module, scalars), timeout);
  result.output = reply.output;
  if (!reply.ok()) {
    result.verdict = reply.verdict;
    result.detail = reply.detail;
    return result;
  }
  for (const auto& g : reply.body.at("guard_violations")) {
    result.verdict = Verdict::wrong;
    result.detail =
        fmt::format("wrote outside tensor '{}' ({} byte {})", g.at("tensor").get<std::string>(),
                    g.at("where").get<std::string>(), g.at("byte_offset").get<long long>());
    return result;
  }
  if (!reply.body.at("inputs_modified").empty()) {
    result.verdict = Verdict::wrong;
    result.detail =
        fmt::format("modified its input(s) {}", reply.body.at("inputs_modified").dump());
    return result;
  }

  if (expected.empty()) expected = reference_outputs(op, sizes, tensors, scalars);
  if (expected.empty()) {
    result.skipped = true;
    result.detail = kNoReferenceHere;
    return result;
  }
  result.compare = compare_outputs(op, dtype, tensors, expected, tolerance_scale);
  if (!result.compare.pass) {
    result.verdict = Verdict::wrong;
    result.detail = result.compare.summary();
  }
  return result;
}

bool Checker::check_determinism(const OpSpec& op, const CompileResult& build, const SizeCase& size,
                                uint64_t seed, const CheckOptions& options,
                                const std::function<bool(CaseResult)>& record) {
  const DType dtype = build.variant.dtype;
  CaseResult result{"determinism", size.label + " x4", size.sizes, dtype, InputKind::normal, seed};
  CaseTensors tensors(op, size.sizes, dtype);
  if (options.max_elements > 0 &&
      static_cast<int64_t>(tensors.largest_tensor_elements()) > options.max_elements) {
    result.skipped = true;
    return record(std::move(result));
  }
  tensors.generate_inputs(InputKind::normal, seed);
  const std::vector<double> scalars = op.scalar_values(size.sizes);
  const auto timeout =
      options.timeout.count() > 0 ? options.timeout : default_timeout(op, size.sizes, dtype);

  constexpr int kRuns = 4;  // runs 1-3 in one worker, run 4 in a fresh one
  std::vector<std::vector<std::byte>> outputs;
  for (int run = 0; run < kRuns; ++run) {
    if (run == kRuns - 1) worker_.restart();
    tensors.poison_outputs();
    const WorkerReply reply =
        worker_.request(tensors.request("run", build.module, scalars), timeout);
    result.output += reply.output;
    if (!reply.ok()) {
      result.verdict = reply.verdict;
      result.detail = fmt::format("run {}: {}", run + 1, reply.detail);
      return record(std::move(result));
    }
    std::vector<std::byte> bytes;
    for (const auto& t : tensors.outputs())
      bytes.insert(bytes.end(), t.data, t.data + t.bytes());
    outputs.push_back(std::move(bytes));
  }
  const size_t elem = dtype_size(dtype);
  for (int run = 1; run < kRuns; ++run) {
    if (outputs[run] == outputs[0]) continue;
    size_t first = 0;
    while (std::memcmp(outputs[run].data() + first * elem, outputs[0].data() + first * elem,
                       elem) == 0) {
      ++first;
    }
    const HostTensor& t = tensors.outputs().front();
    result.verdict = Verdict::wrong;
    result.detail = fmt::format(
        "not deterministic: run {} ({}) differs from run 1 bitwise, first at element {} "
        "({:.9g} vs {:.9g})",
        run + 1, run == kRuns - 1 ? "a second worker process" : "same process", first,
        load_element(outputs[run].data(), t.dtype, first),
        load_element(outputs[0].data(), t.dtype, first));
    return record(std::move(result));
  }
  if (!record(std::move(result))) return false;

  // The same inputs once more, but for a few scattered elements of the first input and a few
  // entries of each kept input copied from other rows, in the worker that just ran them: a kernel
  // that keeps results from an earlier call and recognizes its inputs by a sample of them (or by
  // their addresses) returns the old outputs here, and so does one that reads its own copy of
  // the kept inputs.
  Rng rng(seed, 0x74726170);
  tensors.apply_trap(rng.next());
  std::vector<std::vector<double>> expected;
  CaseResult changed{
      "determinism",     fmt::format("{} with {} inputs changed", size.label, fresh::kTrapElements),
      size.sizes,        dtype,
      InputKind::normal, seed};
  changed = run_prepared(op, build, tensors, expected, changed, 1.0, timeout);
  if (!changed.compare.pass) {
    changed.detail = fmt::format(
        "after {} elements of input '{}' changed (and as many of each kept input), the outputs "
        "are wrong (results or inputs kept from an earlier call?): {}",
        fresh::kTrapElements, tensors.inputs().front().name, changed.detail);
  }
  return record(std::move(changed));
}

CheckReport Checker::check(const KernelFile& file, const CheckOptions& options,
                           const ProgressFn& progress) {
  const OpSpec* op = find_op(file.op);
  if (!op) {
    throw UsageError(fmt::format("{}: op '{}' is not known (known ops: {})", file.path.string(),
                                 file.op, op_names()));
  }
  const auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  CheckReport report;
  report.file = file.path.string();
  report.op = file.op;
  report.seed = options.seed ? options.seed : fresh_seed();

  std::vector<DType> dtypes = options.dtypes;
  if (dtypes.empty()) {
    for (const DType d : op->dtypes()) {
      if (file.supports(d)) dtypes.push_back(d);
    }
  }
  for (const DType d : dtypes) {
    if (!file.supports(d) || !op->supports(d)) {
      throw UsageError(
          fmt::format("{} does not support dtype {}", file.path.string(), dtype_name(d)));
    }
  }

  // Build every dtype up front, in parallel. The worker is started first: build() reads the
  // device's limits from it, and a WorkerClient is used from one thread at a time.
  worker_.device();
  const std::string arch = target_arch(options.arch);
  std::vector<CompileResult> builds(dtypes.size());
  {
    std::vector<Verdict> verdicts(dtypes.size());
    std::vector<std::jthread> jobs;
    std::vector<std::exception_ptr> errors(dtypes.size());
    for (size_t i = 0; i < dtypes.size(); ++i) {
      jobs.emplace_back([&, i] {
        try {
          builds[i] = build(file, file.resolve_params(dtypes[i], options.params), dtypes[i], arch,
                            nullptr, &verdicts[i]);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
    jobs.clear();
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    for (size_t i = 0; i < dtypes.size(); ++i) {
      say(fmt::format("[build] {} {}: {}{}", builds[i].variant.describe(),
                      verdict_name(verdicts[i]),
                      verdicts[i] == Verdict::ok ? builds[i].resources.summary() : "",
                      builds[i].from_cache ? " (cached)" : ""));
      if (verdicts[i] != Verdict::ok) {
        report.verdict = verdicts[i];
        report.detail = fmt::format("{}: {}", builds[i].variant.describe(), builds[i].log);
      }
    }
  }
  report.builds = builds;
  if (!report.passed()) return report;

  const auto selected = [&](const std::string& stage) {
    return options.stages.empty() ||
           std::find(options.stages.begin(), options.stages.end(), stage) != options.stages.end();
  };
  const auto tests = op->test_sizes();
  uint64_t case_index = 0;

  for (const auto& stage_name : kStageNames) {
    StageReport stage{stage_name};
    if (!selected(stage_name) || !report.passed()) {
      report.stages.push_back(stage);
      continue;
    }
    stage.ran = true;
    const auto record = [&](CaseResult r) {
      if (!r.output.empty() && report.output.size() < kKeptOutputBytes) {
        report.output += fmt::format("[{} {}] {}", stage_name, r.label, r.output);
        if (report.output.back() != '\n') report.output += '\n';
      }
      ++stage.cases;
      if (r.skipped) ++stage.skipped;
      stage.worst_abs_error = std::max(stage.worst_abs_error, r.compare.max_abs_error);
      stage.worst_rel_error = std::max(stage.worst_rel_error, r.compare.max_rel_error);
      say(fmt::format("[{}] {}: {}{}", stage_name,
                      describe_case(*op, r.label, r.sizes, r.dtype, r.kind),
                      r.skipped ? "SKIPPED" : verdict_name(r.verdict),
                      r.skipped || r.verdict == Verdict::ok ? "" : " - " + r.detail));
      if (!r.skipped && r.verdict != Verdict::ok && stage.passed) {
        stage.passed = false;
        report.verdict = r.verdict;
        report.detail =
            fmt::format("{} / {}: {}", stage_name,
                        describe_case(*op, r.label, r.sizes, r.dtype, r.kind), r.detail);
      }
      stage.results.push_back(std::move(r));
      return stage.passed;
    };
    const auto run = [&](const CompileResult& b, const std::string& label, const Sizes& sizes,
                         InputKind kind, double scale) {
      const uint64_t seed = derive_seed(report.seed, stage_name, case_index++);
      // Not run: past --max-elements, or with nothing to compare with here (the CPU backend past
      // the host reference's limit, where a CPU matmul at 4096^3 would outlast its time limit
      // only to be skipped after; the sizes that are checked still catch out-of-bounds writes).
      std::string not_run;
      if (options.max_elements > 0 && largest_tensor_elements(*op, sizes) > options.max_elements)
        not_run = fmt::format("over --max-elements {}", options.max_elements);
      else if (!has_reference(*op, sizes, kind))
        not_run = kNoReferenceHere;
      if (!not_run.empty()) {
        CaseResult skipped{stage_name, label, sizes, b.variant.dtype, kind, seed};
        skipped.skipped = true;
        skipped.detail = std::move(not_run);
        return record(std::move(skipped));
      }
      const auto timeout = options.timeout.count() > 0
                               ? options.timeout
                               : default_timeout(*op, sizes, b.variant.dtype);
      return record(run_case(*op, b, stage_name, label, sizes, kind, seed, scale, timeout));
    };

    if (stage_name == "smoke") {
      for (const auto& b : builds) {
        if (!run(b, tests.front().label, tests.front().sizes, InputKind::normal, 1.0)) break;
      }
    } else if (stage_name == "shape_sweep") {
      for (const auto& size : tests) {
        bool ok = true;
        for (const auto& b : builds) {
          if (!(ok = run(b, size.label, size.sizes, InputKind::normal, 1.0))) break;
        }
        if (!ok) break;
      }
    } else if (stage_name == "stability") {
      const SizeCase size = op->stability_size();
      for (const InputKind kind : op->stability_kinds()) {
        bool ok = true;
        for (const auto& b : builds) {
          if (!(ok = run(b, size.label, size.sizes, kind, kStabilityToleranceScale))) break;
        }
        if (!ok) break;
      }
    } else if (stage_name == "determinism") {
      // A mid-sized problem: large enough for many blocks to race, small enough to run 4 times.
      const SizeCase& size = tests[std::min<size_t>(1, tests.size() - 1)];
      for (const auto& b : builds) {
        if (!check_determinism(*op, b, size, derive_seed(report.seed, stage_name, case_index++),
                               options, record)) {
          break;
        }
      }
    } else if (stage_name == "edge_cases") {
      for (const auto& size : op->edge_sizes()) {
        bool ok = true;
        for (const auto& b : builds) {
          if (!(ok = run(b, size.label, size.sizes, InputKind::normal, 1.0))) break;
        }
        if (!ok) break;
      }
    }
    report.stages.push_back(std::move(stage));
  }
  if (!options.sanitizer_tools.empty() && report.passed()) {
    StageReport stage = sanitize(*op, builds, options.sanitizer_tools, report.seed, progress);
    if (!stage.passed) {
      report.verdict = Verdict::wrong;
      for (const auto& r : stage.results) {
        if (r.verdict != Verdict::ok) {
          report.detail = fmt::format("sanitize / {}: {}", r.label, r.detail);
          break;
        }
      }
    }
    report.stages.push_back(std::move(stage));
  }
  return report;
}

StageReport Checker::sanitize(const OpSpec& op, const std::vector<CompileResult>& builds,
                              const std::vector<std::string>& tools, uint64_t seed,
                              const ProgressFn& progress) {
  StageReport stage{"sanitize"};
  stage.ran = true;
  const auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  if (worker_.options().backend != "cuda") {
    say("[sanitize] CPU kernel files have no sanitizer stage: skipped");
    stage.skipped = 1;
    return stage;
  }
  const auto sanitizer = find_compute_sanitizer();
  // Small problems: the smoke size and the smallest edge size.
  std::vector<SizeCase> cases = {op.test_sizes().front()};
  const auto edges = op.edge_sizes();
  if (!edges.empty()) {
    cases.push_back(
        *std::min_element(edges.begin(), edges.end(), [&](const auto& a, const auto& b) {
          return largest_tensor_elements(op, a.sizes) < largest_tensor_elements(op, b.sizes);
        }));
  }
  for (const std::string& tool : tools) {
    CaseResult result{"sanitize",        tool, cases.front().sizes, builds.front().variant.dtype,
                      InputKind::normal, seed};
    ++stage.cases;
    if (!sanitizer) {
      result.verdict = Verdict::wrong;
      result.detail = "compute-sanitizer not found (on PATH or in /usr/local/cuda/bin)";
    } else {
      WorkerOptions options = worker_.options();
      options.log_dir.clear();
      options.launcher = sanitizer_launcher(*sanitizer, tool);
      options.start_timeout = std::chrono::minutes(5);
      WorkerClient sanitized(options);
      for (const auto& b : builds) {
        for (const auto& c : cases) {
          if (result.verdict != Verdict::ok) break;
          CaseTensors tensors(op, c.sizes, b.variant.dtype);
          tensors.generate_inputs(InputKind::normal, derive_seed(seed, tool, 0));
          tensors.poison_outputs();
          // The tools slow kernels down by 10-100x.
          const auto timeout = 50 * default_timeout(op, c.sizes, b.variant.dtype);
          const WorkerReply reply = sanitized.request(
              tensors.request("run", b.module, op.scalar_values(c.sizes)), timeout);
          if (!reply.ok()) {
            result.verdict = reply.verdict;
            result.detail = fmt::format("{} {} under {}: {}", c.label, dtype_name(b.variant.dtype),
                                        tool, reply.detail);
          }
        }
      }
      const WorkerClient::Finish finish = sanitized.finish();
      const SanitizerVerdict v =
          read_sanitizer_output(finish.output, finish.status.exited ? finish.status.exit_code : -1);
      if (!v.clean) {
        result.verdict = Verdict::wrong;
        result.detail = fmt::format("{} found {} error(s):\n{}", tool, v.errors, v.summary);
      }
    }
    say(fmt::format("[sanitize] {}: {}{}", tool, verdict_name(result.verdict),
                    result.verdict == Verdict::ok ? "" : " - " + result.detail));
    if (result.verdict != Verdict::ok) stage.passed = false;
    stage.results.push_back(std::move(result));
  }
  return stage;
}

}  // namespace kforge

namespace kforge {

nlohmann::json CheckReport::to_json(const OpSpec& op_spec) const {
  nlohmann::json j;
  j["file"] = file;
  j["op"] = op;
  j["seed"] = seed;
  j["verdict"] = verdict_name(verdict);
  j["detail"] = detail;
  j["output"] = truncate_middle(output, kKeptOutputBytes);
  j["builds"] = nlohmann::json::array();
  for (const auto& b : builds) {
    j["builds"].push_back({{"variant", b.variant.describe()},
                           {"key", b.variant.key()},
                           {"ok", b.ok},
                           {"from_cache", b.from_cache},
                           {"compile_seconds", b.seconds},
                           {"resources", b.resources.summary()},
                           {"registers", b.resources.max_registers()},
                           {"static_shared_bytes", b.resources.max_static_shared_bytes()},
                           {"stack_frame_bytes", b.resources.max_stack_frame_bytes()},
                           {"spills", b.resources.spills()}});
  }
  j["stages"] = nlohmann::json::array();
  for (const auto& s : stages) {
    nlohmann::json cases = nlohmann::json::array();
    for (const auto& c : s.results) {
      cases.push_back({{"label", c.label},
                       {"shape", op_spec.format_shape(c.sizes)},
                       {"dtype", dtype_name(c.dtype)},
                       {"inputs", input_kind_name(c.kind)},
                       {"seed", c.seed},
                       {"verdict", c.skipped ? "SKIPPED" : verdict_name(c.verdict)},
                       {"detail", c.detail},
                       {"compare", c.compare.to_json()}});
    }
    j["stages"].push_back({{"name", s.name},
                           {"ran", s.ran},
                           {"passed", s.ran && s.passed},
                           {"cases", s.cases},
                           {"skipped", s.skipped},
                           {"worst_abs_error", s.worst_abs_error},
                           {"worst_rel_error", s.worst_rel_error},
                           {"results", cases}});
  }
  return j;
}

}  // namespace kforge
