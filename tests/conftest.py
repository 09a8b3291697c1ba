"""Shared fixtures: the built-in tiny model, made once per test session, and a KV-block leak check.

Every ``LLMEngine`` built during the session is registered (weakly), whichever fixture scope
built it. After every test, each live engine with no unfinished requests must have all its KV
blocks free — cached-but-unreferenced blocks count as free — so a block not returned on finish,
abort or preemption fails the test that leaked it, not a later one.
"""

import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from pdserve.cluster.serve_env import apply_serve_env

if TYPE_CHECKING:
    from pdserve.engine.llm_engine import LLMEngine
    from pdserve.serving.config import ClusterConfig
    from pdserve.tests.ray_cluster import SessionCluster

# The tests' clusters run Serve as `pdserve serve` does; this must come before ray.serve's import.
apply_serve_env()
# The interpreters the tests start never put their working directory, a checkout, first on
# sys.path (tests/shadowing.py).
os.environ["PYTHONSAFEPATH"] = "1"

SHARED_APP = "shared_app"  # the fixture's name, by which its tests are ordered

# Weak references, so the registry never keeps an engine (and its KV cache) alive; each with the
# test that was running when the engine was built, to name it in a leak report.
_ENGINES: list[tuple["weakref.ref[LLMEngine]", str]] = []


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pdserve.cluster.make_model import make_model

    return make_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator["SessionCluster"]:
    """The session's one Ray cluster with Serve (tests/ray_cluster.py), started on first use."""
    from pdserve.tests.ray_cluster import session_cluster

    with session_cluster(tmp_path_factory.mktemp("ray")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def shared_app(ray_cluster: "SessionCluster", tiny_model_dir: Path) -> "ClusterConfig":
    """One disaggregated app (tests/e2e/serve_replicas.py, ``shared_model``) for every module that
    uses it: they run first of the session cluster's tests, one after another, and the next
    module's deployment replaces the app. Their tests leave replicas killed and restarted and
    prefixes cached: a module that kills replicas runs after those that count on fresh ones (file
    order), and each module's prompts use seeds of their own."""
    from pdserve.cluster.serve import deploy
    from pdserve.tests.e2e.serve_replicas import shared_model

    config = ray_cluster.config([shared_model(tiny_model_dir)])
    deploy(config)  # its tests run before any other module deploys, so it replaces none
    return config


def _uses_ray(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("own_ray_cluster")) or "ray_cluster" in getattr(
        item, "fixturenames", ()
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the marker this adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses Ray is marked ``ray``: ``make test`` runs those (one cluster, in
    order) and the rest side by side, the rest in the Ray tests' waits (start-ups, scrapes,
    planner intervals).

    Tests that start a Ray cluster of their own go first, before the session's cluster exists:
    two clusters at once would share Ray's files in /tmp/ray (Prometheus' service-discovery file
    among them). ``make test`` runs beside the session's cluster those whose cluster has a temp
    folder of its own (``ray_apart``: ``pdserve serve`` as a user runs it) and the multihost
    tests, whose test hosts have a /tmp of their own. The tests of ``shared_app`` come next, so
    that one deployment serves them all."""
    items.sort(
        key=lambda item: (
            not item.get_closest_marker("own_ray_cluster"),
            SHARED_APP not in getattr(item, "fixturenames", ()),
        )
    )
    for item in items:
        if _uses_ray(item):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def native_ops() -> ModuleType:
    """The native CPU kernels, built here if the set-up step has not (skipped with no compiler
    or with them disabled)."""
    from pdserve.kernels import native

    if not native.library_path(native.cpu_capability()).exists():
        try:
            native.build()
        except RuntimeError as error:
            pytest.skip(str(error))
        native.load.cache_clear()
    assert native.load()
    if not native.available():
        pytest.skip(f"{native.DISABLE_ENV}=0")
    return native


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """``torch.set_num_threads`` for one test, restored after it (engines choose their matmul
    path by the thread count they are built under)."""
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def check_no_leaks(engine: "LLMEngine", where: str = "engine") -> None:
    """Raises AssertionError if an idle engine holds KV blocks; busy engines are not checked."""
    if engine.has_unfinished_requests():
        return
    pool = engine.block_pool
    if pool.num_free_blocks != pool.num_blocks:
        raise AssertionError(
            f"{where}: KV blocks leaked: {pool.num_free_blocks} of {pool.num_blocks} free with "
            f"no unfinished requests ({pool.num_blocks - pool.num_free_blocks} held)"
        )


@pytest.fixture(scope="session")
def assert_no_leaks() -> Callable[["LLMEngine"], None]:
    """The leak check as a callable, for tests and module fixtures to run between their phases
    (conftest is not importable under ``--import-mode=importlib``)."""
    return check_no_leaks


@pytest.fixture(scope="session", autouse=True)
def _register_engines() -> Iterator[None]:
    # Session-scoped: a test's own ``monkeypatch`` would miss engines that module fixtures build
    # before the test starts.
    try:
        from pdserve.engine.llm_engine import LLMEngine
    except Exception:  # an engine that does not import must fail only the tests that use it
        yield
        return
    original_init = LLMEngine.__init__

    def registering_init(self: "LLMEngine", *args: object, **kwargs: object) -> None:
        original_init(self, *args, **kwargs)
        built_in = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        _ENGINES.append((weakref.ref(self), built_in))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LLMEngine, "__init__", registering_init)
        yield


@pytest.fixture(autouse=True)
def _no_leaked_blocks(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    leaks = []
    for entry in list(_ENGINES):
        ref, built_in = entry
        engine = ref()
        if engine is None:
            _ENGINES.remove(entry)
            continue
        try:
            check_no_leaks(engine, f"after {request.node.nodeid} (engine built in {built_in})")
        except AssertionError as leak:
            # Reported once: a failed test's traceback can keep the engine alive, and it must not
            # fail every test that runs after.
            _ENGINES.remove(entry)
            leaks.append(str(leak))
    if leaks:
        pytest.fail("\n".join(leaks), pytrace=False)
