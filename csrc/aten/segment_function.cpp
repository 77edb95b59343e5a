#include "aten/segment_function.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace torch_replay::aten {

namespace {

// Keeps the Python runner alive inside the autograd graph; the graph may be
// freed on a thread that does not hold the GIL.
struct RunnerHolder : torch::CustomClassHolder {
  explicit RunnerHolder(py::object r) : runner(std::move(r)) {}
  ~RunnerHolder() override {
    py::gil_scoped_acquire gil;
    runner = py::object();
  }
  py::object runner;
};

struct SegmentFunction : torch::autograd::Function<SegmentFunction> {
  static variable_list forward(
      AutogradContext* ctx, py::object runner, at::TensorList inputs_ref) {
    // TensorList (not a vector) so that autograd sees each tensor as an input.
    variable_list inputs = inputs_ref.vec();
    ctx->save_for_backward(inputs);
    ctx->saved_data["runner"] =
        c10::IValue::make_capsule(c10::make_intrusive<RunnerHolder>(runner));
    py::gil_scoped_acquire gil;
    return runner.attr("forward")(inputs).cast<variable_list>();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(
        torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
        "When use_reentrant=True, torch.utils.checkpoint is incompatible"
        " with .grad() or passing an `inputs` parameter to .backward()."
        " To resolve this error, you can either set use_reentrant=False,"
        " or call .backward() without passing the `inputs` argument."
        " (torch_replay.checkpoint)");
    variable_list inputs = ctx->get_saved_variables();
    auto capsule = ctx->saved_data["runner"].toCapsule();
    auto* holder = static_cast<RunnerHolder*>(capsule.get());
    const bool create_graph = at::GradMode::is_enabled();

    variable_list detached;
    detached.reserve(inputs.size());
    for (const auto& t : inputs) {
      auto d = t.detach();
      d.requires_grad_(t.requires_grad());
      detached.push_back(d);
    }
    variable_list result(inputs.size() + 1);
    py::gil_scoped_acquire gil;
    py::object runner = holder->runner;
    try {
      variable_list outputs;
      {
        at::AutoGradMode enable(true);
        outputs = runner.attr("recompute")(detached).cast<variable_list>();
      }
      variable_list with_grad, out_grads;
      for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
        if (outputs[i].defined() && outputs[i].requires_grad()) {
          with_grad.push_back(outputs[i]);
          out_grads.push_back(grads[i]);
        }
      }
      TORCH_CHECK(
          !with_grad.empty(),
          "none of output has requires_grad=True,"
          " this checkpoint() is not necessary (torch_replay.checkpoint)");
      {
        py::gil_scoped_release nogil;
        torch::autograd::backward(
            with_grad, out_grads, /*retain_graph=*/std::nullopt, create_graph);
      }
      for (size_t i = 0; i < detached.size(); ++i) {
        result[i + 1] = detached[i].grad();
      }
    } catch (...) {
      try {
        runner.attr("finish")();
      } catch (...) {
      }
      throw;
    }
    runner.attr("finish")();
    return result;
  }
};

}  // namespace

variable_list apply_segment(py::object runner, const variable_list& inputs) {
  return SegmentFunction::apply(std::move(runner), at::TensorList(inputs));
}

}  // namespace torch_replay::aten
