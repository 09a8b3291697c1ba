"""The planner's hands: set a deployment's replica count in place, without redeploying the app.

This is what Ray Serve's external-scaler REST endpoint
(``POST /api/v1/applications/{app}/deployments/{name}/scale``) does in the dashboard: ask the
Serve controller to ``update_deployment_replicas``. The planner runs inside the cluster, so it
asks the controller itself and needs no dashboard or token. The app must be deployed with
``external_scaler_enabled`` (``cluster/app.py`` sets it when the planner is on). Serve's
private names are kept to this module.
"""

import ray
from ray.serve._private.common import DeploymentID
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

CONTROLLER_TIMEOUT_S = 30.0


class ServeScaler:
    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self._controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)

    def scale(self, deployment: str, replicas: int) -> None:
        """Sets the deployment's target; Serve starts or drains replicas to reach it."""
        deployment_id = DeploymentID(name=deployment, app_name=self.app_name)
        ray.get(
            self._controller.update_deployment_replicas.remote(deployment_id, replicas),
            timeout=CONTROLLER_TIMEOUT_S,
        )

    def running(self) -> dict[str, int]:
        """How many replicas of each of the app's deployments are running now."""
        from ray import serve

        deployments = serve.status().applications[self.app_name].deployments
        return {name: d.replica_states.get("RUNNING", 0) for name, d in deployments.items()}
