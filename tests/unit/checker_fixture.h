// Runs the five-stage check of a kernel file through real worker processes, on whatever
// backend the file names. Shared by the CPU unit tests and the GPU tests.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "check/checker.h"
#include "test_support.h"

namespace kforge::test {

struct CheckOutcome {
  CheckReport report;
  std::string failed_stage;  // "" when it passed, "build" when it did not compile
};

class CheckerFixture : public ::testing::Test {
 protected:
  CheckOutcome run_check(const std::string& path, CheckOptions options) {
    const KernelFile file = KernelFile::load(path);
    auto& worker = worker_for(std::string(backend_name(file.backend)));
    Checker checker(*compiler_, worker);
    CheckOutcome out{checker.check(file, options, [](const std::string& line) {
      std::fprintf(stderr, "  %s\n", line.c_str());
    })};
    if (!out.report.passed()) {
      out.failed_stage = "build";
      for (const auto& s : out.report.stages) {
        if (s.ran && !s.passed) out.failed_stage = s.name;
      }
    }
    return out;
  }

  // The tests' one compiler, made on first use.
  Compiler& compiler() {
    if (!compiler_) {
      CompilerOptions options;
      options.cache_dir = shared_module_cache();
      compiler_ = std::make_unique<Compiler>(options);
    }
    return *compiler_;
  }

  WorkerClient& worker_for(const std::string& backend) {
    compiler();
    auto& slot = backend == "cuda" ? cuda_worker_ : cpu_worker_;
    if (!slot) slot = std::make_unique<WorkerClient>(WorkerOptions{backend, 0, kforge_binary()});
    return *slot;
  }

  std::unique_ptr<Compiler> compiler_;
  std::unique_ptr<WorkerClient> cpu_worker_;
  std::unique_ptr<WorkerClient> cuda_worker_;
};

}  // namespace kforge::test
