"""What the benchmark scripts share: the command line and results tail (``cli``), the
counters beside the timings (``counters``), the recording of profiles (``recording``), the
models the benchmarks and tests build (``models``, ``hf_models``, ``hf_stacks``,
``stack_rows``, ``recompute_models``, ``compile_models``, ``replay_steps``,
``inductor_zoo`` with ``zoo_convnets`` and ``zoo_sequence``), the Lightning, accelerate and
torchtitan setups of ``stack_rows`` and the tests (``distributed_stacks``,
``torchtitan_models``), the tables of ``bench_inductor`` (``inductor_table``) and the copy
of benchmarks/README.md's table into docs/commands.md (``readme``).

Nothing here imports a script (``benchmarks/*.py``) or a profiler (``benchmarks/profilers``).
"""
