"""``python -m benchmarks.count_compile``: the profiler
benchmarks/profilers/count_compile.py (the instructions of a warm compile, torch_replay
against plain Inductor, by callgrind).

The results and docs quote its commands by this name; its options are the profiler's.
"""

from __future__ import annotations

import sys

from benchmarks.profilers.count_compile import main

if __name__ == "__main__":
    sys.exit(main())
