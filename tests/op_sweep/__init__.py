"""The differential operator sweep: torch's OpInfo database against eager (tests/test_op_sweep.py,
benchmarks/bench_op_sweep.py; cases.py builds the cases, run.py runs and classifies them,
report.py writes the table)."""
