#include "run/case_tensors.h"

#include <cstring>

#include "core/fresh_fill.h"
#include "core/parallel.h"

namespace kforge {

CaseTensors::CaseTensors(const OpSpec& op, const Sizes& sizes, DType dtype)
    : op_(op), sizes_(sizes) {
  size_t offset = 0;
  for (const auto& spec : op.tensors()) {
    TensorRef ref;
    ref.name = spec.name;
    ref.dtype = op.dtype_of(spec, dtype);
    ref.shape = op.shape_of(spec, sizes);
    ref.is_output = spec.is_output;
    int64_t n = 1;
    for (const auto d : ref.shape)
      n *= d;
    ref.bytes = static_cast<size_t>(n) * dtype_size(ref.dtype);
    ref.offset = offset;
    offset += (ref.bytes + 255) / 256 * 256;
    refs_.push_back(ref);
  }
  region_ = SharedRegion::create(offset);
  for (const auto& ref : refs_) {
    HostTensor t{ref.name, ref.dtype, ref.shape, region_.data() + ref.offset};
    (ref.is_output ? outputs_ : inputs_).push_back(t);
  }
}

int64_t largest_tensor_elements(const OpSpec& op, const Sizes& sizes) {
  int64_t largest = 0;
  for (const auto& spec : op.tensors()) {
    int64_t n = 1;
    for (const auto d : op.shape_of(spec, sizes))
      n *= d;
    largest = std::max(largest, n);
  }
  return largest;
}

size_t CaseTensors::largest_tensor_elements() const {
  size_t largest = 0;
  for (const auto& ref : refs_)
    largest = std::max(largest, ref.bytes / dtype_size(ref.dtype));
  return largest;
}

void CaseTensors::generate_inputs(InputKind kind, uint64_t seed) {
  kind_ = kind;
  op_.generate(sizes_, kind, seed, inputs_);
}

void CaseTensors::apply_trap(uint64_t trap_seed) {
  for (size_t input = 0; input < inputs_.size(); ++input) {
    HostTensor& t = inputs_[input];
    const FreshInput rule = op_.fresh_input(input, sizes_);
    const int64_t count = t.numel();
    if (input == 0 && count > 0) {
      for (int j = 0; j < fresh::kTrapElements; ++j) {
        const int64_t e = fresh::trap_element(trap_seed, j, count);
        fill_fresh_host(t.data, t.dtype, e, e + 1, rule, fresh::mix(trap_seed + 1));
      }
    }
    if (const int64_t rows = fresh::trap_rows(rule, count); rows > 0) {
      const size_t elem = dtype_size(t.dtype);
      for (int j = 0; j < fresh::kTrapElements; ++j) {
        const fresh::TrapEntry e = fresh::trap_entry(trap_seed, j, rows, rule.row_length);
        std::memcpy(t.data + e.to * elem, t.data + e.from * elem, elem);
      }
    }
  }
}

std::vector<std::vector<std::byte>> CaseTensors::kept_inputs() const {
  std::vector<std::vector<std::byte>> saved(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (fresh::trap_rows(op_.fresh_input(i, sizes_), inputs_[i].numel()) == 0) continue;
    saved[i].assign(inputs_[i].data, inputs_[i].data + inputs_[i].bytes());
  }
  return saved;
}

void CaseTensors::restore_kept_inputs(const std::vector<std::vector<std::byte>>& saved) {
  for (size_t i = 0; i < inputs_.size() && i < saved.size(); ++i) {
    if (!saved[i].empty()) std::memcpy(inputs_[i].data, saved[i].data(), saved[i].size());
  }
}

void CaseTensors::poison_outputs() {
  for (auto& t : outputs_)
    std::memset(t.data, fresh::kPoisonByte, t.bytes());
}

std::vector<std::vector<double>> CaseTensors::inputs_as_double() const {
  std::vector<std::vector<double>> out;
  for (const auto& t : inputs_) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    constexpr int64_t kChunk = 1 << 20;
    parallel_for((t.numel() + kChunk - 1) / kChunk, [&](int64_t c) {
      const int64_t end = std::min<int64_t>(t.numel(), (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) {
        v[static_cast<size_t>(i)] = load_element(t.data, t.dtype, static_cast<size_t>(i));
      }
    });
    out.push_back(std::move(v));
  }
  return out;
}

nlohmann::json CaseTensors::request(const char* op, const std::filesystem::path& module,
                                    const std::vector<double>& scalars) const {
  return {{"op", op},
          {"module", module.string()},
          {"region", region_.name()},
          {"region_bytes", region_.size()},
          {"tensors", refs_},
          {"scalars", scalars}};
}

}  // namespace kforge
