#pragma once

// ByteDevice (Note [Byte devices]) for a torch device: host memory for CPU,
// the kernels of cuda/ for CUDA when the extension was built with them.

#include <c10/core/Device.h>

#include "core/byte_device.h"

namespace torch_replay::aten {

// Throws ReplayException(kUnsupported) for a device without a byte device.
ByteDevice& byte_device_for(const c10::Device& device);

// Called once by the CUDA registration (csrc/aten/cuda/) at load time.
void register_cuda_byte_device(ByteDevice* device);

}  // namespace torch_replay::aten
