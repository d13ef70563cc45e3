#include "kernelbench/kernelbench_op.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "check/checker.h"
#include "compile/compiler.h"
#include "core/error.h"
#include "core/process.h"
#include "core/temp_directory.h"
#include "kforge/kernel.h"
#include "ops/registry.h"
#include "run/case_tensors.h"

namespace kforge {
namespace fs = std::filesystem;

// The problem's Python child: one request at a time, data through files in a private folder.
class ProblemServer {
 public:
  explicit ProblemServer(const fs::path& problem) : data_("kforge-kb") {
    const fs::path script =
        default_include_dir().parent_path() / "src" / "kernelbench" / "kernelbench_problem.py";
    if (!fs::exists(script)) throw Error(fmt::format("{} is missing", script.string()));
    log_ = data_.path() / "problem.log";
    child_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{kernelbench_python(), script.string(),
                                 fs::absolute(problem).string()},
        log_.string());
    const nlohmann::json ready = receive(std::chrono::minutes(2), "start");
    if (!ready.value("ok", false)) {
      throw UsageError(fmt::format("{}: {}", problem.string(), ready.value("error", "")));
    }
  }

  const fs::path& folder() const { return data_.path(); }

  // Sends one request and returns its reply; Error when the child fails or is gone.
  nlohmann::json request(nlohmann::json request, std::chrono::milliseconds timeout) {
    const std::string cmd = request.at("cmd");
    if (!child_->send_line(request.dump())) throw Error(died("the request " + cmd));
    nlohmann::json reply = receive(timeout, cmd);
    if (!reply.value("ok", false)) {
      throw Error(fmt::format("the problem's {} failed: {}", cmd, reply.value("error", "")));
    }
    return reply;
  }

  std::mutex& mutex() { return mutex_; }

 private:
  nlohmann::json receive(std::chrono::milliseconds timeout, const std::string& what) {
    bool timed_out = false;
    const auto line = child_->receive_line(timeout, &timed_out);
    if (!line) {
      throw Error(timed_out
                      ? fmt::format("the problem's {} took over {} s", what, timeout.count() / 1000)
                      : died(what));
    }
    try {
      return nlohmann::json::parse(*line);
    } catch (const std::exception&) {
      throw Error(fmt::format("the problem's {} replied '{}'", what, line->substr(0, 200)));
    }
  }

  std::string died(const std::string& what) {
    std::ifstream in(log_);
    std::string log((std::istreambuf_iterator<char>(in)), {});
    if (log.size() > 2000) log = fmt::format("...{}", log.substr(log.size() - 2000));
    return fmt::format("the problem's Python child ended during {}; its log:\n{}", what, log);
  }

  TempDirectory data_;
  fs::path log_;
  std::unique_ptr<ChildProcess> child_;
  std::mutex mutex_;
};

namespace {

constexpr auto kRequestTimeout = std::chrono::minutes(10);

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

void write_file(const fs::path& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) throw Error(fmt::format("cannot write {}", path.string()));
}

std::vector<char> read_file(const fs::path& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> data(bytes);
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  if (!in || in.peek() != std::char_traits<char>::eof()) {
    throw Error(fmt::format("{} does not hold {} bytes", path.string(), bytes));
  }
  return data;
}

}  // namespace

std::string signature_misfit(const OpSpec& base, const nlohmann::json& described,
                             const std::string& where, Sizes& sizes, DType& dtype) {
  const std::string base_name(base.name());
  const auto parsed = parse_dtype(described.at("dtype").get<std::string>());
  if (!parsed || !base.supports(*parsed)) {
    return fmt::format("{}: {} does not take dtype {}", where, base_name,
                       described.at("dtype").get<std::string>());
  }
  dtype = *parsed;
  sizes.clear();

  // The problem's tensors, in the kernel's order, must be the op's: sizes are read off them.
  const std::vector<TensorSpec> specs = base.tensors();
  const auto& given = described.at("tensors");
  const auto list = [&](const auto& items) {
    std::vector<std::string> parts;
    for (const auto& t : items)
      parts.push_back(fmt::format("{}{}", t.at("name").template get<std::string>(),
                                  shape_text(t.at("shape").template get<std::vector<int64_t>>())));
    return fmt::format("{}", fmt::join(parts, " "));
  };
  if (given.size() != specs.size()) {
    return fmt::format(
        "{}: {} takes {} (get_inputs()'s tensors, then the Model's parameters, then the "
        "outputs); the problem has {}",
        where, base_name, base.signature(), list(given));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto shape = given[i].at("shape").get<std::vector<int64_t>>();
    if (shape.size() != specs[i].dims.size()) {
      return fmt::format("{}: tensor {} ({}) is {} but {}'s {} has dims [{}]", where, i,
                         given[i].at("name").get<std::string>(), shape_text(shape), base_name,
                         specs[i].name, fmt::join(specs[i].dims, ", "));
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      const auto [it, added] = sizes.emplace(specs[i].dims[d], shape[d]);
      if (!added && it->second != shape[d]) {
        return fmt::format("{}: {} is {} in {} but {} in an earlier tensor", where,
                           specs[i].dims[d], shape[d], specs[i].name, it->second);
      }
    }
  }
  for (const auto& [n, v] : base.named_size_defaults())
    sizes.emplace(n, v);
  base.complete_sizes(sizes);
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto shape = given[i].at("shape").get<std::vector<int64_t>>();
    const DType expected = base.dtype_of(specs[i], dtype);
    if (base.shape_of(specs[i], sizes) != shape ||
        given[i].at("dtype").get<std::string>() != dtype_name(expected)) {
      return fmt::format("{}: tensor {} is {} {} but {} wants {} {} there", where,
                         given[i].at("name").get<std::string>(),
                         given[i].at("dtype").get<std::string>(), shape_text(shape), base_name,
                         dtype_name(expected), shape_text(base.shape_of(specs[i], sizes)));
    }
  }
  return "";
}

KernelBenchOp::KernelBenchOp(std::string name, fs::path problem, const nlohmann::json& described,
                             std::shared_ptr<ProblemServer> server)
    : name_(std::move(name)), problem_(std::move(problem)), server_(std::move(server)) {
  const std::string where = problem_.filename().string();
  if (!described.contains("op") || described.at("op").is_null()) {
    throw UsageError(fmt::format(
        "{} names no KFORGE_OP: kforge takes problems whose signature is one of its ops' ({}); "
        "set KFORGE_OP to the op whose inputs, parameters and outputs the Model has",
        where, op_names()));
  }
  const std::string base_name = described.at("op");
  base_ = find_op(base_name);
  if (!base_ || base_name.starts_with("kb:")) {
    throw UsageError(
        fmt::format("{}: KFORGE_OP '{}' is not a kforge op ({})", where, base_name, op_names()));
  }
  if (const std::string why = signature_misfit(*base_, described, where, sizes_, dtype_);
      !why.empty()) {
    throw UsageError(why);
  }
  identified_ = described.value("identified", "");
  formula_ = fmt::format("{} (KernelBench problem {}, with {}'s signature{})", name_, where,
                         base_name, identified_.empty() ? "" : "; " + identified_);
}

KernelBenchOp::~KernelBenchOp() = default;

SizeCase KernelBenchOp::stability_size() const {
  if (base_->reference_flops(sizes_) <= kHostReferenceFlopLimit) return {"problem", sizes_};
  return base_->stability_size();
}

void KernelBenchOp::generate(const Sizes& sizes, InputKind kind, uint64_t seed,
                             std::span<HostTensor> inputs) const {
  if (kind != InputKind::normal) {
    base_->generate(sizes, kind, seed, inputs);
    return;
  }
  if (!server_) throw Error(fmt::format("{} has no Python child to draw inputs", name_));
  const std::lock_guard lock(server_->mutex());
  const fs::path dir = server_->folder() / "inputs";
  fs::create_directories(dir);
  // Seeds are 64-bit; torch.manual_seed takes what fits in 63 bits.
  server_->request(
      {{"cmd", "inputs"}, {"seed", static_cast<int64_t>(seed >> 1)}, {"dir", dir.string()}},
      kRequestTimeout);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto data = read_file(dir / fmt::format("in{}.bin", i), inputs[i].bytes());
    std::memcpy(inputs[i].data, data.data(), data.size());
  }
}

void KernelBenchOp::reference(const Sizes& sizes, std::span<const std::vector<double>> inputs,
                              std::span<const double> scalars,
                              std::span<std::vector<double>> outputs) const {
  if (!server_) throw Error(fmt::format("{} has no Python child to run its Model", name_));
  const std::vector<TensorSpec> in_specs = this->inputs();
  const size_t out_count = this->outputs().size();
  {
    const std::lock_guard lock(server_->mutex());
    const fs::path dir = server_->folder() / "forward";
    fs::create_directories(dir);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const fs::path path = dir / fmt::format("in{}.bin", i);
      if (is_floating(base_->dtype_of(in_specs[i], dtype_))) {
        write_file(path, inputs[i].data(), inputs[i].size() * sizeof(double));
      } else {
        std::vector<int64_t> wide(inputs[i].begin(), inputs[i].end());
        write_file(path, wide.data(), wide.size() * sizeof(int64_t));
      }
    }
    server_->request({{"cmd", "forward"}, {"dir", dir.string()}}, kRequestTimeout);
    for (size_t o = 0; o < out_count; ++o) {
      const auto data =
          read_file(dir / fmt::format("out{}.bin", o), outputs[o].size() * sizeof(double));
      std::memcpy(outputs[o].data(), data.data(), data.size());
    }
  }
  // Magnitudes (the scale of each output's rounding error) come from the op's own reference
  // where the host can afford it, else the plain relative tolerance applies (stricter).
  if (outputs.size() <= out_count) return;
  if (base_->reference_flops(sizes) <= kHostReferenceFlopLimit) {
    std::vector<std::vector<double>> own(outputs.size());
    for (size_t o = 0; o < outputs.size(); ++o)
      own[o].resize(outputs[o].size());
    base_->reference(sizes, inputs, scalars, own);
    for (size_t o = out_count; o < outputs.size(); ++o)
      outputs[o] = std::move(own[o]);
  } else {
    for (size_t o = out_count; o < outputs.size(); ++o) {
      for (size_t i = 0; i < outputs[o].size(); ++i)
        outputs[o][i] = std::abs(outputs[o - out_count][i]);
    }
  }
}

ProblemTiming KernelBenchOp::time(const fs::path& module, double max_seconds) const {
  if (!server_) throw Error(fmt::format("{} has no Python child to time its Model", name_));
  const std::lock_guard lock(server_->mutex());
  const nlohmann::json reply = server_->request({{"cmd", "time"},
                                                 {"module", module.string()},
                                                 {"entry", KFORGE_ENTRY_SYMBOL},
                                                 {"abi_version", KFORGE_ABI_VERSION},
                                                 {"scalars", scalar_values(sizes_)},
                                                 {"seed", 1},
                                                 {"max_seconds", max_seconds},
                                                 {"atol", tolerance(dtype_).atol},
                                                 {"rtol", tolerance(dtype_).rtol}},
                                                kRequestTimeout);
  ProblemTiming t;
  t.kforge_us = reply.at("kforge");
  t.eager_us = reply.at("eager");
  t.compile_us = reply.at("compile");
  t.agrees_after_timing = reply.at("agrees_after_timing");
  t.excess_over_tolerance = reply.at("excess_over_tolerance");
  t.device = reply.at("device");
  t.torch_version = reply.at("torch");
  return t;
}

std::string kernelbench_op_name(const fs::path& problem) {
  return fmt::format("kb:{}", problem.stem().string());
}

IdentifiedOp identify_signature_op(
    const fs::path& problem, const nlohmann::json& described,
    const std::function<std::optional<std::string>(const OpSpec&)>& model_disagrees) {
  const std::string where = problem.filename().string();
  std::vector<std::pair<const OpSpec*, Sizes>> fits;  // each with the sizes read off the tensors
  for (const OpSpec* op : all_ops()) {
    Sizes sizes;
    DType dtype = DType::f32;
    if (!op->name().starts_with("kb:") &&
        signature_misfit(*op, described, where, sizes, dtype).empty()) {
      fits.emplace_back(op, std::move(sizes));
    }
  }
  if (fits.empty()) {
    throw UsageError(fmt::format(
        "{} names no KFORGE_OP, and its tensors (get_inputs()'s, the Model's parameters, the "
        "outputs) fit no kforge op's signature ({}); kforge takes problems with one of its ops' "
        "signatures",
        where, op_names()));
  }
  std::vector<std::string> agree;
  std::vector<std::string> unjudged;
  std::vector<std::string> differ;
  for (const auto& [op, sizes] : fits) {
    const std::string name(op->name());
    if (op->reference_flops(sizes) > kHostReferenceFlopLimit) {
      unjudged.push_back(name);
    } else if (const auto why = model_disagrees(*op)) {
      differ.push_back(fmt::format("not {}: {}", name, *why));
    } else {
      agree.push_back(name);
    }
  }
  if (agree.size() == 1 && unjudged.empty()) {
    return {agree.front(),
            fmt::format("identified by its Model agreeing with {}'s reference", agree.front())};
  }
  if (agree.empty() && unjudged.size() == 1) {
    return {unjudged.front(),
            fmt::format("identified by its signature alone ({}'s host reference is too costly "
                        "at this size to compare with the Model)",
                        unjudged.front())};
  }
  if (agree.size() + unjudged.size() > 1) {
    agree.insert(agree.end(), unjudged.begin(), unjudged.end());
    throw UsageError(fmt::format(
        "{} names no KFORGE_OP and could be any of {}: set KFORGE_OP to the one it computes", where,
        fmt::join(agree, ", ")));
  }
  throw UsageError(fmt::format(
      "{} names no KFORGE_OP and its Model computes none of the ops whose signature it has ({})",
      where, fmt::join(differ, ", ")));
}

namespace {

// Why the problem's Model does not compute what `candidate`'s signature op does, on one draw of
// the problem's own inputs (nullopt: it does, within the op's tolerance for the problem's dtype).
std::optional<std::string> model_disagreement(const KernelBenchOp& candidate) {
  const OpSpec& op = candidate.signature_op();
  const Sizes& sizes = candidate.problem_sizes();
  CaseTensors tensors(candidate, sizes, candidate.problem_dtype());
  tensors.generate_inputs(InputKind::normal, fresh_seed());
  const std::vector<std::vector<double>> inputs = tensors.inputs_as_double();
  const std::vector<double> scalars = candidate.scalar_values(sizes);
  const size_t outputs = tensors.outputs().size();
  std::vector<std::vector<double>> model(outputs);
  std::vector<std::vector<double>> want(op.tolerance_relative_to_magnitude() ? 2 * outputs
                                                                             : outputs);
  for (size_t o = 0; o < want.size(); ++o)
    want[o].resize(static_cast<size_t>(tensors.outputs()[o % outputs].numel()));
  for (size_t o = 0; o < outputs; ++o)
    model[o].resize(want[o].size());
  candidate.reference(sizes, inputs, scalars, model);
  op.reference(sizes, inputs, scalars, want);
  const Tolerance tolerance = op.tolerance(candidate.problem_dtype());
  for (size_t o = 0; o < outputs; ++o) {
    size_t differing = 0;
    std::optional<size_t> first;
    for (size_t i = 0; i < want[o].size(); ++i) {
      const double got = model[o][i], expected = want[o][i];
      const double scale = want.size() > outputs
                               ? std::max(std::abs(expected), want[outputs + o][i])
                               : std::abs(expected);
      const bool same = std::isfinite(expected)
                            ? std::abs(got - expected) <= tolerance.atol + tolerance.rtol * scale
                            : (std::isnan(expected) ? std::isnan(got) : got == expected);
      if (!same) {
        ++differing;
        if (!first) first = i;
      }
    }
    if (differing > 0) {
      return fmt::format(
          "{} of {} elements of output {} differ (element {}: the Model gives {:.6g}, "
          "{} {:.6g})",
          differing, want[o].size(), o, *first, model[o][*first], op.name(), want[o][*first]);
    }
  }
  return std::nullopt;
}

struct LoadedProblems {
  std::mutex mutex;
  std::map<std::string, const KernelBenchOp*> by_name;
};

LoadedProblems& loaded() {
  static LoadedProblems problems;
  return problems;
}

}  // namespace

const KernelBenchOp& load_kernelbench_problem(const fs::path& problem) {
  if (!fs::is_regular_file(problem)) {
    throw UsageError(fmt::format("KernelBench problem {} is not a file", problem.string()));
  }
  const std::string name = kernelbench_op_name(problem);
  const fs::path canonical = fs::canonical(problem);
  auto& problems = loaded();
  const std::lock_guard lock(problems.mutex);
  if (const auto it = problems.by_name.find(name); it != problems.by_name.end()) {
    if (fs::canonical(it->second->problem()) != canonical) {
      throw UsageError(fmt::format("two KernelBench problems are named {}: {} and {}", name,
                                   it->second->problem().string(), problem.string()));
    }
    return *it->second;
  }
  auto server = std::make_shared<ProblemServer>(canonical);
  nlohmann::json described = server->request({{"cmd", "describe"}}, kRequestTimeout);
  if (!described.contains("op") || described.at("op").is_null()) {
    const IdentifiedOp identified =
        identify_signature_op(canonical, described, [&](const OpSpec& op) {
          nlohmann::json as_op = described;
          as_op["op"] = op.name();
          return model_disagreement(KernelBenchOp(name, canonical, as_op, server));
        });
    described["op"] = identified.op;
    described["identified"] = identified.how;
  }
  auto op = std::make_unique<KernelBenchOp>(name, canonical, described, std::move(server));
  const KernelBenchOp* registered = op.get();
  register_op(std::move(op));
  problems.by_name[name] = registered;
  return *registered;
}

void install_kernelbench_resolver() {
  set_op_resolver([](std::string_view name) -> const OpSpec* {
    if (!name.starts_with("kb:")) return nullptr;
    const char* folders = std::getenv("KFORGE_KERNELBENCH_PROBLEMS");
    if (!folders) return nullptr;
    std::string_view rest = folders;
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      const fs::path folder(std::string(rest.substr(0, colon)));
      rest = colon == std::string_view::npos ? "" : rest.substr(colon + 1);
      const fs::path file = folder / (std::string(name.substr(3)) + ".py");
      if (!folder.empty() && fs::is_regular_file(file)) return &load_kernelbench_problem(file);
    }
    return nullptr;
  });
}

void add_kernelbench_folder(const fs::path& folder) {
  const char* old = std::getenv("KFORGE_KERNELBENCH_PROBLEMS");
  const std::string value = old && *old ? fmt::format("{}:{}", fs::absolute(folder).string(), old)
                                        : fs::absolute(folder).string();
  setenv("KFORGE_KERNELBENCH_PROBLEMS", value.c_str(), 1);
}

std::string kernelbench_python() {
  if (const auto python = find_python_with("torch")) return *python;
  throw UsageError(
      "KernelBench problems run in Python with PyTorch, and no python3 here imports torch: set "
      "KFORGE_PYTHON to one that does");
}

double fast_p(const std::vector<ProblemScore>& scores, double p) {
  if (scores.empty()) return 0;
  const auto fast = std::count_if(scores.begin(), scores.end(), [&](const ProblemScore& s) {
    return s.passed && (p == 0 || s.speedup > p);
  });
  return static_cast<double>(fast) / static_cast<double>(scores.size());
}

}  // namespace kforge
