"""``python -m torch_replay.audit``: the audit's command line (see ``--help``)."""

from torch_replay.audit import main

if __name__ == "__main__":
    raise SystemExit(main())
