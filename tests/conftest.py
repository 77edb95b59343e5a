import os

# pytest-xdist (scripts/run_tests.sh runs ``-n 2``): each worker compiles into its own
# Inductor and Triton cache directory, under the one the run was given or the checkout's
# ``build/``, so that no worker loads a kernel file another is still writing. Set before
# anything compiles: Inductor reads the variable at each lookup (``cache_dir()`` in
# torch/_inductor/runtime/cache_dir_utils.py), and the tests' subprocesses inherit it.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    _BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")
    for _var, _name in (
        ("TORCHINDUCTOR_CACHE_DIR", "inductor_cache"),
        ("TRITON_CACHE_DIR", "triton_cache"),
    ):
        _base = os.environ.get(_var) or os.path.join(_BUILD, _name)
        os.environ[_var] = os.path.join(_base, _WORKER)

import pytest  # noqa: E402
import torch  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_collection_modifyitems(config, items):
    # Files with a test that starts JAX run last, in collection order and so in each
    # pytest-xdist worker (scripts/run_tests.sh keeps that order: --no-loadscope-reorder):
    # JAX's threads make a later os.fork() in that process unsafe (JAX warns so), and the
    # Inductor pass forks its variant builds (inductor_pass/variants/fork.py).
    jax_files = {item.path for item in items if "imports_jax" in item.keywords}
    items.sort(key=lambda item: item.path in jax_files)  # stable: the rest keep their order
    slow = os.environ.get("TORCH_REPLAY_SLOW", "0") == "1"
    for item in items:
        if "slow" in item.keywords and not slow:
            item.add_marker(pytest.mark.skip(reason="slow: set TORCH_REPLAY_SLOW=1 to run"))
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (none here)"))


@pytest.fixture(autouse=True)
def _detect_level(request):
    """``@pytest.mark.detect("reads")``: the test runs at that ``tr.config.detect``
    level (the refusing one, for tests of what a refusal says), not the default."""
    marker = request.node.get_closest_marker("detect")
    if marker is None:
        yield
        return
    import torch_replay as tr

    with tr.config.patch(detect=marker.args[0]):
        yield


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
    reference, the TorchDispatchMode of torch_replay/_replay/observe.py."""
    import torch_replay as tr

    with tr.config.patch(observer=request.param):
        yield request.param
