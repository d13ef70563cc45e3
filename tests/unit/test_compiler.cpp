// Compiler and cache: CPU modules are built with the system compiler, so these run anywhere.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/parallel.h"
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
}

// Every CUDA kernel file in the repository compiles for sm_90a, each in the first dtype it
// declares (its other dtypes compile when the GPU checks run them; here they would add a fifth
// to the test's time on two cores). The compiles of all files share one pool of as many workers
// as there are cores, CUTLASS files (a minute or more each) first, so that no core waits while a
// long compile of one file runs alone.
TEST(CudaKernels, AllCompileForSm90a) {
  const fs::path dir = test::temp_dir("cuda-compile");
  CompilerOptions options;
  options.cache_dir = dir / "cache";
  const Compiler compiler(options);
  std::vector<KernelFile> sources;
  for (const fs::path root : {fs::path(test::kernels_dir()), fs::path(test::test_data_dir())}) {
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.path().extension() == ".cu") sources.push_back(KernelFile::load(entry.path()));
    }
  }
  std::stable_partition(sources.begin(), sources.end(),
                        [](const KernelFile& f) { return f.uses("cutlass"); });
  struct Job {
    const KernelFile* file;
    Variant variant;
  };
  std::vector<Job> jobs;
  for (const KernelFile& file : sources) {
    const DType d = file.dtypes.front();
    const Bindings context = {{"elem_bytes", static_cast<long long>(dtype_size(d))}};
    jobs.push_back({&file, Variant::make(file, file.with_derived(file.resolve_params(d), context),
                                         d, "sm_90a")});
  }
  std::vector<CompileResult> results(jobs.size());
  std::vector<std::string> errors(jobs.size());
  parallel_for_each_claimed(jobs.size(), 0, [&](size_t i) {
    try {
      results[i] = compiler.compile(*jobs[i].file, jobs[i].variant);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  });
  for (size_t i = 0; i < jobs.size(); ++i) {
    const CompileResult& r = results[i];
    EXPECT_TRUE(errors[i].empty()) << jobs[i].variant.describe() << ": " << errors[i];
    EXPECT_TRUE(r.ok) << jobs[i].variant.describe() << "\n" << r.log;
    EXPECT_FALSE(r.resources.functions.empty()) << jobs[i].variant.describe();
    std::cout << jobs[i].variant.describe() << ": " << r.seconds << " s\n";
  }
  EXPECT_GE(sources.size(), 2u);
}

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
