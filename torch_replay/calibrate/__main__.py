"""``python -m torch_replay.calibrate``: the command line (see ``--help``)."""

from torch_replay.calibrate.cli import main

raise SystemExit(main())
