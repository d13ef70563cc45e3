// `kforge kernelbench` on the GPU (CTest label `gpu`): problems checked against their own
// PyTorch Models, a scripted edit that computes nothing reverted as WRONG, a Model that differs
// from the op it names failing every kforge kernel, and fast_p counting passed problems only.
// Skipped where no CUDA device is visible or python3 cannot import torch with CUDA.
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <regex>

#include <gtest/gtest.h>

#include "core/json_file.h"
#include "core/process.h"
#include "device/backend.h"
#include "test_support.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

TEST(KernelBenchGpu, ScoresProblemsAgainstTheirModels) {
  if (list_cuda_devices().empty()) GTEST_SKIP() << "no CUDA device";
  if (!run_command({"python3", "-c", "import torch; assert torch.cuda.is_available()"},
                   std::chrono::minutes(2))
           .ok())
    GTEST_SKIP() << "python3 cannot import torch with CUDA";
  const fs::path dir = test::temp_dir("kernelbench-gpu");
  const fs::path problems = dir / "problems";
  fs::create_directories(problems);
  const fs::path data = fs::path(test::test_data_dir()) / "kernelbench";
  for (const char* name : {"softmax_of_double.py", "small_cross_entropy.py"})
    fs::copy_file(data / name, problems / name);
  fs::copy_file(test::source_root() / "examples" / "kernelbench" / "level1" / "01_softmax.py",
                problems / "01_softmax.py");

  // One scripted edit for 01_softmax: the library's starter with an entry that launches
  // nothing, so its poisoned output comes back as it was.
  const fs::path edits = dir / "edits" / "01_softmax";
  fs::create_directories(edits);
  std::string starter = read_text_file(test::kernels_dir() + "/softmax/softmax_rowblock.cu");
  starter =
      std::regex_replace(starter, std::regex(R"(\n\s*\* op: softmax)"), "\n * op: kb:01_softmax");
  starter =
      std::regex_replace(starter, std::regex(R"((int kforge_run\(const kf_args\* args\) \{))"),
                         "$1\n  if (args) return KF_OK;");
  std::ofstream(edits / "1-skip.cu") << starter;

  // Both runs below are one kforge commit, even from a modified tree (whose scores are never
  // reused otherwise).
  ::setenv("KFORGE_GIT_SHA", "kernelbench-gpu-test", 1);
  ::unsetenv("KFORGE_GIT_DIRTY");
  const fs::path json = dir / "score.json";
  const CommandResult r =
      run_command({test::kforge_binary(), "kernelbench", problems.string(), "--workspace",
                   (dir / "ws").string(), "--propose", "scripted:" + (dir / "edits").string(),
                   "--max-seconds", "0.2", "--json", json.string()},
                  std::chrono::minutes(30));
  std::cout << r.output;
  ASSERT_TRUE(r.ok()) << r.output;
  const nlohmann::json score = read_json_file(json);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& p : score.at("problems"))
    by_name[p.at("problem")] = p;
  EXPECT_EQ(by_name.at("01_softmax").at("check"), "OK");
  EXPECT_EQ(by_name.at("small_cross_entropy").at("check"), "OK");
  EXPECT_EQ(by_name.at("softmax_of_double").at("check"), "WRONG");
  // Two of three passed; the failed one never counts, however fast.
  EXPECT_NEAR(score.at("fast_p").at("0").at("eager").get<double>(), 2.0 / 3, 1e-9);
  // The edit that computed nothing was reverted as WRONG and the start stayed the best.
  const std::string log = read_text_file(dir / "ws" / "01_softmax" / "results.tsv");
  EXPECT_NE(log.find("WRONG"), std::string::npos) << log;

  // A second run finds every task's score saved beside it, for the same kernel, problem and
  // device, and reuses it: the same verdicts and fast_p, nothing measured again.
  const fs::path json_again = dir / "score-again.json";
  const CommandResult again =
      run_command({test::kforge_binary(), "kernelbench", problems.string(), "--workspace",
                   (dir / "ws").string(), "--max-seconds", "0.2", "--json", json_again.string()},
                  std::chrono::minutes(10));
  ASSERT_TRUE(again.ok()) << again.output;
  int reused = 0;
  for (size_t at = again.output.find("scored earlier"); at != std::string::npos;
       at = again.output.find("scored earlier", at + 1))
    ++reused;
  EXPECT_EQ(reused, 3) << again.output;
  EXPECT_EQ(read_json_file(json_again).at("fast_p"), score.at("fast_p"));
}

// Problems as KernelBench publishes them, without KFORGE_OP: kforge runs each Model beside the
// references of the ops whose signature it has. Needs PyTorch only (the CPU backend).
TEST(KernelBenchGpu, IdentifiesTheOpsOfProblemsThatNameNone) {
  if (!find_python_with("torch")) GTEST_SKIP() << "no python3 that imports torch";
  const fs::path dir = test::temp_dir("kernelbench-unnamed");
  const fs::path data = fs::path(test::test_data_dir()) / "kernelbench" / "unnamed";
  const auto task = [&](const char* file) {
    return run_command({test::kforge_binary(), "task", "--kernelbench", (data / file).string(),
                        "--workspace", (dir / "ws").string(), "--backend", "cpu"},
                       std::chrono::minutes(5));
  };
  const CommandResult rms = task("rms_norm.py");
  ASSERT_TRUE(rms.ok()) << rms.output;
  EXPECT_NE(rms.output.find("rmsnorm, identified by its Model agreeing with rmsnorm's reference"),
            std::string::npos)
      << rms.output;
  const CommandResult softmax = task("softmax.py");
  ASSERT_TRUE(softmax.ok()) << softmax.output;
  EXPECT_NE(softmax.output.find("softmax, identified by its Model agreeing"), std::string::npos)
      << softmax.output;
  // Softmax's signature, a ReLU's Model: refused, not taken as softmax.
  const CommandResult relu = task("relu.py");
  EXPECT_EQ(relu.exit_code, 2) << relu.output;
  EXPECT_NE(relu.output.find("computes none of the ops whose signature it has (not softmax:"),
            std::string::npos)
      << relu.output;
}

}  // namespace
}  // namespace kforge
