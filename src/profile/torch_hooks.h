// The PyTorch hooks of `kforge profile --torch`: a sitecustomize.py (torch_hooks/, built into
// the binary) that gives every module call of a PyTorch program an NVTX range with its class,
// name, operand sizes and dtypes, and switches on PyTorch's op ranges with input sizes, without
// any change to the program. Its docstring says what it records.
#pragma once

#include <filesystem>
#include <string_view>

namespace kforge {

// The file's text, as built in.
std::string_view torch_hooks_source();

// Writes it as `directory`/sitecustomize.py (creating the directory); the directory then goes
// first on the command's PYTHONPATH (InjectionPaths::python_directory).
void write_torch_hooks(const std::filesystem::path& directory);

}  // namespace kforge
