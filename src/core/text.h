// Small text helpers shared by the loop's briefs, proposers and logs.
#pragma once

#include <string>
#include <vector>

namespace kforge {

// The first `lines` lines of `text`, without the newline after them.
std::string first_lines(const std::string& text, size_t lines = 1);

// The lines of `text` without their newlines. A final newline ends the last line; it does not
// start an empty one ("a\nb\n" and "a\nb" both give {"a", "b"}).
std::vector<std::string> split_lines(const std::string& text);

}  // namespace kforge
