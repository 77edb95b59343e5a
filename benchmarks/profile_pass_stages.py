"""``python -m benchmarks.profile_pass_stages``: the profiler
benchmarks/profilers/profile_pass_stages.py (where the torch_replay backend spends a
cold compile, stage by stage).

The results and docs quote its commands by this name; its options are the profiler's.
"""

from __future__ import annotations

import sys

from benchmarks.profilers.profile_pass_stages import main

if __name__ == "__main__":
    sys.exit(main())
