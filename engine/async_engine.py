"""The engine loop in one background thread, with an asyncio front that streams token deltas.

Only the engine thread touches the ``LLMEngine`` (it is not thread-safe). Callers send commands
(add, abort, stop) through a thread-safe queue; the thread applies them between steps and hands
each delta to its request's event loop with ``call_soon_threadsafe``.
"""

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pdserve.engine.config import EngineConfig
from pdserve.engine.errors import EngineOverloadedError, EngineStoppedError, RequestError
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class _Stream:
    # One request's side on its event loop: the add's outcome, then its output. Deltas the consumer
    # has not taken yet merge into one chunk, so a slow consumer gets fewer, bigger chunks.
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.added = self.loop.create_future()
        self.chunk: RequestOutput | None = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()

    def send(self, method: Callable[..., None], *args: Any) -> bool:
        # Called from the engine thread; False when the caller's loop is closed (nobody listens).
        try:
            self.loop.call_soon_threadsafe(method, *args)
        except RuntimeError:
            return False
        return True

    def settle(self, error: BaseException | None) -> None:
        if self.added.done():  # generate() was cancelled while waiting for the add
            return
        if error is None:
            self.added.set_result(None)
        else:
            self.added.set_exception(error)

    def put(self, delta: RequestOutput) -> None:
        if self.chunk is None:
            self.chunk = delta
        else:
            self.chunk.add(delta)
        self.ready.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.ready.set()

    async def get(self) -> RequestOutput:
        while self.chunk is None and self.error is None:
            self.ready.clear()
            await self.ready.wait()
        if self.chunk is None:
            raise self.error
        chunk, self.chunk = self.chunk, None
        return chunk


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int
    stream: _Stream


@dataclass
class _Abort:
    request_id: str
    stream: _Stream | None  # None: abort whoever holds the id; else only that stream's request


class AsyncLLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.engine = LLMEngine(config)
        self.max_waiting_requests = config.max_waiting_requests
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()  # None: stop
        # Guards the admission counters and `_closed`, so no add can slip in behind the stop.
        self._lock = threading.Lock()
        self._closed = False
        self._reported_waiting = 0  # scheduler.num_waiting as of the engine thread's last look
        self._pending_adds = 0  # adds submitted but not yet applied by the engine thread
        self._targets: dict[str, tuple[_Stream, Request]] = {}  # engine thread only
        self._thread = threading.Thread(target=self._run, name="pdserve-engine", daemon=True)
        self._thread.start()

    async def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Streams a request's output as delta chunks of one or more tokens; the last is finished.

        Before any chunk, raises the engine's validation error (``RequestError``, ``ValueError``),
        ``EngineOverloadedError`` or ``EngineStoppedError``. Closing the iterator aborts it.
        """
        if params.n != 1:
            raise RequestError("n > 1 is not supported here: send n requests instead", "n")
        stream = _Stream()
        self._submit_add(_Add(request_id, prompt, params, priority, stream))
        finished = False
        try:
            await stream.added
            while not finished:
                chunk = await stream.get()
                finished = chunk.finished
                yield chunk
        finally:
            if not finished:
                self._submit_abort(_Abort(request_id, stream))

    def abort(self, request_id: str) -> None:
        """Aborts a request from any thread; its stream ends with a chunk finished by "abort"."""
        self._submit_abort(_Abort(request_id, None))

    def shutdown(self) -> None:
        """Stops the engine thread and joins it; in-flight streams raise ``EngineStoppedError``."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._commands.put(None)
        self._thread.join()

    async def __aenter__(self) -> "AsyncLLMEngine":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.shutdown)

    def _submit_add(self, command: _Add) -> None:
        with self._lock:
            if self._closed:
                raise EngineStoppedError("engine is shut down")
            waiting = self._reported_waiting + self._pending_adds
            if waiting >= self.max_waiting_requests:
                raise EngineOverloadedError(
                    f"engine overloaded: {waiting} requests waiting "
                    f"(max_waiting_requests={self.max_waiting_requests}); retry later"
                )
            self._pending_adds += 1
            self._commands.put(command)

    def _submit_abort(self, command: _Abort) -> None:
        with self._lock:
            if not self._closed:  # a stopped engine has already dropped every request
                self._commands.put(command)

    # --- engine thread ---

    def _run(self) -> None:
        """The engine loop: apply queued commands (sleeping on the queue while there is no work),
        run one step, hand out the deltas. On exit every stream and pending add gets an error."""
        try:
            while self._apply_commands():
                if self.engine.has_unfinished_requests():
                    self._step()
        finally:  # a crash here is still reported by threading.excepthook
            with self._lock:
                self._closed = True
            stopped = EngineStoppedError("engine is shut down")
            self._fail_all(stopped)
            # Nothing is queued once `_closed` is set; adds queued before it must not hang.
            while not self._commands.empty():
                command = self._commands.get_nowait()
                if isinstance(command, _Add):
                    command.stream.send(command.stream.settle, stopped)

    def _apply_commands(self) -> bool:
        # Returns False once told to stop.
        block = not self.engine.has_unfinished_requests()
        num_adds = 0
        try:
            while True:
                command = self._commands.get(block=block)
                block = False
                if command is None:
                    return False
                if isinstance(command, _Add):
                    num_adds += 1
                    self._add(command)
                else:
                    self._abort(command)
        except queue.Empty:
            return True
        finally:
            self._publish_waiting(num_adds)

    def _add(self, command: _Add) -> None:
        stream = command.stream
        try:
            request = self.engine.add_request(
                command.request_id, command.prompt, command.params, priority=command.priority
            )
        except Exception as error:  # validation errors belong to the caller, not to this loop
            stream.send(stream.settle, error)
            return
        self._targets[command.request_id] = (stream, request)
        # If the caller's loop is gone, the request's first delta finds out and aborts it.
        stream.send(stream.settle, None)

    def _abort(self, command: _Abort) -> None:
        stream, request = self._targets.get(command.request_id, (None, None))
        # A closing stream whose add failed (e.g. a duplicate id) must not abort the id's owner.
        if request is None or command.stream not in (None, stream):
            return
        del self._targets[command.request_id]
        self.engine.abort_request(command.request_id)
        completion = CompletionOutput(0, finish_reason=RequestStatus.FINISHED_ABORTED.value)
        final = RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            [completion],
            finished=True,
            num_cached_tokens=request.num_cached_tokens,
            metrics=request.metrics(),
        )
        stream.send(stream.put, final)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:
            logger.exception("engine step failed; failing %d requests", len(self._targets))
            self._fail_all(error)
            return
        finally:
            self._publish_waiting(0)
        for delta in outputs:
            stream, _ = self._targets[delta.request_id]
            if delta.finished:
                del self._targets[delta.request_id]
            if not stream.send(stream.put, delta) and not delta.finished:
                self._abort(_Abort(delta.request_id, None))

    def _fail_all(self, error: BaseException) -> None:
        for request_id, (stream, _) in self._targets.items():
            try:
                self.engine.abort_request(request_id)
            except Exception:  # keep failing the rest: a stream that never ends is worse
                logger.exception("aborting %s after an engine error failed", request_id)
            stream.send(stream.fail, error)
        self._targets.clear()

    def _publish_waiting(self, num_adds_applied: int) -> None:
        # An add counts as waiting (via the scheduler) before it stops counting as pending, so the
        # asyncio side's sum is never below the truth.
        with self._lock:
            self._reported_waiting = self.engine.scheduler.num_waiting
            self._pending_adds -= num_adds_applied
