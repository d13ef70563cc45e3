#include "compile/compiler.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "compile/kernel_text.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/parallel.h"
#include "core/process.h"

namespace kforge {
namespace fs = std::filesystem;

std::string elem_macro_name(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "KF_ELEM_F16";
    case DType::bf16:
      return "KF_ELEM_BF16";
    case DType::f32:
      return "KF_ELEM_F32";
    default:
      throw UsageError(fmt::format("kernels are not compiled for {}", dtype_name(dtype)));
  }
}

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw Error(fmt::format("cannot write {}", path.string()));
}

// "sm_90a" -> "arch=compute_90a,code=sm_90a"
std::string gencode_for(const std::string& arch) {
  static const std::regex pattern("sm_([0-9]+[a-z]?)");
  std::smatch m;
  if (!std::regex_match(arch, m, pattern)) {
    throw UsageError(fmt::format("architecture '{}' is not of the form sm_90a / sm_80", arch));
  }
  return fmt::format("arch=compute_{0},code=sm_{0}", std::string(m[1]));
}

std::string elem_macro(DType dtype) {
  return "-D" + elem_macro_name(dtype);
}

std::string find_nvcc() {
  if (const char* env = std::getenv("KFORGE_NVCC")) return env;
  if (run_command({"sh", "-c", "command -v nvcc"}).ok()) return "nvcc";
  return "/usr/local/cuda/bin/nvcc";
}

nlohmann::json resources_to_json(const ResourceReport& report) {
  nlohmann::json functions = nlohmann::json::array();
  for (const auto& f : report.functions) {
    functions.push_back({{"function", f.function},
                         {"registers", f.registers},
                         {"static_shared_bytes", f.static_shared_bytes},
                         {"stack_frame_bytes", f.stack_frame_bytes},
                         {"spill_store_bytes", f.spill_store_bytes},
                         {"spill_load_bytes", f.spill_load_bytes},
                         {"serialized_wgmma", f.serialized_wgmma}});
  }
  return functions;
}

std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  return fmt::format("{}-{}-{:08x}", getpid(), counter++, rd());
}

}  // namespace

int ResourceReport::max_registers() const {
  int m = 0;
  for (const auto& f : functions)
    m = std::max(m, f.registers);
  return m;
}
long long ResourceReport::max_static_shared_bytes() const {
  long long m = 0;
  for (const auto& f : functions)
    m = std::max(m, f.static_shared_bytes);
  return m;
}
long long ResourceReport::max_stack_frame_bytes() const {
  long long m = 0;
  for (const auto& f : functions)
    m = std::max(m, f.stack_frame_bytes);
  return m;
}
bool ResourceReport::spills() const {
  return std::any_of(functions.begin(), functions.end(), [](const FunctionResources& f) {
    return f.spill_store_bytes > 0 || f.spill_load_bytes > 0;
  });
}
std::string ResourceReport::serialized_wgmma() const {
  for (const auto& f : functions) {
    if (!f.serialized_wgmma.empty()) return f.serialized_wgmma;
  }
  return {};
}
std::string ResourceReport::summary() const {
  if (functions.empty()) return "no GPU resource report (CPU module)";
  const std::string serialized = serialized_wgmma();
  return fmt::format("regs {}, smem {} B, stack {} B, {}{}", max_registers(),
                     max_static_shared_bytes(), max_stack_frame_bytes(),
                     spills() ? "SPILLS" : "no spills",
                     serialized.empty() ? "" : ", WGMMA SERIALIZED (" + serialized + ")");
}

ResourceReport parse_ptxas_report(const std::string& log) {
  static const std::regex function_re(R"(Function properties for (\S+))");
  static const std::regex frame_re(
      R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex used_re(R"(Used (\d+) registers)");
  static const std::regex smem_re(R"((\d+) bytes smem)");
  // ptxas prints these before the functions' properties, naming the function.
  static const std::regex serialized_re(
      R"(Potential Performance Loss: wgmma\.mma_async instructions are serialized due to (.+?) in (?:the )?function '([^']+)')");
  static const std::regex repeated_spaces("  +");
  std::vector<std::pair<std::string, std::string>> serialized;  // (function, reason)
  ResourceReport report;
  std::istringstream in(log);
  std::string line;
  FunctionResources* current = nullptr;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, serialized_re)) {
      // ptxas doubles a space inside some of its reasons.
      serialized.emplace_back(m[2], std::regex_replace(std::string(m[1]), repeated_spaces, " "));
    } else if (std::regex_search(line, m, function_re)) {
      report.functions.push_back({});
      current = &report.functions.back();
      current->function = m[1];
    } else if (current && std::regex_search(line, m, frame_re)) {
      current->stack_frame_bytes = std::stoll(m[1]);
      current->spill_store_bytes = std::stoll(m[2]);
      current->spill_load_bytes = std::stoll(m[3]);
    } else if (current && std::regex_search(line, m, used_re)) {
      current->registers = std::stoi(m[1]);
      if (std::regex_search(line, m, smem_re)) current->static_shared_bytes = std::stoll(m[1]);
    }
  }
  for (const auto& [function, reason] : serialized) {
    auto it = std::find_if(report.functions.begin(), report.functions.end(),
                           [&](const FunctionResources& f) { return f.function == function; });
    if (it == report.functions.end()) {
      report.functions.push_back({});
      it = std::prev(report.functions.end());
      it->function = function;
    }
    if (it->serialized_wgmma.empty()) it->serialized_wgmma = reason;
  }
  return report;
}

fs::path default_cache_dir() {
  if (const char* env = std::getenv("KFORGE_CACHE_DIR")) return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME")) return fs::path(xdg) / "kforge";
  if (const char* home = std::getenv("HOME")) return fs::path(home) / ".cache" / "kforge";
  return fs::temp_directory_path() / "kforge-cache";
}

fs::path default_cutlass_include_dir() {
  if (const char* env = std::getenv("KFORGE_CUTLASS_INCLUDE")) return env;
  const fs::path unpacked = default_include_dir().parent_path() / ".deps" / "nvidia-cutlass" /
                            "cutlass_library" / "source" / "include";
  return fs::exists(unpacked / "cutlass" / "cutlass.h") ? unpacked : fs::path();
}

const std::vector<std::string>& cutlass_compile_flags() {
  // CuTe's constexpr helpers are called from device code; NDEBUG keeps CUTLASS's asserts out of
  // the kernels.
  static const std::vector<std::string> flags = {"--expt-relaxed-constexpr", "-DNDEBUG"};
  return flags;
}

fs::path library_kernels_dir() {
  return default_include_dir().parent_path() / "kernels";
}

bool is_library_file(const fs::path& path) {
  const std::string library = fs::weakly_canonical(library_kernels_dir()).string() + "/";
  return fs::weakly_canonical(path).string().starts_with(library);
}

fs::path default_include_dir() {
  if (const char* env = std::getenv("KFORGE_INCLUDE_DIR")) return env;
  // The binary lives in build/<preset>/; the headers in include/ at the source root.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (fs::exists(dir / "include" / "kforge" / "kernel.h")) return dir / "include";
    }
  }
  return KFORGE_SOURCE_DIR "/include";
}

Compiler::Compiler(CompilerOptions options) : options_(std::move(options)) {
  if (options_.cache_dir.empty()) options_.cache_dir = default_cache_dir();
  if (options_.include_dir.empty()) options_.include_dir = default_include_dir();
  if (options_.cutlass_include_dir.empty())
    options_.cutlass_include_dir = default_cutlass_include_dir();
  if (options_.nvcc.empty()) options_.nvcc = find_nvcc();
  if (options_.cxx.empty()) {
    const char* cxx = std::getenv("CXX");
    options_.cxx = cxx ? cxx : "c++";
  }
}

std::vector<std::string> Compiler::command_line(const KernelFile& file, const Variant& variant,
                                                const fs::path& source,
                                                const fs::path& output) const {
  std::vector<std::string> cmd;
  if (variant.backend == Backend::cuda) {
    cmd = {options_.nvcc,
           "-std=c++20",
           "-O3",
           "-shared",
           "-Xcompiler",
           "-fPIC",
           "-gencode=" + gencode_for(variant.arch),
           "-cudart",
           "shared",
           "-lineinfo",
           "-Xptxas",
           "-v"};
  } else {
    cmd = {options_.cxx, "-std=c++20", "-O3", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall"};
  }
  cmd.push_back("-I" + options_.include_dir.string());
  cmd.push_back("-I" + fs::absolute(file.path).parent_path().string());
  // A copy of a library file (a loop task's) finds its op folder's shared headers.
  std::vector<fs::path> folders;
  for (const auto& header : local_headers(file)) {
    const fs::path folder = header.parent_path();
    if (folder != fs::absolute(file.path).parent_path() &&
        std::find(folders.begin(), folders.end(), folder) == folders.end()) {
      folders.push_back(folder);
      cmd.push_back("-I" + folder.string());
    }
  }
  if (file.uses("cutlass")) {
    cmd.push_back("-I" + cutlass_include_dir(file).string());
    cmd.insert(cmd.end(), cutlass_compile_flags().begin(), cutlass_compile_flags().end());
  }
  cmd.push_back(elem_macro(variant.dtype));
  for (const auto& [name, value] : variant.params)
    cmd.push_back(fmt::format("-D{}={}", name, value));
  cmd.push_back(source.string());
  cmd.push_back("-o");
  cmd.push_back(output.string());
  return cmd;
}

std::string Compiler::compiler_version(Backend backend) const {
  static std::mutex mutex;
  static std::map<std::string, std::string> versions;
  const std::string& tool = backend == Backend::cuda ? options_.nvcc : options_.cxx;
  std::lock_guard lock(mutex);
  auto it = versions.find(tool);
  if (it == versions.end()) {
    const CommandResult r = run_command({tool, "--version"}, std::chrono::seconds(60));
    if (!r.ok()) throw Error(fmt::format("cannot run '{} --version': {}", tool, r.output));
    it = versions.emplace(tool, r.output).first;
  }
  return it->second;
}

std::string Compiler::toolkit_version(Backend backend) const {
  std::istringstream in(compiler_version(backend));
  std::string line, first;
  while (std::getline(in, line)) {
    if (first.empty() && !line.empty()) first = line;
    if (line.find("release") != std::string::npos) return line;
  }
  return first;
}

std::string Compiler::headers_fingerprint(const KernelFile& file) const {
  // Every kforge header a kernel could include, plus headers it names with #include "..."
  // beside itself. System headers are covered by the compiler's version.
  std::vector<fs::path> headers;
  if (fs::exists(options_.include_dir / "kforge")) {
    for (const auto& entry : fs::recursive_directory_iterator(options_.include_dir / "kforge")) {
      if (entry.is_regular_file()) headers.push_back(entry.path());
    }
  }
  for (const auto& local : local_headers(file))
    headers.push_back(local);
  std::sort(headers.begin(), headers.end());
  Hasher h;
  for (const auto& p : headers)
    h.add(p.filename().string()).add(read_file(p));
  // CUTLASS's headers change together with its release, which version.h names.
  if (file.uses("cutlass")) h.add(read_file(cutlass_include_dir(file) / "cutlass" / "version.h"));
  return h.hex();
}

fs::path Compiler::cutlass_include_dir(const KernelFile& file) const {
  const fs::path& dir = options_.cutlass_include_dir;
  if (dir.empty() || !fs::exists(dir / "cutlass" / "cutlass.h")) {
    throw UsageError(fmt::format(
        "{} uses CUTLASS, whose headers are not {}: run scripts/setup (it unpacks the "
        "nvidia-cutlass wheel into .deps/), or set KFORGE_CUTLASS_INCLUDE to CUTLASS's include/",
        file.path.string(), dir.empty() ? "installed" : "in " + dir.string()));
  }
  return dir;
}

std::string Compiler::cache_key(const KernelFile& file, const Variant& variant) const {
  Hasher h;
  h.add("kforge-module-v1").add(file.source).add(headers_fingerprint(file));
  // Entries built with intermediates kept are separate, so asking for them never finds an
  // entry without them.
  h.add(options_.keep_intermediates ? "keep" : "");
  for (const auto& arg : command_line(file, variant, "SOURCE", "OUTPUT"))
    h.add(arg);
  h.add(compiler_version(variant.backend));
  return h.hex();
}

CompileResult Compiler::compile(const KernelFile& file, const Variant& variant) const {
  CompileResult result;
  result.variant = variant;
  const std::string key = cache_key(file, variant);
  const fs::path entry = options_.cache_dir / "modules" / key;
  const fs::path module = entry / "module.so";
  // The compiler's log is where the resources are read from (below), so an entry without it
  // is built again rather than reported with none.
  if (fs::exists(entry / "resources.json") && fs::exists(module) &&
      fs::exists(entry / "build.log")) {
    result.ok = true;
    result.from_cache = true;
    result.module = module;
    result.log = read_file(entry / "build.log");
    result.command = read_file(entry / "command.txt");
    // From the compiler's own output, so that an entry built before kforge read some part of
    // it reports that part too.
    result.resources = parse_ptxas_report(result.log);
    return result;
  }

  const fs::path staging = options_.cache_dir / "tmp" / (key + "." + unique_suffix());
  fs::create_directories(staging);
  const std::string ext = variant.backend == Backend::cuda ? ".cu" : ".cpp";
  write_file(staging / ("source" + ext), file.source);
  const auto cmd = command_line(file, variant, staging / ("source" + ext), staging / "module.so");
  result.command = fmt::format("{}", fmt::join(cmd, " "));

  const auto start = std::chrono::steady_clock::now();
  const CommandResult run = run_command(cmd, options_.time_limit);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.log = run.output;
  if (!run.ok()) {
    if (run.timed_out) {
      result.log +=
          fmt::format("\n[kforge] compiler timed out after {} s", options_.time_limit.count());
    }
    fs::remove_all(staging);
    return result;
  }
  result.resources = parse_ptxas_report(run.output);

  if (options_.keep_intermediates && variant.backend == Backend::cuda) {
    auto ptx_cmd = cmd;
    std::replace(ptx_cmd.begin(), ptx_cmd.end(), std::string("-shared"), std::string("-ptx"));
    ptx_cmd.back() = (staging / "module.ptx").string();
    run_command(ptx_cmd);
    auto cubin_cmd = cmd;
    std::replace(cubin_cmd.begin(), cubin_cmd.end(), std::string("-shared"), std::string("-cubin"));
    cubin_cmd.back() = (staging / "module.cubin").string();
    if (run_command(cubin_cmd).ok()) {
      // cuobjdump ships with the full toolkit, not with every nvcc install.
      fs::path cuobjdump = fs::path(options_.nvcc).parent_path() / "cuobjdump";
      if (!fs::exists(cuobjdump)) cuobjdump = "cuobjdump";
      try {
        const auto sass =
            run_command({cuobjdump.string(), "--dump-sass", (staging / "module.cubin").string()});
        if (sass.ok()) write_file(staging / "module.sass", sass.output);
      } catch (const Error&) {
        result.log += "\n[kforge] cuobjdump not found: no SASS kept";
      }
    }
  }

  write_file(staging / "build.log", result.log);
  write_file(staging / "command.txt", result.command);
  write_file(staging / "variant.txt", variant.describe() + "\n" + variant.key() + "\n");
  // resources.json is written last: its presence marks a complete entry.
  write_file(staging / "resources.json", resources_to_json(result.resources).dump(2));
  fs::create_directories(entry.parent_path());
  std::error_code ec;
  fs::rename(staging, entry, ec);
  if (ec) {
    // Another process finished the same entry first; it is identical, use it.
    fs::remove_all(staging);
    if (!fs::exists(entry / "resources.json")) {
      throw Error(fmt::format("cannot store module in {}: {}", entry.string(), ec.message()));
    }
  }
  result.ok = true;
  result.module = module;
  return result;
}

std::vector<CompileResult> Compiler::compile_all(const KernelFile& file,
                                                 const std::vector<Variant>& variants,
                                                 unsigned jobs) const {
  std::vector<std::pair<const KernelFile*, Variant>> work;
  for (const Variant& variant : variants)
    work.emplace_back(&file, variant);
  return compile_all(work, jobs);
}

std::vector<CompileResult> Compiler::compile_all(
    const std::vector<std::pair<const KernelFile*, Variant>>& work, unsigned jobs) const {
  std::vector<CompileResult> results(work.size());
  std::mutex error_mutex;
  std::exception_ptr error;
  parallel_for_each_claimed(work.size(), jobs, [&](size_t i) {
    try {
      results[i] = compile(*work[i].first, work[i].second);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  return results;
}

}  // namespace kforge
