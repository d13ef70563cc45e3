// The standalone export, for CUDA C++ users: the kernel files with their tuned parameters
// defined per variant, a C header (kforge_export.h), the size -> variant dispatch in C, a CMake
// file that builds them into the static library `kforge_export`, and an example program.
//
//   OUT/kforge_export.cmake       include() it from a CUDA project; link kforge_export
//   OUT/CMakeLists.txt            the example's project: cmake -S OUT -B build && cmake --build
//   build OUT/example/example.cu        runs every exported op at one covered size and times it
//   OUT/include/kforge_export.h   the API;  OUT/include/kforge/   the ABI and kernel headers
//   OUT/src/kforge_dispatch.c     sizes -> variants;  OUT/variants/*.cu   one unit per variant
//   OUT/kernels/<op>/             the kernel files, unmodified
//   OUT/kforge_export.json        the plan: device, variants, rows, provenance
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "compile/compiler.h"
#include "compile/linkage.h"
#include "core/error.h"
#include "export/export_target.h"

namespace kforge {
namespace fs = std::filesystem;
namespace {

// "90a" from "sm_90a": CMake's CUDA_ARCHITECTURES spelling.
std::string cmake_architecture(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) throw UsageError(fmt::format("not a CUDA arch: {}", arch));
  return arch.substr(3);
}

// `text` as the inside of a CMake quoted argument: its escapes and variable references taken
// literally. (A ';' still splits it where CMake reads the value as a list.)
std::string cmake_quoted(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\\' || c == '"' || c == '$') out += '\\';
    out += c;
  }
  return out;
}

// Whether any variant is built on CUTLASS.
bool uses_cutlass(const ExportPlan& plan) {
  return std::any_of(plan.ops.begin(), plan.ops.end(), [](const ExportOp& op) {
    return std::any_of(op.variants.begin(), op.variants.end(),
                       [](const ExportVariant& v) { return v.uses_cutlass; });
  });
}

// The variants' sources as CMake list lines, those built on CUTLASS alone when `cutlass_only`.
std::string variant_sources(const ExportPlan& plan, bool cutlass_only) {
  std::string sources;
  for (const ExportOp& op : plan.ops) {
    for (const ExportVariant& v : op.variants) {
      if (v.uses_cutlass || !cutlass_only)
        sources += fmt::format("    ${{KFORGE_EXPORT_DIR}}/variants/{}.cu\n", v.symbol);
    }
  }
  return sources;
}

// The CMake lines that build the CUTLASS variants as kforge's compiler does (its headers and
// cutlass_compile_flags()), for those sources alone; empty when no variant uses it.
std::string cutlass_cmake(const ExportPlan& plan, const ExportContext& context) {
  if (!uses_cutlass(plan)) return "";
  return fmt::format(
      "# Some variants are built on CUTLASS/CuTe (headers only): KFORGE_CUTLASS_INCLUDE is its\n"
      "# include/ folder, e.g. cutlass_library/source/include of `pip install nvidia-cutlass`.\n"
      "set(KFORGE_CUTLASS_INCLUDE \"{}\" CACHE PATH\n"
      "  \"CUTLASS's include/ folder (cutlass/, cute/) for the export's CUTLASS variants\")\n"
      "if(NOT EXISTS \"${{KFORGE_CUTLASS_INCLUDE}}/cutlass/cutlass.h\")\n"
      "  message(FATAL_ERROR \"kforge export: CUTLASS's headers are not in \"\n"
      "    \"'${{KFORGE_CUTLASS_INCLUDE}}': pass -DKFORGE_CUTLASS_INCLUDE=<CUTLASS>/include\")\n"
      "endif()\n"
      "set_source_files_properties(\n{}"
      "  PROPERTIES INCLUDE_DIRECTORIES \"${{KFORGE_CUTLASS_INCLUDE}}\"\n"
      "  COMPILE_OPTIONS \"{}\")\n",
      cmake_quoted(context.cutlass_include_dir.generic_string()), variant_sources(plan, true),
      fmt::join(cutlass_compile_flags(), ";"));
}

std::string cmake_file(const ExportPlan& plan, const ExportContext& context) {
  const std::string sources =
      "    ${KFORGE_EXPORT_DIR}/src/kforge_dispatch.c\n" + variant_sources(plan, false);
  return fmt::format(
      "# kforge export: tuned kernels for {}.\n"
      "# include() this file from a CMake project with the CUDA language enabled, then link the\n"
      "# target kforge_export. The kernels need the architecture they were tuned for ({}).\n"
      "cmake_minimum_required(VERSION 3.24)\n"
      "set(KFORGE_EXPORT_DIR ${{CMAKE_CURRENT_LIST_DIR}})\n"
      "find_package(CUDAToolkit REQUIRED)\n"
      "add_library(kforge_export STATIC\n{})\n"
      "target_include_directories(kforge_export PUBLIC ${{KFORGE_EXPORT_DIR}}/include)\n"
      "set_target_properties(kforge_export PROPERTIES CUDA_ARCHITECTURES {}\n"
      "  POSITION_INDEPENDENT_CODE ON)\n"
      "# The kernels are C++20; CMake does not know every nvcc's C++20 flag, so it is given.\n"
      "target_compile_options(kforge_export PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -O3>)\n"
      "target_link_libraries(kforge_export PUBLIC CUDA::cudart)\n"
      "{}"
      "set(KFORGE_EXPORT_ARCHITECTURES {})\n",
      export_provenance(plan, context), plan.arch, sources, cmake_architecture(plan.arch),
      cutlass_cmake(plan, context), cmake_architecture(plan.arch));
}

std::string example_cmake() {
  return "# The example program of a kforge export: builds the export and runs each op once.\n"
         "cmake_minimum_required(VERSION 3.24)\n"
         "project(kforge_export_example LANGUAGES C CXX CUDA)\n"
         "include(${CMAKE_CURRENT_SOURCE_DIR}/kforge_export.cmake)\n"
         "add_executable(kforge_export_example example/example.cu)\n"
         "set_target_properties(kforge_export_example PROPERTIES CUDA_ARCHITECTURES "
         "${KFORGE_EXPORT_ARCHITECTURES})\n"
         "target_link_libraries(kforge_export_example PRIVATE kforge_export)\n";
}

std::string host_type(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "__half";
    case DType::bf16:
      return "__nv_bfloat16";
    case DType::f32:
      return "float";
    case DType::i64:
      return "int64_t";
    case DType::i32:
      return "int32_t";
    default:
      throw Error(fmt::format("the example cannot hold {}", dtype_name(dtype)));
  }
}

// One function of the example: the op at `row`'s sizes, inputs drawn on the host, one call
// checked, then timed over 20 calls. Integer inputs (cross-entropy's targets) index the first
// input's last dimension.
std::string example_case(const ExportOp& op, const ExportRow& row, const std::string& function) {
  Sizes sizes = row.sizes;
  op.op->complete_sizes(sizes);
  const std::vector<TensorSpec> tensors = op.op->tensors();
  std::string body;
  std::string declarations;
  int inputs = 0;
  int outputs = 0;
  int64_t index_range = 0;
  for (const TensorSpec& t : tensors) {
    const std::vector<int64_t> shape = op.op->shape_of(t, sizes);
    const DType dtype = op.op->dtype_of(t, op.dtype);
    int64_t numel = 1;
    for (const int64_t d : shape)
      numel *= d;
    const int index = t.is_output ? outputs++ : inputs++;
    const std::string array = t.is_output ? "outputs" : "inputs";
    if (!t.is_output && index == 0 && !shape.empty()) index_range = shape.back();
    const std::string dims = fmt::format("{}", fmt::join(shape, ", "));
    body += fmt::format("  /* {}: {} [{}] */\n", t.name, dtype_name(dtype), dims);
    body += fmt::format(
        "  {{\n    const int64_t shape[] = {{{}}};\n"
        "    if (!make_tensor(&{}[{}], {}, {}, shape, {}, sizeof({}))) return 1;\n",
        dims.empty() ? "1" : dims, array, index, abi_dtype_name(dtype), shape.size(), numel,
        host_type(dtype));
    if (!t.is_output) {
      if (dtype == DType::i64 || dtype == DType::i32) {
        body += fmt::format("    fill_indices<{}>(&{}[{}], {});\n", host_type(dtype), array, index,
                            index_range);
      } else {
        body += fmt::format("    fill_values<{}>(&{}[{}], {});\n", host_type(dtype), array, index,
                            index + 1);
      }
    }
    body += "  }\n";
  }
  declarations += fmt::format("  kf_tensor inputs[{}] = {{}};\n  kf_tensor outputs[{}] = {{}};\n",
                              std::max(inputs, 1), std::max(outputs, 1));
  const std::vector<double> scalar_values = op.op->scalar_values(sizes);
  const std::string scalars = fmt::format("{:.17g}", fmt::join(scalar_values, ", "));
  declarations +=
      fmt::format("  const double scalars[] = {{{}}};\n", scalars.empty() ? "0" : scalars);
  std::string finite_checks;
  for (int o = 0; o < outputs; ++o) {
    const TensorSpec& t = tensors[inputs + o];
    finite_checks += fmt::format("  ok = ok && all_finite<{}>(&outputs[{}]);\n",
                                 host_type(op.op->dtype_of(t, op.dtype)), o);
  }
  return fmt::format(
      "// {0} {1} at {2}.\n"
      "static int {3}(cudaStream_t stream) {{\n"
      "{4}"
      "{5}"
      "  kf_args args = {{KFORGE_ABI_VERSION, {6}, inputs, {7}, outputs, {8}, scalars, stream}};\n"
      "  const char* variant = kforge_{0}_variant(&args);\n"
      "  const int status = kforge_{0}(&args);\n"
      "  if (status != KF_OK || cudaStreamSynchronize(stream) != cudaSuccess) {{\n"
      "    std::printf(\"%-24s %-6s %-22s failed: status %d, %s\\n\", \"{0}\", \"{1}\", \"{2}\", "
      "status,\n"
      "                cudaGetErrorString(cudaGetLastError()));\n"
      "    return 1;\n  }}\n"
      "  bool ok = true;\n{9}"
      "  const double us = time_calls(kforge_{0}, &args, stream);\n"
      "  std::printf(\"%-24s %-6s %-22s %-30s %9.2f us  outputs %s\\n\", \"{0}\", \"{1}\", "
      "\"{2}\", "
      "variant, us,\n"
      "              ok ? \"finite\" : \"NOT FINITE\");\n"
      "  for (int i = 0; i < {6}; ++i) cudaFree(inputs[i].data);\n"
      "  for (int i = 0; i < {7}; ++i) cudaFree(outputs[i].data);\n"
      "  return ok ? 0 : 1;\n}}\n",
      op.op->name(), dtype_name(op.dtype), op.op->format_shape(row.sizes), function, declarations,
      body, inputs, outputs, scalar_values.size(), finite_checks);
}

// The row an op's example runs: its default size when covered, else its largest.
const ExportRow& example_row(const ExportOp& op) {
  Sizes preferred = op.op->default_size();
  for (const ExportRow& r : op.rows) {
    bool same = true;
    for (const auto& [name, value] : r.sizes)
      same = same && preferred.count(name) && preferred.at(name) == value;
    if (same) return r;
  }
  const auto bytes = [&](const ExportRow& r) {
    Sizes sizes = r.sizes;
    op.op->complete_sizes(sizes);
    return op.op->cost(sizes, op.dtype).bytes;
  };
  const ExportRow* largest = &op.rows.front();
  for (const ExportRow& r : op.rows) {
    if (bytes(r) > bytes(*largest)) largest = &r;
  }
  return *largest;
}

std::string example_source(const ExportPlan& plan, const ExportContext& context) {
  std::string cases;
  std::string calls;
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    const ExportOp& op = plan.ops[i];
    const std::string function = fmt::format("run_{}_{}", op.op->name(), dtype_name(op.dtype));
    cases += fmt::format("\n{}", example_case(op, example_row(op), function));
    calls += fmt::format("  failures += {}(stream);\n", function);
  }
  return fmt::format(
      "// The example program of a kforge export ({}).\n"
      "// Runs every exported op once at one covered size on the current GPU, checks that the\n"
      "// call succeeds and its outputs are finite, and times 20 calls. It shows how to call the\n"
      "// export; correctness against a reference is what `kforge check` established.\n"
      "#include <cmath>\n#include <cstdint>\n#include <cstdio>\n#include <vector>\n\n"
      "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n\n"
      "#include \"kforge_export.h\"\n\n"
      "namespace {{\n\n"
      "// Inline: an example of one dtype leaves the others' unused.\n"
      "inline float to_float(float v) {{ return v; }}\n"
      "inline float to_float(__half v) {{ return __half2float(v); }}\n"
      "inline float to_float(__nv_bfloat16 v) {{ return __bfloat162float(v); }}\n"
      "template <typename T> T from_float(float v) {{ return T(v); }}\n"
      "template <> inline __half from_float<__half>(float v) {{ return __float2half(v); }}\n"
      "template <> inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {{\n"
      "  return __float2bfloat16(v);\n}}\n\n"
      "// A contiguous device tensor of `numel` elements of `bytes` each.\n"
      "bool make_tensor(kf_tensor* t, kf_dtype dtype, int ndim, const int64_t* shape, int64_t "
      "numel,\n"
      "                 size_t bytes) {{\n"
      "  t->dtype = dtype;\n  t->ndim = ndim;\n"
      "  int64_t stride = 1;\n"
      "  for (int i = ndim - 1; i >= 0; --i) {{\n"
      "    t->shape[i] = shape[i];\n    t->stride[i] = stride;\n    stride *= shape[i];\n  }}\n"
      "  if (cudaMalloc(&t->data, size_t(numel) * bytes) != cudaSuccess) {{\n"
      "    std::printf(\"cudaMalloc of %lld elements failed\\n\", (long long)numel);\n"
      "    return false;\n  }}\n"
      "  return true;\n}}\n\n"
      "int64_t numel_of(const kf_tensor* t) {{ return kf_numel(t); }}\n\n"
      "// Values in [-2, 2) from a fixed linear congruential sequence.\n"
      "template <typename T>\nvoid fill_values(kf_tensor* t, uint64_t seed) {{\n"
      "  std::vector<T> host(size_t(numel_of(t)));\n"
      "  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;\n"
      "  for (auto& v : host) {{\n"
      "    state = state * 6364136223846793005ull + 1442695040888963407ull;\n"
      "    v = from_float<T>(float(state >> 40) / float(1 << 24) * 4.0f - 2.0f);\n  }}\n"
      "  cudaMemcpy(t->data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);\n}}\n\n"
      "template <typename T>\nvoid fill_indices(kf_tensor* t, int64_t range) {{\n"
      "  std::vector<T> host(size_t(numel_of(t)));\n"
      "  for (size_t i = 0; i < host.size(); ++i) host[i] = T((i * 7919) % uint64_t(range));\n"
      "  cudaMemcpy(t->data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);\n}}\n\n"
      "template <typename T>\nbool all_finite(const kf_tensor* t) {{\n"
      "  std::vector<T> host(size_t(numel_of(t)));\n"
      "  cudaMemcpy(host.data(), t->data, host.size() * sizeof(T), cudaMemcpyDeviceToHost);\n"
      "  for (const T& v : host) {{\n    if (!std::isfinite(to_float(v))) return false;\n  }}\n"
      "  return true;\n}}\n\n"
      "// Mean time of 20 calls after 3 warm-up calls, in microseconds (L2 not flushed).\n"
      "double time_calls(int (*run)(const kf_args*), const kf_args* args, cudaStream_t stream) "
      "{{\n"
      "  for (int i = 0; i < 3; ++i) run(args);\n"
      "  cudaEvent_t start, stop;\n  cudaEventCreate(&start);\n  cudaEventCreate(&stop);\n"
      "  cudaEventRecord(start, stream);\n"
      "  for (int i = 0; i < 20; ++i) run(args);\n"
      "  cudaEventRecord(stop, stream);\n  cudaEventSynchronize(stop);\n"
      "  float ms = 0;\n  cudaEventElapsedTime(&ms, start, stop);\n"
      "  cudaEventDestroy(start);\n  cudaEventDestroy(stop);\n"
      "  return ms * 1000.0 / 20;\n}}\n"
      "{}\n"
      "}}  // namespace\n\n"
      "int main() {{\n"
      "  cudaStream_t stream;\n"
      "  if (cudaStreamCreate(&stream) != cudaSuccess) {{\n"
      "    std::printf(\"no CUDA device: %s\\n\", cudaGetErrorString(cudaGetLastError()));\n"
      "    return 1;\n  }}\n"
      "  int failures = 0;\n{}"
      "  cudaStreamDestroy(stream);\n"
      "  std::printf(\"%s\\n\", failures == 0 ? \"all ops ran\" : \"some ops failed\");\n"
      "  return failures == 0 ? 0 : 1;\n}}\n",
      export_provenance(plan, context), cases, calls);
}

std::string readme(const ExportPlan& plan, const ExportContext& context) {
  std::string rows;
  for (const ExportOp& op : plan.ops) {
    for (const ExportRow& r : op.rows) {
      const ExportVariant& v = op.variants[r.variant];
      rows +=
          fmt::format("| {} | {} | {} | {} | {} | {} |\n", op.op->name(), dtype_name(op.dtype),
                      op.op->format_shape(r.sizes), v.symbol, v.file.filename().string(), r.choice);
    }
  }
  return fmt::format(
      "# kforge export (standalone CUDA)\n\n"
      "Tuned kernels for {}.\n\n"
      "Build and run the example (it runs every op once at one covered size):\n\n"
      "```sh\ncmake -S . -B build -G Ninja && cmake --build build && "
      "./build/kforge_export_example\n"
      "```\n\n"
      "In your own CMake project with CUDA enabled: `include(path/to/kforge_export.cmake)` and\n"
      "link `kforge_export`; call `kforge_<op>(const kf_args*)` from `kforge_export.h`. A call\n"
      "whose dtype or sizes are not listed below returns `KF_ERR_UNSUPPORTED` and launches\n"
      "nothing: run your own op then.\n\n{}"
      "| op | dtype | sizes | variant | kernel file | kforge's choice |\n"
      "|---|---|---|---|---|---|\n{}",
      export_provenance(plan, context),
      !uses_cutlass(plan)
          ? ""
          : "Some variants are built on CUTLASS's headers: CMake takes them from "
            "`KFORGE_CUTLASS_INCLUDE`\n(default: where kforge found them at export; "
            "`-DKFORGE_CUTLASS_INCLUDE=<CUTLASS>/include` to change).\n\n",
      rows);
}

// The library's kernel files are held to the linkage rule by the compile test; a file from
// elsewhere (a loop task's best, staged under another name) is compiled here and refused when it
// defines code of its own with external linkage, which could collide with the library's variants
// of the op in the export's one library.
void refuse_shared_symbols(const ExportPlan& plan) {
  const Compiler compiler;
  for (const ExportOp& op : plan.ops) {
    for (const ExportVariant& v : op.variants) {
      if (is_library_file(v.file)) continue;
      const KernelFile file = KernelFile::load(v.file);
      fmt::print(stderr, "{}: compiling it to check what it links (nvcc)\n",
                 v.file.filename().string());
      const CompileResult built = compiler.compile(file, v.variant);
      if (!built.ok)
        throw Error(fmt::format("{} does not compile: {}", v.variant.describe(), built.log));
      const std::vector<std::string> shared =
          symbols_shared_between_variants(built.module, file.source);
      if (shared.empty()) continue;
      throw Error(fmt::format("{}\n(Or export without that file.)",
                              describe_shared_symbols(v.file.filename().string(), shared)));
    }
  }
}

class StandaloneTarget final : public ExportTarget {
 public:
  std::string_view name() const override { return "standalone"; }
  std::string_view description() const override {
    return "CUDA sources with the tuned parameters, a C header, a CMake file and an example";
  }

  std::vector<fs::path> write(const ExportPlan& plan, const ExportContext& context,
                              const fs::path& out) const override {
    refuse_shared_symbols(plan);
    std::vector<fs::path> written;
    copy_export_sources(plan, context, out, written);
    write_export_file(out, "include/kforge_export.h", export_header(plan, context), written);
    write_export_file(out, "src/kforge_dispatch.c", dispatch_source(plan, context), written);
    for (const ExportOp& op : plan.ops) {
      for (const ExportVariant& v : op.variants) {
        write_export_file(out, fs::path("variants") / (v.symbol + ".cu"),
                          variant_source(op, v, "../kernels"), written);
      }
    }
    write_export_file(out, "kforge_export.cmake", cmake_file(plan, context), written);
    write_export_file(out, "CMakeLists.txt", example_cmake(), written);
    write_export_file(out, "example/example.cu", example_source(plan, context), written);
    write_export_file(out, "README.md", readme(plan, context), written);
    write_export_file(out, "kforge_export.json",
                      export_manifest(plan, context, name()).dump(2) + "\n", written);
    return written;
  }
};

}  // namespace

const ExportTarget& standalone_export_target() {
  static const StandaloneTarget target;
  return target;
}

}  // namespace kforge
