"""API keys: who may call the API, checked the same way over HTTP and gRPC.

A client sends ``Authorization: Bearer <key>`` (HTTP header or gRPC metadata), as OpenAI's SDK
does. The router holds only the keys' SHA-256 digests: the keys stay in the process that read
them (``pdserve serve``'s flags or ``PDSERVE_API_KEY``), so no deployment config, log line or
error message can show one. A presented key is hashed and compared with every digest by
``hmac.compare_digest``, in time that does not depend on where the bytes differ. No keys: open.
"""

import hashlib
import hmac
from collections.abc import Iterable
from typing import Annotated

from fastapi import Security
from fastapi.params import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pdserve.router.api.errors import invalid_api_key

AUTHORIZATION = "authorization"  # the gRPC metadata key (gRPC sends keys in lower case)
BEARER = "bearer"  # the scheme, matched without regard to case (RFC 7235)


def key_digest(key: str) -> str:
    """The hex SHA-256 of ``key``: what the router is given instead of the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The key in an ``Authorization: Bearer <key>`` value; None if there is none."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != BEARER:
        return None
    return token.strip() or None


class APIKeys:
    def __init__(self, digests: Iterable[str] = ()) -> None:
        self._digests = [bytes.fromhex(digest) for digest in digests]

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def check(self, key: str | None) -> None:
        """Returns when ``key`` (None: the client sent none) is a known key, or when no key is
        required; else raises the 401 ``APIError``."""
        if not self.required:
            return
        if key is None:
            raise invalid_api_key()
        presented = hashlib.sha256(key.encode()).digest()
        # Every digest is compared, so the time taken does not tell which key matched.
        matches = [hmac.compare_digest(presented, digest) for digest in self._digests]
        if not any(matches):
            raise invalid_api_key()

    def http_dependencies(self) -> list[Depends]:
        """The FastAPI dependencies that guard a route (none when no key is required); the
        bearer scheme they declare puts the key requirement into the OpenAPI document."""
        if not self.required:
            return []
        scheme = HTTPBearer(auto_error=False, description="one of the server's API keys")

        async def require_key(
            credentials: Annotated[HTTPAuthorizationCredentials | None, Security(scheme)],
        ) -> None:
            self.check(None if credentials is None else credentials.credentials)

        return [Security(require_key)]
