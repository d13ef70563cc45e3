// What a compiled kernel module defines with external linkage of its own. A standalone export
// links every variant of a file (and a loop task's edited copy of it) into one library: a
// function a file defines with external linkage then exists once per variant under one name,
// and the linker refuses the copies or, for inline and template functions, silently keeps one
// variant's code for all. Kernel files keep such code static or in an anonymous namespace
// (docs/kernel-format.md); this finds what breaks that rule.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kforge {

// The symbols `module` (a compiled kernel file, `source` its text) defines with external
// linkage that come from the file itself: anything in a namespace the file opens (templates of
// CUTLASS or CuTe instantiated on its types included), and anything else but its entry point,
// the C++ and CUDA runtimes, CUTLASS/CuTe and kforge's headers (include/kforge and the op
// folders' headers, whose code depends on no tunable). Each as nm prints it ("T name").
// Throws Error when nm cannot read the module.
std::vector<std::string> symbols_shared_between_variants(const std::filesystem::path& module,
                                                         const std::string& source);

// Why a file (`file_name`) whose module defines `shared` (symbols_shared_between_variants) cannot
// go into a standalone export, and the fix.
std::string describe_shared_symbols(const std::string& file_name,
                                    const std::vector<std::string>& shared);

// The namespace a mangled name starts in ("kf" of _ZN2kf17setup_gemm_device...), for the names
// the demangler gives up on (CUTLASS's longest); empty when it is in none.
std::string mangled_namespace(const std::string& name);
// The namespace a demangled name is in: the identifier before its first "::" outside template
// arguments and parameters ("kf" of "int kf::f<cute::X>(...)"); empty for a global name.
std::string demangled_namespace(const std::string& name);

}  // namespace kforge
