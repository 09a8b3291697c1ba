"""The Serve ingress: the OpenAI HTTP app and the gRPC service (``api/``) over the pools of every
model (``dispatch/``). Its deployment is named ``router``.

HTTP goes through the FastAPI app ``build_http_app`` makes once the clients exist (Serve calls
``__serve_build_asgi_app__`` after ``__init__``). Serve's gRPC proxy calls the methods named after
the rpcs of ``api/pdserve.proto``, which this class inherits from ``GenerationServicer``.
"""

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from pdserve.router.api.admission import Admission
from pdserve.router.api.api_keys import APIKeys
from pdserve.router.api.grpc_service import GenerationServicer
from pdserve.router.api.http_app import build_http_app
from pdserve.router.dispatch.disaggregation import possible_routes
from pdserve.router.dispatch.placement import placement_for
from pdserve.router.dispatch.serve_client import ServeEngineClient
from pdserve.router.metrics import RouterMetrics
from pdserve.router.timing import TimingLog
from pdserve.serving.config import ServedModel
from pdserve.serving.logs import log_replica_lines


@serve.ingress()
class APIIngress(GenerationServicer):
    def __init__(
        self,
        models: list[dict],
        prefill: dict[str, DeploymentHandle],
        decode: dict[str, DeploymentHandle],
        planner: DeploymentHandle | None = None,
        api_key_digests: list[str] | None = None,
    ) -> None:
        """``prefill`` lacks the models served without a prefill pool (aggregated); ``planner``
        is the SLA planner's deployment, when it runs (its place in the app's graph);
        ``api_key_digests`` are the SHA-256 digests of the API keys (none: open)."""
        log_replica_lines()
        self._planner = planner
        served_models = [ServedModel.model_validate(model) for model in models]
        self._metrics = RouterMetrics() if any(m.metrics for m in served_models) else None
        clients = {}
        for served in served_models:
            metrics = self._metrics if served.metrics else None
            if metrics is not None:
                metrics.publish(served, possible_routes(served.name in prefill))
            clients[served.name] = ServeEngineClient(
                served, prefill.get(served.name), decode[served.name], metrics
            )
        admission = Admission({m.name: m.max_concurrent_requests for m in served_models})
        super().__init__(clients, admission, APIKeys(api_key_digests or ()))
        self._timing_log = TimingLog()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_http_app(
            self.clients, self._timing_log, self._metrics, self.admission, self.api_keys
        )

    def route_decisions(self) -> dict:
        """This router replica's id (``replica``), and per model how many requests took each path
        ("local" or "remote" prefill; "migrated": continued after a lost decode replica) here
        (``models``)."""
        replica = serve.get_replica_context().replica_id.unique_id
        models = {name: dict(client.route_decisions) for name, client in self.clients.items()}
        return {"replica": replica, "models": models}

    def placements(self) -> dict[str, dict[str, dict[str, dict]]]:
        """Per model and pool, each replica as the KV-aware placement sees it (none under
        Serve's default router, or before the pool's first call)."""
        views: dict[str, dict[str, dict[str, dict]]] = {}
        for name in self.clients:
            for role in ("prefill", "decode"):
                placement = placement_for(name, role)
                if placement is not None:
                    views.setdefault(name, {})[role] = placement.view()
        return views

    async def planner_history(self) -> list[str]:
        """The SLA planner's decisions so far, one line each (empty when it does not run)."""
        if self._planner is None:
            return []
        return await self._planner.history.remote()

    def requests_in_flight(self) -> dict:
        """This router replica's id (``replica``), and per model the requests it holds now
        (``models``) and its bound on them (``bounds``, ``max_concurrent_requests``)."""
        replica = serve.get_replica_context().replica_id.unique_id
        return {
            "replica": replica,
            "models": self.admission.in_flight(),
            "bounds": self.admission.limits(),
        }

    def take_request_timings(self) -> list[dict]:
        """The HTTP requests' timings logged since the last call (``router/timing.py``)."""
        return self._timing_log.take()
