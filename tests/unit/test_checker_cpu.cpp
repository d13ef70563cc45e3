// The five-stage check on the CPU backend: the starters pass, and every planted fault gets its
// verdict in the stage meant to catch it. Problems are capped in size to keep CI quick.
#include <algorithm>

#include <gtest/gtest.h>

#include "checker_fixture.h"

namespace kforge {
namespace {

using test::CheckerFixture;

CheckOptions quick() {
  CheckOptions o;
  o.max_elements = int64_t{1} << 22;
  o.timeout = std::chrono::seconds(20);
  return o;
}

std::string fault(const std::string& name) {
  return test::test_data_dir() + "/faulty/" + name;
}

// Every op's CPU starter passes all five stages (problems capped in size).
class CpuStarterTest : public CheckerFixture, public ::testing::WithParamInterface<std::string> {};

TEST_P(CpuStarterTest, PassesAllStages) {
  const auto out =
      run_check(test::kernels_dir() + "/" + starter_kernel(GetParam(), false, DType::f32), quick());
  EXPECT_TRUE(out.report.passed()) << out.report.detail;
  for (const auto& s : out.report.stages)
    EXPECT_TRUE(s.ran && s.passed) << s.name;
}

INSTANTIATE_TEST_SUITE_P(AllOps, CpuStarterTest,
                         ::testing::Values("matmul", "softmax", "layernorm", "rmsnorm",
                                           "flash_attention", "fused_mlp", "cross_entropy",
                                           "rotary_embedding", "rotary_embedding_half", "reduce",
                                           "matmul_bias", "matmul_residual"),
                         [](const auto& info) { return info.param; });

TEST_F(CheckerFixture, RmsnormCpuStarterPasses) {
  const auto out = run_check(test::kernels_dir() + "/rmsnorm/rmsnorm_cpu.cpp", quick());
  EXPECT_TRUE(out.report.passed()) << out.report.detail;
  EXPECT_EQ(out.report.stages.size(), 5u);
  for (const auto& s : out.report.stages) {
    EXPECT_TRUE(s.ran && s.passed) << s.name;
    EXPECT_GT(s.cases - s.skipped, 0) << s.name;
  }
}

TEST_F(CheckerFixture, SoftmaxCpuStarterPasses) {
  const auto out = run_check(test::kernels_dir() + "/softmax/softmax_cpu.cpp", quick());
  EXPECT_TRUE(out.report.passed()) << out.report.detail;
}

struct PlantedFault {
  const char* file;
  Verdict verdict;
  const char* stage;
  const char* detail;  // a fragment the report's detail must contain
};

void PrintTo(const PlantedFault& f, std::ostream* os) {
  *os << f.file;
}

class PlantedFaultTest : public CheckerFixture,
                         public ::testing::WithParamInterface<PlantedFault> {};

TEST_P(PlantedFaultTest, GetsItsVerdict) {
  const PlantedFault& f = GetParam();
  CheckOptions options = quick();
  if (f.verdict == Verdict::timeout) options.timeout = std::chrono::seconds(3);
  const auto out = run_check(fault(f.file), options);
  EXPECT_EQ(verdict_name(out.report.verdict), verdict_name(f.verdict)) << out.report.detail;
  EXPECT_EQ(out.failed_stage, f.stage) << out.report.detail;
  EXPECT_NE(out.report.detail.find(f.detail), std::string::npos) << out.report.detail;
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, PlantedFaultTest,
    ::testing::Values(
        PlantedFault{"segfault.cpp", Verdict::crash, "smoke", "signal 11"},
        PlantedFault{"infinite_loop.cpp", Verdict::timeout, "smoke", "worker killed"},
        PlantedFault{"wrong_result.cpp", Verdict::wrong, "smoke", "out of tolerance"},
        PlantedFault{"unwritten_last.cpp", Verdict::wrong, "smoke",
                     "NaN where the reference is finite"},
        PlantedFault{"nondeterministic.cpp", Verdict::wrong, "determinism", "not deterministic"},
        PlantedFault{"ignores_weight.cpp", Verdict::wrong, "smoke", "out of tolerance"},
        PlantedFault{"ignores_bias.cpp", Verdict::wrong, "smoke", "out of tolerance"},
        PlantedFault{"nan_large.cpp", Verdict::wrong, "stability", "near_max"},
        PlantedFault{"oom.cpp", Verdict::oom, "smoke", "allocation"},
        PlantedFault{"bad_syntax.cpp", Verdict::compile_error, "build", "error"}),
    [](const auto& info) {
      std::string name = info.param.file;
      return name.substr(0, name.find('.'));
    });

TEST_F(CheckerFixture, RejectsVariantBreakingARequirement) {
  CheckOptions options = quick();
  options.params = {{"UNROLL", 3}};
  const auto out = run_check(test::test_data_dir() + "/constrained.cpp", options);
  EXPECT_EQ(out.report.verdict, Verdict::rejected) << out.report.detail;
  EXPECT_NE(out.report.detail.find("require 'UNROLL % 2 == 0 || UNROLL == 1' (line 6)"),
            std::string::npos)
      << out.report.detail;
  ASSERT_EQ(out.report.builds.size(), 1u);
  EXPECT_TRUE(out.report.builds[0].module.empty());  // never compiled
}

// `kforge check --table` compiles the variants it will check all at once: each check then
// finds its build in the cache. A variant the header refuses is left out, not compiled.
TEST_F(CheckerFixture, PrebuildFillsTheCacheWithTheAllowedVariants) {
  CompilerOptions compiler_options;
  compiler_options.cache_dir = test::temp_dir("prebuild-cache");
  const Compiler fresh(compiler_options);
  const KernelFile file = KernelFile::load(test::test_data_dir() + "/constrained.cpp");
  Checker checker(fresh, worker_for("cpu"));
  const auto request = [&](long long unroll) {
    return Checker::BuildRequest{&file, file.resolve_params(DType::f32, {{"UNROLL", unroll}}),
                                 DType::f32};
  };
  // UNROLL 4 twice (without sizes, and at sizes, from which nothing is derived here): one build.
  const Sizes sizes = {{"M", 64}, {"N", 256}};
  Checker::BuildRequest at_sizes = request(4);
  at_sizes.sizes = &sizes;
  checker.prebuild({request(1), request(4), at_sizes, request(3)}, "");

  const std::string arch = worker_for("cpu").device().default_arch();
  for (const long long unroll : {1, 4}) {
    Verdict verdict{};
    const CompileResult r =
        checker.build(file, file.resolve_params(DType::f32, {{"UNROLL", unroll}}), DType::f32, arch,
                      nullptr, &verdict);
    EXPECT_EQ(verdict, Verdict::ok) << r.log;
    EXPECT_TRUE(r.from_cache) << "UNROLL " << unroll << " was compiled again";
  }
  // Neither UNROLL 3 (refused) nor the default, UNROLL 2 (not asked for), was built.
  EXPECT_EQ(
      std::distance(std::filesystem::directory_iterator(compiler_options.cache_dir / "modules"),
                    std::filesystem::directory_iterator()),
      2);
}

TEST_F(CheckerFixture, WorkerSurvivesCrashes) {
  // After a crash, the next check gets a fresh worker and passes.
  run_check(fault("segfault.cpp"), quick());
  CheckOptions options = quick();
  options.stages = {"smoke"};
  const auto out = run_check(test::kernels_dir() + "/rmsnorm/rmsnorm_cpu.cpp", options);
  EXPECT_TRUE(out.report.passed()) << out.report.detail;
  EXPECT_GE(cpu_worker_->workers_started(), 2);
}

// Without a size cap, the CPU backend checks a matmul at the sizes its host reference covers and
// does not run the others (it has nothing to compare them with): the fixture spins past the
// reference's limit, so running such a case would end in TIMEOUT.
TEST_F(CheckerFixture, CpuDoesNotRunSizesItCannotCompare) {
  CheckOptions options;
  options.stages = {"shape_sweep"};
  options.timeout = std::chrono::seconds(20);
  const auto out =
      run_check(test::test_data_dir() + "/cpu/matmul_slow_past_host_reference.cpp", options);
  EXPECT_TRUE(out.report.passed()) << out.report.detail;
  const auto sweep_stage =
      std::find_if(out.report.stages.begin(), out.report.stages.end(),
                   [](const StageReport& s) { return s.name == "shape_sweep"; });
  ASSERT_NE(sweep_stage, out.report.stages.end());
  const StageReport& sweep = *sweep_stage;
  int compared = 0, not_run = 0;
  for (const CaseResult& c : sweep.results) {
    if (!c.skipped) {
      ++compared;
      continue;
    }
    ++not_run;
    EXPECT_NE(c.detail.find("no reference at this size"), std::string::npos) << c.label;
  }
  EXPECT_GE(compared, 3);  // tiny, small, medium
  EXPECT_GE(not_run, 1);   // large, xlarge, ...
}

}  // namespace
}  // namespace kforge
