#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh), then runs the main job: a model whose
# buffer changes between forward and backward, where torch.utils.checkpoint
# returns a wrong gradient and torch_replay.checkpoint the right one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${TORCH_REPLAY_VENV:-.venv}/bin/python" -m torch_replay.demo "$@"
