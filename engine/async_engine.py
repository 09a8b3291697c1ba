"""The engine loop in one background thread, with an asyncio front that streams token deltas.

Only the engine thread touches the ``LLMEngine`` (it is not thread-safe), and it builds it too:
OpenMP keeps a team of threads for each thread that starts parallel work, and with more of them
than cores (one team from the thread that loaded the model, one from the thread that steps) they
sleep at every barrier instead of spinning (docs/benchmarks.md, "Measurements behind the code's
choices"). Callers send commands (add, abort, stop) through a thread-safe queue; the thread
applies them between steps and hands each delta to its request's event loop with
``call_soon_threadsafe``.

In a disaggregated cluster the same thread drives KV transfer (``remote_kv.py``): it exports the
blocks of finished ``hold_kv`` requests, and polls the transfers of requests whose prompt KV is
coming from a peer, which join the batch when it lands (or prefill here if it failed).
"""

import asyncio
import concurrent.futures
import logging
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pdserve.engine.config import EngineConfig
from pdserve.engine.errors import (
    EngineOverloadedError,
    EngineStoppedError,
    RemoteKVError,
    RequestError,
)
from pdserve.engine.kv_events import KVEventLog
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.remote_kv import KVHooks, RemoteKV
from pdserve.engine.request import Request, RequestStatus
from pdserve.engine.request_stream import RequestStream
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.stats import EngineStats, IterationStats

logger = logging.getLogger(__name__)

# How long the idle loop sleeps on its queue between looks at in-flight transfers, and at leases.
TRANSFER_POLL_S = 0.0005
LEASE_POLL_S = 0.05
# The interpreter's GIL switch interval in a process that hosts the engine thread. Each of a
# step's few hundred ops takes the GIL to start and to return; while another thread runs Python
# (the server's event loop streaming tokens), Python's default makes each such wait up to 5 ms.
# Measured on a 2-core VM: a 1-row product of SmolLM2's head 25 ms a call instead of 4 beside a
# busy thread (5.4 ms at this interval); a batch-1 stream's ITL 25.7 -> 24.8 ms in-process, where
# the engine loop alone takes 23.4 (docs/benchmarks.md, "Measurements behind the code's choices").
GIL_SWITCH_INTERVAL_S = 0.0002


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    priority: int
    stream: RequestStream
    hold_kv: bool = False
    remote_kv: RemoteKV | None = None


@dataclass
class _Transfer:
    """A request whose prompt KV is in transit; an abort waits for the transfer to end."""

    remote_kv: RemoteKV
    aborted: bool = False


@dataclass
class _Abort:
    request_id: str
    # None: abort whoever holds the id; else only that stream's request
    stream: RequestStream | None


class AsyncLLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        kv_hooks: Callable[[LLMEngine], KVHooks] | None = None,
        collect_stats: bool = False,
        kv_events: bool = False,
    ) -> None:
        """``kv_hooks`` builds the KV transfer layer over the engine (its cache, its pool).
        ``collect_stats``: keep the engine's ``IterationStats`` for ``take_iteration_stats``,
        which the caller must then call now and then (a server's metrics do). ``kv_events``: log
        the prefix cache's changes in ``self.kv_events``, whose reports the caller must then
        take now and then (a KV-aware router's stats do)."""
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.kv_events = KVEventLog() if kv_events else None
        self._collect_stats = collect_stats
        self._iteration_stats = IterationStats()  # taken from the engine thread, under _lock
        self._transfers: dict[str, _Transfer] = {}  # engine thread only
        self.num_transfer_failures = 0  # remote prefills recomputed here instead
        self.max_waiting_requests = config.max_waiting_requests
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()  # None: stop
        # Guards the admission counters and `_closed`, so no add can slip in behind the stop.
        self._lock = threading.Lock()
        self._closed = False
        self._reported_waiting = 0  # scheduler.num_waiting as of the engine thread's last look
        self._pending_adds = 0  # adds submitted but not yet applied by the engine thread
        self._targets: dict[str, tuple[RequestStream, Request]] = {}  # engine thread only
        built: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run, args=(config, kv_hooks, built), name="pdserve-engine", daemon=True
        )
        self._thread.start()
        built.result()  # raises what building the engine raised

    async def generate(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int = 0,
        hold_kv: bool = False,
        remote_kv: RemoteKV | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Streams a request's output as delta chunks of one or more tokens; the last is finished.

        Before any chunk, raises the engine's validation error (``RequestError``, ``ValueError``),
        ``EngineOverloadedError`` or ``EngineStoppedError``. Closing the iterator aborts it.
        ``hold_kv`` (prefill role): a request finished by length hands its blocks to the KV hooks,
        whose handle is the last chunk's ``kv_transfer_params``. ``remote_kv`` (decode role): the
        prompt's KV comes from a peer, with its first token, which the first chunk carries.
        """
        if params.n != 1:
            raise RequestError("n > 1 is not supported here: send n requests instead", "n")
        if hold_kv and self._kv_hooks is None:
            raise RequestError("hold_kv needs an engine built with kv_hooks", "hold_kv")
        stream = RequestStream()
        self._submit_add(_Add(request_id, prompt, params, priority, stream, hold_kv, remote_kv))
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

    def take_iteration_stats(self) -> IterationStats:
        """What the engine did since the last call (``collect_stats`` only)."""
        with self._lock:
            taken, self._iteration_stats = self._iteration_stats, IterationStats()
        return taken

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def check_health(self) -> None:
        if not self.is_running:
            raise EngineStoppedError("engine is shut down")

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

    def _build(self, config: EngineConfig, kv_hooks: Callable[[LLMEngine], KVHooks] | None) -> None:
        self.engine = LLMEngine(config, self._collect_stats, self.kv_events)
        self._kv_hooks = None if kv_hooks is None else kv_hooks(self.engine)
        self.stats: EngineStats = self.engine.stats()  # a snapshot, renewed by the engine thread

    def _run(
        self,
        config: EngineConfig,
        kv_hooks: Callable[[LLMEngine], KVHooks] | None,
        built: concurrent.futures.Future[None],
    ) -> None:
        """Builds the engine, then loops: apply queued commands (sleeping on the queue while
        there is no work), run one step, hand out the deltas. On exit every stream and pending
        add gets an error."""
        try:
            self._build(config, kv_hooks)
        except BaseException as error:  # the constructor raises it
            built.set_exception(error)
            return
        built.set_result(None)
        try:
            while self._apply_commands():
                self._poll_kv()
                if self.engine.has_runnable_requests():
                    self._step()
                self._publish_state()
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
        # Returns False once told to stop. Sleeps on the queue only when there is nothing to run,
        # and then not past the next look at transfers or leases.
        timeout = None
        if self._transfers:
            timeout = TRANSFER_POLL_S
        elif self._kv_hooks is not None:
            timeout = LEASE_POLL_S
        block = not self.engine.has_runnable_requests()
        num_adds = 0
        try:
            while True:
                command = self._commands.get(block=block, timeout=timeout if block else None)
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
            request = self._add_to_engine(command)
        except Exception as error:  # validation errors belong to the caller, not to this loop
            stream.send(stream.settle, error)
            return
        self._targets[command.request_id] = (stream, request)
        # If the caller's loop is gone, the request's first delta finds out and aborts it.
        stream.send(stream.settle, None)

    def _add_to_engine(self, command: _Add) -> Request:
        engine, request_id = self.engine, command.request_id
        remote_kv = command.remote_kv
        if remote_kv is not None:
            slots = engine.add_remote_prefilled(
                request_id, command.prompt, command.params, command.priority
            )
            if slots is not None:
                self._transfers[request_id] = _Transfer(remote_kv)
                try:
                    remote_kv.start(slots)
                except Exception as error:
                    self._transfer_failed(request_id, error)
                return engine.get_request(request_id)
            # No room for the prompt's blocks now: prefill it here, queued like any other.
            logger.info("%s: no KV blocks free for the remote prefill; prefilling here", request_id)
            self._release(request_id, remote_kv)
        return engine.add_request(
            request_id, command.prompt, command.params, command.priority, hold_kv=command.hold_kv
        )

    def _poll_kv(self) -> None:
        if self._kv_hooks is not None:
            self._kv_hooks.poll()
        for request_id, transfer in list(self._transfers.items()):
            try:
                if not transfer.remote_kv.poll():
                    continue
            except Exception as error:
                self._transfer_failed(request_id, error)
                continue
            del self._transfers[request_id]
            if transfer.aborted:  # its stream has ended already
                self.engine.abort_request(request_id)
            else:
                remote_kv = transfer.remote_kv
                delta = self.engine.complete_remote_prefill(
                    request_id, remote_kv.first_token, remote_kv.first_logprobs
                )
                self._dispatch(delta)

    def _transfer_failed(self, request_id: str, error: Exception) -> None:
        # Nothing writes into the request's blocks any more: safe to free or reuse them.
        transfer = self._transfers.pop(request_id)
        # A failure transfers may have is one line; anything else is a bug, with its traceback.
        expected = isinstance(error, RemoteKVError)
        logger.warning(
            "%s: KV transfer failed, prefilling here: %s",
            request_id,
            error,
            exc_info=None if expected else error,
        )
        self.num_transfer_failures += 1
        self._release(request_id, transfer.remote_kv)
        if transfer.aborted:
            self.engine.abort_request(request_id)
        else:
            self.engine.recompute_remote_prefill(request_id)

    @staticmethod
    def _release(request_id: str, remote_kv: RemoteKV) -> None:
        # Best effort: the peer's lease frees its blocks anyway, only later.
        try:
            remote_kv.release()
        except Exception:
            logger.warning("%s: could not release the peer's KV blocks", request_id, exc_info=True)

    def _abort(self, command: _Abort) -> None:
        stream, request = self._targets.get(command.request_id, (None, None))
        # A closing stream whose add failed (e.g. a duplicate id) must not abort the id's owner.
        if request is None or command.stream not in (None, stream):
            return
        del self._targets[command.request_id]
        transfer = self._transfers.get(command.request_id)
        if transfer is not None:  # blocks still being written: freed when the transfer ends
            transfer.aborted = True
        else:
            self.engine.abort_request(command.request_id)
        completion = CompletionOutput(0, finish_reason=RequestStatus.FINISHED_ABORTED.value)
        stream.send(stream.put, RequestOutput.delta(request, completion, request.metrics()))

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
            self._dispatch(delta)

    def _dispatch(self, delta: RequestOutput) -> None:
        stream, request = self._targets[delta.request_id]
        if delta.finished:
            del self._targets[delta.request_id]
            if request.hold_kv and delta.outputs[0].finish_reason == "length":
                held = self.engine.take_held_kv(delta.request_id)
                delta.kv_transfer_params = self._kv_hooks.export(delta.request_id, held)
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

    def _publish_state(self) -> None:
        # Whole-object assignments: readers on other threads see the old or the new snapshot.
        self.stats = self.engine.stats()
        if self._collect_stats:
            taken = self.engine.take_iteration_stats()
            with self._lock:
                self._iteration_stats.add(taken)

    def _publish_waiting(self, num_adds_applied: int) -> None:
        # An add counts as waiting (via the scheduler) before it stops counting as pending, so the
        # asyncio side's sum is never below the truth.
        with self._lock:
            self._reported_waiting = self.engine.scheduler.num_waiting
            self._pending_adds -= num_adds_applied
