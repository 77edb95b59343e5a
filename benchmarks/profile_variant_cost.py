"""``python -m benchmarks.profile_variant_cost``: the profiler
benchmarks/profilers/profile_variant_cost.py (what the program variant costs at a cold
compile).

The results and docs quote its commands by this name; its options are the profiler's.
"""

from __future__ import annotations

import sys

from benchmarks.profilers.profile_variant_cost import main

if __name__ == "__main__":
    sys.exit(main())
