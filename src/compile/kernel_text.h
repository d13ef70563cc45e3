// What a kernel file's code is made of: its own text and the text of every project header it
// includes, found as the compiler finds them (the one place kforge resolves #include "..."). A
// record that stands for "this code" (a tuner's timing, a table's check) is keyed by the hash of
// all of it, so that an edit to a shared header (kforge/cutlass_gemm.cuh, an op folder's
// *_common.cuh) makes the records of every file that includes it stale, as an edit to the file
// itself does.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "compile/kernel_file.h"

namespace kforge {

// The headers a kernel file names with #include "...": beside it, or else the shared header of
// a library op folder of that name (kernels/matmul/matmul_common.cuh), so that a copy of a
// library file (a loop task's, a KernelBench task's) compiles wherever it is. Their folders are
// the compiler's -I folders, and their texts part of the compile cache's key.
std::vector<std::filesystem::path> local_headers(const KernelFile& file);

// One header a kernel file's code includes: as it was spelled, where it was found, its text.
struct IncludedHeader {
  std::string name;  // as in the #include line, e.g. "kforge/elem_cuda.cuh"
  std::filesystem::path path;
  std::string text;
};

// The project headers `source` (the text of a kernel file at `path`) includes, directly or
// through another: every #include "NAME" found where the compiler finds it (beside the header
// that includes it, in kforge's include/, beside the kernel file, in an op folder of the
// library).
// Each appears once, in the order first met. Names found nowhere are not project headers (the
// compiler resolves or refuses them), and headers named with <...> (system, CUDA, CUTLASS) are
// covered by the toolchain's and CUTLASS's versions in the compile cache instead.
std::vector<IncludedHeader> included_project_headers(const std::string& source,
                                                     const std::filesystem::path& path);

// C++ or CUDA text without its comments, as the compiler reads it: line splices joined, each
// comment replaced by whitespace, every run of whitespace outside literals written as one space
// (or one newline when it held one, so that preprocessor lines stay apart). String, character
// and raw string literals, header names (<...> after #include) and preprocessing numbers are
// kept as written.
std::string code_without_comments(const std::string& text);

// What of a text the hash covers: its code without comments, or the whole text when its code
// reads line numbers (__LINE__, __builtin_LINE, std::source_location), which a comment's lines
// would move, or pastes tokens (##), which could spell __LINE__.
std::string kernel_code_for_hash(const std::string& text);

// The hash of a kernel file's code: its kforge header block as written (the parameters, rules and
// launch shape it declares, comment lines and all; header_for_hash), its code
// (kernel_code_for_hash), and each included project header's name and code. An edit to a
// comment outside the header block, or to blank space, leaves it unchanged; an edit to anything
// the compiler reads or a check depends on changes it.
std::string kernel_text_hash(const std::string& source, const std::filesystem::path& path);

}  // namespace kforge
