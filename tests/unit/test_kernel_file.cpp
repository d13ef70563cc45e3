#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "compile/kernel_file.h"
#include "compile/kernel_text.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/json_file.h"
#include "device/launch_limits.h"
#include "test_support.h"

namespace kforge {
namespace {

const char* kValid = R"(/* kforge
 * op: rmsnorm
 * backend: cpu
 * dtypes: f16, bf16, f32
 * param: BLOCK = 256 in {64, 128, 256}
 * param: VEC = 4 in {1, 2, 4, 8}
 * derive: WARPS = BLOCK / 32
 * require: BLOCK % 32 == 0
 * require: VEC * elem_bytes <= 16
 * shared_bytes: WARPS * 4
 */
int body;
)";

// Replaces the first occurrence of `from` in the valid file and returns the parse error.
std::string error_after(const std::string& from, const std::string& to) {
  std::string text = kValid;
  text.replace(text.find(from), from.size(), to);
  try {
    KernelFile::parse(text, "k.cpp");
  } catch (const ParseError& e) {
    return e.what();
  }
  return "no error";
}

TEST(KernelFile, ParsesHeaderBlock) {
  const KernelFile f = KernelFile::parse(kValid, "k.cpp");
  EXPECT_EQ(f.op, "rmsnorm");
  EXPECT_EQ(f.backend, Backend::cpu);
  ASSERT_EQ(f.dtypes.size(), 3u);
  ASSERT_EQ(f.params.size(), 2u);
  EXPECT_EQ(f.params[0].name, "BLOCK");
  EXPECT_EQ(f.params[0].default_value, 256);
  EXPECT_EQ(f.params[1].candidates, (std::vector<long long>{1, 2, 4, 8}));
  ASSERT_EQ(f.requirements.size(), 2u);
  EXPECT_EQ(f.requirements[1].line, 9);
  ASSERT_TRUE(f.shared_bytes.has_value());
}

// Every library kernel file's header parses, and its defaults meet its own constraints on an
// H100 in every dtype it declares: the defaults are what a device without a table runs. (A
// formatter that folds a long header line into the next ones breaks the first.)
TEST(KernelFile, EveryLibraryFileParsesAndItsDefaultsHold) {
  const auto recorded = read_json_file(std::filesystem::path(test::test_data_dir()) /
                                       "recorded_hf" / "ceilings_h100.json");
  const DeviceInfo h100 = recorded.at("device").get<DeviceInfo>();
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(test::kernels_dir())) {
    const auto ext = entry.path().extension();
    if (ext != ".cu" && ext != ".cpp") continue;
    ++files;
    KernelFile f;
    ASSERT_NO_THROW(f = KernelFile::load(entry.path())) << entry.path();
    for (const DType dtype : f.dtypes) {
      const Bindings bindings = problem_bindings(h100, dtype, nullptr);
      ParamValues all;
      ASSERT_NO_THROW(all = f.with_derived(f.resolve_params(dtype), bindings)) << entry.path();
      if (f.backend != Backend::cuda) continue;
      Bindings with_params = bindings;
      for (const auto& [name, value] : all)
        with_params[name] = value;
      EXPECT_EQ(first_violation(f, with_params, h100, false), "")
          << entry.path() << " " << dtype_name(dtype);
    }
  }
  EXPECT_GT(files, 20);
}

// A file's code is its text and the project headers it includes, found where the compiler finds
// them (kforge's include/, beside the kernel file, beside the including header), through other
// headers too; names
// found nowhere and <...> headers are not part of it. Its hash follows an edit to any of them.
TEST(KernelFile, ItsCodeCoversTheProjectHeadersItIncludes) {
  const std::filesystem::path dir = test::temp_dir("kernel-text");
  const std::filesystem::path kernel = dir / "k.cpp";
  std::ofstream(dir / "mine.h") << "#include \"kforge/elem_cpu.h\"\nint mine;\n";
  std::string source = kValid;
  source += "#include <cstdint>\n#include \"mine.h\"\n#include \"absent.h\"\n";
  std::ofstream(kernel) << source;

  std::vector<std::string> names;
  for (const IncludedHeader& h : included_project_headers(source, kernel))
    names.push_back(h.name);
  EXPECT_EQ(names, (std::vector<std::string>{"mine.h", "kforge/elem_cpu.h", "kforge/kernel.h"}));

  const KernelFile file = KernelFile::load(kernel);
  EXPECT_EQ(file.text_hash, kernel_text_hash(source, kernel));
  EXPECT_NE(file.text_hash, hash_hex(source));
  std::ofstream(dir / "mine.h") << "#include \"kforge/elem_cpu.h\"\nint mine2;\n";
  EXPECT_NE(KernelFile::load(kernel).text_hash, file.text_hash);

  // A comment-only edit to an included header leaves the code as it was.
  std::ofstream(dir / "mine.h") << "#include \"kforge/elem_cpu.h\"\n// the second\nint mine2;\n";
  const std::string with_comment = KernelFile::load(kernel).text_hash;
  std::ofstream(dir / "mine.h") << "#include \"kforge/elem_cpu.h\"\nint mine2; /* second */\n";
  EXPECT_EQ(KernelFile::load(kernel).text_hash, with_comment);
}

// The hash of a file's code ignores what the compiler ignores (comments, blank space) and keeps
// everything it reads, including the header block, which kforge reads.
TEST(KernelText, CommentsAndBlankSpaceDoNotCount) {
  const std::string code = std::string(kValid) + "int f(int x) {\n  return x + 1;  // one\n}\n";
  const auto hash = [](const std::string& text) { return kernel_text_hash(text, "k.cpp"); };
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = code;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  const std::string h = hash(code);
  EXPECT_EQ(hash(with("// one", "// the next one")), h);
  EXPECT_EQ(hash(with("// one", "/* one,\n   over lines */")), h);
  EXPECT_EQ(hash(with("int f", "// f adds one\n\n\nint  f")), h);
  EXPECT_EQ(hash(with("  return", "\treturn")), h);
  // Code and the header block count.
  EXPECT_NE(hash(with("x + 1", "x + 2")), h);
  EXPECT_NE(hash(with("BLOCK = 256", "BLOCK = 128")), h);
  EXPECT_NE(hash(with(" * require: BLOCK % 32", " * # why\n * require: BLOCK % 32")), h);
  // Code that reads its line numbers: a comment's lines move them, so its text counts whole; so
  // does code that pastes tokens, which could spell __LINE__.
  const std::string lines = code + "int line = __LINE__;\n";
  EXPECT_NE(hash(lines + "// more\n"), hash(lines));
  const std::string pasted = code + "#define CAT(a, b) a##b\nint line = CAT(__LI, NE__);\n";
  EXPECT_NE(hash(pasted + "// more\n"), hash(pasted));
}

TEST(KernelText, CodeWithoutCommentsReadsAsTheCompilerDoes) {
  EXPECT_EQ(code_without_comments("a /* x */ b // y\n\n   c  d\n"), "a b\nc d");
  EXPECT_EQ(code_without_comments("a/**/b"), "a b");
  // A block comment is one space even across lines: the directive goes on.
  EXPECT_EQ(code_without_comments("#define A 1 /*\n*/ + 2\nint x;"), "#define A 1 + 2\nint x;");
  // Literals as written, comment markers and blank space inside them too.
  EXPECT_EQ(code_without_comments("s = \"// a  /* b */\"; c = '\"'; // x"),
            "s = \"// a  /* b */\"; c = '\"';");
  EXPECT_EQ(code_without_comments("r = R\"d(// x\n  )\" y)d\"; // z"),
            "r = R\"d(// x\n  )\" y)d\";");
  // Digit separators are not character literals.
  EXPECT_EQ(code_without_comments("n = 1'000; // it's"), "n = 1'000;");
  EXPECT_EQ(code_without_comments("x = 0x1'fe'8p+3 // 'q"), "x = 0x1'fe'8p+3");
  EXPECT_EQ(code_without_comments("#include <a//b.h> // c\n#include\t<d>"),
            "#include <a//b.h>\n#include <d>");
  EXPECT_EQ(code_without_comments("x = a < b // c"), "x = a < b");
}

// Texts the compiler reads differently never share a hash. Each pair differs in what a naive
// comment stripper would get wrong.
TEST(KernelText, TextsTheCompilerReadsApartHashApart) {
  const auto differ = [](const std::string& a, const std::string& b) {
    EXPECT_NE(code_without_comments(a), code_without_comments(b)) << a << "\n---\n" << b;
  };
  // A splice at the end of a line comment continues the comment onto the next line.
  differ("// x \\\nint y = 1;\n", "// x\nint y = 1;\n");
  // "//" on a line inside a block comment does not hide the "*/" after it.
  differ("/*\n// */ int y = 1;\n*/\n", "/*\n*/\n");
  // A splice joins "/" and "/" into a comment.
  differ("a = b /\\\n/ c\n;", "a = b / / c\n;");
  // Blank space inside a string, and the line that ends a directive.
  differ("s = \"a  b\";", "s = \"a b\";");
  differ("#define A 1\n+ 2;", "#define A 1 + 2;");
  // A raw string keeps its splices (they are not joined inside it).
  differ("r = R\"(a\\\nb)\";", "r = R\"(ab)\";");
  // A raw string ends where its text as written ends: a splice hides the )" after it.
  differ("r = R\"(a)\\\n\" // x\n)\";", "r = R\"(a)\\\n\" // y\n)\";");
  // <a//b.h> after #include names a file; it holds no comment.
  differ("#include <a//b.h>\n", "#include <a//c.h>\n");
  differ("#if __has_include(<a//b.h>)\n#endif\n", "#if __has_include(<a//c.h>)\n#endif\n");
  // An apostrophe in a digit separator does not open a literal that would swallow code.
  differ("n = 1'0; s = \"'\"; // x\nint y;", "n = 1'0; s = \"'\"; // x\n");
}

TEST(KernelFile, ResolvesParamsAndDerivedValues) {
  const KernelFile f = KernelFile::parse(kValid, "k.cpp");
  const ParamValues p = f.resolve_params(DType::f32, {{"BLOCK", 128}});
  EXPECT_EQ(p.at("BLOCK"), 128);
  EXPECT_EQ(p.at("VEC"), 4);
  const ParamValues all = f.with_derived(p, {});
  EXPECT_EQ(all.at("WARPS"), 4);
  EXPECT_THROW(f.resolve_params(DType::f32, {{"NOPE", 1}}), UsageError);
}

// A default may be an expression of elem_bytes: one 16-byte pack is 8 bf16 elements but 4 f32.
TEST(KernelFile, DefaultsMayDependOnTheElementSize) {
  std::string text = kValid;
  text.replace(text.find("VEC = 4 in"), 10, "VEC = 16 / elem_bytes in");
  const KernelFile f = KernelFile::parse(text, "k.cpp");
  EXPECT_EQ(f.resolve_params(DType::bf16).at("VEC"), 8);
  EXPECT_EQ(f.resolve_params(DType::f16).at("VEC"), 8);
  EXPECT_EQ(f.resolve_params(DType::f32).at("VEC"), 4);
  EXPECT_EQ(f.resolve_params(DType::bf16, {{"VEC", 2}}).at("VEC"), 2);
  EXPECT_EQ(f.params[1].default_for(4), 4);

  EXPECT_EQ(error_after("VEC = 4 in", "VEC = 32 / elem_bytes in"),
            "k.cpp:6: param VEC: default 16 (in f16) is not one of {1, 2, 4, 8}");
  EXPECT_EQ(error_after("VEC = 4 in", "VEC = 16 / BLOCK in"),
            "k.cpp:6: param VEC: a default may depend on elem_bytes only, not 'BLOCK'");
}

TEST(KernelFile, ErrorsNameTheLine) {
  EXPECT_EQ(error_after("VEC = 4 in", "VEC = 3 in"),
            "k.cpp:6: param VEC: default 3 is not one of {1, 2, 4, 8}");
  EXPECT_EQ(error_after("{64, 128, 256}", "{64, x, 256}"),
            "k.cpp:5: param BLOCK: candidate 'x' is not an integer");
  EXPECT_EQ(error_after("backend: cpu", "backend: opencl"),
            "k.cpp:3: backend 'opencl' is not 'cuda' or 'cpu'");
  EXPECT_EQ(error_after("dtypes: f16, bf16, f32", "dtypes: f16, int8"),
            "k.cpp:4: dtype 'int8' is not one of f16, bf16, f32");
  EXPECT_EQ(error_after("require: BLOCK % 32 == 0", "require: BLOCK %% 32"),
            "k.cpp:8: expression 'BLOCK %% 32': Unexpected token \"% 32 \" found at position 7.");
  EXPECT_EQ(error_after("derive: WARPS", "derive: BLOCK"),
            "k.cpp:7: 'BLOCK' is already declared on line 5");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", " * colour blue\n"),
            "k.cpp:2: expected 'key: value', got 'colour blue'");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", " * flavour: mint\n"),
            "k.cpp:2: unknown key 'flavour' (expected op, backend, dtypes, param, derive, require, "
            "prune, shared_bytes, threads, cluster, busy, let, min_occupancy, uses)");
  EXPECT_EQ(error_after(" */\n", " * let: WARPS = 2\n */\n"),
            "k.cpp:11: 'WARPS' is already declared on line 7");
  EXPECT_EQ(error_after(" */\n", " * let: SLOTS 2\n */\n"),
            "k.cpp:11: let: expected 'NAME = EXPRESSION'");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", " * op: rmsnorm\n * uses: thrust\n"),
            "k.cpp:3: uses: 'thrust' is not a library kforge provides (cutlass)");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", " * op: rmsnorm\n * uses: cutlass\n"),
            "k.cpp:3: uses: CUTLASS is for CUDA files");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", " * op: rmsnorm\n * min_occupancy: 150\n"),
            "k.cpp:3: min_occupancy: expected a percentage 1..100, got '150'");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", " * op: rmsnorm\n * threads: 32\n * threads: 64\n"),
            "k.cpp:4: 'threads' is given twice");
  EXPECT_EQ(error_after(" * op: rmsnorm\n", ""), "k.cpp:1: header block has no 'op:' line");
  EXPECT_EQ(error_after(" */\nint body;\n", ""), "k.cpp:1: header block is not closed with '*/'");
}

TEST(KernelFile, NamesTheLibrariesItUses) {
  std::string text = kValid;
  text.replace(text.find("backend: cpu"), 12, "backend: cuda\n * uses: cutlass");
  const KernelFile f = KernelFile::parse(text, "k.cu");
  EXPECT_TRUE(f.uses("cutlass"));
  EXPECT_FALSE(KernelFile::parse(kValid, "k.cpp").uses("cutlass"));
}

TEST(KernelFile, BackendMustMatchExtension) {
  try {
    KernelFile::parse(kValid, "k.cu");
    FAIL() << "expected a ParseError";
  } catch (const ParseError& e) {
    EXPECT_EQ(std::string(e.what()),
              "k.cu:3: backend 'cpu' does not match the file extension '.cu'");
  }
}

TEST(KernelFile, MissingHeaderBlock) {
  EXPECT_THROW(KernelFile::parse("int main() {}\n", "k.cpp"), ParseError);
}

TEST(KernelFile, ParamAssignmentFromCommandLine) {
  EXPECT_EQ(parse_param_assignment("VEC=8"), (std::pair<std::string, long long>{"VEC", 8}));
  EXPECT_THROW(parse_param_assignment("VEC"), UsageError);
  EXPECT_THROW(parse_param_assignment("VEC=eight"), UsageError);
}

TEST(Expression, IntegerSemantics) {
  const Bindings b{{"A", 100}, {"B", 32}, {"N", 4097}};
  EXPECT_EQ(Expression("A / B").evaluate(b), 3);
  EXPECT_EQ(Expression("A % B").evaluate(b), 4);
  EXPECT_EQ(Expression("-A + 3").evaluate(b), -97);
  EXPECT_EQ(Expression("A > B && !(N % 2 == 0)").evaluate(b), 1);
  EXPECT_EQ(Expression("min(A, B) * 2").evaluate(b), 64);
  EXPECT_EQ(Expression("A > B ? 7 : 9").evaluate(b), 7);
  EXPECT_EQ(Expression("A / B").variables(), (std::vector<std::string>{"A", "B"}));
}

TEST(Expression, ConcurrentEvaluation) {
  // A fresh expression each round: muParser parses on first use, the riskiest moment.
  std::atomic<int> wrong{0};
  for (int round = 0; round < 200; ++round) {
    const Expression e("A >= 32 * B && A % 32 == 0");
    std::vector<std::jthread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        for (long long i = 0; i < 50; ++i) {
          const long long a = 32 * (i % 40 + t) + (i % 7 == 0 ? 1 : 0), b = i % 3;
          const long long expected = (a >= 32 * b && a % 32 == 0) ? 1 : 0;
          try {
            if (e.evaluate({{"A", a}, {"B", b}}) != expected) ++wrong;
          } catch (const Error&) {
            ++wrong;
          }
        }
      });
    }
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Expression, Errors) {
  EXPECT_THROW(Expression("A +* 3"), Error);
  EXPECT_THROW(Expression("Q + 1").evaluate({}), Error);
  EXPECT_THROW(Expression("A / 0").evaluate({{"A", 1}}), Error);
}

TEST(KernelFile, LaunchShapeDeclarations) {
  std::string text = kValid;
  text.replace(text.find(" */"), 3, " * threads: BLOCK\n * cluster: 2\n * min_occupancy: 25\n */");
  const KernelFile f = KernelFile::parse(text, "k.cpp");
  ASSERT_TRUE(f.block_threads && f.cluster_blocks);
  EXPECT_EQ(f.block_threads->evaluate({{"BLOCK", 128}}), 128);
  EXPECT_EQ(f.cluster_blocks->evaluate({}), 2);
  EXPECT_EQ(f.min_occupancy_percent, 25);
  EXPECT_FALSE(KernelFile::parse(kValid, "k.cpp").block_threads);
}

// busy: lines (they add up) and the let: values they read, which may use the problem's sizes;
// neither counts in the code hash.
TEST(KernelFile, BusyLinesAndTheirLetValues) {
  std::string text = kValid;
  text.replace(
      text.find(" */"), 3,
      " * let: BLOCKS = (M + BLOCK - 1) / BLOCK\n * busy: BLOCKS * N\n * busy: WARPS\n */");
  const KernelFile f = KernelFile::parse(text, "k.cpp");
  ASSERT_EQ(f.busy_lets.size(), 1u);
  EXPECT_EQ(f.busy_lets[0].name, "BLOCKS");
  EXPECT_EQ(f.busy_lets[0].expression.evaluate({{"M", 1000}, {"BLOCK", 256}}), 4);
  ASSERT_EQ(f.busy.size(), 2u);
  EXPECT_EQ(f.busy[0].evaluate({{"BLOCKS", 4}, {"N", 10}}), 40);
  EXPECT_EQ(f.text_hash, KernelFile::parse(kValid, "k.cpp").text_hash);
}

}  // namespace
}  // namespace kforge
