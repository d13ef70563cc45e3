// The loop's experiment evaluation on the CPU backend: a faster proposal is kept, one that does
// not compile, one that is wrong and one that cheats (the adversarial memo kernel) are each
// refused with their verdict and failing stage, and an unchanged file is not kept (no gain
// beyond both runs' spreads). Then the same through a task journal.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "check/checker.h"
#include "device/ceilings.h"
#include "loop/experiment.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

using test::read_text;

// rmsnorm_cpu.cpp with `from` replaced by `to` (once), written to `dir / name`.
fs::path edited(const fs::path& dir, const std::string& name, const std::string& from,
                const std::string& to) {
  std::string text = read_text(fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp");
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  std::ofstream(dir / name) << text;
  return dir / name;
}

const std::string kInvRms =
    "const acc_t inv_rms = acc_t(1) / std::sqrt(row_sum_of_squares(x_row, N) / acc_t(N) + eps);";

class LoopExperiment : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    CompilerOptions options;
    options.cache_dir = test::shared_module_cache();
    compiler_ = new Compiler(options);
    worker_ = new WorkerClient(WorkerOptions{"cpu", 0, test::kforge_binary()});
    checker_ = new Checker(*compiler_, *worker_);
    ceilings_ = new Ceilings(
        device_ceilings(*worker_, test::temp_dir("loop-ceilings"), false, [](const auto&) {}));
    dir_ = new fs::path(test::temp_dir("loop-experiment"));
    // The task's start: rmsnorm computing each row's sum of squares eight times.
    slow_ = new fs::path(edited(*dir_, "slow.cpp", kInvRms,
                                "acc_t sum = 0;\n"
                                "    for (int rep = 0; rep < 8; ++rep) {\n"
                                "      asm volatile(\"\" ::: \"memory\");\n"
                                "      sum = row_sum_of_squares(x_row, N) + sum * acc_t(0);\n"
                                "    }\n"
                                "    const acc_t inv_rms = acc_t(1) / std::sqrt(sum / acc_t(N) + "
                                "eps);"));
  }
  static void TearDownTestSuite() {
    delete checker_;
    delete worker_;
    delete compiler_;
    delete ceilings_;
    delete dir_;
    delete slow_;
  }

  ExperimentRecord evaluate(const fs::path& proposal, const fs::path& best) {
    LoopTask task;
    task.op = find_op("rmsnorm");
    task.sizes = {{"M", 1024}, {"N", 1024}};
    task.dtype = DType::f32;
    EvaluationOptions options;
    options.settings.max_seconds = 0.5;
    return evaluate_proposal(*checker_, *worker_, *ceilings_, task, proposal, best, options);
  }

  static Compiler* compiler_;
  static WorkerClient* worker_;
  static Checker* checker_;
  static Ceilings* ceilings_;
  static fs::path* dir_;
  static fs::path* slow_;
};
Compiler* LoopExperiment::compiler_ = nullptr;
WorkerClient* LoopExperiment::worker_ = nullptr;
Checker* LoopExperiment::checker_ = nullptr;
Ceilings* LoopExperiment::ceilings_ = nullptr;
fs::path* LoopExperiment::dir_ = nullptr;
fs::path* LoopExperiment::slow_ = nullptr;

TEST_F(LoopExperiment, KeepsOnlyACorrectAndClearlyFasterFile) {
  const fs::path library = fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp";
  const ExperimentRecord faster = evaluate(library, *slow_);
  EXPECT_EQ(faster.verdict, "KEEP") << faster.to_json().dump(2);
  EXPECT_TRUE(faster.kept);
  EXPECT_GT(faster.fields.value("gain_vs_best", 0.0), 1.5);
  EXPECT_GT(faster.fields.value("fastest_gain_vs_best", 0.0), 1.5);
  // A keep is confirmed by a second pair of timings.
  ASSERT_TRUE(faster.fields.contains("confirmation"));
  EXPECT_EQ(faster.fields["confirmation"].value("comparison", ""), "FASTER");

  const ExperimentRecord unchanged = evaluate(*slow_, *slow_);
  EXPECT_EQ(unchanged.verdict, "UNCHANGED") << unchanged.to_json().dump(2);
  EXPECT_FALSE(unchanged.kept);
  EXPECT_GT(unchanged.time_us, 0);  // the best, timed once for the record

  // The same code under another comment is timed, against the best before and after it.
  const fs::path recommented = *dir_ / "recommented.cpp";
  std::ofstream(recommented) << test::read_text(*slow_) << "// the same code\n";
  const ExperimentRecord same = evaluate(recommented, *slow_);
  EXPECT_EQ(same.verdict, "REVERT") << same.to_json().dump(2);
  // (On a busy host both medians' comparisons can still say FASTER; the fastest samples and the
  // confirming pair are what keep the file out then.)
  EXPECT_FALSE(same.kept);
  EXPECT_TRUE(same.fields.contains("best_again"));

  const ExperimentRecord slower = evaluate(*slow_, library);
  EXPECT_EQ(slower.verdict, "REVERT");
}

TEST_F(LoopExperiment, RefusesBrokenWrongAndCheatingFiles) {
  const ExperimentRecord broken =
      evaluate(edited(*dir_, "broken.cpp", kInvRms, "this does not compile;"), *slow_);
  EXPECT_EQ(broken.verdict, "COMPILE_ERROR");
  EXPECT_EQ(broken.fields.value("failing_stage", ""), "build");
  EXPECT_NE(broken.fields.value("compiler_log", "").find("error"), std::string::npos);

  const ExperimentRecord wrong =
      evaluate(edited(*dir_, "wrong.cpp", "v * inv_rms *", "v * inv_rms * acc_t(1.01) *"), *slow_);
  EXPECT_EQ(wrong.verdict, "WRONG");
  EXPECT_EQ(wrong.fields.value("failing_stage", ""), "smoke");
  EXPECT_FALSE(wrong.kept);

  const ExperimentRecord cheat =
      evaluate(fs::path(test::test_data_dir()) / "adversarial" / "memo_last.cpp", *slow_);
  EXPECT_FALSE(cheat.kept) << cheat.to_json().dump(2);
  EXPECT_EQ(cheat.verdict, "WRONG");

  const ExperimentRecord other_op =
      evaluate(fs::path(test::kernels_dir()) / "softmax" / "softmax_cpu.cpp", *slow_);
  EXPECT_EQ(other_op.verdict, "BAD_FILE");
}

// An agent's round through the journal: the journal saves the proposal, the evaluation reads
// the saved copy, and a kept one becomes the repository's file.
TEST_F(LoopExperiment, RunsThroughTheJournal) {
  TaskJournal journal = TaskJournal::open(*dir_ / "task", *slow_);
  const fs::path library = fs::path(test::kernels_dir()) / "rmsnorm" / "rmsnorm_cpu.cpp";
  const fs::path saved = journal.begin(read_text(library));
  ExperimentRecord r = evaluate(saved, journal.kernel_path());
  r.proposer = "test";
  r.note = "the library's file";
  const ExperimentRecord logged = journal.finish(r);
  EXPECT_TRUE(logged.kept);
  EXPECT_EQ(read_text(journal.kernel_path()), read_text(library));
}

}  // namespace
}  // namespace kforge
