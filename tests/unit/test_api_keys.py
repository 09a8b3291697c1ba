"""API keys: the bearer key read from an Authorization value, checked against the keys' digests
with ``hmac.compare_digest`` (every digest, every time), and a 401 that shows no key."""

import hashlib
import hmac
from http import HTTPStatus

import pytest

from pdserve.router.api import api_keys as api_keys_module
from pdserve.router.api.api_keys import APIKeys, bearer_token, key_digest
from pdserve.router.api.errors import APIError

KEYS = ("sk-first", "sk-second", "sk-third")


@pytest.mark.parametrize(
    ("authorization", "token"),
    [
        ("Bearer sk-first", "sk-first"),
        ("bearer sk-first", "sk-first"),  # the scheme is not case-sensitive
        ("BEARER  sk-first ", "sk-first"),
        ("Basic sk-first", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("sk-first", None),
        ("", None),
        (None, None),
    ],
)
def test_the_bearer_key_is_read_from_the_header(
    authorization: str | None, token: str | None
) -> None:
    assert bearer_token(authorization) == token


def test_digests_are_sha256_of_the_key() -> None:
    assert key_digest("sk-first") == hashlib.sha256(b"sk-first").hexdigest()


def test_no_keys_means_open() -> None:
    keys = APIKeys()
    assert not keys.required
    keys.check(None)
    keys.check("anything")
    assert keys.http_dependencies() == []


@pytest.mark.parametrize("key", KEYS)
def test_each_key_passes(key: str) -> None:
    APIKeys(key_digest(k) for k in KEYS).check(key)


@pytest.mark.parametrize("presented", [None, "", "sk-fourth", "sk-firs", "sk-first ", "SK-FIRST"])
def test_anything_else_gets_401_without_the_key(presented: str | None) -> None:
    keys = APIKeys(key_digest(k) for k in KEYS)
    with pytest.raises(APIError) as refused:
        keys.check(presented)
    error = refused.value
    assert error.kind.status == HTTPStatus.UNAUTHORIZED
    assert error.kind.grpc_code == "UNAUTHENTICATED"
    assert error.envelope()["error"] == {
        "message": error.message,
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert all(key not in error.message for key in KEYS)
    assert not presented or presented not in error.message


def test_every_digest_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(api_keys_module.hmac, "compare_digest", compare_digest)
    keys = APIKeys(key_digest(k) for k in KEYS)
    keys.check(KEYS[0])  # a match on the first digest still compares the others
    presented = hashlib.sha256(KEYS[0].encode()).digest()
    assert compared == [(presented, hashlib.sha256(k.encode()).digest()) for k in KEYS]
