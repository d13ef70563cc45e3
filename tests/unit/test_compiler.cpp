// Compiler and cache: CPU modules are built with the system compiler, so these run anywhere.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "compile/compiler.h"
#include "compile/kernel_text.h"
#include "compile/linkage.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/process.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

const char* kSource = R"(/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f32
 * param: SCALE = 1 in {1, 2}
 */
#include "kforge/elem_cpu.h"
KFORGE_ENTRY int kforge_run(const kf_args* args) { return args->num_inputs == SCALE ? 0 : 1; }
)";

class CompilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir("compiler");
    // A private copy of the include directory, so one test can change a header.
    fs::copy(test::source_root() / "include", dir_ / "include", fs::copy_options::recursive);
    options_.cache_dir = dir_ / "cache";
    options_.include_dir = dir_ / "include";
  }
  KernelFile write_kernel(const std::string& text) {
    const fs::path path = dir_ / "k.cpp";
    std::ofstream(path) << text;
    return KernelFile::load(path);
  }
  fs::path dir_;
  CompilerOptions options_;
};

TEST_F(CompilerTest, CachesAndInvalidates) {
  const Compiler compiler(options_);
  const KernelFile file = write_kernel(kSource);
  const Variant v1 = Variant::make(file, {{"SCALE", 1}}, DType::f32, "host");

  const CompileResult first = compiler.compile(file, v1);
  ASSERT_TRUE(first.ok) << first.log;
  EXPECT_FALSE(first.from_cache);
  EXPECT_TRUE(fs::exists(first.module));

  const CompileResult again = compiler.compile(file, v1);
  ASSERT_TRUE(again.ok);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.module, first.module);

  // A different parameter value is a different module.
  const Variant v2 = Variant::make(file, {{"SCALE", 2}}, DType::f32, "host");
  EXPECT_NE(compiler.cache_key(file, v2), compiler.cache_key(file, v1));
  EXPECT_FALSE(compiler.compile(file, v2).from_cache);

  // Changing the source invalidates.
  const KernelFile edited = write_kernel(std::string(kSource) + "// edited\n");
  EXPECT_NE(compiler.cache_key(edited, v1), compiler.cache_key(file, v1));

  // Changing a kforge header the kernel may include invalidates.
  const std::string before = compiler.cache_key(file, v1);
  std::ofstream(dir_ / "include" / "kforge" / "elem_cpu.h", std::ios::app) << "// changed\n";
  EXPECT_NE(compiler.cache_key(file, v1), before);

  // Changing the compiler flags (here: the compiler itself) invalidates.
  CompilerOptions other = options_;
  other.cxx = "g++";
  options_.cxx = "c++";
  EXPECT_NE(Compiler(other).cache_key(file, v1), Compiler(options_).cache_key(file, v1));

  // No temporary directories are left behind.
  EXPECT_TRUE(fs::is_empty(options_.cache_dir / "tmp"));
}

// A cache hit reads the resources from the compiler's log kept with the module, so an entry
// built before kforge read some note of ptxas's (here: serialized wgmma) reports it too.
TEST_F(CompilerTest, ACacheHitReadsTheCompilersLogAgain) {
  const Compiler compiler(options_);
  const KernelFile file = write_kernel(kSource);
  const Variant v = Variant::make(file, {{"SCALE", 1}}, DType::f32, "host");
  const CompileResult first = compiler.compile(file, v);
  ASSERT_TRUE(first.ok) << first.log;
  EXPECT_TRUE(first.resources.functions.empty()) << "a CPU module has no ptxas report";

  const fs::path log = first.module.parent_path() / "build.log";
  ASSERT_TRUE(fs::exists(log));
  std::ofstream(log, std::ios::app)
      << "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
         "serialized due to a reason in the function '_Z1kv'\n"
         "ptxas info    : Function properties for _Z1kv\n"
         "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
         "ptxas info    : Used 168 registers, used 16 barriers\n";
  const CompileResult again = compiler.compile(file, v);
  ASSERT_TRUE(again.from_cache);
  ASSERT_EQ(again.resources.functions.size(), 1u);
  EXPECT_EQ(again.resources.functions[0].registers, 168);
  EXPECT_EQ(again.resources.serialized_wgmma(), "a reason");

  // Without its log an entry is built again, not reported with no resources.
  fs::remove(log);
  const CompileResult rebuilt = compiler.compile(file, v);
  ASSERT_TRUE(rebuilt.ok) << rebuilt.log;
  EXPECT_FALSE(rebuilt.from_cache);
}

TEST_F(CompilerTest, ReportsCompilerLogOnFailure) {
  const Compiler compiler(options_);
  const KernelFile file = write_kernel(std::string(kSource) + "this is not C++;\n");
  const CompileResult r =
      compiler.compile(file, Variant::make(file, {{"SCALE", 1}}, DType::f32, "host"));
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.log.find("error"), std::string::npos) << r.log;
  EXPECT_FALSE(fs::exists(options_.cache_dir / "modules" / compiler.cache_key(file, r.variant)));
}

TEST_F(CompilerTest, CompilesInParallel) {
  const Compiler compiler(options_);
  const KernelFile file = write_kernel(kSource);
  std::vector<Variant> variants;
  for (const DType d : {DType::f32}) {
    for (const long long scale : {1, 2})
      variants.push_back(Variant::make(file, {{"SCALE", scale}}, d, "host"));
  }
  const auto results = compiler.compile_all(file, variants, 2);
  ASSERT_EQ(results.size(), 2u);
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].ok) << results[i].log;
    EXPECT_EQ(results[i].variant, variants[i]);
  }
}

// A file that uses CUTLASS gets its headers on the command line and their release in its cache
// key; without them, compiling it says how to install them.
TEST_F(CompilerTest, FilesUsingCutlassNeedItsHeaders) {
  const fs::path path = dir_ / "k.cu";
  std::ofstream(path) << "/* kforge\n * op: rmsnorm\n * backend: cuda\n * dtypes: f32\n"
                         " * uses: cutlass\n */\n#include <cutlass/cutlass.h>\n";
  const KernelFile file = KernelFile::load(path);
  const Variant variant = Variant::make(file, {}, DType::f32, "sm_90a");

  options_.cutlass_include_dir = dir_ / "no-cutlass";
  try {
    Compiler(options_).compile(file, variant);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("uses CUTLASS, whose headers are not in"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("scripts/setup"), std::string::npos) << e.what();
  }

  const fs::path fake = dir_ / "cutlass-include";
  fs::create_directories(fake / "cutlass");
  std::ofstream(fake / "cutlass" / "cutlass.h") << "#pragma once\n";
  std::ofstream(fake / "cutlass" / "version.h") << "#define CUTLASS_MAJOR 4\n";
  options_.cutlass_include_dir = fake;
  const std::string key = Compiler(options_).cache_key(file, variant);
  std::ofstream(fake / "cutlass" / "version.h") << "#define CUTLASS_MAJOR 5\n";
  EXPECT_NE(Compiler(options_).cache_key(file, variant), key);
  const CompileResult r = Compiler(options_).compile(file, variant);
  EXPECT_NE(r.command.find("-I" + fake.string()), std::string::npos) << r.command;
  EXPECT_NE(r.command.find("--expt-relaxed-constexpr"), std::string::npos) << r.command;
}

TEST(PtxasReport, ParsesResources) {
  const std::string log = R"(ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90a'
ptxas info    : Function properties for _Z6kernelPf
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 368 bytes cmem[0]
ptxas info    : Function properties for _Z5otherv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 368 bytes cmem[0]
)";
  const ResourceReport r = parse_ptxas_report(log);
  ASSERT_EQ(r.functions.size(), 2u);
  EXPECT_EQ(r.functions[0].registers, 40);
  EXPECT_EQ(r.functions[0].static_shared_bytes, 256);
  EXPECT_EQ(r.functions[0].stack_frame_bytes, 16);
  EXPECT_EQ(r.max_registers(), 40);
  EXPECT_TRUE(r.spills());
  EXPECT_EQ(r.functions[1].static_shared_bytes, 0);
  EXPECT_EQ(r.serialized_wgmma(), "");
  EXPECT_EQ(r.summary().find("WGMMA"), std::string::npos);
}

// ptxas's note that it serializes a function's wgmma instructions (as ptxas 13.0 prints it, the
// doubled space included) comes before the function's properties and names it.
TEST(PtxasReport, NotesSerializedWgmma) {
  const std::string log =
      "ptxas info    : (C7519) warpgroup.arrive is injected in around line 1452 by compiler to "
      "allow use of registers in GMMA in function '_Z4gemmv'\n"
      "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
      "between start and end of the pipeline stage in the function '_Z4gemmv'\n"
      "ptxas info    : Function properties for _Z5otherv\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 74 registers, used 1 barriers\n"
      "ptxas info    : Function properties for _Z4gemmv\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 16 barriers\n";
  const ResourceReport r = parse_ptxas_report(log);
  ASSERT_EQ(r.functions.size(), 2u);
  EXPECT_EQ(r.functions[0].serialized_wgmma, "");
  EXPECT_EQ(r.functions[1].function, "_Z4gemmv");
  const std::string reason =
      "non wgmma instructions reading accumulator registers of a wgmma between start and end of "
      "the pipeline stage";
  EXPECT_EQ(r.functions[1].serialized_wgmma, reason);
  EXPECT_EQ(r.serialized_wgmma(), reason);
  EXPECT_NE(r.summary().find("WGMMA SERIALIZED (" + reason + ")"), std::string::npos)
      << r.summary();
  EXPECT_FALSE(r.spills());
}

// Every CUDA kernel file in the repository, CUTLASS files first (each takes minutes on a CI core;
// the others seconds).
std::vector<fs::path> cuda_kernel_files() {
  std::vector<fs::path> files;
  for (const fs::path root : {fs::path(test::kernels_dir()), fs::path(test::test_data_dir())}) {
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.path().extension() == ".cu") files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  // A file that does not load goes with the short ones; its own test reports why.
  std::stable_partition(files.begin(), files.end(), [](const fs::path& f) {
    try {
      return KernelFile::load(f).uses("cutlass");
    } catch (const std::exception&) {
      return false;
    }
  });
  return files;
}

TEST(CudaKernels, TheRepositoryHasKernelFilesToCompile) {
  EXPECT_GE(cuda_kernel_files().size(), 2u);
}

// Each file compiles for sm_90a in the first dtype it declares (its other dtypes compile when
// the GPU checks run them; here they would add a fifth to CI's time on two cores). One test per
// file: ctest spreads the compiles over the cores beside the other tests, CMake starts these
// first (the long CUTLASS ones leading), and each file has the test timeout to itself.
class KernelCompiles : public ::testing::TestWithParam<fs::path> {};

// The check itself, on a small library built by the host compiler: what a file defines in its
// own namespace or globally is found, in demangled and in (too long to demangle) mangled form;
// its entry point, its anonymous namespace and kforge's namespaces are not.
TEST(CudaKernels, TheLinkageCheckFindsWhatAFileDefinesItself) {
  const fs::path dir = test::temp_dir("linkage-check");
  // kforge's namespace comes from a header, as in the library.
  std::ofstream(dir / "header.h")
      << "namespace kf { inline int shared_header(int x) { return x - 1; } }\n";
  const std::string source =
      "#include \"header.h\"\n"
      "namespace mine { int helper(int x) { return x + 1; } }\n"
      "int global_helper(int x) { return x * 2; }\n"
      "template <int N> int scaled(int x) { return N * x; }\n"
      "namespace { int hidden(int x) { return x ^ 3; } }\n"
      "extern \"C\" int kforge_run(int x) {\n"
      "  return mine::helper(x) + global_helper(x) + scaled<3>(x) + kf::shared_header(x) +\n"
      "         hidden(x);\n"
      "}\n";
  std::ofstream(dir / "file.cpp") << source;
  const CommandResult built =
      run_command({"c++", "-shared", "-fPIC", "-O0", (dir / "file.cpp").string(), "-o",
                   (dir / "file.so").string()});
  ASSERT_TRUE(built.ok()) << built.output;
  const std::string found =
      fmt::format("{}", fmt::join(symbols_shared_between_variants(dir / "file.so", source), "\n"));
  for (const char* name : {"mine::helper", "global_helper", "scaled<3>"})
    EXPECT_NE(found.find(name), std::string::npos) << name << " in:\n" << found;
  for (const char* name : {"kforge_run", "shared_header", "hidden"})
    EXPECT_EQ(found.find(name), std::string::npos) << name << " in:\n" << found;
  EXPECT_EQ(mangled_namespace("_ZN2kf17setup_gemm_deviceIN7cutlass4gemmEEEbiRNS_1XE"), "kf");
  EXPECT_EQ(mangled_namespace("_ZNK4mine1fEv"), "mine");
  EXPECT_EQ(demangled_namespace("int kf::f<cute::X>(mine::Y const&)"), "kf");
  EXPECT_EQ(demangled_namespace("int f<cute::X>(int)"), "");
}

TEST_P(KernelCompiles, ForSm90aInItsFirstDtype) {
  const KernelFile file = KernelFile::load(GetParam());
  CompilerOptions options;
  options.cache_dir = test::temp_dir("cuda-compile") / "cache";
  // This test is about whether each file compiles, not how fast: on a loaded two-core machine
  // matmul_bias's 128x256 cooperative kernel took over the default limit.
  options.time_limit = std::chrono::minutes(14);
  const DType d = file.dtypes.front();
  const Bindings context = {{"elem_bytes", static_cast<long long>(dtype_size(d))}};
  const Variant variant =
      Variant::make(file, file.with_derived(file.resolve_params(d), context), d, "sm_90a");
  const CompileResult r = Compiler(options).compile(file, variant);
  EXPECT_TRUE(r.ok) << variant.describe() << "\n" << r.log;
  EXPECT_FALSE(r.resources.functions.empty()) << variant.describe();
  // A file whose defaults ptxas serializes would have every tune reject them (occupancy.cpp).
  EXPECT_EQ(r.resources.serialized_wgmma(), "") << variant.describe();
  std::cout << variant.describe() << ": " << r.seconds << " s\n";
  if (r.ok && is_library_file(GetParam())) {
    const std::vector<std::string> shared = symbols_shared_between_variants(r.module, file.source);
    EXPECT_TRUE(shared.empty())
        << GetParam().filename().string()
        << " defines these with external linkage; a standalone export links its variants into "
           "one library, where the linker would keep one variant's copy for all (or refuse). "
           "Put them in an anonymous namespace or make them static:\n"
        << fmt::format("{}", fmt::join(shared, "\n"));
  }
}

INSTANTIATE_TEST_SUITE_P(Files, KernelCompiles, ::testing::ValuesIn(cuda_kernel_files()),
                         [](const auto& info) {
                           std::string name = info.param.stem().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// A library file copied out of its folder (a loop task's repository holds one file) still
// finds its op folder's shared header, and that header is part of its cache key.
TEST(CudaKernels, ACopyOfALibraryFileFindsItsOpFolderHeaders) {
  const std::filesystem::path dir = test::temp_dir("copied-library-file");
  const auto copy = dir / "proposal.cu";
  std::filesystem::copy_file(test::kernels_dir() + "/cross_entropy/cross_entropy_rowblock.cu",
                             copy);
  const KernelFile file = KernelFile::load(copy);
  const auto headers = local_headers(file);
  ASSERT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers[0].filename(), "cross_entropy_common.cuh");
  CompilerOptions options;
  options.cache_dir = dir / "cache";
  const Compiler compiler(options);
  const Bindings context = {{"elem_bytes", 2}};
  const auto r = compiler.compile(
      file, Variant::make(file, file.with_derived(file.resolve_params(DType::bf16), context),
                          DType::bf16, "sm_90a"));
  EXPECT_TRUE(r.ok) << r.log;
}

TEST(CudaKernels, KeepsPtxCubinAndSassOnRequest) {
  const std::filesystem::path dir = test::temp_dir("keep");
  CompilerOptions options;
  options.cache_dir = dir / "cache";
  options.keep_intermediates = true;
  const Compiler compiler(options);
  const KernelFile file = KernelFile::load(test::kernels_dir() + "/softmax/softmax_rowblock.cu");
  const Bindings context = {{"elem_bytes", 2}};
  const auto r = compiler.compile(
      file, Variant::make(file, file.with_derived(file.resolve_params(DType::bf16), context),
                          DType::bf16, "sm_90a"));
  ASSERT_TRUE(r.ok) << r.log;
  const auto entry = r.module.parent_path();
  EXPECT_TRUE(std::filesystem::exists(entry / "source.cu"));
  EXPECT_TRUE(std::filesystem::exists(entry / "module.ptx"));
  EXPECT_TRUE(std::filesystem::exists(entry / "module.cubin"));
  if (r.log.find("cuobjdump not found") == std::string::npos) {
    ASSERT_TRUE(std::filesystem::exists(entry / "module.sass"));
    EXPECT_NE(std::ifstream(entry / "module.sass").peek(), EOF);
  }
}

}  // namespace
}  // namespace kforge
