"""The profilers: where a benchmark's time or instructions go (``perf_symbols``,
``count_compile``, ``profile_pass_stages``, ``profile_variant_cost``).

Each is a script too; ``python -m benchmarks.NAME`` runs it through its entry point at
the top of ``benchmarks/`` (the commands the results and docs quote). The folder is not
called ``profile``: a script run by path (``python benchmarks/bench_compile.py``, as
bench_compile runs its children) has ``benchmarks/`` first on ``sys.path``, where a
``profile`` package would hide the standard library's (``cProfile`` imports it).
"""
