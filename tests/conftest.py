import os

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_collection_modifyitems(config, items):
    slow = os.environ.get("TORCH_REPLAY_SLOW", "0") == "1"
    for item in items:
        if "slow" in item.keywords and not slow:
            item.add_marker(pytest.mark.skip(reason="slow: set TORCH_REPLAY_SLOW=1 to run"))
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (none here)"))
