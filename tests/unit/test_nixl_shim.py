"""What ``kvtransfer/nixl_shim.py`` uses of NIXL's private binding, touched here: a NIXL upgrade
that moves it fails in this file, naming it, before a transfer does; and NIXL's errors come out
saying what they mean."""

from importlib.metadata import PackageNotFoundError, version

import pytest

from pdserve.kvtransfer import nixl_shim
from pdserve.kvtransfer.handles import KVTransferError

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


@pytest.mark.parametrize("name", sorted(nixl_shim.MEANINGS))
def test_each_error_class_meaning_names_is_in_the_binding(name: str) -> None:
    assert hasattr(nixl_shim._api.nixlBind, name), _missing(f"_api.nixlBind.{name}")


def test_a_notification_to_a_peer_never_connected_says_what_it_means() -> None:
    # NIXL's C++ prints "genNotif: no specified or potential backend ..." on stderr; ours follows.
    agent = nixl_shim.make_agent("shim-meaning", DELAY_US)
    with (
        pytest.raises(KVTransferError) as raised,
        nixl_shim.explained("release of pdserve-gone's blocks"),
    ):
        agent.send_notif("pdserve-gone", b"release:lease-0")
    assert str(raised.value) == (
        "release of pdserve-gone's blocks: "
        f"{nixl_shim.MEANINGS['nixlNotFoundError']} (nixlNotFoundError: NIXL_ERR_NOT_FOUND)"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
