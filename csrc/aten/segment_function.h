#pragma once

// The segment boundary for use_reentrant=True: a C++ autograd Function whose
// forward runs the Python segment without grad and whose backward re-runs it
// with grad inside a replay transaction (Note [Replay protocol]) and
// back-propagates through the re-run before the live state is put back.
//
// The Python side passes a "runner" object with three methods:
//   forward(inputs: list[Tensor]) -> list[Tensor]   run the segment
//   recompute(detached: list[Tensor]) -> list[Tensor]
//       begin the replay, re-run the segment with grad, verify the end state
//   finish() -> None   put the live state back (always called)

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/custom_function.h>

namespace torch_replay::aten {

torch::autograd::variable_list apply_segment(
    pybind11::object runner, const torch::autograd::variable_list& inputs);

}  // namespace torch_replay::aten
