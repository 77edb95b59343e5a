"""``python -m benchmarks.perf_symbols``: the profiler benchmarks/profilers/perf_symbols.py
(where torch_replay's step time goes beside torch.utils.checkpoint's, symbol by symbol).

The results and docs quote its commands by this name; its options are the profiler's.
"""

from __future__ import annotations

import sys

from benchmarks.profilers.perf_symbols import main

if __name__ == "__main__":
    sys.exit(main())
