"""The planner's hands: set a deployment's replica count in place, without redeploying the app.

This is what Ray Serve's external-scaler REST endpoint
(``POST /api/v1/applications/{app}/deployments/{name}/scale``) does in the dashboard: ask the
Serve controller to update the deployment's replicas. The planner runs inside the cluster, so it
asks the controller itself (``serving/ray_compat.py``) and needs no dashboard or token. The app
must be deployed with ``external_scaler_enabled`` (``cluster/app.py`` sets it when the planner is
on).
"""

from pdserve.serving.ray_compat import set_target_replicas

CONTROLLER_TIMEOUT_S = 30.0


class ServeScaler:
    def __init__(self, app_name: str) -> None:
        self.app_name = app_name

    def scale(self, deployment: str, replicas: int) -> None:
        """Sets the deployment's target; Serve starts or drains replicas to reach it."""
        set_target_replicas(self.app_name, deployment, replicas, CONTROLLER_TIMEOUT_S)

    def running(self) -> dict[str, int]:
        """How many replicas of each of the app's deployments are running now."""
        from ray import serve

        deployments = serve.status().applications[self.app_name].deployments
        return {name: d.replica_states.get("RUNNING", 0) for name, d in deployments.items()}
