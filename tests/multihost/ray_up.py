"""`ray up`, `ray exec` and `ray down` on the test hosts, with deploy/'s own files.

``cluster_config`` renders deploy/cluster-local.yaml for the hosts: their addresses, the harness's
SSH key, this run's Ray token; since the hosts share this machine's disk, it drops the copies of
the checkout and the model and `make setup`, and puts this checkout's environment on the PATH.
Each node's object store is kept small: the default (30% of memory) would not fit thrice.
``autoscaling_config`` makes it one whose autoscaler starts some of the hosts on demand.
``serve_config`` renders deploy/serve-cluster.yaml for one small model with fixed pools.
``ray_up_state`` makes the folder a `ray up` keeps its files in, and each host's own resources.
"""

import json
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pdserve.tests.multihost.hosts import CHECKOUT, Host

RAY = Path(sys.executable).with_name("ray")  # this checkout's environment: hosts share the disk
CLUSTER_LOCAL = CHECKOUT / "deploy" / "cluster-local.yaml"
SERVE_CLUSTER = CHECKOUT / "deploy" / "serve-cluster.yaml"
TOKEN_MOUNT = "~/.ray/auth_token"  # where Ray reads its token on each node
NODE_RESOURCES = "~/pdserve-node-resources.json"  # a worker's own resources (cluster-local.yaml)
SHARED_COPIES = ("~/pdserve", "~/models/tiny")  # the mounts the shared disk makes needless
SETUP_VENV = "~/pdserve/.venv/bin"
OBJECT_STORE_BYTES = 100 * 2**20
NODE_FLAGS = f"--object-store-memory={OBJECT_STORE_BYTES} --disable-usage-stats"
# The workers' watch for a lost head (cluster-local.yaml) looks every 10 s; here every 2 s, so that
# `ray down`'s test waits less for their Ray to stop.
HEAD_WATCH_SLEEP = ("sleep 10;", "sleep 2;")
# The head's GCS declares a silent node dead after 3 missed health checks a second apart (Ray's
# defaults: 5, 3 s apart, each waiting 10 s: a minute), so a test that kills a host waits
# seconds for its actors to be reported dead. Ray reads each setting from RAY_<name>.
FAST_NODE_DEATH = (
    "RAY_health_check_period_ms=1000 RAY_health_check_timeout_ms=1000 "
    "RAY_health_check_failure_threshold=3"
)
# A starting node has 30 s to register with the head's GCS (fixed in Ray 2.60's node.py), and the
# autoscaler starts every worker at once: with four hosts on two cores one can miss that, fail its
# update and never be started again. Here each worker's `ray start` tries three times.
RETRIED_RAY_START = (
    'ray_start() { for try in 1 2 3; do ray start "$@" && return 0; ray stop; done; return 1; }; '
)
# Ray 2.60's autoscaler v2, the default for `ray up`, starts one of the local provider's two
# workers and then waits forever; v1 starts both.
AUTOSCALER_V1 = {"RAY_UP_enable_autoscaler_v2": "0"}
RAY_CLI_TIMEOUT_S = 240.0
LOG_TAIL_CHARS = 4000
LOCAL_NODE_TYPE = "local.cluster.node"  # the local provider's one node type (Ray's name)
IDLE_MINUTES = 0.5  # an added host idle this long goes again


def ray_up_state(
    hosts: list[Host], name: str, host_resources: dict[int, dict[str, float]]
) -> tuple[Path, Path]:
    """A folder ``name`` for one `ray up` (its config, log and Ray token: the folder and the
    token's path are returned), with each host in ``host_resources`` (by index) given its own
    resources where its start commands read them (``NODE_RESOURCES``)."""
    state = hosts[0].dir.parent / name
    state.mkdir()
    token = state / "auth_token"
    token.write_text(secrets.token_hex(32))
    for index, resources in host_resources.items():
        hosts[index - 1].ssh(f"echo {shlex.quote(json.dumps(resources))} > {NODE_RESOURCES}")
    return state, token


def cluster_config(hosts: list[Host], token: Path) -> dict[str, Any]:
    """deploy/cluster-local.yaml with the head on ``hosts[0]`` and workers on all the others."""
    config = yaml.safe_load(CLUSTER_LOCAL.read_text())
    head, *workers = hosts
    config["provider"].update(head_ip=head.address, worker_ips=[w.address for w in workers])
    config["min_workers"] = config["max_workers"] = len(workers)
    config["auth"] = {"ssh_user": "root", "ssh_private_key": str(head.identity.key)}
    mounts = config["file_mounts"]
    if TOKEN_MOUNT not in mounts:
        raise ValueError(f"{CLUSTER_LOCAL} copies no Ray token to {TOKEN_MOUNT}")
    config["file_mounts"] = {path: src for path, src in mounts.items() if path not in SHARED_COPIES}
    config["file_mounts"][TOKEN_MOUNT] = str(token)
    venv = str(CHECKOUT / ".venv" / "bin")
    setup = [c.replace(SETUP_VENV, venv) for c in config["setup_commands"] if "make" not in c]
    config["setup_commands"] = setup
    for role in ("head_start_ray_commands", "worker_start_ray_commands"):
        config[role] = [c.replace("ray start", f"ray start {NODE_FLAGS}") for c in config[role]]
    head_start = config["head_start_ray_commands"]
    config["head_start_ray_commands"] = [
        c.replace("ray start", f"{FAST_NODE_DEATH} ray start") for c in head_start
    ]
    workers = config["worker_start_ray_commands"]
    if not any(HEAD_WATCH_SLEEP[0] in command for command in workers):
        raise ValueError(f"no `{HEAD_WATCH_SLEEP[0]}` in {CLUSTER_LOCAL}'s worker commands")
    config["worker_start_ray_commands"] = [
        RETRIED_RAY_START + c.replace("ray start", "ray_start") if "ray start" in c else c
        for c in (c.replace(*HEAD_WATCH_SLEEP) for c in workers)
    ]
    return config


def autoscaling_config(
    config: dict[str, Any], resources: dict[str, float], min_workers: int
) -> dict[str, Any]:
    """``config`` (``cluster_config``'s) with ``min_workers`` of its workers started by `ray up`
    and the others by the autoscaler when a replica asks for room that does not fit, each
    counted as offering ``resources``; one idle for ``IDLE_MINUTES`` goes again.

    Ray's local provider gives its one worker type no resources of its own, so its autoscaler
    never starts a machine for a custom resource (``prefill_node``, ``decode_node``): it learns
    only a type's CPUs and memory from the nodes it sees. A config that already names the type
    (``local.cluster.node``) with its resources is taken as written, which Ray allows only in its
    full form: every field its own preparation would fill in, written out here.
    """
    config = dict(config)
    del config["min_workers"]
    config["available_node_types"] = {
        LOCAL_NODE_TYPE: {
            "node_config": {},
            "resources": resources,
            "min_workers": min_workers,
            "max_workers": config["max_workers"],
        }
    }
    config["head_node_type"] = LOCAL_NODE_TYPE
    config["idle_timeout_minutes"] = IDLE_MINUTES
    config["head_setup_commands"] = config["worker_setup_commands"] = config["setup_commands"]
    config |= {key: [] for key in ("cluster_synced_files", "initialization_commands")}
    config |= {"rsync_filter": [], "file_mounts_sync_continuously": False}
    return config


def serve_config(
    model: dict[str, Any],
    pools: dict[str, dict[str, Any]],
    env: dict[str, str],
    planner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """deploy/serve-cluster.yaml with ``model``'s keys set in its model, each pool as the file
    has it but for ``pools[role]``, ``env`` in every replica's environment, and the planner off,
    or with ``planner``'s keys set in it."""
    config = yaml.safe_load(SERVE_CLUSTER.read_text())
    (app,) = config["applications"]
    (served,) = app["args"]["models"]
    served.update(model)
    for role, overrides in pools.items():
        served[role].update(overrides)
    if planner is None:
        del app["args"]["planner"]
    else:
        app["args"]["planner"].update(planner)
    app["runtime_env"] = {"env_vars": env}
    return config


def ray_cli(log: Path, *args: str) -> str:
    """`ray ARGS` on this machine, keeping the cluster's state and cached config in the log's
    folder, not in this machine's /tmp; its output, which is also in ``log``."""
    env = os.environ | AUTOSCALER_V1 | {"RAY_TMPDIR": str(log.parent), "TMPDIR": str(log.parent)}
    done = subprocess.run(
        [str(RAY), *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=RAY_CLI_TIMEOUT_S,
    )  # fmt: skip
    with open(log, "a") as out:
        out.write(f"$ ray {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    if done.returncode:
        tail = (done.stdout + done.stderr)[-LOG_TAIL_CHARS:]
        raise RuntimeError(f"`ray {' '.join(args)}` exited {done.returncode}:\n{tail}")
    return done.stdout
