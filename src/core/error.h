// Typed errors. The library throws; only the CLI turns errors into exit codes.
#pragma once

#include <stdexcept>
#include <string>

namespace kforge {

// Something went wrong that the user can act on (bad input, missing file, ...).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Invalid input named by the user: a flag, a shape, a file that does not parse.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A malformed kernel file; the message names the file and line.
class ParseError : public Error {
 public:
  ParseError(const std::string& file, int line, const std::string& what)
      : Error(file + ":" + std::to_string(line) + ": " + what), file_(file), line_(line) {}
  const std::string& file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string file_;
  int line_;
};

}  // namespace kforge
