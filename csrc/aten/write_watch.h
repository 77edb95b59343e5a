#pragma once

// Note [Write watch]
// A journal-engine segment keeps the old bytes of every destructive write to
// its declared state until its re-run (Note [Region journal]). Writes made
// inside segments are journaled by their transactions; writes made anywhere
// else in the process (the training loop enqueueing into a MoCo queue, an
// optimizer step, a hook, another thread) are journaled by a process-wide
// RecordFunction callback, registered while some journal segment is alive:
// before an operator that declares a write (depth 0, as in Note [C++
// observer]) runs outside any segment, the written bytes of a journaled
// storage are recorded. Its cost, while registered, is the dispatcher's
// boxing of arguments for every operator of the process (about a
// microsecond) plus a lookup per written argument. Writes that bypass the
// dispatcher are not seen; under tr.config.verify="bytes" the re-run's start
// hashes then refuse the replay with StateMutationError naming the tensor.
//   * What is left unwatched: an operator whose schema declares no write (and
//     is not a batch norm) is dismissed after one lookup of its cached facts,
//     without reading its arguments; so are operators run inside a segment
//     (its transactions see them). An operator nested in another one's
//     implementation is looked at like any other: a kernel writes what its
//     operator declares or tensors it made, but the __torch_dispatch__ of a
//     Python dispatch mode or tensor subclass runs inside the enclosing
//     operator and may write anything (tests/test_backward_writes.py, a mode
//     writing a buffer inside the backward's `expand`). The boxing of every
//     operator's arguments cannot be left out: RecordFunction decides it per
//     callback, not per operator, before the callback runs. The watch is
//     needed for as long as a journaled, preserved or guarded segment waits,
//     the backward included (hooks, FSDP's unshard, other threads write then).
//   * Tried and measured, not kept: turning RecordFunction off on the thread
//     for the apply of each of torch's generated derivative formulas (their
//     operators write only the gradients they make), from a BACKWARD_FUNCTION
//     callback. at::enableRecordFunction rebuilds the thread's whole callback
//     cache (a mutex, a copy of the global callbacks, every scope), twice per
//     node, which costs what the skipped operators cost: 211.7 M instructions
//     against 210.6 M without it (a scratch build with the path behind a
//     switch; callgrind, 3 steps of the 6-block d=64 GPT model of
//     `perf_symbols --model gpt-small` under state=[block], engine="guard";
//     torch's checkpoint 176.3 M).
//     The same rebuild runs twice per node anyway (the engine sets its
//     ThreadLocalState per task), and allocates once a global callback is
//     registered: part of the watch's price that no callback can lower.
//   * What the watch costs, by instruction count (callgrind, 3 steps of the
//     same model under detect="preserve", with the watch and with a scratch
//     build that never registered it: 199.6 M against 187.5 M instructions;
//     torch's checkpoint 176.3 M): of the 12.2 M, RecordFunction's own
//     machinery (building the range, running callbacks, rebuilding the
//     callback cache) 3.6 M; the autograd engine naming each node it runs,
//     "autograd::engine::evaluate_function: " + the node's name through an
//     ostringstream, which it does only while some FUNCTION-scope callback is
//     active, 3.0 M; malloc/free 1.9 M; boxing 0.8 M; thread-local lookups
//     0.6 M; this callback 0.8 M; other 1.4 M. No callback can avoid the first
//     five: they happen before it runs, for every operator and node of every
//     thread. A dispatch key with kernels for the writing operators only (a
//     fallthrough for the rest) would cost nothing for the others, but torch
//     has no such key for extensions (TESTING_ONLY_GenericMode says "don't
//     use it for anything real") and a thread-local key would not see the
//     process's other threads.

#include <ATen/ATen.h>
#include <ATen/record_function.h>

namespace torch_replay::aten {

// Registers the process-wide write watch (counted: one per live journal
// transaction) / releases one registration.
void write_watch_acquire();
void write_watch_release();

// Journals the bytes `t` covers if its storage was declared by a live
// journal-engine segment (or is marked, Note [Write marks]): called before a
// write made outside any segment.
void journal_write_outside_segments(const at::Tensor& t);

// The write watch's registration: process-wide, with inputs, every
// operator (RecordScope::FUNCTION); also what the observation floor
// registers (Note [Observation floor]).
at::CallbackHandle add_watch_callback(
    at::RecordFunctionCallback::StartCallback start);

}  // namespace torch_replay::aten
