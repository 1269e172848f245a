// tessera::KVScales (checked by detail::check_kv_scales) as the kernels read them.
#pragma once

#include "kernels/common/fp8.cuh"
#include "tessera/formats.h"

namespace tessera {
namespace detail {

/// A device tensor of one element is a per-tensor scale (stride 0), of num_kv_heads a per-head one.
inline kernels::KVScaleParams kv_scale_params(const KVScales& s) {
  kernels::KVScaleParams p{};
  p.k = static_cast<float>(s.k);
  p.v = static_cast<float>(s.v);
  p.k_device = s.k_device.defined() ? s.k_device.data_as<const float>() : nullptr;
  p.v_device = s.v_device.defined() ? s.v_device.data_as<const float>() : nullptr;
  p.k_device_stride = s.k_device.defined() && s.k_device.numel() > 1 ? 1 : 0;
  p.v_device_stride = s.v_device.defined() && s.v_device.numel() > 1 ? 1 : 0;
  p.q = static_cast<float>(s.q);
  p.q_device = s.q_device.defined() ? s.q_device.data_as<const float>() : nullptr;
  p.q_device_stride = s.q_device.defined() && s.q_device.numel() > 1 ? 1 : 0;
  return p;
}

}  // namespace detail
}  // namespace tessera
