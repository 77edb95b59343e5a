#include "aten/byte_devices.h"

#include "core/status.h"

namespace torch_replay::aten {

namespace {
ByteDevice*& cuda_device() {
  static ByteDevice* device = nullptr;
  return device;
}
}  // namespace

void register_cuda_byte_device(ByteDevice* device) {
  cuda_device() = device;
}

ByteDevice& byte_device_for(const c10::Device& device) {
  if (device.is_cpu()) {
    return host_device();
  }
  if (device.is_cuda() && cuda_device() != nullptr) {
    return *cuda_device();
  }
  throw ReplayException(
      ErrorKind::kUnsupported,
      "torch_replay cannot preserve state on device " + device.str() +
          (device.is_cuda()
               ? ": the extension was built without CUDA kernels. Rebuild it "
                 "with a CUDA build of torch and nvcc (bash scripts/setup.sh)."
               : ": only CPU and CUDA storages are supported. Move the state "
                 "to CPU or CUDA, or do not declare it."));
}

}  // namespace torch_replay::aten
