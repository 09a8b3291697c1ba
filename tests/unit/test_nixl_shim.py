"""What ``kvtransfer/nixl_shim.py`` uses of NIXL's private binding, touched here: a NIXL upgrade
that moves it fails in this file, naming it, before a transfer does."""

from importlib.metadata import PackageNotFoundError, version

import pytest

from pdserve.kvtransfer import nixl_shim

pytestmark = pytest.mark.skipif(not nixl_shim.nixl_available(), reason="NIXL is not installed")

DELAY_US = 7


def _installed() -> str:
    for distribution in ("nixl-cu12", "nixl"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return "unknown"


def _missing(name: str) -> str:
    return (
        f"{name} is missing from nixl {_installed()}; kvtransfer/nixl_shim.py uses it and was "
        f"written against nixl {nixl_shim.NIXL_VERSION}"
    )


@pytest.mark.parametrize("name", ["nixlAgentConfig", "nixlAgent"])
def test_each_binding_the_shim_uses_is_there(name: str) -> None:
    assert hasattr(nixl_shim._api, "nixlBind"), _missing("_api.nixlBind")
    assert hasattr(nixl_shim._api.nixlBind, name), _missing(f"_api.nixlBind.{name}")


class _Built(Exception):
    """Stops the agent's construction once its binding config is made: no UCX needed."""


def test_make_agent_hands_the_binding_our_progress_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    bindings = nixl_shim._api.nixlBind
    original = bindings.nixlAgentConfig
    seen = {}

    def agent(name: str, config: object) -> None:
        seen["pthrDelay"] = getattr(config, "pthrDelay", None)
        raise _Built

    monkeypatch.setattr(bindings, "nixlAgent", agent)
    with pytest.raises(_Built):
        nixl_shim.make_agent("shim-test", DELAY_US)
    assert seen == {"pthrDelay": DELAY_US}, _missing("nixlAgentConfig.pthrDelay")
    assert bindings.nixlAgentConfig is original  # the swap is undone
