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


@pytest.fixture
def one_thread():
    """One intra-op thread for the test. Inductor's CPU scatter-add accumulates with
    atomics: with several threads the float sums depend on timing, so plain Inductor is
    not bitwise reproducible against itself; one thread makes the reference exact."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def fresh_dynamo():
    """Dynamo reset before and after: recompiling one code object with new shapes would
    make dynamo mark them dynamic, and each test compiles its own graphs."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_decision_cache():
    """The Inductor pass itself runs at every first call (the decision cache has its own
    tests, ``tests/test_inductor_caches.py``)."""
    from tests.inductor_support import pass_config

    with pass_config(decision_cache=False):
        yield


@pytest.fixture(params=["c++", "python"])
def observer(request):
    """Runs the test under each observer (Note [C++ observer]): the C++ one and its
    reference, the TorchDispatchMode of torch_replay/_observe.py."""
    import torch_replay as tr

    old = tr.config.observer
    tr.config.observer = request.param
    yield request.param
    tr.config.observer = old
