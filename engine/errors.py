"""Errors a request can raise; the HTTP edge maps them onto OpenAI's error envelope."""


class RequestError(ValueError):
    """A request the engine refuses; ``param`` names the offending field when there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(RequestError):
    """The prompt does not fit the model's context."""


class EngineOverloadedError(RuntimeError):
    """Too many requests are already waiting; the caller should retry later (HTTP 503)."""


class EngineStoppedError(RuntimeError):
    """The engine loop is shut down (or died), so the request cannot run or finish."""


class RemoteKVError(RuntimeError):
    """A transfer of a prompt's KV failed as transfers may (a peer gone, a timeout, blocks that
    landed wrong): the request prefills where it is instead, and one line says why."""


class CheckpointError(ValueError):
    """A checkpoint pdserve cannot load; the message is one line that names the file and why
    (the CLI prints it without a traceback)."""
