// CUDA registrations of torch.ops.torch_replay.{gather_ranges, scatter_ranges_,
// hash_ranges} (schemas in csrc/aten/ops.cpp), on the kernels of cuda/.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "journal_kernels.h"

namespace torch_replay::aten {
namespace {

struct Uploaded {
  at::Tensor ranges, offsets;
  int64_t total = 0;
};

Uploaded upload(const at::Tensor& data, const at::Tensor& ranges) {
  TORCH_CHECK(
      data.is_cuda() && data.dim() == 1 && data.scalar_type() == at::kByte &&
          data.is_contiguous(),
      "torch_replay: data must be a contiguous 1-D uint8 CUDA tensor");
  TORCH_CHECK(
      ranges.device().is_cpu() && ranges.scalar_type() == at::kLong &&
          ranges.dim() == 2 && ranges.size(1) == 2 && ranges.is_contiguous(),
      "torch_replay: ranges must be a contiguous int64 CPU tensor [n, 2]");
  const int64_t* r = ranges.const_data_ptr<int64_t>();
  at::Tensor offsets = at::empty({ranges.size(0)}, ranges.options());
  int64_t* o = offsets.mutable_data_ptr<int64_t>();
  int64_t total = 0, prev_end = 0;
  for (int64_t i = 0; i < ranges.size(0); ++i) {
    TORCH_CHECK(
        r[2 * i] >= prev_end && r[2 * i] <= r[2 * i + 1] &&
            r[2 * i + 1] <= data.numel(),
        "torch_replay: ranges must be sorted, disjoint and inside data");
    o[i] = total;
    total += r[2 * i + 1] - r[2 * i];
    prev_end = r[2 * i + 1];
  }
  return {ranges.to(data.device()), offsets.to(data.device()), total};
}

void check(cudaError_t err) {
  TORCH_CHECK(
      err == cudaSuccess,
      "torch_replay CUDA kernel: ",
      cudaGetErrorString(err));
}

at::Tensor gather_cuda(
    const at::Tensor& data, const at::Tensor& ranges, int64_t total) {
  c10::cuda::CUDAGuard guard(data.device());
  Uploaded u = upload(data, ranges);
  TORCH_CHECK(
      total == u.total,
      "torch_replay.gather_ranges: total must equal "
      "the bytes in ranges");
  at::Tensor out = at::empty({total}, data.options());
  check(
      cuda::gather_ranges(
          data.const_data_ptr<uint8_t>(),
          u.ranges.const_data_ptr<int64_t>(),
          u.offsets.const_data_ptr<int64_t>(),
          ranges.size(0),
          out.mutable_data_ptr<uint8_t>(),
          c10::cuda::getCurrentCUDAStream()));
  return out;
}

void scatter_cuda(
    const at::Tensor& data, const at::Tensor& ranges, const at::Tensor& src) {
  c10::cuda::CUDAGuard guard(data.device());
  Uploaded u = upload(data, ranges);
  TORCH_CHECK(
      src.device() == data.device() && src.scalar_type() == at::kByte &&
          src.is_contiguous() && src.numel() == u.total,
      "torch_replay.scatter_ranges_: src must hold exactly the bytes of "
      "ranges, on data's device");
  check(
      cuda::scatter_ranges(
          data.mutable_data_ptr<uint8_t>(),
          u.ranges.const_data_ptr<int64_t>(),
          u.offsets.const_data_ptr<int64_t>(),
          ranges.size(0),
          src.const_data_ptr<uint8_t>(),
          c10::cuda::getCurrentCUDAStream()));
}

at::Tensor hash_cuda(const at::Tensor& data, const at::Tensor& ranges) {
  c10::cuda::CUDAGuard guard(data.device());
  Uploaded u = upload(data, ranges);
  at::Tensor out = at::zeros({2}, data.options().dtype(at::kLong));
  check(
      cuda::hash_ranges(
          data.const_data_ptr<uint8_t>(),
          u.ranges.const_data_ptr<int64_t>(),
          ranges.size(0),
          reinterpret_cast<unsigned long long*>(
              out.mutable_data_ptr<int64_t>()),
          c10::cuda::getCurrentCUDAStream()));
  return out.cpu();
}

}  // namespace

TORCH_LIBRARY_IMPL(torch_replay, CUDA, m) {
  m.impl("gather_ranges", &gather_cuda);
  m.impl("scatter_ranges_", &scatter_cuda);
  m.impl("hash_ranges", &hash_cuda);
}

}  // namespace torch_replay::aten
