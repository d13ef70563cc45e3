// The export plan, the generated dispatch (compiled on the host and called), and the standalone
// export's build. The device is the recorded H100's (its ceilings file), its tables the
// library's own.
#include <dlfcn.h>

#include <cmath>
#include <fstream>
#include <random>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compile/compiler.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/process.h"
#include "device/ceilings.h"
#include "export/export_target.h"
#include "loop/journal.h"
#include "ops/op_spec.h"
#include "profile/cupti_import.h"
#include "profile/planner.h"
#include "test_support.h"
#include "tune/library.h"
#include "tune/results_db.h"

namespace kforge {
namespace {
namespace fs = std::filesystem;

DeviceInfo recorded_h100() {
  const Ceilings c =
      read_ceilings_file(fs::path(test::test_data_dir()) / "recorded_hf" / "ceilings_h100.json");
  return c.raw.at("device").get<DeviceInfo>();
}

ExportPlan plan_for(const std::vector<std::string>& ops,
                    std::vector<std::pair<const OpSpec*, Sizes>> extra = {}) {
  ExportRequest request;
  for (const auto& name : ops)
    request.ops.push_back(find_op(name));
  request.dtypes = {DType::bf16};
  request.extra_sizes = std::move(extra);
  return make_export_plan(request, recorded_h100());
}

ExportContext context() {
  ExportContext c;
  c.run = {{"kforge_git_sha", "test"}, {"date", "2026-11-24T00:00:00Z"}};
  c.include_dir = test::source_root() / "include";
  return c;
}

TEST(ExportPlan, EveryTableSizeRunsTheLibrarysChoice) {
  const OpSpec& rmsnorm = *find_op("rmsnorm");
  Sizes model = {{"M", 3 * 1024}, {"N", 2048}};  // not a table size
  const ExportPlan plan = plan_for({"rmsnorm", "softmax"}, {{&rmsnorm, model}});
  ASSERT_EQ(plan.ops.size(), 2u);
  for (const ExportOp& op : plan.ops) {
    const auto table = find_tuned_table(std::string(op.op->name()), DType::bf16, plan.device_key);
    ASSERT_TRUE(table) << op.op->name();
    size_t table_rows = read_tuned_table(table->path).at("sizes").size();
    EXPECT_EQ(op.rows.size(), table_rows + (op.op == &rmsnorm ? 1 : 0)) << op.op->name();
    std::set<std::string> symbols;
    for (const ExportVariant& v : op.variants)
      EXPECT_TRUE(symbols.insert(v.symbol).second) << v.symbol;
    for (const ExportRow& row : op.rows) {
      Sizes sizes = row.sizes;
      op.op->complete_sizes(sizes);
      const LibraryChoice choice = library_choice(*op.op, sizes, DType::bf16, plan.device);
      const ExportVariant& v = op.variants.at(row.variant);
      EXPECT_EQ(v.file, choice.file) << op.op->format_shape(sizes);
      for (const auto& [name, value] : choice.params)
        EXPECT_EQ(v.variant.params.at(name), value) << name << " at " << op.op->format_shape(sizes);
      EXPECT_EQ(row.choice, choice.describe());
    }
  }
  // The model's size is exported with the nearest valid row's variant, marked as the plan's.
  const auto& rows = plan.ops[0].rows;
  const auto model_row =
      std::find_if(rows.begin(), rows.end(), [](const ExportRow& r) { return r.source == "plan"; });
  ASSERT_NE(model_row, rows.end());
  EXPECT_EQ(model_row->sizes, model);
}

TEST(ExportPlan, RefusesWhatItCannotDispatchOrHasNoSizesFor) {
  ExportRequest request;
  request.ops = {find_op("rmsnorm")};
  request.dtypes = {DType::bf16};
  DeviceInfo unknown = recorded_h100();
  unknown.name = "NVIDIA H999";  // no table for it, and no plan shapes
  EXPECT_THROW(make_export_plan(request, unknown), UsageError);
  DeviceInfo cpu = unknown;
  cpu.backend = "cpu";
  EXPECT_THROW(make_export_plan(request, cpu), UsageError);
}

TEST(ExportPlan, DispatchSizesFoldLeadingDimensions) {
  const auto key = dispatch_key(*find_op("rmsnorm"));
  EXPECT_EQ(*dispatch_sizes(key, {{2, 1024, 4096}, {4096}}), (Sizes{{"M", 2048}, {"N", 4096}}));
  EXPECT_EQ(*dispatch_sizes(key, {{8, 4096}, {4096}}), (Sizes{{"M", 8}, {"N", 4096}}));
  EXPECT_FALSE(dispatch_sizes(key, {{4096}, {4096}}));  // fewer dimensions than x[M, N]
  const auto rope = dispatch_key(*find_op("rotary_embedding_half"));
  EXPECT_EQ(*dispatch_sizes(rope, {{1, 32, 4096, 128}, {4096, 64}, {4096, 64}}),
            (Sizes{{"batch", 1}, {"heads", 32}, {"seq_len", 4096}, {"head_dim", 128}}));
}

// Attention's calls show its causal flag as a scalar and kv_heads as K's heads; its scale does
// not choose the variant, so it is not in the key and the table's rows at other scales are not
// exported.
TEST(ExportPlan, AttentionDispatchesOnItsFlagAndKeyValueHeads) {
  const OpSpec& attention = *find_op("flash_attention");
  const auto key = dispatch_key(attention);
  const std::vector<std::vector<int64_t>> gqa = {
      {2, 32, 1024, 128}, {2, 8, 1024, 128}, {2, 8, 1024, 128}};
  EXPECT_EQ(*dispatch_sizes(key, gqa, {0.088, 1.0}), (Sizes{{"batch", 2},
                                                            {"heads", 32},
                                                            {"seq_len", 1024},
                                                            {"head_dim", 128},
                                                            {"causal", 1},
                                                            {"kv_heads", 8}}));
  EXPECT_EQ(dispatch_sizes(key, gqa, {0.088, 0.0})->at("causal"), 0);
  EXPECT_FALSE(dispatch_sizes(key, gqa, {0.088}));  // no causal flag passed
  EXPECT_FALSE(dispatch_sizes(key, gqa, {0.088, std::nan("")}));

  // A model's shape at another scale is exported at the default scale.
  Sizes scaled = {{"batch", 1},     {"heads", 8},           {"seq_len", 256},
                  {"head_dim", 64}, {"scale_permille", 50}, {"causal", 1}};
  const ExportPlan plan = plan_for({"flash_attention"}, {{&attention, scaled}});
  ASSERT_EQ(plan.ops.size(), 1u);
  const auto table = find_tuned_table("flash_attention", DType::bf16, plan.device_key);
  ASSERT_TRUE(table);
  const nlohmann::json rows = read_tuned_table(table->path);
  size_t default_scale_rows = 0;
  for (const auto& row : rows.at("sizes"))
    default_scale_rows += row.at("sizes").value("scale_permille", 0) == 0;
  EXPECT_EQ(plan.ops[0].rows.size(), default_scale_rows + 1);
  const ExportRow& model = plan.ops[0].rows.back();
  EXPECT_EQ(model.source, "plan");
  scaled.erase("scale_permille");
  scaled["kv_heads"] = 8;
  EXPECT_EQ(model.sizes, scaled);
  bool causal = false, full = false;
  for (const ExportRow& row : plan.ops[0].rows) {
    EXPECT_FALSE(row.sizes.contains("scale_permille"));
    (row.sizes.at("causal") ? causal : full) = true;
  }
  EXPECT_TRUE(causal && full) << "the table has rows of both kinds";
}

// The generated dispatch, compiled with stand-in variants (each returns 1000 + its index among
// the symbols) and called through dlopen, against the plan and dispatch_sizes.
class GeneratedDispatch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const OpSpec& rmsnorm = *find_op("rmsnorm");
    // Attention with grouped queries too, so that kv_heads is read from K, not Q.
    const Sizes gqa = {{"batch", 2},      {"heads", 32}, {"seq_len", 1024},
                       {"head_dim", 128}, {"causal", 1}, {"kv_heads", 8}};
    plan_ = new ExportPlan(
        plan_for({"rmsnorm", "rotary_embedding_half", "cross_entropy", "flash_attention"},
                 {{&rmsnorm, {{"M", 4096}, {"N", 2048}}}, {find_op("flash_attention"), gqa}}));
    dir_ = new fs::path(test::temp_dir("export-dispatch"));
    const auto written = find_export_target("standalone")->write(*plan_, context(), *dir_);
    ASSERT_FALSE(written.empty());
    std::string stubs = "#include \"kforge/kernel.h\"\n";
    int index = 0;
    for (const ExportOp& op : plan_->ops) {
      for (const ExportVariant& v : op.variants) {
        stubs += fmt::format("int {}(const kf_args* a) {{ (void)a; return {}; }}\n", v.symbol,
                             1000 + index);
        symbols_.push_back(v.symbol);
        ++index;
      }
    }
    std::ofstream(*dir_ / "stubs.c") << stubs;
    const auto r = run_command(
        {"cc", "-std=c11", "-Wall", "-Werror", "-shared", "-fPIC",
         "-I" + (*dir_ / "include").string(), (*dir_ / "src" / "kforge_dispatch.c").string(),
         (*dir_ / "stubs.c").string(), "-o", (*dir_ / "dispatch.so").string()});
    ASSERT_TRUE(r.ok()) << r.output;
    library_ = dlopen((*dir_ / "dispatch.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << dlerror();
  }
  static void TearDownTestSuite() {
    if (library_) dlclose(library_);
    delete plan_;
    delete dir_;
  }

  using Run = int (*)(const kf_args*);
  using Name = const char* (*)(const kf_args*);

  // Calls kforge_<op>_variant and kforge_<op> with tensors of `shapes` in `dtype` and
  // `scalars`; returns the variant's name ("" for none) after checking that the call agrees.
  static std::string dispatched(const std::string& op,
                                const std::vector<std::vector<int64_t>>& shapes, DType dtype,
                                const std::vector<double>& scalars = {},
                                int abi = KFORGE_ABI_VERSION) {
    std::vector<kf_tensor> inputs(shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      inputs[i].dtype = i == 0 ? to_abi(dtype) : KF_DTYPE_I64;
      inputs[i].ndim = static_cast<int32_t>(shapes[i].size());
      for (size_t d = 0; d < shapes[i].size(); ++d)
        inputs[i].shape[d] = shapes[i][d];
    }
    kf_args args{};
    args.abi_version = abi;
    args.num_inputs = static_cast<int32_t>(inputs.size());
    args.inputs = inputs.data();
    args.num_scalars = static_cast<int32_t>(scalars.size());
    args.scalars = scalars.empty() ? nullptr : scalars.data();
    const auto name =
        reinterpret_cast<Name>(dlsym(library_, ("kforge_" + op + "_variant").c_str()));
    const auto run = reinterpret_cast<Run>(dlsym(library_, ("kforge_" + op).c_str()));
    EXPECT_TRUE(name && run) << op;
    if (!name || !run) return "?";
    const char* variant = name(&args);
    const int status = run(&args);
    if (!variant) {
      EXPECT_EQ(status, KF_ERR_UNSUPPORTED);
      return "";
    }
    const auto at = std::find(symbols_.begin(), symbols_.end(), std::string(variant));
    EXPECT_NE(at, symbols_.end()) << variant;
    EXPECT_EQ(status, 1000 + (at - symbols_.begin())) << variant;
    return variant;
  }

  // What the plan says a call with these input shapes runs ("" for not covered).
  static std::string expected(const ExportOp& op, const std::vector<std::vector<int64_t>>& shapes,
                              const std::vector<double>& scalars = {}) {
    const auto sizes = dispatch_sizes(op.key, shapes, scalars);
    if (!sizes) return "";
    for (const ExportRow& r : op.rows) {
      if (r.sizes == *sizes) return op.variants[r.variant].symbol;
    }
    return "";
  }

  static ExportPlan* plan_;
  static fs::path* dir_;
  static void* library_;
  static std::vector<std::string> symbols_;
};
ExportPlan* GeneratedDispatch::plan_ = nullptr;
fs::path* GeneratedDispatch::dir_ = nullptr;
void* GeneratedDispatch::library_ = nullptr;
std::vector<std::string> GeneratedDispatch::symbols_;

TEST_F(GeneratedDispatch, EveryRowRunsItsVariantAndNothingElseIsCovered) {
  for (const ExportOp& op : plan_->ops) {
    const std::string name(op.op->name());
    for (const ExportRow& row : op.rows) {
      Sizes sizes = row.sizes;
      op.op->complete_sizes(sizes);
      std::vector<std::vector<int64_t>> shapes;
      for (const TensorSpec& t : op.op->tensors()) {
        if (!t.is_output) shapes.push_back(op.op->shape_of(t, sizes));
      }
      std::vector<double> scalars = op.op->scalar_values(sizes);
      const bool flagged = std::any_of(op.key.begin(), op.key.end(),
                                       [](const DispatchDim& d) { return d.scalar >= 0; });
      EXPECT_EQ(dispatched(name, shapes, DType::bf16, scalars), op.variants[row.variant].symbol)
          << name << " " << op.op->format_shape(row.sizes);
      EXPECT_EQ(dispatched(name, shapes, DType::f32, scalars), "") << "f32 was not exported";
      EXPECT_EQ(dispatched(name, shapes, DType::bf16, scalars, KFORGE_ABI_VERSION + 1), "");
      if (flagged) {
        EXPECT_EQ(dispatched(name, shapes, DType::bf16), "") << "a call without its flag";
        for (const DispatchDim& d : op.key) {
          if (d.scalar < 0) continue;
          std::vector<double> flipped = scalars;
          flipped[d.scalar] = flipped[d.scalar] != 0 ? 0 : 1;
          EXPECT_EQ(dispatched(name, shapes, DType::bf16, flipped), expected(op, shapes, flipped))
              << name << " " << op.op->format_shape(row.sizes) << " with " << d.size << " flipped";
        }
      }
      shapes[0].back() += 1;  // a size no row has
      EXPECT_EQ(dispatched(name, shapes, DType::bf16, scalars), "") << name;
    }
  }
}

TEST_F(GeneratedDispatch, AgreesWithDispatchSizesOnRandomShapes) {
  std::mt19937_64 random(20261124);
  const ExportOp& rmsnorm = plan_->ops.at(0);
  ASSERT_EQ(rmsnorm.op->name(), "rmsnorm");
  int covered = 0;
  for (int i = 0; i < 400; ++i) {
    // x: 1 to 4 dimensions whose product is often a table size's M.
    const ExportRow& row = rmsnorm.rows[random() % rmsnorm.rows.size()];
    const int64_t m = row.sizes.at("M");
    const int64_t n = random() % 4 == 0 ? row.sizes.at("N") * 2 : row.sizes.at("N");
    std::vector<int64_t> x;
    switch (random() % 4) {
      case 0:
        x = {n};
        break;
      case 1:
        x = {m, n};
        break;
      case 2:
        x = {2, m / 2, n};
        break;
      default:
        x = {2, 2, m / 4, n};
    }
    const std::vector<std::vector<int64_t>> shapes = {x, {n}};
    const std::string want = expected(rmsnorm, shapes);
    covered += !want.empty();
    EXPECT_EQ(dispatched("rmsnorm", shapes, DType::bf16), want) << fmt::format("{}", x.size());
  }
  EXPECT_GT(covered, 100);
  EXPECT_LT(covered, 400);
}

// The standalone export builds with CMake and nvcc into a static library and the example
// program (which needs a GPU to run; building it needs none).
TEST(StandaloneExport, BuildsWithCMake) {
  if (!run_command({"sh", "-c", "command -v nvcc && command -v cmake && command -v ninja"}).ok())
    GTEST_SKIP() << "nvcc, cmake or ninja not found";
  const ExportPlan plan = plan_for({"rmsnorm"});
  const fs::path dir = test::temp_dir("export-build");
  const fs::path out = dir / "export";
  find_export_target("standalone")->write(plan, context(), out);
  const auto configure =
      run_command({"cmake", "-S", out.string(), "-B", (dir / "build").string(), "-G", "Ninja"},
                  std::chrono::minutes(5));
  ASSERT_TRUE(configure.ok()) << configure.output;
  const auto build =
      run_command({"cmake", "--build", (dir / "build").string()}, std::chrono::minutes(15));
  ASSERT_TRUE(build.ok()) << build.output;
  EXPECT_TRUE(fs::exists(dir / "build" / "kforge_export_example"));
  EXPECT_TRUE(fs::exists(dir / "build" / "libkforge_export.a"));
  const nlohmann::json manifest = read_json_file(out / "kforge_export.json");
  EXPECT_EQ(manifest.at("device_key"), plan.device_key);
  EXPECT_EQ(manifest.at("ops").at(0).at("rows").size(), plan.ops.at(0).rows.size());
}

// A CUTLASS variant's source is built as kforge's compiler builds it: with CUTLASS's headers
// (KFORGE_CUTLASS_INCLUDE, defaulting to where kforge found them), --expt-relaxed-constexpr and
// NDEBUG; the other variants without them; a folder without the headers stops CMake with the fix.
TEST(StandaloneExport, CutlassVariantsGetItsHeadersAndFlags) {
  if (!run_command({"sh", "-c", "command -v nvcc && command -v cmake && command -v ninja"}).ok())
    GTEST_SKIP() << "nvcc, cmake or ninja not found";
  const fs::path headers = default_cutlass_include_dir();
  if (headers.empty()) GTEST_SKIP() << "CUTLASS's headers not installed";
  const fs::path dir = test::temp_dir("export-cutlass");
  // Reached through a name CMake would otherwise read as a variable reference.
  ExportContext with_cutlass = context();
  with_cutlass.cutlass_include_dir = dir / "cutlass ${HOME}";
  fs::create_directory_symlink(headers, with_cutlass.cutlass_include_dir);
  const ExportPlan plan = plan_for({"rmsnorm", "matmul"});
  const fs::path out = dir / "export";
  find_export_target("standalone")->write(plan, with_cutlass, out);

  std::set<std::string> cutlass_symbols;  // the variants kforge compiles with CUTLASS
  for (const ExportOp& op : plan.ops) {
    for (const ExportVariant& v : op.variants) {
      if (v.uses_cutlass) cutlass_symbols.insert(v.symbol);
    }
  }
  const auto configure = [&](const std::string& build, std::vector<std::string> extra) {
    // No build type: its flags (Release's -DNDEBUG) would reach every variant.
    std::vector<std::string> cmd = {"cmake",
                                    "-DCMAKE_BUILD_TYPE=",
                                    "-S",
                                    out.string(),
                                    "-B",
                                    (dir / build).string(),
                                    "-G",
                                    "Ninja",
                                    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return run_command(cmd, std::chrono::minutes(5));
  };
  const CommandResult missing =
      configure("build-missing", {"-DKFORGE_CUTLASS_INCLUDE=" + dir.string()});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.output.find("CUTLASS's headers are not in"), std::string::npos)
      << missing.output;

  const CommandResult configured = configure("build", {});
  ASSERT_TRUE(configured.ok()) << configured.output;
  EXPECT_NE(test::read_text(dir / "build" / "CMakeCache.txt")
                .find("KFORGE_CUTLASS_INCLUDE:PATH=" +
                      with_cutlass.cutlass_include_dir.generic_string() + "\n"),
            std::string::npos)
      << "the folder's name taken literally";
  int cutlass_variants = 0, plain_variants = 0;
  for (const nlohmann::json& entry : read_json_file(dir / "build" / "compile_commands.json")) {
    const std::string file = entry.at("file").get<std::string>();
    const std::string command = entry.at("command").get<std::string>();
    if (file.find("/variants/") == std::string::npos) continue;
    const bool cutlass = cutlass_symbols.contains(fs::path(file).stem().string());
    (cutlass ? cutlass_variants : plain_variants)++;
    for (const std::string flag :
         {"-I\"" + (dir / "cutlass ").generic_string(), std::string("--expt-relaxed-constexpr"),
          std::string("-DNDEBUG")}) {
      EXPECT_EQ(command.find(flag) != std::string::npos, cutlass) << flag << " in " << command;
    }
  }
  EXPECT_GT(cutlass_variants, 0);
  EXPECT_GT(plain_variants, 0);
}

// `kforge patch --export DIR -- PROGRAM`: the program runs unchanged (its output, its exit
// status), a sitecustomize it had on PYTHONPATH still runs, and the patching is set up in its first
// Python process only. Without PyTorch (CI) the program runs unpatched and says so; with it, the
// patched model's run is checked on the GPU machine (test_export_gpu.cpp).
TEST(TorchExport, PatchRunsTheProgramUnchanged) {
  const ExportPlan plan = plan_for({"rmsnorm"});
  const fs::path dir = test::temp_dir("export-patch");
  const fs::path out = dir / "package";
  find_export_target("torch")->write(plan, context(), out);
  const fs::path own = dir / "own-site";
  fs::create_directories(own);
  {
    std::ofstream site(own / "sitecustomize.py");
    site << "import os\nos.environ['OWN_SITE_RAN'] = '1'\n";
  }
  const std::string program =
      "import os, subprocess, sys\n"
      "print('own site', os.environ.get('OWN_SITE_RAN'))\n"
      "print('claimed by', os.environ.get('KFORGE_PATCH_CLAIMED') == str(os.getpid()))\n"
      "child = subprocess.run([sys.executable, '-c', 'import os; "
      "print(os.environ.get(\"KFORGE_PATCH_CLAIMED\"))'], capture_output=True, text=True)\n"
      "print('child sees', child.stdout.strip() == os.environ['KFORGE_PATCH_CLAIMED'])\n"
      "sys.exit(3)\n";
  const auto r = run_command({"env", "PYTHONPATH=" + own.string(), test::kforge_binary(), "patch",
                              "--export", out.string(), "--", "python3", "-c", program},
                             std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("own site 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("claimed by True"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("child sees True"), std::string::npos) << r.output;
  if (!run_command({"python3", "-c", "import torch"}).ok()) {
    EXPECT_NE(r.output.find("not patching: cannot load PyTorch or the export"), std::string::npos)
        << r.output;
  }

  const auto missing = run_command(
      {test::kforge_binary(), "patch", "--export", dir.string(), "--", "python3", "-c", "pass"});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.output.find("not a `kforge export --target torch` directory"),
            std::string::npos)
      << missing.output;
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// The PyTorch package: its modules are the ones kforge compiles (byte for byte, each exporting
// the entry point), its manifest names them, and its Python parses. Building and importing the
// extension needs PyTorch and a GPU (tests labelled gpu).
TEST(TorchExport, PackagesTheModulesKforgeChecks) {
  const ExportPlan plan = plan_for({"rmsnorm"});
  const fs::path out = test::temp_dir("export-torch") / "package";
  find_export_target("torch")->write(plan, context(), out);
  const nlohmann::json manifest = read_json_file(out / "kforge_ops" / "manifest.json");
  const auto& variants = manifest.at("ops").at(0).at("variants");
  ASSERT_EQ(variants.size(), plan.ops.at(0).variants.size());
  const Compiler compiler;
  for (size_t v = 0; v < variants.size(); ++v) {
    const fs::path module =
        out / "kforge_ops" / "modules" / variants[v].at("module").get<std::string>();
    ASSERT_TRUE(fs::exists(module)) << module;
    const ExportVariant& planned = plan.ops[0].variants[v];
    const CompileResult built = compiler.compile(KernelFile::load(planned.file), planned.variant);
    ASSERT_TRUE(built.ok) << built.log;
    const auto bytes = [](const fs::path& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_EQ(bytes(module), bytes(built.module)) << module;
    const auto symbols = run_command({"nm", "-D", module.string()});
    ASSERT_TRUE(symbols.ok()) << symbols.output;
    EXPECT_NE(symbols.output.find(" T kforge_run"), std::string::npos) << module;
  }
  for (const char* file : {"kforge_ops/__init__.py", "kforge_ops/patch.py", "kforge_ops/verify.py",
                           "kforge_ops/_autopatch/sitecustomize.py", "setup.py"}) {
    const auto parsed = run_command({"python3", "-m", "py_compile", (out / file).string()});
    EXPECT_TRUE(parsed.ok()) << file << ": " << parsed.output;
  }
  EXPECT_TRUE(fs::exists(out / "csrc" / "kforge_ops.cpp"));
  EXPECT_TRUE(fs::exists(out / "csrc" / "kforge" / "kernel.h"));
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// A real model's plan: Hugging Face Llama recorded on an H100 (tests/data/recorded_hf) gives its
// RMSNorm and RoPE shapes to the export, which adds them to the tables' sizes.
TEST(ExportPlan, TakesAModelsShapesFromItsPlan) {
  AssembleOptions assemble;
  assemble.range = "step";
  assemble.skip = 1;
  const fs::path recorded = fs::path(test::test_data_dir()) / "recorded_hf";
  const Profile profile = assemble_profile(read_raw_files(recorded / "llama"), assemble);
  const Ceilings c = read_ceilings_file(recorded / "ceilings_h100.json");
  PlanOptions options;
  options.copy_gbps = c.copy_gbps;
  options.matmul_tflops = c.matmul_tflops;
  const nlohmann::json plan = plan_to_json(make_plan(profile, options));

  const std::vector<const OpSpec*> ops = {find_op("rmsnorm"), find_op("rotary_embedding_half")};
  std::vector<DType> dtypes;
  const auto sizes = plan_sizes(plan, ops, &dtypes);
  EXPECT_EQ(dtypes, std::vector<DType>{DType::bf16});
  // hf_model.py llama: batch 4 x 1024 tokens, hidden 2048, 16 heads of 128.
  const Sizes norm = {{"M", 4096}, {"N", 2048}};
  const Sizes rope = {{"batch", 4}, {"heads", 16}, {"seq_len", 1024}, {"head_dim", 128}};
  const auto has = [&](const OpSpec* op, const Sizes& s) {
    return std::any_of(sizes.begin(), sizes.end(), [&](const auto& p) {
      if (p.first != op) return false;
      Sizes known = p.second;
      for (const auto& [name, value] : s) {
        if (!known.count(name) || known.at(name) != value) return false;
      }
      return true;
    });
  };
  EXPECT_TRUE(has(ops[0], norm));
  EXPECT_TRUE(has(ops[1], rope));

  ExportRequest request;
  request.ops = ops;
  request.dtypes = dtypes;
  request.extra_sizes = sizes;
  const ExportPlan exported = make_export_plan(request, c.raw.at("device").get<DeviceInfo>());
  for (const ExportOp& op : exported.ops) {
    const Sizes& wanted = op.op == ops[0] ? norm : rope;
    const auto row = std::find_if(op.rows.begin(), op.rows.end(),
                                  [&](const ExportRow& r) { return r.sizes == wanted; });
    ASSERT_NE(row, op.rows.end()) << op.op->name();
    // A size the device's table already holds is exported as the table's row (once); any
    // other comes from the plan, with the variant of the nearest tuned size.
    const bool tuned_here = row->choice.find("nearest") == std::string::npos &&
                            row->choice.find("defaults") == std::string::npos;
    EXPECT_EQ(row->source, tuned_here ? "table" : "plan") << op.op->name() << ": " << row->choice;
    // Another size's row here is one tune from a row of its own, at the whole problem's shape.
    EXPECT_EQ(row->untuned_shape.empty(), row->choice.find("nearest") == std::string::npos)
        << op.op->name() << ": " << row->choice;
    if (!row->untuned_shape.empty()) {
      EXPECT_EQ(row->untuned_shape, op.op->format_shape(op.op == ops[0] ? norm : rope));
    }
  }
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

// Writes `task`'s journal as the loop would after keeping `text` (a change to `starter`): 8 us
// against its start's 10.
void keep_in_journal(const fs::path& task, const fs::path& starter, const std::string& text,
                     const std::string& note) {
  TaskJournal journal = TaskJournal::open(task, starter);
  journal.begin(text, "scripted", note);
  ExperimentRecord kept;
  kept.verdict = "KEEP";
  kept.kept = true;
  kept.time_us = 8;
  kept.fields["best"] = {{"median_us", 10.0}};
  journal.finish(kept);
}

// `kforge export --workspace WS`: a task with a kept experiment exports its best file at its
// size (named after the task), beside the library's variants at the tables' sizes; a task with
// nothing kept is left to the library, and says so.
TEST(ExportCli, AWorkspaceExportsEachTasksKeptBest) {
  const fs::path dir = test::temp_dir("export-workspace");
  ::setenv("KFORGE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const fs::path ws = dir / "ws";
  const fs::path kept_task = ws / "task-01-rmsnorm";
  const fs::path idle_task = ws / "task-02-softmax";
  fs::create_directories(kept_task);
  fs::create_directories(idle_task);
  std::ofstream(kept_task / "task.json")
      << R"({"op": "rmsnorm", "shape": "3000x1000", "dtype": "bf16"})";
  std::ofstream(idle_task / "task.json")
      << R"({"op": "softmax", "shape": "3000x1000", "dtype": "bf16"})";
  const fs::path starter = library_kernels_dir() / starter_kernel("rmsnorm", true, DType::bf16);
  // A change of code (a comment alone would leave the library's variant, the same code).
  keep_in_journal(kept_task, starter,
                  test::read_text(starter) + "[[maybe_unused]] static const int kf_kept = 1;\n",
                  "a marker");
  const std::string ceilings =
      (fs::path(test::test_data_dir()) / "recorded_hf" / "ceilings_h100.json").string();
  const fs::path out = dir / "export";
  const CommandResult r = run_command({test::kforge_binary(), "export", "--workspace", ws.string(),
                                       "--ceilings", ceilings, "--out", out.string()});
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("task-02-softmax (softmax 3000x1000): nothing kept"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("3000x1000            kforge_rmsnorm_bf16_v"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("loop task-01-rmsnorm: 8.00 us, 1.25x its start [loop]"),
            std::string::npos)
      << r.output;
  const std::string exported = "loop_task-01-rmsnorm_" + starter.filename().string();
  EXPECT_NE(test::read_text(out / "kernels" / "rmsnorm" / exported).find("kf_kept = 1"),
            std::string::npos);
  EXPECT_EQ(r.output.find("\nsoftmax "), std::string::npos)
      << "softmax was not asked for and has nothing kept: " << r.output;

  // A kept file that defines a function of its own with external linkage is refused by name:
  // beside the library's variants in one library it would collide.
  const fs::path ws_shared = dir / "ws-shared";
  const fs::path shared_task = ws_shared / "task-01-rmsnorm";
  fs::create_directories(shared_task);
  fs::copy_file(kept_task / "task.json", shared_task / "task.json");
  keep_in_journal(shared_task, starter,
                  test::read_text(starter) + "int kept_helper(int x) { return x + 1; }\n",
                  "a global helper");
  const CommandResult refused =
      run_command({test::kforge_binary(), "export", "--workspace", ws_shared.string(), "--ceilings",
                   ceilings, "--out", (dir / "export-shared").string()});
  EXPECT_FALSE(refused.ok()) << refused.output;
  EXPECT_NE(refused.output.find("defines code with external linkage"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("kept_helper"), std::string::npos) << refused.output;

  // The torch target leaves out an op it has no torch op for (here from --shape), and refuses
  // one named on the command line.
  const CommandResult torch = run_command(
      {test::kforge_binary(), "export", "--workspace", ws.string(), "--target", "torch", "--shape",
       "matmul:256x128x512", "--ceilings", ceilings, "--out", (dir / "torch").string()});
  ASSERT_TRUE(torch.ok()) << torch.output;
  EXPECT_NE(torch.output.find("matmul: not exported (the torch target has no such op yet"),
            std::string::npos)
      << torch.output;
  for (const nlohmann::json& op :
       read_json_file(dir / "torch" / "kforge_ops" / "manifest.json").at("ops"))
    EXPECT_NE(op.value("op", ""), "matmul");
  const CommandResult named =
      run_command({test::kforge_binary(), "export", "matmul", "--target", "torch", "--ceilings",
                   ceilings, "--out", (dir / "named").string()});
  EXPECT_FALSE(named.ok());
  EXPECT_NE(named.output.find("the torch target has no op matmul yet"), std::string::npos)
      << named.output;
}

// A size that runs another size's table row is one tune from a row of its own: the export says
// which and how; a size with its own row is not listed.
TEST(ExportCli, ASizeWithoutARowIsOfferedItsTune) {
  const fs::path dir = test::temp_dir("export-untuned-shape");
  const std::string ceilings =
      (fs::path(test::test_data_dir()) / "recorded_hf" / "ceilings_h100.json").string();
  const CommandResult r =
      run_command({test::kforge_binary(), "export", "matmul", "--shape", "matmul:4096x11008x4096",
                   "--shape", "matmul:4096x4096x4096", "--no-table-sizes", "--ceilings", ceilings,
                   "--out", (dir / "out").string()});
  ASSERT_TRUE(r.ok()) << r.output;
  EXPECT_NE(r.output.find("matmul bf16 at 1 size(s) runs other sizes' table rows"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\n  kforge tune matmul --shape 4096x11008x4096 --dtype bf16 "
                          "--strategy given --all-rows --update-table\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("--shape 4096x4096x4096 --dtype"), std::string::npos) << r.output;
}

// `kforge export all`: every op with a table for the device that the target carries (the
// standalone target: attention too, dispatched on its causal flag); an op the target has not
// (the torch target: attention) is refused when named.
TEST(ExportCli, AllExportsWhatTheTargetCarries) {
  const fs::path dir = test::temp_dir("export-all");
  const std::string ceilings =
      (fs::path(test::test_data_dir()) / "recorded_hf" / "ceilings_h100.json").string();
  ASSERT_TRUE(
      find_tuned_table("flash_attention", DType::bf16, device_key(recorded_h100())).has_value());
  const CommandResult all = run_command({test::kforge_binary(), "export", "all", "--ceilings",
                                         ceilings, "--out", (dir / "all").string()});
  ASSERT_TRUE(all.ok()) << all.output;
  for (const char* op : {"\nrmsnorm ", "\nflash_attention "})
    EXPECT_NE(all.output.find(op), std::string::npos) << op << all.output;
  EXPECT_NE(test::read_text(dir / "all" / "src" / "kforge_dispatch.c")
                .find("kf_export_scalar(args, 1); /* causal */"),
            std::string::npos);

  // (The torch target compiles what it packs: `all` there is the GPU machine's test.)
  const CommandResult named =
      run_command({test::kforge_binary(), "export", "flash_attention", "--target", "torch",
                   "--ceilings", ceilings, "--out", (dir / "named").string()});
  EXPECT_FALSE(named.ok());
  EXPECT_NE(named.output.find("the torch target has no op flash_attention yet"), std::string::npos)
      << named.output;
}

}  // namespace
}  // namespace kforge
