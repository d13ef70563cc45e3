#include "ops/op_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/parallel.h"
#include "core/random.h"

namespace kforge {
namespace {

constexpr int64_t kChunk = 1 << 20;  // elements per independently seeded chunk

// Maps a standard normal sample to the value `kind` asks for at flat index i.
double shape_value(InputKind kind, double z, double u, int64_t i, int64_t row, double max_magnitude,
                   double min_normal, double constant, double cancel) {
  switch (kind) {
    case InputKind::normal:
      return z;
    case InputKind::near_max:
      return (z < 0 ? -1.0 : 1.0) * max_magnitude * (0.5 + 0.5 * u);
    case InputKind::near_zero:
      return z * 16.0 * min_normal;
    case InputKind::mixed_scales:  // 1e3 where the op's safe magnitude allows it
      return z * (((i / 64) % 2 == 0) ? std::min(1e3, max_magnitude / 8) : 1e-3);
    case InputKind::all_zeros:
      return 0.0;
    case InputKind::all_equal:
      return constant;
    case InputKind::very_negative:
      return -max_magnitude * (0.5 + 0.5 * u);
    case InputKind::near_constant:
      return constant * 50.0 + 1e-2 * z;
    case InputKind::cancelling:
      return (2 * (i % row) < row ? 1.0 : -1.0) * cancel * (1.0 + 0.1 * u);
    case InputKind::fully_masked:  // masks are op-specific; activations stay normal
      return z;
  }
  return z;
}

}  // namespace

std::string_view input_kind_name(InputKind kind) {
  switch (kind) {
    case InputKind::normal:
      return "normal";
    case InputKind::near_max:
      return "near_max";
    case InputKind::near_zero:
      return "near_zero";
    case InputKind::mixed_scales:
      return "mixed_scales";
    case InputKind::all_zeros:
      return "all_zeros";
    case InputKind::all_equal:
      return "all_equal";
    case InputKind::very_negative:
      return "very_negative";
    case InputKind::near_constant:
      return "near_constant";
    case InputKind::cancelling:
      return "cancelling";
    case InputKind::fully_masked:
      return "fully_masked";
  }
  return "?";
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (const auto d : shape)
    n *= d;
  return n;
}

std::vector<InputKind> OpSpec::stability_kinds() const {
  return {InputKind::near_max, InputKind::near_zero, InputKind::mixed_scales, InputKind::all_zeros,
          InputKind::all_equal};
}

double OpSpec::max_input_magnitude(const Sizes&, DType dtype) const {
  return 0.9 * dtype_max(dtype);
}

void OpSpec::generate(const Sizes& sizes, InputKind kind, uint64_t seed,
                      std::span<HostTensor> inputs) const {
  const auto specs = this->inputs();
  for (size_t t = 0; t < inputs.size(); ++t) {
    HostTensor& tensor = inputs[t];
    const bool parameter = t < specs.size() && specs[t].is_parameter;
    const InputKind tensor_kind = parameter ? InputKind::normal : kind;
    const double max_magnitude = max_input_magnitude(sizes, tensor.dtype);
    const double min_normal = dtype_min_normal(tensor.dtype);
    const double scale = t < specs.size() && !specs[t].fan_in.empty()
                             ? 1.0 / std::sqrt(static_cast<double>(sizes.at(specs[t].fan_in)))
                             : 1.0;
    const double constant = Rng(seed, 1000 + t).normal() * 2.0;
    const int64_t n = tensor.numel();
    // Rows are the last dimension. `cancelling` halves peak at row/2 * a: enough to overflow
    // fp16 partial sums, while fp32 partial sums stay finite.
    const int64_t row = tensor.shape.empty() ? 1 : std::max<int64_t>(1, tensor.shape.back());
    const double cancel = tensor.dtype == DType::f16
                              ? 4.0 * 65504.0 / static_cast<double>(row)
                              : 0.25 * 3.4028234663852886e38 / static_cast<double>(row);
    parallel_for((n + kChunk - 1) / kChunk, [&](int64_t chunk) {
      Rng rng(seed, (t << 40) | static_cast<uint64_t>(chunk));
      const int64_t end = std::min(n, (chunk + 1) * kChunk);
      for (int64_t i = chunk * kChunk; i < end; ++i) {
        const double z = rng.normal();
        const double u = rng.uniform();
        store_element(tensor.data, tensor.dtype, static_cast<size_t>(i),
                      scale * shape_value(tensor_kind, z, u, i, row, max_magnitude, min_normal,
                                          constant, cancel));
      }
    });
  }
}

FreshInput OpSpec::fresh_input(size_t input, const Sizes& sizes) const {
  const TensorSpec spec = inputs().at(input);
  if (spec.fixed_dtype && !is_floating(*spec.fixed_dtype)) {
    throw Error(
        fmt::format("op {} does not say how its integer input '{}' is redrawn", name(), spec.name));
  }
  FreshInput rule;
  if (!spec.fan_in.empty())
    rule.scale = 1.0 / std::sqrt(static_cast<double>(sizes.at(spec.fan_in)));
  return rule;
}

std::vector<TensorSpec> OpSpec::inputs() const {
  std::vector<TensorSpec> out;
  for (auto& t : tensors()) {
    if (!t.is_output) out.push_back(t);
  }
  return out;
}

std::vector<TensorSpec> OpSpec::outputs() const {
  std::vector<TensorSpec> out;
  for (auto& t : tensors()) {
    if (t.is_output) out.push_back(t);
  }
  return out;
}

std::vector<int64_t> OpSpec::shape_of(const TensorSpec& tensor, const Sizes& sizes) const {
  std::vector<int64_t> shape;
  for (const auto& dim : tensor.dims) {
    const auto it = sizes.find(dim);
    if (it == sizes.end()) throw Error(fmt::format("{}: size '{}' is not set", name(), dim));
    shape.push_back(it->second);
  }
  return shape;
}

std::vector<double> OpSpec::scalar_values(const Sizes&) const {
  std::vector<double> values;
  for (const auto& s : scalars())
    values.push_back(s.value);
  return values;
}

namespace {

int64_t parse_size(std::string_view text, std::string_view part, bool allow_zero) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
  if (ec != std::errc() || ptr != part.data() + part.size() || v < (allow_zero ? 0 : 1)) {
    throw UsageError(fmt::format("shape '{}': '{}' is not a {} integer", text, part,
                                 allow_zero ? "non-negative" : "positive"));
  }
  return v;
}

}  // namespace

Sizes OpSpec::parse_shape(std::string_view text) const {
  const auto names = size_names();
  Sizes sizes = named_size_defaults();
  const std::string_view positional = text.substr(0, text.find(','));
  std::vector<int64_t> values;
  size_t start = 0;
  while (start <= positional.size()) {
    const auto end = std::min(positional.find('x', start), positional.size());
    values.push_back(parse_size(text, positional.substr(start, end - start), false));
    start = end + 1;
  }
  if (values.size() != names.size()) {
    throw UsageError(fmt::format("{} takes a shape {} ({} sizes), got '{}'", name(),
                                 fmt::join(names, "x"), names.size(), text));
  }
  for (size_t i = 0; i < names.size(); ++i)
    sizes[names[i]] = values[i];
  // Named sizes: ",name=value" after the positional ones.
  for (size_t pos = text.find(','); pos != std::string_view::npos;) {
    const size_t next = text.find(',', pos + 1);
    const std::string_view item = text.substr(pos + 1, next - pos - 1);
    const size_t eq = item.find('=');
    const std::string key(item.substr(0, eq));
    if (eq == std::string_view::npos || !named_size_defaults().contains(key)) {
      std::vector<std::string> known;
      for (const auto& [k, v] : named_size_defaults())
        known.push_back(k);
      throw UsageError(
          fmt::format("shape '{}': '{}' is not NAME=VALUE with NAME one of: {}", text, item,
                      known.empty() ? "(none)" : fmt::format("{}", fmt::join(known, ", "))));
    }
    sizes[key] = parse_size(text, item.substr(eq + 1), true);
    pos = next;
  }
  complete_sizes(sizes);
  return sizes;
}

std::string OpSpec::format_shape(const Sizes& sizes) const {
  std::vector<int64_t> values;
  for (const auto& n : size_names())
    values.push_back(sizes.at(n));
  std::string text = fmt::format("{}", fmt::join(values, "x"));
  for (const auto& [key, fallback] : named_size_defaults()) {
    if (named_size_implied(key, sizes)) continue;
    const auto it = sizes.find(key);
    text += fmt::format(",{}={}", key, it == sizes.end() ? fallback : it->second);
  }
  return text;
}

bool OpSpec::supports(DType dtype) const {
  const auto d = dtypes();
  return std::find(d.begin(), d.end(), dtype) != d.end();
}

std::string OpSpec::signature() const {
  std::vector<std::string> parts;
  for (const auto& t : tensors()) {
    parts.push_back(
        fmt::format("{}{}[{}]", t.is_output ? "-> " : "", t.name, fmt::join(t.dims, ",")));
  }
  return fmt::format("{}", fmt::join(parts, " "));
}

}  // namespace kforge
