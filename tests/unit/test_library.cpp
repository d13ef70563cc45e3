// The op library without a GPU: where tuned tables live, which kernel file and parameters a
// problem gets from a table (exact size, nearest size, starter defaults), and `kforge build` on
// the CPU backend. Every test works in a temporary source tree (KFORGE_INCLUDE_DIR points at its
// include/), so no table is ever written into the real kernels/ folder.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "compile/compiler.h"
#include "compile/kernel_text.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/process.h"
#include "device/backend.h"
#include "device/launch_limits.h"
#include "ops/op_spec.h"
#include "run/verdict.h"
#include "test_support.h"
#include "tune/library.h"
#include "tune/results_db.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Sets an environment variable for one scope and puts the previous value back.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

using test::read_text;

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

constexpr const char* kUnrollLine = " * param: UNROLL = 4 in {1, 2, 4, 8}\n";
// A busy: line for the tree's rmsnorm files: rows in blocks of UNROLL rows each, all of N per
// block (inserted before kUnrollLine).
constexpr const char* kRowBlocksBusyLine = " * busy: ceil_div(M, UNROLL) * UNROLL * N\n";

// A source tree of its own: include/kforge copied from the real one, and kernels/rmsnorm/ with
// the real CPU starter plus rmsnorm_chunked_cpu.cpp, the same kernel with a second tunable and
// a size requirement (N % CHUNK == 0), so a tuned row can be invalid at another size.
fs::path make_library_tree(const std::string& name) {
  const fs::path real_root = test::source_root();
  const fs::path root = test::temp_dir(name);
  fs::create_directories(root / "include");
  fs::copy(real_root / "include" / "kforge", root / "include" / "kforge",
           fs::copy_options::recursive);
  const fs::path op_dir = root / "kernels" / "rmsnorm";
  fs::create_directories(op_dir);
  fs::copy_file(real_root / "kernels" / "rmsnorm" / "rmsnorm_cpu.cpp", op_dir / "rmsnorm_cpu.cpp");

  std::string chunked = read_text(real_root / "kernels" / "rmsnorm" / "rmsnorm_cpu.cpp");
  const size_t at = chunked.find(kUnrollLine);
  EXPECT_NE(at, std::string::npos) << "rmsnorm_cpu.cpp no longer declares UNROLL as expected";
  if (at != std::string::npos) {
    chunked.insert(at + std::string(kUnrollLine).size(),
                   " * param: CHUNK = 256 in {256, 1024, 4096}\n"
                   " * require: N % CHUNK == 0\n");
  }
  write_text(op_dir / "rmsnorm_chunked_cpu.cpp", chunked);
  return root;
}

Sizes mn(int64_t m, int64_t n) {
  return {{"M", m}, {"N", n}};
}

// One row as `kforge tune --sizes all` writes it. Its variant key "test" becomes the file's
// present text (write_table), as a tune of the tree would have it; any other key is kept.
json table_row(int64_t m, int64_t n, const std::string& file, const json& params, double time_us,
               const std::string& final_check = "PASS (seed 1)") {
  return {{"shape", std::to_string(m) + "x" + std::to_string(n)},
          {"sizes", mn(m, n)},
          {"file", file},
          {"params", params},
          {"variant_key", "test"},
          {"time_us", time_us},
          {"final_check", final_check}};
}

// Writes the rmsnorm table (f32 unless told) for this machine's CPU (in the tree
// KFORGE_INCLUDE_DIR names).
fs::path write_table(std::vector<json> rows, DType dtype = DType::f32) {
  const std::string key = device_key(cpu_device_info());
  const fs::path path = tuned_table_path("rmsnorm", dtype, key);
  for (json& row : rows) {
    if (row.value("variant_key", json()) != "test" || !row.at("file").is_string()) continue;
    const fs::path file = library_kernels_dir() / "rmsnorm" / row.at("file").get<std::string>();
    if (fs::is_regular_file(file)) row["variant_key"] = KernelFile::load(file).text_hash + "|test";
  }
  write_text(path, json{{"op", "rmsnorm"},
                        {"dtype", dtype_name(dtype)},
                        {"device", key},
                        {"strategy", "exhaustive"},
                        {"sizes", rows}}
                       .dump(2));
  return path;
}

TEST(LibraryPaths, FileNameSlugKeepsLettersAndDigitsJoinedBySingleDashes) {
  EXPECT_EQ(file_name_slug("NVIDIA H200 (cc 9.0)"), "NVIDIA-H200-cc-9-0");
  EXPECT_EQ(file_name_slug("cpu: AMD EPYC 9654 96-Core Processor"),
            "cpu-AMD-EPYC-9654-96-Core-Processor");
  EXPECT_EQ(file_name_slug("a_b/c\\d"), "a-b-c-d");
  EXPECT_EQ(file_name_slug("H100"), "H100");
  EXPECT_EQ(file_name_slug(""), "");
  EXPECT_EQ(file_name_slug("(x)"), "x");
}

TEST(LibraryPaths, TunedTablePathIsUnderTheKernelsTree) {
  const ScopedEnv env("KFORGE_INCLUDE_DIR", "/opt/kforge-src/include");
  EXPECT_EQ(tuned_table_path("softmax", DType::bf16, "NVIDIA H200 (cc 9.0)").string(),
            "/opt/kforge-src/kernels/softmax/tuned/bf16-NVIDIA-H200-cc-9-0.json");
  EXPECT_EQ(tuned_table_path("rmsnorm", DType::f32, "cpu: Test CPU").string(),
            "/opt/kforge-src/kernels/rmsnorm/tuned/f32-cpu-Test-CPU.json");
  const std::string key = device_key(cpu_device_info());
  EXPECT_EQ(key.rfind("cpu: ", 0), 0u) << key;
  EXPECT_EQ(tuned_table_path("rmsnorm", DType::f16, key).filename().string(),
            "f16-" + file_name_slug(key) + ".json");
}

// Each test gets a fresh tree and KFORGE_INCLUDE_DIR pointing into it.
class LibraryChoiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = make_library_tree(std::string("library-") + info->name());
    env_.emplace("KFORGE_INCLUDE_DIR", (root_ / "include").string());
    ASSERT_EQ(library_kernels_dir(), root_ / "kernels");
  }
  void TearDown() override { env_.reset(); }

  LibraryChoice choose(const Sizes& sizes, DType dtype = DType::f32) const {
    return library_choice(*find_op("rmsnorm"), sizes, dtype, cpu_device_info());
  }
  fs::path kernel(const std::string& name) const { return root_ / "kernels" / "rmsnorm" / name; }

  fs::path root_;
  std::optional<ScopedEnv> env_;
};

TEST_F(LibraryChoiceTest, LibraryFilesAreTheOpsFilesForTheBackend) {
  const std::vector<KernelFile> files = library_files("rmsnorm", "cpu");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].path, kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(files[1].path, kernel("rmsnorm_cpu.cpp"));
  ASSERT_EQ(files[0].params.size(), 2u);
  EXPECT_EQ(files[0].requirements.size(), 1u);
  // The tree has no CUDA files and no softmax folder.
  EXPECT_THROW(library_files("rmsnorm", "cuda"), UsageError);
  EXPECT_THROW(library_files("softmax", "cpu"), UsageError);
}

TEST_F(LibraryChoiceTest, NoTableGivesTheStarterDefaults) {
  const LibraryChoice c = choose(mn(4096, 4096));
  EXPECT_EQ(c.file, root_ / "kernels" / starter_kernel("rmsnorm", false, DType::f32));
  EXPECT_EQ(c.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_TRUE(c.params.empty());
  EXPECT_EQ(c.source, LibraryChoice::Source::defaults);
  EXPECT_EQ(c.tuned_shape, "");
  EXPECT_FALSE(c.tuned_median_us.has_value());
  EXPECT_TRUE(c.table.empty());
  EXPECT_EQ(c.describe(), "defaults: untuned (no tuned table for this dtype and device)");
  EXPECT_TRUE(c.untuned_device());
  const json j = c.to_json();
  EXPECT_EQ(j.at("source"), "defaults");
  EXPECT_EQ(j.at("file"), kernel("rmsnorm_cpu.cpp").string());
  EXPECT_EQ(j.at("params"), json::object());
  EXPECT_FALSE(j.contains("table"));
  EXPECT_FALSE(j.contains("tuned_shape"));
  EXPECT_FALSE(j.contains("tuned_median_us"));
  EXPECT_TRUE(j.at("untuned_device").get<bool>());
}

// A starter whose defaults this device cannot run (a Hopper-only wgmma file on another GPU)
// gives way to the first library file that can; where none can, the starter stands.
TEST_F(LibraryChoiceTest, AStarterTheDeviceCannotRunGivesWayToOneItCan) {
  const auto require_hopper = [](const fs::path& path) {
    std::string text = read_text(path);
    const size_t at = text.find(kUnrollLine);
    ASSERT_NE(at, std::string::npos) << path;
    text.insert(at + std::string(kUnrollLine).size(), " * require: cc == 90\n");
    write_text(path, text);
  };
  const OpSpec& rmsnorm = *find_op("rmsnorm");
  EXPECT_EQ(device_starter(rmsnorm, DType::f32, cpu_device_info()), kernel("rmsnorm_cpu.cpp"));

  require_hopper(kernel("rmsnorm_cpu.cpp"));
  EXPECT_EQ(device_starter(rmsnorm, DType::f32, cpu_device_info()),
            kernel("rmsnorm_chunked_cpu.cpp"));
  const LibraryChoice c = choose(mn(4096, 4096));
  EXPECT_EQ(c.file, kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(c.source, LibraryChoice::Source::defaults);

  require_hopper(kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(device_starter(rmsnorm, DType::f32, cpu_device_info()), kernel("rmsnorm_cpu.cpp"));
}

TEST_F(LibraryChoiceTest, ExactSizeTakesThatRow) {
  const fs::path table = write_table(
      {table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5),
       table_row(1024, 768, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 2}, {"CHUNK", 256}}, 10.25)});
  EXPECT_EQ(table.parent_path(), root_ / "kernels" / "rmsnorm" / "tuned");

  const LibraryChoice big = choose(mn(4096, 4096));
  EXPECT_EQ(big.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_EQ(big.params, (ParamValues{{"UNROLL", 8}}));
  EXPECT_EQ(big.source, LibraryChoice::Source::exact_size);
  EXPECT_EQ(big.tuned_shape, "4096x4096");
  ASSERT_TRUE(big.tuned_median_us.has_value());
  EXPECT_DOUBLE_EQ(*big.tuned_median_us, 120.5);
  EXPECT_EQ(big.table, table);
  EXPECT_EQ(big.describe(), "tuned at 4096x4096");
  const json j = big.to_json();
  EXPECT_EQ(j.at("source"), "exact_size");
  EXPECT_EQ(j.at("params"), (json{{"UNROLL", 8}}));
  EXPECT_EQ(j.at("tuned_shape"), "4096x4096");
  EXPECT_DOUBLE_EQ(j.at("tuned_median_us").get<double>(), 120.5);
  EXPECT_EQ(j.at("table"), table.string());

  const LibraryChoice small = choose(mn(1024, 768));
  EXPECT_EQ(small.file, kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(small.params, (ParamValues{{"CHUNK", 256}, {"UNROLL", 2}}));
  EXPECT_EQ(small.source, LibraryChoice::Source::exact_size);
  EXPECT_EQ(small.tuned_shape, "1024x768");
  EXPECT_DOUBLE_EQ(small.tuned_median_us.value_or(-1), 10.25);

  // The table is for f32 only: bf16 has none.
  const LibraryChoice bf16 = choose(mn(4096, 4096), DType::bf16);
  EXPECT_EQ(bf16.source, LibraryChoice::Source::defaults);
  EXPECT_EQ(bf16.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_TRUE(bf16.params.empty());
  EXPECT_TRUE(bf16.table.empty());
}

TEST_F(LibraryChoiceTest, OtherSizesTakeTheNearestRowOnALogScale) {
  write_table(
      {table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5),
       table_row(1024, 768, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 2}, {"CHUNK", 256}}, 10.25)});

  // |log(2048/4096)| = 0.69 against |log(2048/1024)| + |log(4096/768)| = 2.37.
  const LibraryChoice c = choose(mn(2048, 4096));
  EXPECT_EQ(c.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_EQ(c.params, (ParamValues{{"UNROLL", 8}}));
  EXPECT_EQ(c.source, LibraryChoice::Source::nearest_size);
  EXPECT_EQ(c.tuned_shape, "4096x4096");
  EXPECT_DOUBLE_EQ(c.tuned_median_us.value_or(-1), 120.5);
  EXPECT_EQ(c.describe(), "tuned at 4096x4096 (the nearest tuned size)");
  EXPECT_EQ(c.to_json().at("source"), "nearest_size");

  // 1024x1024: 0.29 from 1024x768, 2.77 from 4096x4096; N % 256 == 0 holds.
  const LibraryChoice d = choose(mn(1024, 1024));
  EXPECT_EQ(d.file, kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(d.params, (ParamValues{{"CHUNK", 256}, {"UNROLL", 2}}));
  EXPECT_EQ(d.source, LibraryChoice::Source::nearest_size);
  EXPECT_EQ(d.tuned_shape, "1024x768");

  // A size far larger than any row still takes the nearest one.
  const LibraryChoice e = choose(mn(65536, 16384));
  EXPECT_EQ(e.source, LibraryChoice::Source::nearest_size);
  EXPECT_EQ(e.tuned_shape, "4096x4096");
}

// Where every candidate row's file has a busy: line, a size without a row of its own runs the
// row whose time, scaled to the size by that line, is the shortest, not the nearest row; where
// one of them lacks the line, the nearest. The line does not count in the code hash.
TEST_F(LibraryChoiceTest, BusyLinesScaleEachRowsTimeToTheSize) {
  const std::string busy_line = kRowBlocksBusyLine;
  for (const char* name : {"rmsnorm_cpu.cpp", "rmsnorm_chunked_cpu.cpp"}) {
    std::string text = read_text(kernel(name));
    const std::string before_hash = kernel_text_hash(text, kernel(name));
    text.insert(text.find(kUnrollLine), busy_line);
    write_text(kernel(name), text);
    EXPECT_EQ(kernel_text_hash(text, kernel(name)), before_hash) << name;
  }
  // 4096x4096 is nearer to 2048x4096 (0.69 against 1.39), but 1024x1024's 2 us scale to
  // 2 * (2048 * 4096) / (1024 * 1024) = 16 us there, against 120.5 / 2 = 60.25.
  write_table(
      {table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5),
       table_row(1024, 1024, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 2}, {"CHUNK", 256}}, 2.0)});
  const LibraryChoice c = choose(mn(2048, 4096));
  EXPECT_EQ(c.file, kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(c.tuned_shape, "1024x1024");
  EXPECT_EQ(c.source, LibraryChoice::Source::nearest_size);
  EXPECT_DOUBLE_EQ(c.predicted_us.value_or(-1), 16.0);
  EXPECT_EQ(c.describe(),
            "tuned at 1024x1024 (of the tuned sizes, the one predicted fastest here: 16.0 us by "
            "its file's busy: line)");
  EXPECT_DOUBLE_EQ(c.to_json().at("predicted_us").get<double>(), 16.0);
  // Every row it weighed, nearest first, with its prediction.
  ASSERT_EQ(c.weighed.size(), 2u);
  EXPECT_EQ(c.weighed[0].tuned_shape, "4096x4096");
  EXPECT_DOUBLE_EQ(c.weighed[0].predicted_us, 60.25);
  EXPECT_EQ(c.weighed[1].tuned_shape, "1024x1024");
  EXPECT_DOUBLE_EQ(c.to_json().at("weighed").at(1).at("predicted_us").get<double>(), 16.0);
  // A row of the size itself is taken as it is.
  const LibraryChoice exact = choose(mn(4096, 4096));
  EXPECT_EQ(exact.source, LibraryChoice::Source::exact_size);
  EXPECT_FALSE(exact.predicted_us);

  // A file's busy: lines add up (kernels run one after another): with a second line of
  // 1048576, 1024x1024's 2 us scale by (2048 * 4096 + 1048576) / (1024 * 1024 + 1048576).
  std::string two_lines = read_text(kernel("rmsnorm_chunked_cpu.cpp"));
  two_lines.insert(two_lines.find(busy_line), " * busy: 1048576\n");
  write_text(kernel("rmsnorm_chunked_cpu.cpp"), two_lines);
  EXPECT_DOUBLE_EQ(choose(mn(2048, 4096)).predicted_us.value_or(-1), 9.0);
  // A let: value may not take a name the problem binds (M here): it would replace the size.
  std::string shadowing = two_lines;
  shadowing.insert(shadowing.find(busy_line), " * let: M = 1\n");
  write_text(kernel("rmsnorm_chunked_cpu.cpp"), shadowing);
  EXPECT_THROW(choose(mn(2048, 4096)), Error);
  // Nor may a line name what nothing binds (a typo), which would turn the prediction off.
  std::string typo = two_lines;
  typo.insert(typo.find(busy_line), " * let: ROWS = ceil_div(M, UNROL)\n");
  write_text(kernel("rmsnorm_chunked_cpu.cpp"), typo);
  EXPECT_THROW(choose(mn(2048, 4096)), Error);
  write_text(kernel("rmsnorm_chunked_cpu.cpp"), two_lines);

  // Without the line in one file there is no common scale: the nearest row.
  std::string without = read_text(kernel("rmsnorm_cpu.cpp"));
  without.erase(without.find(busy_line), busy_line.size());
  write_text(kernel("rmsnorm_cpu.cpp"), without);
  const LibraryChoice d = choose(mn(2048, 4096));
  EXPECT_EQ(d.tuned_shape, "4096x4096");
  EXPECT_FALSE(d.predicted_us);
}

// Every library file's busy: and let: lines name only what a problem binds.
TEST(LibraryFiles, BusyLinesNameOnlyWhatAProblemBinds) {
  for (const auto& entry : fs::recursive_directory_iterator(library_kernels_dir())) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cpp") continue;
    const KernelFile file = KernelFile::load(entry.path());
    EXPECT_EQ(busy_lines_problem(file, *find_op(file.op)), "") << entry.path();
  }
}

// Over the library's own files: the hash reads every header line but the `busy:` and `let:`
// ones, so a file without them hashes as it did before they existed.
TEST(KernelTextHash, ReadsEveryHeaderLineButBusyAndLet) {
  int with_busy = 0;
  for (const auto& entry : fs::recursive_directory_iterator(library_kernels_dir())) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cpp") continue;
    const std::string header = find_header_block(read_text(entry.path())).text;
    const std::string hashed = header_for_hash(header);
    const auto count = [](const std::string& text, const std::string& what) {
      int n = 0;
      for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
      return n;
    };
    const int busy_lines = count(header, " * busy:") + count(header, " * let:");
    if (busy_lines == 0) {
      EXPECT_EQ(hashed, header) << entry.path();
    } else {
      ++with_busy;
      EXPECT_EQ(count(hashed, "\n"), count(header, "\n") - busy_lines) << entry.path();
      EXPECT_EQ(hashed.find("busy:"), std::string::npos) << entry.path();
      EXPECT_EQ(hashed.find("let:"), std::string::npos) << entry.path();
    }
  }
  // The tensor-core GEMM files: matmul, matmul_bias, matmul_residual, fused_mlp.
  EXPECT_GE(with_busy, 4);
}

// matmul_wgmma.cu's busy: line on the H200's table as shipped: N 2048 with K 8960 has no row.
// Its nearest row (4096x1536x8960) holds a 256 x 192 tile, which leaves a third of the 11th
// tile along N empty and fills 1.33 waves; the 128 x 256 rows fill two whole waves.
TEST(LibraryChoiceBusy, AMatmulSizeWithoutARowRunsTheRowPredictedFastestThere) {
  const DeviceInfo h200 = test::hopper_device("NVIDIA H200");
  const LibraryChoice c = library_choice(
      *find_op("matmul"), {{"M", 4096}, {"N", 2048}, {"K", 8960}}, DType::bf16, h200);
  ASSERT_EQ(c.source, LibraryChoice::Source::nearest_size) << c.describe();
  ASSERT_TRUE(c.predicted_us) << c.describe();
  std::cout << "4096x2048x8960: " << c.describe() << "\n";
  EXPECT_NE(c.tuned_shape, "4096x1536x8960") << c.describe();
  EXPECT_EQ(c.params.at("TILE_M"), 128) << c.describe();
  EXPECT_EQ(c.params.at("TILE_N"), 256) << c.describe();
}

// The other tensor-core GEMM files' busy: lines bind on their H200 tables as shipped, so every row
// is weighed at a size without one: fused_mlp's two lines (gate-up, then down) at Llama-3-8B's
// MLP, matmul_bias's at Qwen2-7B's q projection over 8192 tokens. Each row's prediction grows
// with the work (both are larger than every row).
TEST(LibraryChoiceBusy, TheFusedMlpAndBiasGemmTablesWeighEveryRow) {
  const DeviceInfo h200 = test::hopper_device("NVIDIA H200");
  const std::pair<const char*, Sizes> problems[] = {
      {"fused_mlp", {{"batch", 4096}, {"dim", 4096}, {"hidden", 14336}}},
      {"matmul_bias", {{"M", 8192}, {"N", 3584}, {"K", 3584}}}};
  for (const auto& [op, sizes] : problems) {
    const LibraryChoice c = library_choice(*find_op(op), sizes, DType::bf16, h200);
    ASSERT_EQ(c.source, LibraryChoice::Source::nearest_size) << op << ": " << c.describe();
    ASSERT_TRUE(c.predicted_us) << op << ": " << c.describe();
    const nlohmann::json table = read_tuned_table(c.table);
    EXPECT_EQ(c.weighed.size(), table.at("sizes").size()) << op;
    for (const LibraryChoice::WeighedRow& w : c.weighed) {
      EXPECT_GT(w.predicted_us, w.tuned_median_us) << op << " row " << w.tuned_shape;
      EXPECT_LE(*c.predicted_us, w.predicted_us) << op << " row " << w.tuned_shape;
    }
    EXPECT_TRUE(c.checked_in_present_text) << op << ": " << c.describe();
  }
}

// CUTLASS's scheduler rounds its tiles up to whole swizzle bands of clusters, and a block runs
// the K loop of a slot past the problem too (matmul_wgmma.cu's let: lines). At 4096x11008x4096,
// 128 x 256 tiles in clusters of 2 along M with SWIZZLE 8 (the 4096^3 row) are 32 x 43 tiles
// but 32 x 48 slots: 12 waves of 132 SMs, not 11, against the row's own 4. At batch 1024,
// fused_mlp's DOWN_SWIZZLE 8 rows give its down GEMM's 8 x 16 tiles 16 x 16 slots (2 waves, not
// 1): the DOWN_SWIZZLE 1 row runs (390 us on the H200 against 518 for the others).
TEST(LibraryChoiceBusy, TheSchedulersSlotsCountNotTheTiles) {
  const DeviceInfo h200 = test::hopper_device("NVIDIA H200");
  const LibraryChoice c = library_choice(
      *find_op("matmul"), {{"M", 4096}, {"N", 11008}, {"K", 4096}}, DType::bf16, h200);
  const auto row = std::find_if(c.weighed.begin(), c.weighed.end(),
                                [](const auto& w) { return w.tuned_shape == "4096x4096x4096"; });
  ASSERT_NE(row, c.weighed.end()) << c.describe();
  EXPECT_DOUBLE_EQ(row->predicted_us, row->tuned_median_us * 12 / 4);

  // The band narrows where the shorter side is short: at 5120x768, 3 tiles along N give bands of
  // 4, 40 x 4 slots, 2 waves (bands of 8: 48 x 8, 3 waves; none: 40 x 3, 1). The short side
  // counts whole clusters: at 640x8192, 5 tiles along M are 6 in clusters of 2, so bands of 8
  // (16 x 32 slots, 4 waves; 5 tiles would give bands of 4 and 2 waves). The row's own size has
  // 4 waves, K is the same.
  const auto predicted_for_the_4096_row = [&](int64_t m, int64_t n) {
    const LibraryChoice at =
        library_choice(*find_op("matmul"), {{"M", m}, {"N", n}, {"K", 4096}}, DType::bf16, h200);
    for (const auto& w : at.weighed) {
      if (w.tuned_shape == "4096x4096x4096") return w.predicted_us / w.tuned_median_us;
    }
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(predicted_for_the_4096_row(5120, 768), 2.0 / 4);
  EXPECT_DOUBLE_EQ(predicted_for_the_4096_row(640, 8192), 4.0 / 4);

  const LibraryChoice mlp =
      library_choice(*find_op("fused_mlp"), {{"batch", 1024}, {"dim", 4096}, {"hidden", 11008}},
                     DType::bf16, h200);
  ASSERT_TRUE(mlp.predicted_us) << mlp.describe();
  EXPECT_EQ(mlp.params.at("DOWN_SWIZZLE"), 1) << mlp.describe();
}

TEST(SizeDistance, FlagsThatAgreeCostNothingAndFlagsThatDifferOutweighDimensions) {
  const Sizes causal = {{"batch", 4}, {"heads", 32}, {"causal", 1}, {"scale_permille", 0}};
  Sizes non_causal = causal;
  non_causal["causal"] = 0;
  // Zeros that agree (scale_permille = 0, causal = 0) are the same problem.
  EXPECT_DOUBLE_EQ(size_distance(causal, causal), 0.0);
  EXPECT_DOUBLE_EQ(size_distance(non_causal, non_causal), 0.0);
  // Dimensions still count on a log scale beside them.
  Sizes half_batch = non_causal;
  half_batch["batch"] = 2;
  EXPECT_NEAR(size_distance(non_causal, half_batch), std::log(2.0), 1e-12);
  // A different flag is farther than any difference of dimensions, yet not unrelated.
  Sizes tiny_batch = non_causal;
  tiny_batch["batch"] = 1;
  EXPECT_GT(size_distance(non_causal, causal), size_distance(non_causal, tiny_batch));
  EXPECT_LT(size_distance(non_causal, causal), std::numeric_limits<double>::max());
  // A name the row lacks makes it unrelated.
  Sizes no_flag = non_causal;
  no_flag.erase("causal");
  EXPECT_EQ(size_distance(non_causal, no_flag), std::numeric_limits<double>::max());
}

TEST_F(LibraryChoiceTest, RowWhoseRequirementFailsAtTheNewSizeIsSkipped) {
  write_table(
      {table_row(4096, 4096, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 4}, {"CHUNK", 4096}}, 100.0),
       table_row(1024, 768, "rmsnorm_cpu.cpp", {{"UNROLL", 2}}, 10.0)});

  // 4096x1024: 1.39 from 4096x4096, 1.67 from 1024x768; but 1024 % 4096 != 0.
  const LibraryChoice c = choose(mn(4096, 1024));
  EXPECT_EQ(c.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_EQ(c.params, (ParamValues{{"UNROLL", 2}}));
  EXPECT_EQ(c.source, LibraryChoice::Source::nearest_size);
  EXPECT_EQ(c.tuned_shape, "1024x768");
  EXPECT_DOUBLE_EQ(c.tuned_median_us.value_or(-1), 10.0);

  // Where the requirement holds, the nearest row stands.
  const LibraryChoice d = choose(mn(8192, 8192));
  EXPECT_EQ(d.file, kernel("rmsnorm_chunked_cpu.cpp"));
  EXPECT_EQ(d.params, (ParamValues{{"CHUNK", 4096}, {"UNROLL", 4}}));
  EXPECT_EQ(d.source, LibraryChoice::Source::nearest_size);
  EXPECT_EQ(d.tuned_shape, "4096x4096");
}

TEST_F(LibraryChoiceTest, NoRowValidAtTheNewSizeGivesDefaults) {
  const fs::path table = write_table(
      {table_row(4096, 4096, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 4}, {"CHUNK", 4096}}, 100.0)});
  const LibraryChoice c = choose(mn(4096, 1024));
  EXPECT_EQ(c.source, LibraryChoice::Source::defaults);
  EXPECT_EQ(c.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_TRUE(c.params.empty());
  EXPECT_EQ(c.tuned_shape, "");
  EXPECT_FALSE(c.tuned_median_us.has_value());
  EXPECT_EQ(c.table, table);
  EXPECT_EQ(c.describe(), "defaults (no tuned size applies)");
  EXPECT_EQ(c.to_json().at("table"), table.string());

  // The same row at its own size is valid.
  EXPECT_EQ(choose(mn(4096, 4096)).source, LibraryChoice::Source::exact_size);
}

TEST_F(LibraryChoiceTest, UncheckedUnknownAndOutOfRangeRowsAreIgnored) {
  // Every row but the last is nearer to 4096x4096, and every one is unusable.
  const std::vector<json> unusable = {
      {{"shape", "4096x4096"}, {"sizes", mn(4096, 4096)}, {"file", nullptr}},  // none passed
      table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 50.0, "FAIL: mismatch at [0, 3]"),
      table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 50.0, "not checked (replay)"),
      table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 50.0, ""),
      table_row(2048, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 16}}, 50.0),         // not a candidate
      table_row(4096, 2048, "rmsnorm_cpu.cpp", {{"BLOCK", 128}}, 50.0),         // unknown name
      table_row(4096, 8192, "rmsnorm_cpu.cpp", {{"UNROLL", "8"}}, 50.0),        // not an integer
      table_row(8192, 4096, "rmsnorm_removed_cpu.cpp", {{"UNROLL", 2}}, 50.0),  // no such file
      table_row(2048, 2048, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 2}, {"CHUNK", 512}}, 50.0),
  };
  std::vector<json> rows = unusable;
  rows.push_back(table_row(1024, 768, "rmsnorm_cpu.cpp", {{"UNROLL", 1}}, 9.0));
  write_table(rows);

  const LibraryChoice c = choose(mn(4096, 4096));
  EXPECT_EQ(c.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_EQ(c.params, (ParamValues{{"UNROLL", 1}}));
  EXPECT_EQ(c.source, LibraryChoice::Source::nearest_size);
  EXPECT_EQ(c.tuned_shape, "1024x768");
  EXPECT_DOUBLE_EQ(c.tuned_median_us.value_or(-1), 9.0);

  // Without the usable row, nothing applies.
  write_table(unusable);
  const LibraryChoice d = choose(mn(4096, 4096));
  EXPECT_EQ(d.source, LibraryChoice::Source::defaults);
  EXPECT_TRUE(d.params.empty());
  EXPECT_EQ(d.describe(), "defaults (no tuned size applies)");
}

// The error for a table that cannot be read as one names it.
void expect_table_error(const fs::path& table, const std::function<void()>& choose) {
  try {
    choose();
    ADD_FAILURE() << "no error for the malformed table " << table;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(table.string()), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a kforge::Error: " << e.what();
  }
}

TEST_F(LibraryChoiceTest, SameWidthDtypeBorrowsOnlyRowsCheckedInIt) {
  const fs::path table = write_table(
      {table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5),
       table_row(1024, 768, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 2}, {"CHUNK", 256}}, 10.25),
       table_row(2048, 2048, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 60.0)},
      DType::bf16);
  // Nothing checked in f16 yet: f16 gets the defaults, though a bf16 table exists.
  EXPECT_EQ(choose(mn(4096, 4096), DType::f16).source, LibraryChoice::Source::defaults);

  // Both rows running UNROLL=8 get the pass; the chunked row gets a failure.
  const std::string text = KernelFile::load(kernel("rmsnorm_cpu.cpp")).text_hash;
  EXPECT_EQ(record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 8}}, DType::f16,
                               "PASS (five stages)", 7, text),
            2);
  EXPECT_EQ(
      record_table_check(table, "rmsnorm_chunked_cpu.cpp", json{{"CHUNK", 256}, {"UNROLL", 2}},
                         DType::f16, "FAIL (WRONG): x", 7, "text-1"),
      1);
  EXPECT_EQ(
      record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 4}}, DType::f16, "PASS", 7, "x"),
      0);
  const json rows = read_tuned_table(table).at("sizes");
  EXPECT_EQ(rows[0].at("checks").at("f16").at("result"), "PASS (five stages)");
  EXPECT_EQ(rows[0].at("checks").at("f16").at("seed"), 7);
  EXPECT_EQ(rows[0].at("checks").at("f16").at("source_hash"), text);
  EXPECT_TRUE(row_serves_dtype(rows[0], DType::bf16, DType::f16));
  EXPECT_TRUE(row_serves_dtype(rows[0], DType::bf16, DType::bf16));
  EXPECT_FALSE(row_serves_dtype(rows[0], DType::bf16, DType::f32));
  EXPECT_FALSE(row_serves_dtype(rows[1], DType::bf16, DType::f16));

  const LibraryChoice f16 = choose(mn(4096, 4096), DType::f16);
  EXPECT_EQ(f16.source, LibraryChoice::Source::exact_size);
  EXPECT_EQ(f16.params, (ParamValues{{"UNROLL", 8}}));
  ASSERT_TRUE(f16.borrowed_from.has_value());
  EXPECT_EQ(*f16.borrowed_from, DType::bf16);
  EXPECT_EQ(f16.describe(), "tuned at 4096x4096, bf16 table, checked in this dtype");
  EXPECT_EQ(f16.to_json().at("table_dtype"), "bf16");
  // The failed row is skipped: 1024x768 falls to the nearest checked row.
  const LibraryChoice small = choose(mn(1024, 768), DType::f16);
  EXPECT_EQ(small.file, kernel("rmsnorm_cpu.cpp"));
  EXPECT_EQ(small.tuned_shape, "2048x2048");
  // f32 has another element size: it never borrows.
  EXPECT_EQ(choose(mn(4096, 4096), DType::f32).source, LibraryChoice::Source::defaults);
  // bf16 itself is unaffected.
  EXPECT_FALSE(choose(mn(4096, 4096), DType::bf16).borrowed_from.has_value());
}

// A row serves a problem in the file's present text when its check there passed, says so when its
// checks were made on another text (the file edited since), and is passed over when its check in
// the present text failed.
TEST_F(LibraryChoiceTest, ARowSaysWhetherItWasCheckedInItsFilesPresentText) {
  json row = table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5);
  row["variant_key"] = "earlier-text|UNROLL=8|f32|cpu|";
  const fs::path table = write_table({row, table_row(2048, 2048, "rmsnorm_cpu.cpp", {}, 60.0)});
  const std::string text = KernelFile::load(kernel("rmsnorm_cpu.cpp")).text_hash;

  // Tuned (and finally checked) on an earlier text: used, and said to be.
  LibraryChoice c = choose(mn(4096, 4096));
  EXPECT_EQ(c.source, LibraryChoice::Source::exact_size);
  EXPECT_FALSE(c.checked_in_present_text);
  EXPECT_EQ(c.describe(),
            "tuned at 4096x4096; not checked in its file's present text (kforge check --table "
            "checks it)");
  EXPECT_EQ(c.to_json().at("checked_in_present_text"), false);
  // The row tuned on the present text.
  EXPECT_TRUE(choose(mn(2048, 2048)).checked_in_present_text);
  EXPECT_EQ(choose(mn(2048, 2048)).describe(), "tuned at 2048x2048");
  // Defaults carry no such field.
  EXPECT_FALSE(choose(mn(4096, 4096), DType::bf16).to_json().contains("checked_in_present_text"));

  // kforge check --table passes it on the present text.
  ASSERT_EQ(record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 8}}, DType::f32,
                               "PASS (five stages)", 3, text),
            1);
  c = choose(mn(4096, 4096));
  EXPECT_TRUE(c.checked_in_present_text);
  EXPECT_EQ(c.describe(), "tuned at 4096x4096");

  // It fails there: the row is passed over (the nearest other row serves), though its final
  // check on the earlier text passed.
  ASSERT_EQ(record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 8}}, DType::f32,
                               "FAIL (WRONG): x", 4, text),
            1);
  c = choose(mn(4096, 4096));
  EXPECT_EQ(c.tuned_shape, "2048x2048");
  EXPECT_EQ(c.source, LibraryChoice::Source::nearest_size);

  // A failure on yet another text says nothing about this one.
  ASSERT_EQ(record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 8}}, DType::f32,
                               "FAIL (WRONG): x", 5, "another-text"),
            1);
  c = choose(mn(4096, 4096));
  EXPECT_EQ(c.tuned_shape, "4096x4096");
  EXPECT_FALSE(c.checked_in_present_text);

  EXPECT_EQ(row_check_in_text(row, DType::f32, DType::f32, ""), CheckInText::none);
  EXPECT_EQ(row_check_in_text(row, DType::f32, DType::f32, "earlier-text"), CheckInText::passed);
  EXPECT_EQ(row_check_in_text(row, DType::bf16, DType::f32, "earlier-text"), CheckInText::none);
  // The final check as a check record, with the row's provenance.
  row["git_sha"] = "abc123";
  row["recorded_at"] = "2026-01-02T03:04:05Z";
  EXPECT_EQ(row_check_of_code(row, DType::f32, DType::f32, "earlier-text"),
            json({{"result", "PASS (seed 1)"},
                  {"source_hash", "earlier-text"},
                  {"git_sha", "abc123"},
                  {"checked_at", "2026-01-02T03:04:05Z"}}));
  EXPECT_EQ(row_check_of_code(row, DType::f32, DType::f32, "another-text"), std::nullopt);
  EXPECT_EQ(row_check_of_code(row, DType::bf16, DType::f32, "earlier-text"), std::nullopt);
  row["final_check"] = "FAIL: mismatch at [3, 7]";
  EXPECT_EQ(row_check_in_text(row, DType::f32, DType::f32, "earlier-text"), CheckInText::failed);
  // A final check that was not made is no check, not a failure.
  row["final_check"] = "not checked (replay)";
  EXPECT_EQ(row_check_in_text(row, DType::f32, DType::f32, "earlier-text"), CheckInText::none);
  EXPECT_EQ(row_check_of_code(row, DType::f32, DType::f32, "earlier-text"), std::nullopt);
}

// On one text, a check --table record is the later word than the tune's final check: its FAIL
// stops a row whose final check passed, and its PASS lets one serve whose final check did not
// run. A tune that writes the variant again brings a newer final check, which replaces it.
TEST_F(LibraryChoiceTest, ACheckOfThePresentTextOverridesTheTunesFinalCheck) {
  const std::string text = KernelFile::load(kernel("rmsnorm_cpu.cpp")).text_hash;
  const json row = table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5);
  const fs::path table = write_table({row});
  ASSERT_TRUE(choose(mn(4096, 4096)).checked_in_present_text);
  ASSERT_EQ(record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 8}}, DType::f32,
                               "FAIL (WRONG): x", 4, text),
            1);
  EXPECT_EQ(choose(mn(4096, 4096)).source, LibraryChoice::Source::defaults);

  // The same variant tuned again at the size, on the same text: its final check is the newer.
  json again = row;
  again["variant_key"] = text + "|test";  // as write_table wrote it
  again["time_us"] = 118.0;
  const json rewritten =
      write_tuned_table(table, *find_op("rmsnorm"), DType::f32, device_key(cpu_device_info()),
                        "given", json::array({again}), true)
          .at(0);
  EXPECT_FALSE(rewritten.contains("checks")) << rewritten.dump();
  EXPECT_TRUE(choose(mn(4096, 4096)).checked_in_present_text);

  // A final check that did not run (a replay), and a check --table PASS on the present text.
  write_table(
      {table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5, "not checked (replay)")});
  EXPECT_EQ(choose(mn(4096, 4096)).source, LibraryChoice::Source::defaults);
  ASSERT_EQ(record_table_check(table, "rmsnorm_cpu.cpp", json{{"UNROLL", 8}}, DType::f32,
                               "PASS (five stages)", 5, text),
            1);
  const LibraryChoice c = choose(mn(4096, 4096));
  EXPECT_EQ(c.source, LibraryChoice::Source::exact_size);
  EXPECT_TRUE(c.checked_in_present_text);
}

// A CUDA device of compute capability `major`.`minor`, for the table lookups (no GPU needed).
DeviceInfo cuda_device(const std::string& name, int major, int minor) {
  DeviceInfo d;
  d.backend = "cuda";
  d.name = name;
  d.cc_major = major;
  d.cc_minor = minor;
  return d;
}

// Writes an rmsnorm table for `device` (a device key) in `dtype`, one row per size, each row
// recording that its tune took `tune_seconds` over 10 evaluations.
void write_device_table(const std::string& device, DType dtype,
                        const std::vector<std::pair<int64_t, int64_t>>& sizes,
                        double tune_seconds) {
  json rows = json::array();
  for (const auto& [m, n] : sizes) {
    json row = table_row(m, n, "rmsnorm_cpu.cpp", {{"UNROLL", m > 2048 ? 8 : 4}}, 10.0);
    row["tune_seconds"] = tune_seconds;
    row["evaluations"] = 10;
    rows.push_back(row);
  }
  write_text(
      tuned_table_path("rmsnorm", dtype, device),
      json{{"op", "rmsnorm"}, {"dtype", dtype_name(dtype)}, {"device", device}, {"sizes", rows}}
          .dump(2));
}

// matmul_bias and matmul_residual have their Hopper tensor-core file alone: it is their CUDA
// starter in every dtype and on every GPU, so that what cannot run it is told why (the dtype it
// lacks; on another GPU, its Hopper requirement before any limit of that GPU).
TEST(LibraryPaths, EpilogueMatmulsStartFromTheirHopperFileAndSayWhyElsewhere) {
  DeviceInfo hopper = cuda_device("NVIDIA H100", 9, 0);
  hopper.max_threads_per_block = 1024;
  hopper.max_shared_per_block = 232448;
  DeviceInfo ampere = hopper;
  ampere.name = "NVIDIA A100";
  ampere.cc_major = 8;
  ampere.max_shared_per_block = 166912;
  for (const std::string name : {"matmul_bias", "matmul_residual"}) {
    const OpSpec& op = *find_op(name);
    const fs::path wgmma = library_kernels_dir() / name / (name + "_wgmma.cu");
    EXPECT_EQ(library_kernels_dir() / starter_kernel(name, true, DType::bf16), wgmma);
    EXPECT_EQ(device_starter(op, DType::bf16, hopper), wgmma);
    EXPECT_EQ(device_starter(op, DType::f32, hopper), wgmma);
    EXPECT_EQ(device_starter(op, DType::bf16, ampere), wgmma);
    EXPECT_EQ(device_starter(op, DType::f32, cpu_device_info()),
              library_kernels_dir() / name / (name + "_cpu.cpp"));

    const KernelFile file = KernelFile::load(wgmma);
    EXPECT_TRUE(file.supports(DType::bf16) && file.supports(DType::f16));
    EXPECT_FALSE(file.supports(DType::f32));
    const auto defaults_violation = [&](const DeviceInfo& device) {
      Bindings bindings = problem_bindings(device, DType::bf16, nullptr);
      for (const auto& [param, value] :
           file.with_derived(file.resolve_params(DType::bf16), bindings))
        bindings[param] = value;
      return first_violation(file, bindings, device);
    };
    EXPECT_EQ(defaults_violation(hopper), "") << name;
    EXPECT_NE(defaults_violation(ampere).find("'cc == 90'"), std::string::npos)
        << defaults_violation(ampere);
  }
}

TEST(LibraryPaths, ComputeCapabilityComesFromACudaDeviceKey) {
  EXPECT_EQ(compute_capability_of("NVIDIA H200 (cc 9.0)"), "9.0");
  EXPECT_EQ(compute_capability_of("NVIDIA H100 80GB HBM3 (cc 9.0)"), "9.0");
  EXPECT_EQ(compute_capability_of("cpu: AMD EPYC"), "");
  EXPECT_EQ(compute_capability_of("NVIDIA A100 (cc 8.0) spare"), "");
}

// Tables of other devices with the same compute capability are found, in the dtype or the one
// of the same width; this device's own table and other architectures' are not.
TEST_F(LibraryChoiceTest, SameArchitectureTablesAreTheSiblingsOnly) {
  const DeviceInfo h100 = cuda_device("NVIDIA H100", 9, 0);
  write_device_table("NVIDIA H200 (cc 9.0)", DType::bf16, {{1024, 1024}, {4096, 4096}}, 30);
  write_device_table("NVIDIA H100 (cc 9.0)", DType::bf16, {{1024, 1024}}, 30);
  write_device_table("NVIDIA A100 (cc 8.0)", DType::bf16, {{1024, 1024}}, 30);
  auto tables = same_architecture_tables("rmsnorm", DType::bf16, h100);
  ASSERT_EQ(tables.size(), 1u);
  EXPECT_EQ(tables[0].device, "NVIDIA H200 (cc 9.0)");
  EXPECT_EQ(tables[0].rows, 2u);
  EXPECT_EQ(tables[0].variants, 2u);
  EXPECT_DOUBLE_EQ(tables[0].tune_seconds, 60);
  EXPECT_EQ(tables[0].evaluations, 20u);
  tables = same_architecture_tables("rmsnorm", DType::f16, h100);  // borrows bf16's width
  ASSERT_EQ(tables.size(), 1u);
  EXPECT_EQ(tables[0].dtype, DType::bf16);
  EXPECT_TRUE(same_architecture_tables("rmsnorm", DType::f32, h100).empty());
  EXPECT_TRUE(same_architecture_tables("rmsnorm", DType::bf16, cpu_device_info()).empty());
  const json table = read_tuned_table(tables[0].path);
  const json* row = nearest_table_row(table, mn(3000, 5000));
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->at("shape"), "4096x4096");
}

// A device with no table is told what it runs and how to get a table: tune now (estimated from
// the sibling's recorded seconds per evaluation) or adopt the sibling's table. A choice from a
// table gets no offer.
TEST_F(LibraryChoiceTest, UntunedDeviceGetsTheOfferWithEstimates) {
  const DeviceInfo h100 = cuda_device("NVIDIA H100", 9, 0);
  const OpSpec& op = *find_op("rmsnorm");
  LibraryChoice none;
  none.file = kernel("rmsnorm_cpu.cpp");
  ASSERT_TRUE(none.untuned_device());
  std::string offer = untuned_offer(op, DType::bf16, h100, none);
  EXPECT_NE(offer.find("no tuned table for rmsnorm in bf16 on NVIDIA H100 (cc 9.0)"),
            std::string::npos)
      << offer;
  EXPECT_NE(offer.find("kforge tune rmsnorm --sizes all --dtype bf16 --budget 24"),
            std::string::npos);
  EXPECT_NE(offer.find("1.5 s each, assumed"), std::string::npos) << offer;
  EXPECT_NE(offer.find("no table of a device with the same architecture"), std::string::npos);

  write_device_table("NVIDIA H200 (cc 9.0)", DType::bf16, {{1024, 1024}, {4096, 4096}}, 30);
  offer = untuned_offer(op, DType::bf16, h100, none);
  EXPECT_NE(offer.find("3.0 s each, as tuning the NVIDIA H200 (cc 9.0) table took"),
            std::string::npos)
      << offer;
  EXPECT_NE(offer.find("--adopt \"NVIDIA H200 (cc 9.0)\""), std::string::npos) << offer;

  LibraryChoice tuned = none;
  tuned.table = "some-table.json";
  tuned.source = LibraryChoice::Source::exact_size;
  EXPECT_FALSE(tuned.untuned_device());
  EXPECT_EQ(untuned_offer(op, DType::bf16, h100, tuned), "");
  tuned.tuned_shape = "4096x4096";
  tuned.adopted_from = "NVIDIA H200 (cc 9.0)";
  tuned.checked_in_present_text = true;
  EXPECT_EQ(tuned.describe(),
            "tuned at 4096x4096, adopted from the NVIDIA H200 (cc 9.0) table, checked and timed "
            "here");
}

TEST_F(LibraryChoiceTest, MalformedTableThrowsAnErrorNamingIt) {
  const fs::path table = write_table({});
  const auto choose_big = [&] { choose(mn(4096, 4096)); };

  write_text(table, "{ \"sizes\": [ not json");
  expect_table_error(table, choose_big);

  // Well-formed JSON that is not a table.
  write_text(table, "[1, 2, 3]");
  expect_table_error(table, choose_big);
  write_text(table, R"({"sizes": [{"shape": "4096x4096", "sizes": {"M": "many", "N": 4096},
                       "file": "rmsnorm_cpu.cpp", "params": {"UNROLL": 8},
                       "final_check": "PASS"}]})");
  expect_table_error(table, choose_big);
  write_text(table, R"({"sizes": [{"shape": "4096x4096", "sizes": {"M": 4096, "N": 4096},
                       "file": "rmsnorm_cpu.cpp", "final_check": "PASS"}]})");
  expect_table_error(table, choose_big);
}

// Runs the kforge binary with the environment of this process.
CommandResult run_kforge(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {test::kforge_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, std::chrono::minutes(5));
}

// A tune that writes a row of the same variant again keeps the checks recorded in the old row
// of the same file text, and only those: another text's, and any check of another variant, go.
TEST_F(LibraryChoiceTest, ARewrittenRowKeepsTheChecksOfItsOwnText) {
  json old_row = table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5);
  old_row["variant_key"] = "text-a|UNROLL=8|f32|cpu|";
  old_row["checks"] = {{"f16", {{"result", "PASS (five stages)"}, {"source_hash", "text-a"}}},
                       {"bf16", {{"result", "PASS (five stages)"}, {"source_hash", "text-0"}}},
                       {"f64", {{"result", "PASS (five stages)"}}}};
  const fs::path table = write_table({old_row});
  const OpSpec& op = *find_op("rmsnorm");
  const std::string device = device_key(cpu_device_info());
  const auto rewrite = [&](const json& row, bool merge = true) {
    write_text(table, json{{"op", "rmsnorm"},
                           {"dtype", "f32"},
                           {"device", device},
                           {"sizes", json::array({old_row})}}
                          .dump());
    return write_tuned_table(table, op, DType::f32, device, "given", json::array({row}), merge)
        .at(0);
  };

  json same = table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 118.0);
  same["variant_key"] = "text-a|UNROLL=8|f32|cpu|";
  const json kept = rewrite(same);
  EXPECT_EQ(kept.at("time_us"), 118.0);
  ASSERT_TRUE(kept.contains("checks")) << kept.dump();
  EXPECT_EQ(kept.at("checks").size(), 1u) << kept.dump();
  EXPECT_EQ(kept.at("checks").at("f16").at("source_hash"), "text-a");
  // (f16 and f64 are not the table's dtype: only the checks recorded in them count.)
  EXPECT_TRUE(row_check_of_code(kept, DType::f32, DType::f16, "text-a"));
  EXPECT_FALSE(row_check_of_code(kept, DType::f32, DType::f16, "text-b"));
  EXPECT_FALSE(row_check_of_code(kept, DType::f32, DType::f16, ""));
  EXPECT_FALSE(row_check_of_code(old_row, DType::f32, DType::f64, "text-a"));  // without a text
  EXPECT_EQ(row_check_text(old_row, DType::f64), "");
  EXPECT_EQ(row_check_text(old_row, DType::i32), std::nullopt);
  // A whole table written over (`--sizes all`) keeps them the same way.
  EXPECT_EQ(rewrite(same, false).at("checks"), kept.at("checks"));

  json own = same;  // a row with a check of its own keeps it
  own["checks"] = {{"f16", {{"result", "FAIL (WRONG): x"}, {"source_hash", "text-a"}}}};
  EXPECT_EQ(rewrite(own).at("checks").at("f16").at("result"), "FAIL (WRONG): x");

  json edited = same;  // the file changed since
  edited["variant_key"] = "text-b|UNROLL=8|f32|cpu|";
  EXPECT_FALSE(rewrite(edited).contains("checks"));
  json other = same;  // another variant at the size
  other["params"] = {{"UNROLL", 4}};
  EXPECT_FALSE(rewrite(other).contains("checks"));

  // A row written before a tunable existed does not name it: it is the same variant as a row
  // that names the default, where the library file of that very text supplies the default.
  const KernelFile file = KernelFile::load(kernel("rmsnorm_cpu.cpp"));
  const long long unroll = file.resolve_params(DType::f16).at("UNROLL");
  old_row["params"] = json::object();
  old_row["checks"] = {
      {"f16", {{"result", "PASS (five stages)"}, {"source_hash", file.text_hash}}}};
  json named = table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", unroll}}, 117.0);
  named["variant_key"] = file.text_hash + "|UNROLL=" + std::to_string(unroll) + "|f32|cpu|";
  EXPECT_EQ(rewrite(named).value("checks", json()),
            (json{{"f16", old_row.at("checks").at("f16")}}));
  json not_default = named;
  not_default["params"] = {{"UNROLL", unroll == 8 ? 4 : 8}};
  EXPECT_FALSE(rewrite(not_default).contains("checks"));
  json unknown = named;  // a name the file does not have
  unknown["params"] = {{"UNROLL", unroll}, {"NO_SUCH", 1}};
  EXPECT_FALSE(rewrite(unknown).contains("checks"));
  // Another text's defaults are not the file's present ones.
  old_row["checks"]["f16"]["source_hash"] = "text-a";
  named["variant_key"] = "text-a|UNROLL=" + std::to_string(unroll) + "|f32|cpu|";
  EXPECT_FALSE(rewrite(named).contains("checks"));
  old_row["params"] = {{"UNROLL", 8}};

  // Malformed checks are no checks, not an error.
  old_row["checks"] = {{"f16", "PASS"}, {"bf16", {{"source_hash", 7}}}};
  EXPECT_FALSE(rewrite(same).contains("checks"));
  EXPECT_EQ(row_check_text(old_row, DType::f16), "");
  old_row["checks"] = json::array({1, 2});
  EXPECT_FALSE(rewrite(same).contains("checks"));
  EXPECT_FALSE(row_check_of_code(old_row, DType::f32, DType::f16, "text-a"));
  old_row["variant_key"] = 3;
  EXPECT_EQ(row_source_hash(old_row), "");
}

// `kforge check --table --compile-only` compiles every variant of a table on a machine without
// a GPU, so that an edit that breaks a tuned variant other than the file's defaults shows before
// any device time is spent. It names each variant's verdict, exits non-zero when one does not
// compile or its file's constraints now rule it out, and records nothing.
TEST(TableCheckCli, CompileOnlyCompilesEveryVariantAndRecordsNothing) {
  const std::string rowblock =
      read_text(test::source_root() / "kernels" / "rmsnorm" / "rmsnorm_rowblock.cu");
  const fs::path root = make_library_tree("table-check-compile-only");
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  const fs::path op_dir = root / "kernels" / "rmsnorm";
  write_text(op_dir / "rmsnorm_rowblock.cu", rowblock);
  // A copy that builds at its defaults but not at UNROLL 2, as an edit can break one variant.
  std::string broken = rowblock;
  const size_t body = broken.find("*/\n");
  ASSERT_NE(body, std::string::npos);
  broken.insert(body + 3, "#if UNROLL == 2\n#error \"no build at UNROLL 2\"\n#endif\n");
  write_text(op_dir / "rmsnorm_unroll_cut.cu", broken);
  const fs::path table =
      write_table({table_row(64, 128, "rmsnorm_rowblock.cu", {{"UNROLL", 2}}, 1.0),
                   table_row(128, 128, "rmsnorm_unroll_cut.cu", {{"UNROLL", 2}}, 1.0),
                   table_row(256, 256, "rmsnorm_rowblock.cu",
                             {{"BLOCK_THREADS", 64}, {"ROWS_PER_BLOCK", 4}}, 1.0)},
                  DType::bf16);
  const std::string before = read_text(table);

  const CommandResult r =
      run_kforge({"check", "--table", table.string(), "--dtype", "bf16", "--compile-only"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("COMPILES      rmsnorm_rowblock.cu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("COMPILE_ERROR rmsnorm_unroll_cut.cu"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no build at UNROLL 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("REJECTED      rmsnorm_rowblock.cu [BLOCK_THREADS=64"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("require 'BLOCK_THREADS >= 32 * ROWS_PER_BLOCK'"), std::string::npos)
      << r.output;
  EXPECT_EQ(read_text(table), before);

  const CommandResult no_table = run_kforge(
      {"check", (op_dir / "rmsnorm_rowblock.cu").string(), "--dtype", "bf16", "--compile-only"});
  EXPECT_NE(no_table.exit_code, 0);
  EXPECT_NE(no_table.output.find("give --table"), std::string::npos) << no_table.output;
}

// `kforge check --table` records the code it checked (the file's text and the headers it
// includes), skips a variant checked in that code, and checks it again once the file or a header
// it includes has changed.
TEST(TableCheckCli, AVariantIsCheckedAgainAfterItsFileOrAHeaderChanges) {
  const fs::path root = make_library_tree("table-check-text");
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  json row = table_row(64, 128, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 1.0);
  row["variant_key"] = "an-earlier-text|UNROLL=8";  // tuned (and finally checked) on other code
  row["checks"] = {{"f32", {{"result", "PASS (five stages)"}, {"seed", 1}}}};  // no text named
  const fs::path table = write_table({row});
  const fs::path kernel = root / "kernels" / "rmsnorm" / "rmsnorm_cpu.cpp";
  const fs::path header = root / "include" / "kforge" / "elem_cpu.h";
  const auto check = [&](int seed) {
    const CommandResult r = run_kforge({"check", "--table", table.string(), "--dtype", "f32",
                                        "--backend", "cpu", "--seed", std::to_string(seed)});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const auto recorded = [&] { return read_tuned_table(table).at("sizes").at(0).at("checks"); };
  const auto code = [&] { return kernel_text_hash(read_text(kernel), kernel); };
  const std::string first_code = code();
  EXPECT_NE(first_code, hash_hex(read_text(kernel)));  // it covers the header too

  std::string out = check(11);
  EXPECT_NE(out.find("PASS  f32"), std::string::npos) << out;
  EXPECT_NE(out.find("checked before in another text of the file"), std::string::npos) << out;
  EXPECT_EQ(recorded().at("f32").at("seed"), 11);
  EXPECT_EQ(recorded().at("f32").at("source_hash"), first_code);

  out = check(12);
  EXPECT_NE(out.find("(checked before)"), std::string::npos) << out;
  EXPECT_EQ(recorded().at("f32").at("seed"), 11);

  // A comment is not code: the check stands.
  write_text(kernel, read_text(kernel) + "// a note on the code\n");
  out = check(15);
  EXPECT_NE(out.find("(checked before)"), std::string::npos) << out;
  EXPECT_EQ(recorded().at("f32").at("seed"), 11);

  write_text(kernel, read_text(kernel) + "[[maybe_unused]] static const int kf_an_edit = 1;\n");
  out = check(13);
  EXPECT_NE(out.find("PASS  f32"), std::string::npos) << out;
  EXPECT_EQ(recorded().at("f32").at("seed"), 13);
  const std::string edited_code = code();
  EXPECT_EQ(recorded().at("f32").at("source_hash"), edited_code);
  EXPECT_NE(edited_code, first_code);

  write_text(header, read_text(header) + "#define KF_AN_EDIT_OF_A_HEADER_THE_FILE_INCLUDES 1\n");
  out = check(14);
  EXPECT_NE(out.find("PASS  f32"), std::string::npos) << out;
  EXPECT_EQ(recorded().at("f32").at("seed"), 14);
  EXPECT_EQ(recorded().at("f32").at("source_hash"), code());
  EXPECT_NE(code(), edited_code);
}

// The variants a table check will run are compiled first, all at once, and then checked one by
// one from the compile cache.
TEST(TableCheckCli, TheVariantsToCheckAreCompiledAtOnceFirst) {
  const fs::path root = make_library_tree("table-check-prebuild");
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  json rows[] = {table_row(64, 128, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 1.0),
                 table_row(256, 256, "rmsnorm_cpu.cpp", {{"UNROLL", 2}}, 1.0)};
  for (json& row : rows)
    row["variant_key"] = "an-earlier-text|";  // the tunes' final checks were of other code
  const fs::path table = write_table({rows[0], rows[1]});
  const auto check = [&] {
    const CommandResult r =
        run_kforge({"check", "--table", table.string(), "--dtype", "f32", "--backend", "cpu"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  std::string out = check();
  EXPECT_NE(out.find("compiling the 2 variants to check at once"), std::string::npos) << out;
  EXPECT_NE(out.find("PASS  f32  rmsnorm_cpu.cpp {\"UNROLL\":8}"), std::string::npos) << out;
  EXPECT_NE(out.find("PASS  f32  rmsnorm_cpu.cpp {\"UNROLL\":2}"), std::string::npos) << out;
  // Checked in this text: nothing to compile or run the second time.
  out = check();
  EXPECT_EQ(out.find("compiling"), std::string::npos) << out;
  EXPECT_NE(out.find("(checked before)"), std::string::npos) << out;
}

// A tune that writes a variant on a new row leaves that row without the checks the variant's
// other rows hold. A check of the same code on one row stands for them all: it is copied, not
// run again (a CUTLASS variant's check costs minutes of compiling), and a FAIL copies as a FAIL.
TEST(TableCheckCli, ASameTextCheckOnOneRowIsCopiedToTheVariantsOtherRows) {
  const fs::path root = make_library_tree("table-check-copy");
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  const fs::path kernel = root / "kernels" / "rmsnorm" / "rmsnorm_cpu.cpp";
  const std::string code = kernel_text_hash(read_text(kernel), kernel);
  const auto table_with = [&](const std::string& result) {
    json checked = table_row(64, 128, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 1.0);
    checked["checks"] = {{"f32",
                          {{"result", result},
                           {"seed", 5},
                           {"source_hash", code},
                           {"checked_at", "2026-01-02T03:04:05Z"}}}};
    json unchecked = table_row(128, 128, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 2.0);
    for (json* row : {&checked, &unchecked})
      (*row)["variant_key"] = "an-earlier-text|";  // the tunes' final checks were of other code
    return write_table({checked, unchecked});
  };
  const auto check = [&](const fs::path& table) {
    return run_kforge(
        {"check", "--table", table.string(), "--dtype", "f32", "--backend", "cpu", "--seed", "11"});
  };
  const auto second_row = [](const fs::path& table) {
    return read_tuned_table(table).at("sizes").at(1).at("checks").at("f32");
  };

  fs::path table = table_with("PASS (five stages)");
  CommandResult r = check(table);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("copied"), std::string::npos) << r.output;
  EXPECT_EQ(second_row(table).at("seed"), 5) << "run again instead of copied";
  EXPECT_EQ(second_row(table).at("checked_at"), "2026-01-02T03:04:05Z");
  EXPECT_EQ(second_row(table).at("source_hash"), code);
  EXPECT_NE(check(table).output.find("(checked before)"), std::string::npos);

  table = table_with("FAIL (WRONG): mismatch at [3, 7]");
  r = check(table);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("FAIL (WRONG) f32"), std::string::npos) << r.output;
  EXPECT_EQ(second_row(table).at("result"), "FAIL (WRONG): mismatch at [3, 7]");
}

// In the table's own dtype the final check of the tune that wrote a row is a check of the code
// its variant key names: a freshly tuned table checked in its dtype runs nothing, a FAIL there
// counts in the exit status, and a final check that was not made (a replay) counts for nothing.
// Another dtype runs its stages.
TEST(TableCheckCli, ATunesFinalCheckCountsInTheTablesDtype) {
  const fs::path root = make_library_tree("table-check-final");
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  const auto table_with = [&](const std::string& final_check) {
    json tuned = table_row(64, 128, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 1.0, final_check);
    tuned["git_sha"] = "abc123";
    tuned["recorded_at"] = "2026-01-02T03:04:05Z";
    json earlier = table_row(128, 128, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 2.0);
    earlier["variant_key"] = "an-earlier-text|";
    return write_table({tuned, earlier});  // f32: `tuned` names the present code
  };
  const auto check = [&](const fs::path& table, const char* dtype) {
    return run_kforge(
        {"check", "--table", table.string(), "--dtype", dtype, "--backend", "cpu", "--seed", "11"});
  };
  const auto checks_of_row = [](const fs::path& table, int i) {
    return read_tuned_table(table).at("sizes").at(i).value("checks", json::object());
  };

  fs::path table = table_with("PASS (seed 1)");
  CommandResult r = check(table, "f32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS  f32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("copied"), std::string::npos) << r.output;
  const json copied = checks_of_row(table, 1).at("f32");
  EXPECT_EQ(copied.at("result"), "PASS (seed 1)") << "run again instead of the final check";
  EXPECT_EQ(copied.at("git_sha"), "abc123");
  EXPECT_EQ(copied.at("checked_at"), "2026-01-02T03:04:05Z");
  r = check(table, "f32");
  EXPECT_NE(r.output.find("PASS  f32  rmsnorm_cpu.cpp {\"UNROLL\":8}  (checked before)"),
            std::string::npos)
      << r.output;
  // f16 borrows the table: the f32 final check says nothing about it.
  r = check(table, "f16");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("checked before"), std::string::npos) << r.output;
  EXPECT_EQ(checks_of_row(table, 0).at("f16").at("seed"), 11);

  table = table_with("FAIL: mismatch at [3, 7]");
  r = check(table, "f32");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("FAIL  f32"), std::string::npos) << r.output;
  EXPECT_EQ(checks_of_row(table, 1).at("f32").at("result"), "FAIL: mismatch at [3, 7]");

  table = table_with("not checked (replay)");
  r = check(table, "f32");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(checks_of_row(table, 0).at("f32").at("seed"), 11) << r.output;
}

// `kforge build rmsnorm --sizes all` with a table for two of the five benchmark sizes:
//   1024x768   defaults   (4096x4096 and 4096x1024 rows need N % CHUNK == 0; 1024x768's row FAILed)
//   4096x1024  exact      chunked CHUNK=1024, UNROLL=1
//   4096x4096  exact      chunked CHUNK=4096, UNROLL=8
//   2048x4096  nearest    4096x4096's row
//   8192x8192  nearest    4096x4096's row
TEST(BuildCli, SizesAllBuildsTheLibraryChoiceForEveryBenchSize) {
  const fs::path root = make_library_tree("build-all");
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  const fs::path table = write_table(
      {table_row(4096, 4096, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 8}, {"CHUNK", 4096}}, 50.0),
       table_row(4096, 1024, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 1}, {"CHUNK", 1024}}, 20.0),
       table_row(1024, 768, "rmsnorm_cpu.cpp", {{"UNROLL", 2}}, 5.0, "FAIL: mismatch at [3, 7]")});
  const fs::path manifest_path = root / "manifest.json";
  const CommandResult r = run_kforge({"build", "rmsnorm", "--sizes", "all", "--dtype", "f32",
                                      "--backend", "cpu", "--json", manifest_path.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json manifest = json::parse(std::ifstream(manifest_path));
  EXPECT_EQ(manifest.at("device").at("backend"), "cpu");
  const json& modules = manifest.at("modules");

  struct Expected {
    int64_t m, n;
    std::string source, file, variant, tuned_shape;
    double tuned_us;
  };
  const std::vector<Expected> expected = {
      {1024, 768, "defaults", "rmsnorm_cpu.cpp", "UNROLL=4", "", 0},
      {4096, 1024, "exact_size", "rmsnorm_chunked_cpu.cpp", "CHUNK=1024,UNROLL=1", "4096x1024", 20},
      {4096, 4096, "exact_size", "rmsnorm_chunked_cpu.cpp", "CHUNK=4096,UNROLL=8", "4096x4096", 50},
      {2048, 4096, "nearest_size", "rmsnorm_chunked_cpu.cpp", "CHUNK=4096,UNROLL=8", "4096x4096",
       50},
      {8192, 8192, "nearest_size", "rmsnorm_chunked_cpu.cpp", "CHUNK=4096,UNROLL=8", "4096x4096",
       50},
  };
  const OpSpec& op = *find_op("rmsnorm");
  ASSERT_EQ(modules.size(), op.bench_sizes().size());
  ASSERT_EQ(modules.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const Expected& e = expected[i];
    const json& m = modules[i];
    SCOPED_TRACE(m.dump(2));
    EXPECT_EQ(op.bench_sizes()[i].sizes, mn(e.m, e.n));
    EXPECT_EQ(m.at("op"), "rmsnorm");
    EXPECT_EQ(m.at("shape"), std::to_string(e.m) + "x" + std::to_string(e.n));
    // rmsnorm's default size, where its targets are stated, is 8192x8192.
    EXPECT_EQ(m.at("default_size"), e.m == 8192 && e.n == 8192);
    EXPECT_EQ(m.at("sizes"), (json{{"M", e.m}, {"N", e.n}}));
    EXPECT_EQ(m.at("dtype"), "f32");
    EXPECT_EQ(m.at("verdict"), verdict_name(Verdict::ok));
    EXPECT_EQ(m.at("variant"), e.variant);

    const json& lib = m.at("library");
    EXPECT_EQ(lib.at("source"), e.source);
    EXPECT_EQ(lib.at("file"), (root / "kernels" / "rmsnorm" / e.file).string());
    EXPECT_EQ(lib.at("table"), table.string());
    if (e.source == "defaults") {
      EXPECT_EQ(lib.at("params"), json::object());
      EXPECT_FALSE(lib.contains("tuned_shape"));
    } else {
      EXPECT_EQ(lib.at("tuned_shape"), e.tuned_shape);
      EXPECT_DOUBLE_EQ(lib.at("tuned_median_us").get<double>(), e.tuned_us);
    }

    const fs::path module = m.at("module").get<std::string>();
    EXPECT_TRUE(fs::is_regular_file(module)) << module;
    EXPECT_EQ(module.string().rfind((root / "cache").string(), 0), 0u) << module;
    EXPECT_EQ(m.at("entry"), "kforge_run");

    EXPECT_EQ(m.at("inputs"), (json{{{"name", "x"}, {"dtype", "f32"}, {"shape", {e.m, e.n}}},
                                    {{"name", "weight"}, {"dtype", "f32"}, {"shape", {e.n}}}}));
    EXPECT_EQ(m.at("outputs"), (json{{{"name", "y"}, {"dtype", "f32"}, {"shape", {e.m, e.n}}}}));
    ASSERT_EQ(m.at("scalars").size(), 1u);
    EXPECT_EQ(m.at("scalars")[0].at("name"), "eps");
    EXPECT_DOUBLE_EQ(m.at("scalars")[0].at("value").get<double>(), 1e-6);
    EXPECT_DOUBLE_EQ(m.at("tolerance").at("atol").get<double>(), 1e-5);
    EXPECT_DOUBLE_EQ(m.at("tolerance").at("rtol").get<double>(), 1e-5);
    EXPECT_DOUBLE_EQ(m.at("bytes").get<double>(),
                     (2.0 * static_cast<double>(e.m * e.n) + static_cast<double>(e.n)) * 4);
  }
  // The same defaults at two sizes, or the same variant at three, is one module.
  EXPECT_EQ(modules[2].at("module"), modules[3].at("module"));
  EXPECT_EQ(modules[2].at("module"), modules[4].at("module"));
  EXPECT_NE(modules[1].at("module"), modules[2].at("module"));
  EXPECT_NE(modules[0].at("module"), modules[1].at("module"));
}

TEST(BuildCli, UnknownOpAndBadFlagsAreUsageErrors) {
  const CommandResult unknown =
      run_kforge({"build", "no_such_op", "--dtype", "f32", "--backend", "cpu"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("unknown op 'no_such_op'"), std::string::npos) << unknown.output;
  EXPECT_NE(unknown.output.find("rmsnorm"), std::string::npos) << unknown.output;

  const CommandResult two_ops = run_kforge(
      {"build", "rmsnorm", "softmax", "--shape", "64x64", "--dtype", "f32", "--backend", "cpu"});
  EXPECT_EQ(two_ops.exit_code, 2) << two_ops.output;
  EXPECT_NE(two_ops.output.find("--shape needs exactly one op"), std::string::npos)
      << two_ops.output;
}

// A library tree whose two rmsnorm CPU files have a busy: line
// (BusyLinesScaleEachRowsTimeToTheSize), with a table of `rows`; returns the starts a `--strategy
// given` tune at 2048x4096 used.
std::vector<std::string> tune_starts_at_2048x4096(const std::string& name,
                                                  const std::vector<json>& rows,
                                                  const std::vector<std::string>& flags) {
  const fs::path root = make_library_tree(name);
  const ScopedEnv include("KFORGE_INCLUDE_DIR", (root / "include").string());
  const ScopedEnv cache("KFORGE_CACHE_DIR", (root / "cache").string());
  for (const char* file : {"rmsnorm_cpu.cpp", "rmsnorm_chunked_cpu.cpp"}) {
    const fs::path path = root / "kernels" / "rmsnorm" / file;
    std::string text = read_text(path);
    text.insert(text.find(kUnrollLine), kRowBlocksBusyLine);
    write_text(path, text);
  }
  write_table(rows);
  std::vector<std::string> args = {"tune",
                                   "rmsnorm",
                                   "--shape",
                                   "2048x4096",
                                   "--dtype",
                                   "f32",
                                   "--backend",
                                   "cpu",
                                   "--strategy",
                                   "given",
                                   "--no-final-check",
                                   "--db",
                                   (root / "results.sqlite").string(),
                                   "--json",
                                   (root / "tune.json").string()};
  args.insert(args.end(), flags.begin(), flags.end());
  const CommandResult r = run_kforge(args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return json::parse(std::ifstream(root / "tune.json")).at("starts_used");
}

// A tune at a size without a row starts from the row the library runs there (busy: lines), as
// well as from the nearest row: here 1024x1024's, predicted 16 us at 2048x4096, where the
// nearest, 4096x4096's, is predicted 60.25. With --all-rows, from every row, each variant once.
TEST(TuneCli, ASizeWithoutARowStartsFromTheRowTheLibraryRuns) {
  const std::vector<json> rows = {
      table_row(4096, 4096, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 120.5),
      table_row(1024, 1024, "rmsnorm_chunked_cpu.cpp", {{"UNROLL", 2}, {"CHUNK", 256}}, 2.0),
      table_row(512, 512, "rmsnorm_cpu.cpp", {{"UNROLL", 1}}, 1.0),
      table_row(256, 256, "rmsnorm_cpu.cpp", {{"UNROLL", 8}}, 0.5)};
  EXPECT_EQ(tune_starts_at_2048x4096("tune-library-row-start", rows, {}),
            (std::vector<std::string>{
                "row 4096x4096 of this device's table",
                "row 1024x1024 of this device's table, which the library runs here (predicted "
                "16.0 us by its file's busy: lines)"}));
  EXPECT_EQ(tune_starts_at_2048x4096("tune-all-rows", rows, {"--all-rows"}),
            (std::vector<std::string>{"row 4096x4096 of this device's table",
                                      "row 1024x1024 of this device's table",
                                      "row 512x512 of this device's table"}));
}

}  // namespace
}  // namespace kforge
