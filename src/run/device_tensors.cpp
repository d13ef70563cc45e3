#include "run/device_tensors.h"

#include <cstring>

namespace kforge {
namespace {

constexpr size_t kGuardBytes = 4096;
constexpr unsigned char kGuardPattern = 0xCD;

}  // namespace

DeviceTensors::DeviceTensors(DeviceBackend& backend, const SharedRegion& region,
                             const std::vector<TensorRef>& refs)
    : backend_(backend), region_(region), refs_(refs) {
  const std::vector<std::byte> guard(kGuardBytes, std::byte{kGuardPattern});
  for (const auto& ref : refs_) {
    auto* base = static_cast<std::byte*>(backend_.allocate(ref.bytes + 2 * kGuardBytes));
    bases_.push_back(base);
    backend_.copy_to_device(base, guard.data(), kGuardBytes);
    backend_.copy_to_device(base + kGuardBytes + ref.bytes, guard.data(), kGuardBytes);
    backend_.copy_to_device(base + kGuardBytes, region_.data() + ref.offset, ref.bytes);
  }
}

DeviceTensors::~DeviceTensors() {
  for (auto* base : bases_)
    backend_.release(base);
}

kf_args DeviceTensors::args(const std::vector<double>& scalars, void* stream) {
  abi_inputs_.clear();
  abi_outputs_.clear();
  for (size_t i = 0; i < refs_.size(); ++i) {
    const TensorRef& ref = refs_[i];
    kf_tensor k{};
    k.data = bases_[i] + kGuardBytes;
    k.dtype = to_abi(ref.dtype);
    k.ndim = static_cast<int32_t>(ref.shape.size());
    int64_t stride = 1;
    for (int d = k.ndim - 1; d >= 0; --d) {
      k.shape[d] = ref.shape[d];
      k.stride[d] = stride;
      stride *= ref.shape[d];
    }
    (ref.is_output ? abi_outputs_ : abi_inputs_).push_back(k);
  }
  scalars_ = scalars;
  kf_args a{};
  a.abi_version = KFORGE_ABI_VERSION;
  a.num_inputs = static_cast<int32_t>(abi_inputs_.size());
  a.inputs = abi_inputs_.data();
  a.num_outputs = static_cast<int32_t>(abi_outputs_.size());
  a.outputs = abi_outputs_.data();
  a.num_scalars = static_cast<int32_t>(scalars_.size());
  a.scalars = scalars_.data();
  a.stream = stream;
  return a;
}

std::vector<void*> DeviceTensors::pointers(bool outputs) const {
  std::vector<void*> out;
  for (const DeviceSpan& s : spans(outputs))
    out.push_back(s.data);
  return out;
}

DeviceSpan DeviceTensors::span(size_t i) const {
  const TensorRef& ref = refs_[i];
  return {bases_[i] + kGuardBytes, ref.dtype,
          static_cast<int64_t>(ref.bytes / dtype_size(ref.dtype))};
}

std::vector<DeviceSpan> DeviceTensors::spans(bool outputs) const {
  std::vector<DeviceSpan> out;
  for (size_t i = 0; i < refs_.size(); ++i)
    if (refs_[i].is_output == outputs) out.push_back(span(i));
  return out;
}

std::vector<DeviceSpan> DeviceTensors::all_spans() const {
  std::vector<DeviceSpan> out;
  for (size_t i = 0; i < refs_.size(); ++i)
    out.push_back(span(i));
  return out;
}

nlohmann::json DeviceTensors::guard_violations() {
  nlohmann::json violations = nlohmann::json::array();
  std::vector<std::byte> guard(kGuardBytes);
  for (size_t t = 0; t < refs_.size(); ++t) {
    for (const bool after : {false, true}) {
      const std::byte* band = after ? bases_[t] + kGuardBytes + refs_[t].bytes : bases_[t];
      backend_.copy_to_host(guard.data(), band, kGuardBytes);
      for (size_t i = 0; i < kGuardBytes; ++i) {
        if (guard[i] == std::byte{kGuardPattern}) continue;
        const long long offset =
            after ? static_cast<long long>(i)
                  : static_cast<long long>(i) - static_cast<long long>(kGuardBytes);
        violations.push_back({{"tensor", refs_[t].name},
                              {"where", after ? "after the end" : "before the start"},
                              {"byte_offset", offset}});
        break;
      }
    }
  }
  return violations;
}

nlohmann::json DeviceTensors::inputs_modified() {
  nlohmann::json modified = nlohmann::json::array();
  std::vector<std::byte> scratch;
  for (size_t t = 0; t < refs_.size(); ++t) {
    const TensorRef& ref = refs_[t];
    if (ref.is_output) continue;
    scratch.resize(ref.bytes);
    backend_.copy_to_host(scratch.data(), bases_[t] + kGuardBytes, ref.bytes);
    if (std::memcmp(scratch.data(), region_.data() + ref.offset, ref.bytes) != 0) {
      modified.push_back(ref.name);
    }
  }
  return modified;
}

void DeviceTensors::download(bool outputs) {
  for (size_t t = 0; t < refs_.size(); ++t) {
    const TensorRef& ref = refs_[t];
    if (ref.is_output != outputs) continue;
    backend_.copy_to_host(region_.data() + ref.offset, bases_[t] + kGuardBytes, ref.bytes);
  }
}

}  // namespace kforge
