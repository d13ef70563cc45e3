#include "compile/expression.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <muParser.h>

#include "core/error.h"

namespace kforge {
namespace {

// muParser computes in double; every value here is an integer well inside 2^53, so rounding
// the operands and the result keeps the arithmetic exact.
long long as_integer(double v) {
  return std::llround(v);
}

double divide(double a, double b) {
  if (as_integer(b) == 0) throw mu::ParserError("division by zero");
  return static_cast<double>(as_integer(a) / as_integer(b));
}
double remainder_of(double a, double b) {
  if (as_integer(b) == 0) throw mu::ParserError("remainder by zero");
  return static_cast<double>(as_integer(a) % as_integer(b));
}
double add(double a, double b) {
  return a + b;
}
double subtract(double a, double b) {
  return a - b;
}
double multiply(double a, double b) {
  return a * b;
}
double less(double a, double b) {
  return a < b;
}
double less_equal(double a, double b) {
  return a <= b;
}
double greater(double a, double b) {
  return a > b;
}
double greater_equal(double a, double b) {
  return a >= b;
}
double equal(double a, double b) {
  return as_integer(a) == as_integer(b);
}
double not_equal(double a, double b) {
  return as_integer(a) != as_integer(b);
}
double logical_and(double a, double b) {
  return (a != 0) && (b != 0);
}
double logical_or(double a, double b) {
  return (a != 0) || (b != 0);
}
double negate(double a) {
  return -a;
}
double logical_not(double a) {
  return a == 0;
}
double minimum(double a, double b) {
  return std::min(a, b);
}
double maximum(double a, double b) {
  return std::max(a, b);
}
// a / b rounded up, for counts of tiles or waves (a >= 0, b > 0).
double ceiling_division(double a, double b) {
  if (as_integer(b) <= 0) throw mu::ParserError("ceil_div by a divisor below 1");
  return static_cast<double>((as_integer(a) + as_integer(b) - 1) / as_integer(b));
}

void configure(mu::Parser& parser) {
  parser.EnableBuiltInOprt(false);
  parser.DefineOprtChars("+-*/%<>=!&|");
  parser.DefineInfixOprtChars("-!");
  parser.DefineOprt("||", logical_or, mu::prLOR);
  parser.DefineOprt("&&", logical_and, mu::prLAND);
  parser.DefineOprt("==", equal, mu::prCMP);
  parser.DefineOprt("!=", not_equal, mu::prCMP);
  parser.DefineOprt("<", less, mu::prCMP);
  parser.DefineOprt("<=", less_equal, mu::prCMP);
  parser.DefineOprt(">", greater, mu::prCMP);
  parser.DefineOprt(">=", greater_equal, mu::prCMP);
  parser.DefineOprt("+", add, mu::prADD_SUB);
  parser.DefineOprt("-", subtract, mu::prADD_SUB);
  parser.DefineOprt("*", multiply, mu::prMUL_DIV);
  parser.DefineOprt("/", divide, mu::prMUL_DIV);
  parser.DefineOprt("%", remainder_of, mu::prMUL_DIV);
  parser.DefineInfixOprt("-", negate);
  parser.DefineInfixOprt("!", logical_not);
  parser.DefineFun("min", minimum);
  parser.DefineFun("max", maximum);
  parser.DefineFun("ceil_div", ceiling_division);
}

}  // namespace

struct Expression::Impl {
  mu::Parser parser;
  // muParser's Eval mutates the parser (it parses lazily and binds through `slots`), so one
  // evaluation runs at a time.
  std::mutex mutex;
  std::vector<double> slots;  // one per variable, bound before each Eval
};

Expression::Expression(std::string text) : text_(std::move(text)), impl_(std::make_unique<Impl>()) {
  try {
    configure(impl_->parser);
    impl_->parser.SetExpr(text_);
    // muParser reports the variables an expression uses once it is parsed with a factory that
    // accepts any name; we then bind each to a slot.
    for (const auto& [name, ptr] : impl_->parser.GetUsedVar()) {
      (void)ptr;
      variables_.push_back(name);
    }
  } catch (const mu::ParserError& e) {
    throw Error(fmt::format("expression '{}': {}", text_, e.GetMsg()));
  }
  impl_->slots.resize(variables_.size());
  for (size_t i = 0; i < variables_.size(); ++i) {
    impl_->parser.DefineVar(variables_[i], &impl_->slots[i]);
  }
}

Expression::~Expression() = default;
Expression::Expression(Expression&&) noexcept = default;
Expression& Expression::operator=(Expression&&) noexcept = default;

bool Expression::bound_by(const Bindings& bindings) const {
  return std::all_of(variables_.begin(), variables_.end(),
                     [&](const std::string& name) { return bindings.contains(name); });
}

long long Expression::evaluate(const Bindings& bindings) const {
  std::lock_guard lock(impl_->mutex);
  for (size_t i = 0; i < variables_.size(); ++i) {
    const auto it = bindings.find(variables_[i]);
    if (it == bindings.end()) {
      throw Error(fmt::format("expression '{}': unknown name '{}'", text_, variables_[i]));
    }
    impl_->slots[i] = static_cast<double>(it->second);
  }
  try {
    return as_integer(impl_->parser.Eval());
  } catch (const mu::ParserError& e) {
    throw Error(fmt::format("expression '{}': {}", text_, e.GetMsg()));
  }
}

long long Expression::evaluate_values(const long long* values) const {
  std::lock_guard lock(impl_->mutex);
  for (size_t i = 0; i < variables_.size(); ++i)
    impl_->slots[i] = static_cast<double>(values[i]);
  try {
    return as_integer(impl_->parser.Eval());
  } catch (const mu::ParserError& e) {
    throw Error(fmt::format("expression '{}': {}", text_, e.GetMsg()));
  }
}

}  // namespace kforge
