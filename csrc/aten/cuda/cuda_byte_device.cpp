// ByteDevice for CUDA memory (Note [Byte devices]): blobs come from the CUDA
// caching allocator, bytes move with the kernels of cuda/journal_kernels.cu on
// the current stream. Built only with a CUDA build of torch (setup.py).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "aten/byte_devices.h"
#include "core/status.h"
#include "journal_kernels.h"

namespace torch_replay::aten {
namespace {

void check(cudaError_t err) {
  if (err != cudaSuccess) {
    throw ReplayException(
        ErrorKind::kInternal,
        std::string("torch_replay CUDA kernel failed: ") +
            cudaGetErrorString(err));
  }
}

class CudaBlob final : public Blob {
 public:
  explicit CudaBlob(int64_t n)
      : data_(c10::cuda::CUDACachingAllocator::get()->allocate(n)), n_(n) {}
  int64_t nbytes() const override {
    return n_;
  }
  uint8_t* data() const {
    return static_cast<uint8_t*>(data_.get());
  }

 private:
  c10::DataPtr data_;
  int64_t n_;
};

// Ranges and their packed offsets, uploaded to the device.
struct DeviceRanges {
  c10::DataPtr ranges, offsets;
  int64_t n = 0;
};

// `offsets` (optional): where each range's bytes are in the blob; packed in
// range order when empty.
DeviceRanges upload(
    const RangeSet& set,
    cudaStream_t stream,
    std::vector<int64_t> offsets = {}) {
  std::vector<int64_t> flat;
  const bool packed = offsets.empty();
  int64_t total = 0;
  for (const auto& r : set.ranges()) {
    flat.push_back(r.begin);
    flat.push_back(r.end);
    if (packed) {
      offsets.push_back(total);
    }
    total += r.size();
  }
  auto* alloc = c10::cuda::CUDACachingAllocator::get();
  // One slot more than the values: a valid pointer even for an empty set.
  auto to_device = [&](const std::vector<int64_t>& host) {
    c10::DataPtr ptr = alloc->allocate(sizeof(int64_t) * (host.size() + 1));
    check(cudaMemcpyAsync(
        ptr.get(),
        host.data(),
        sizeof(int64_t) * host.size(),
        cudaMemcpyHostToDevice,
        stream));
    return ptr;
  };
  DeviceRanges out;
  out.n = static_cast<int64_t>(offsets.size());
  out.ranges = to_device(flat);
  out.offsets = to_device(offsets);
  // The host vectors die with this frame: finish the copies first.
  check(cudaStreamSynchronize(stream));
  return out;
}

// The device that owns `ptr` (multi-GPU: blobs and kernels must go there).
c10::DeviceIndex device_of(const void* ptr) {
  cudaPointerAttributes attr;
  check(cudaPointerGetAttributes(&attr, ptr));
  return static_cast<c10::DeviceIndex>(attr.device);
}

class CudaDevice final : public ByteDevice {
 public:
  std::unique_ptr<Blob> gather(
      const uint8_t* base, const RangeSet& ranges) override {
    c10::cuda::CUDAGuard guard(device_of(base));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    auto blob = std::make_unique<CudaBlob>(ranges.bytes());
    DeviceRanges d = upload(ranges, stream);
    check(
        cuda::gather_ranges(
            base,
            static_cast<const int64_t*>(d.ranges.get()),
            static_cast<const int64_t*>(d.offsets.get()),
            d.n,
            blob->data(),
            stream));
    return blob;
  }
  void scatter(
      uint8_t* base, const RangeSet& ranges, const Blob& blob) override {
    scatter_at(base, ranges, blob, {});  // no offsets: packed in range order
  }
  void scatter_at(
      uint8_t* base,
      const RangeSet& dst,
      const Blob& blob,
      const std::vector<int64_t>& blob_offsets) override {
    c10::cuda::CUDAGuard guard(device_of(base));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    DeviceRanges d = upload(dst, stream, blob_offsets);
    check(
        cuda::scatter_ranges(
            base,
            static_cast<const int64_t*>(d.ranges.get()),
            static_cast<const int64_t*>(d.offsets.get()),
            d.n,
            dynamic_cast<const CudaBlob&>(blob).data(),
            stream));
  }
  Hash128 hash(const uint8_t* base, const RangeSet& ranges) override {
    c10::cuda::CUDAGuard guard(device_of(base));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    DeviceRanges d = upload(ranges, stream);
    auto out = c10::cuda::CUDACachingAllocator::get()->allocate(16);
    check(cudaMemsetAsync(out.get(), 0, 16, stream));
    check(
        cuda::hash_ranges(
            base,
            static_cast<const int64_t*>(d.ranges.get()),
            d.n,
            static_cast<unsigned long long*>(out.get()),
            stream));
    unsigned long long host[2];
    check(cudaMemcpyAsync(host, out.get(), 16, cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));
    return {host[0], host[1]};
  }
};

struct Registration {
  Registration() {
    static CudaDevice device;
    register_cuda_byte_device(&device);
  }
} registration;

}  // namespace
}  // namespace torch_replay::aten
