#pragma once

// Note [Observation floor]
// What observing costs before any of torch_replay's code runs: RecordFunction
// builds a range for every operator, boxes its arguments (and, for the
// observer, its results) and calls the callbacks, and while any FUNCTION-scope
// callback is registered the autograd engine also names every node it runs
// through an ostringstream (Note [Write watch]). These two switches register
// callbacks that do nothing with exactly the options of the observer (on this
// thread, inputs and outputs) and of the write watch (process-wide, inputs):
// benchmarks/bench_replay_speed.py times torch's own checkpoint under them,
// the cost no callback body can remove. Counted, like the real ones (a stray
// `off` is ignored); each returns how many `on`s are left. The other ways to
// see operators (a callback given no arguments, one given inputs only, a boxed
// dispatcher fallback on a mode key) are priced by the benchmark alone (Note
// [Other observation floors] in benchmarks/observer_floors.cpp).

namespace torch_replay::aten {

int floor_observer(bool on);
int floor_watch(bool on);

}  // namespace torch_replay::aten
