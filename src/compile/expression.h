// Integer expressions over named values, for a kernel file's `require`, `derive` and
// `shared_bytes` lines. Parsing is done by muParser; this wrapper gives it integer semantics
// (`/` truncates, `%` is the remainder) and reports unknown names clearly.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kforge {

using Bindings = std::map<std::string, long long, std::less<>>;

class Expression {
 public:
  // Throws kforge::Error with muParser's message when the text does not parse.
  explicit Expression(std::string text);
  ~Expression();
  Expression(Expression&&) noexcept;
  Expression& operator=(Expression&&) noexcept;

  const std::string& text() const { return text_; }
  // Names the expression refers to (parameters, sizes, device limits).
  const std::vector<std::string>& variables() const { return variables_; }
  // Whether every variable has a value in `bindings`, so that evaluate() can run.
  bool bound_by(const Bindings& bindings) const;
  // Evaluates with every variable bound; throws kforge::Error naming a missing one or on
  // division by zero. Safe to call from several threads.
  long long evaluate(const Bindings& bindings) const;
  // The same with one value per variables() entry, in that order: no name lookups, for the
  // tuner's space solver, which evaluates expressions millions of times.
  long long evaluate_values(const long long* values) const;

 private:
  struct Impl;
  std::string text_;
  std::vector<std::string> variables_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kforge
