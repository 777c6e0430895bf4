"""Every Ray API vitdeploy uses that Ray does not promise to keep, in one place: private modules and parameters,
attributes of Ray's internals, the environment variables only Ray's internals read, and one developer API. Each
entry (:class:`RayApi`) names the dotted API and says why we need it; the code that needs one goes through the
functions below, so nothing else in vitdeploy names them (tests/base/test_ray_private.py checks both: each entry
against the installed Ray, failing with a line naming the API it lost, and that no other module names one).

Public Ray is used wherever Ray has it: a candidate starts without waiting through ``serve.run_many``
(``serve.run`` always waits until the application runs, with no time limit; its ``blocking`` only means "then
wait for Ctrl-C"). What has no public form: deleting without waiting, a deployment's code version, whether Ray
set up tracing in this process (``serve.get_trace_context()`` is None outside a request either way), the gRPC
proxy's handler factory, the metrics port and node address of a Ray started by ``ray.init``, the variables
Ray's proxy and raylet read, Ray's switch that keeps a node on loopback (base/ray_loopback.py), the GCS's
key-value store (where the rollout registry's state lives: serve/rollout/store.py), and what joining a cluster by
address with Ray's token needs (base/ray_join.py): this process's cached Ray configuration read again, and a GCS
asked whether it wants a token; the clusters running on this machine (``address="auto"``'s search); and Ray
Serve's details of its applications (whether one came from a Serve
config, `serve deploy` or a RayService, or from ``serve.run``: its ``source``; a deployment's autoscaling), and a
version's replica count changed in place (Ray Serve's external scaler: its REST route lives in the dashboard, which
a `vitdeploy serve` Ray runs without).

It stands in base/ because both serve/ and batch/ join Ray through base/ray_join.py, which needs it.

No Ray at import.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class RayApi:
    """One Ray API we depend on: ``name`` (dotted, inside ``module``: ``Deployment.options``), the ``parameter``
    of it we pass (a keyword; one read from ``**kwargs`` counts when Ray's source reads it), or, for a constant,
    the ``value`` it holds (an environment variable's name); ``why`` we need it."""

    module: str
    name: str
    parameter: str = ""
    value: str = ""
    why: str = ""

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.name}" + (f"({self.parameter}=...)" if self.parameter else "")

    @property
    def variable(self) -> str:
        """An environment variable's name: ``value`` where Ray's constant holds the name, else the constant's own
        name (Ray reads the variable into a constant of its name)."""
        return self.value or self.name


RUN_NOWAIT = RayApi(
    "ray.serve",
    "run_many",
    "wait_for_applications_running",
    why="a rollout's candidate is deployed without waiting (a developer API): its start is given a time limit, "
    "serve.run waits for it without one",
)
DELETE_NOWAIT = RayApi(
    "ray.serve",
    "delete",
    "_blocking",
    why="a version is removed within a time limit (serve.delete otherwise waits until it is gone, without one)",
)
DEPLOYMENT_VERSION = RayApi(
    "ray.serve.deployment",
    "Deployment.options",
    "_internal",
    why="a deployment's code version (refused without _internal=True): the same version on a later serve.run "
    "applies a new user_config or replica count in place (tune) instead of replacing the replicas",
)
TRACING_ENABLED = RayApi(
    "ray.serve._private.tracing_utils",
    "is_tracing_enabled",
    why="a replica makes its stage spans only when Ray Serve set up tracing in its process",
)
GRPC_HANDLER_FACTORY = RayApi(
    "ray.serve._private.grpc_util",
    "gRPCGenericServer.__init__",
    "service_handler_factory",
    why="the gRPC proxy's unary handlers are wrapped so that a call whose replica died is sent once more "
    "(Ray Serve has no gRPC interceptor option)",
)
INIT_METRICS_PORT = RayApi(
    "ray",
    "init",
    "_metrics_export_port",
    why="the Prometheus metrics of a Ray `vitdeploy serve` starts, on serve.metrics_port",
)
INIT_NODE_IP = RayApi(
    "ray",
    "init",
    "_node_ip_address",
    why="a Ray `vitdeploy serve` starts on a loopback host listens on 127.0.0.1 only",
)
PROXY_CALLBACK_ENV = RayApi(
    "ray.serve._private.constants",
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH",
    why="Ray's HTTP proxy installs the guard (serve/proxy_guard.py) from this variable",
)
TRACING_EXPORTER_ENV = RayApi(
    "ray.serve._private.constants",
    "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH",
    why="Ray's proxy reads its tracing from the environment only (serve.start's tracing_config never reaches it)",
)
TRACING_RATIO_ENV = RayApi(
    "ray.serve._private.constants",
    "RAY_SERVE_TRACING_SAMPLING_RATIO",
    why="the proxy's sampling ratio, as the exporter above",
)
WORKER_NICENESS_ENV = RayApi(
    "ray._private.ray_constants",
    "RAY_WORKER_NICENESS",
    value="RAY_worker_niceness",
    why="the replicas run at normal priority (Ray starts its workers at nice 15)",
)
CLUSTER_ENV = RayApi(
    "ray._private.ray_constants",
    "ENABLE_RAY_CLUSTERS_ENV_VAR",
    value="RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    why="set to 0, a Ray of our own on loopback keeps 127.0.0.1 (Ray 2.60 otherwise swaps it for the machine's "
    "address and listens on every interface), and a process joining it by a loopback address looks for it there "
    "(base/ray_loopback.py)",
)
CLUSTER_ENABLED = RayApi(
    "ray._private.ray_constants",
    "ENABLE_RAY_CLUSTER",
    why="the variable above as Ray read it when imported: set too where Ray was imported before we set the variable",
)
GCS_KV_GET = RayApi(
    "ray.experimental.internal_kv",
    "_internal_kv_get",
    why="the rollout registry's state read from Ray's GCS (serve/rollout/store.py): a registry started again, "
    "and every proxy's routing, read it there (Ray Serve keeps its own checkpoints in the same store)",
)
GCS_KV_PUT = RayApi(
    "ray.experimental.internal_kv",
    "_internal_kv_put",
    why="the rollout registry's state written to Ray's GCS at every change, so routing survives the registry",
)
CONFIG_REFRESH = RayApi(
    "ray._raylet",
    "Config.initialize",
    why="this process's cached Ray configuration reads RAY_AUTH_MODE again once base/ray_join.py turned token "
    "authentication on (what Ray's own maybe_enable_token_auth_if_token_available does)",
)
GCS_CLIENT = RayApi(
    "ray._raylet",
    "GcsClient",
    why="a cluster's GCS asked, without a token, whether it wants one before joining it by address "
    "(base/ray_join.py): a cluster with token authentication off is joined without one",
)
GCS_CLIENT_KV = RayApi(
    "ray._raylet",
    "InnerGcsClient.internal_kv_get",
    why="the question GcsClient (which hands its calls to InnerGcsClient) asks the GCS, above",
)
SERVE_CLIENT = RayApi(
    "ray.serve.context",
    "_get_global_client",
    why="Ray Serve's client of this cluster, for the details below (serve.status() does not carry them)",
)
SERVE_DETAILS = RayApi(
    "ray.serve._private.client",
    "ServeControllerClient.get_serve_details",
    why="whether an application came from a Serve config (`serve deploy`, a RayService: its `source` is "
    "declarative): `vitdeploy rollout` refuses those, which their config would put back; and the live "
    "deployment's autoscaling_config, which a promoted version takes over",
)
SCALE_REPLICAS = RayApi(
    "ray.serve._private.controller",
    "ServeController.update_deployment_replicas",
    why="a version's replica count changed in place (Ray Serve's external scaler, what the dashboard's REST "
    "`.../deployments/<name>/scale` calls; a `vitdeploy serve` Ray runs without the dashboard): a promotion on a "
    "full cluster lowers the old version one replica at a time as the new one grows, and a takeover gives it back",
)
DEPLOYMENT_ID = RayApi(
    "ray.serve._private.common", "DeploymentID", why="the deployment the external scaler above is asked to scale"
)
SERVE_CONTROLLER = RayApi(
    "ray.serve._private.constants",
    "SERVE_CONTROLLER_NAME",
    why="the Serve controller actor's name (the external scaler above is one of its methods)",
)
SERVE_NAMESPACE = RayApi(
    "ray.serve._private.constants", "SERVE_NAMESPACE", why="the namespace the Serve controller actor lives in"
)
FIND_CLUSTERS = RayApi(
    "ray._private.services",
    "find_gcs_addresses",
    why="the Ray clusters running on this machine (what address='auto' looks for): `vitdeploy rollout` without "
    "--address joins the one there is, and names it",
)
FIND_RECORDED = RayApi(
    "ray._private.services",
    "find_bootstrap_address",
    why="the cluster `ray start` recorded last on this machine, which Ray's own tools join first",
)
#: every entry, checked against the installed Ray by tests/base/test_ray_private.py
APIS = (
    RUN_NOWAIT,
    DELETE_NOWAIT,
    DEPLOYMENT_VERSION,
    TRACING_ENABLED,
    GRPC_HANDLER_FACTORY,
    INIT_METRICS_PORT,
    INIT_NODE_IP,
    PROXY_CALLBACK_ENV,
    TRACING_EXPORTER_ENV,
    TRACING_RATIO_ENV,
    WORKER_NICENESS_ENV,
    CLUSTER_ENV,
    CLUSTER_ENABLED,
    GCS_KV_GET,
    GCS_KV_PUT,
    CONFIG_REFRESH,
    GCS_CLIENT,
    GCS_CLIENT_KV,
    SERVE_CLIENT,
    SERVE_DETAILS,
    SCALE_REPLICAS,
    DEPLOYMENT_ID,
    SERVE_CONTROLLER,
    SERVE_NAMESPACE,
    FIND_CLUSTERS,
    FIND_RECORDED,
)


def missing(api: RayApi) -> Optional[str]:
    """None when the installed Ray has ``api`` as we use it, else one line naming it and why vitdeploy needs it."""

    def gone(what: str) -> str:
        return f"Ray {_version()} no longer has {api.dotted}: {what}; vitdeploy needs it: {api.why}"

    try:
        found: Any = importlib.import_module(api.module)
    except ImportError as exc:
        return gone(f"module {api.module} does not import ({exc})")
    for part in api.name.split("."):
        if not hasattr(found, part):
            return gone(f"{part} is not there")
        found = getattr(found, part)
    if api.value and found != api.value:
        return gone(f"it is {found!r}, not {api.value!r}")
    if api.parameter and not _takes(found, api.parameter):
        return gone(f"it takes no {api.parameter}")
    return None


def _takes(function: Any, parameter: str) -> bool:
    params = inspect.signature(function).parameters
    if parameter in params:
        return True
    reads_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return reads_kwargs and f'"{parameter}"' in inspect.getsource(function)


def _version() -> str:
    try:
        import ray
    except ImportError:
        return "(not installed)"
    return str(ray.__version__)


# ------------------------------------------------------------------------------------------------ the uses


def run_nowait(
    application: Any, name: str, route_prefix: str, logging_config: Any, external_scaler: bool = False
) -> None:
    """Deploy ``application`` as ``name`` at ``route_prefix`` beside what runs, returning once Ray accepted it
    (``external_scaler``: its replica count may be changed in place, :func:`scale_in_place`)."""
    from ray import serve

    scaler = {"external_scaler_enabled": True} if external_scaler else {}
    target = serve.RunTarget(
        application, name=name, route_prefix=route_prefix, logging_config=logging_config, **scaler
    )
    serve.run_many([target], **{RUN_NOWAIT.parameter: False})


def scale_in_place(app: str, deployments: list[str], replicas: int, timeout_s: float = 30.0) -> None:
    """Set each of ``deployments`` of Serve application ``app`` to ``replicas`` in place (its running replicas stay;
    one removed finishes its requests first). Raises Ray's error when ``app`` was not deployed with the external
    scaler on (:func:`run_nowait`'s ``external_scaler``, ``serve.run(external_scaler_enabled=True)``)."""
    import ray

    constants = importlib.import_module(SERVE_CONTROLLER.module)
    name, namespace = getattr(constants, SERVE_CONTROLLER.name), getattr(constants, SERVE_NAMESPACE.name)
    controller = ray.get_actor(name, namespace=namespace)
    ident = _function(DEPLOYMENT_ID)
    method = getattr(controller, SCALE_REPLICAS.name.rsplit(".", 1)[1])
    for deployment in deployments:
        ray.get(method.remote(ident(name=deployment, app_name=app), int(replicas)), timeout=timeout_s)


def delete_nowait(app: str) -> None:
    """Ask Ray Serve to delete ``app`` and return (the caller waits, with its own time limit)."""
    from ray import serve

    serve.delete(app, **{DELETE_NOWAIT.parameter: False})


def with_version(deployment: Any, version: str) -> Any:
    """``deployment`` with the code version ``version``."""
    return deployment.options(version=version, **{DEPLOYMENT_VERSION.parameter: True})


def tracing_enabled() -> bool:
    """Whether Ray Serve set up tracing in this process (its proxy and replica do so before user code runs); False
    on a Ray without the function (no stage spans; Ray's own spans, if any, unchanged)."""
    try:
        module = importlib.import_module(TRACING_ENABLED.module)
    except ImportError:
        return False
    check = getattr(module, TRACING_ENABLED.name, None)
    return bool(check()) if callable(check) else False


def wrap_grpc_handlers(server: Any, wrap: Callable[[Any], Any]) -> bool:
    """Replace Ray's gRPC server's handler factory by ``wrap(factory)``; False where it has none (another Ray)."""
    factory = getattr(server, GRPC_HANDLER_FACTORY.parameter, None)
    if not callable(factory):
        return False
    setattr(server, GRPC_HANDLER_FACTORY.parameter, wrap(factory))
    return True


def local_ray_options(metrics_port: Optional[int], loopback: bool) -> dict[str, Any]:
    """``ray.init``'s private keywords for a Ray of our own: its metrics port (None: Ray's choice), and 127.0.0.1
    as its address when it serves loopback only (else Ray's node address, every interface)."""
    options: dict[str, Any] = {} if metrics_port is None else {INIT_METRICS_PORT.parameter: metrics_port}
    if loopback:
        options[INIT_NODE_IP.parameter] = "127.0.0.1"
    return options


def _function(api: RayApi) -> Any:
    """The callable ``api`` names (its module imported now)."""
    found: Any = importlib.import_module(api.module)
    for part in api.name.split("."):
        found = getattr(found, part)
    return found


def gcs_kv_get(key: str, namespace: str) -> Optional[bytes]:
    """``key``'s value in Ray's GCS key-value store (this process connected to Ray); None when it has none."""
    return _function(GCS_KV_GET)(key, namespace=namespace) or None


def gcs_kv_put(key: str, value: bytes, namespace: str) -> None:
    """``key`` set to ``value`` in Ray's GCS key-value store (this process connected to Ray)."""
    _function(GCS_KV_PUT)(key, value, overwrite=True, namespace=namespace)


def set_imported(api: RayApi, value: Any) -> None:
    """``api``'s constant set to ``value`` in its module where Ray already imported it (it read its environment
    variable then); nothing where it was not imported (Ray reads the variable when it is)."""
    module = sys.modules.get(api.module)
    if module is not None and hasattr(module, api.name):
        setattr(module, api.name, value)


def refresh_ray_config() -> bool:
    """This process's cached Ray configuration read again from the environment; False where this Ray has no
    such call (the environment alone must then do)."""
    try:
        _function(CONFIG_REFRESH)("")
    except (ImportError, AttributeError):
        return False
    return True


def local_clusters() -> tuple[Optional[str], list[str]]:
    """The Ray clusters on this machine, as address='auto' finds them: (the GCS address `ray start` recorded last,
    None without one; the GCS address of every cluster whose GCS runs here)."""
    recorded = _function(FIND_RECORDED)(None)
    return (str(recorded) if recorded else None), sorted(str(a) for a in _function(FIND_CLUSTERS)() or ())


def serve_details() -> dict[str, Any]:
    """Ray Serve's details of this cluster (this process connected to it), as ``serve status``'s REST API gives
    them (``applications``: each one's ``source``, its deployments' ``deployment_config``); {} where this Ray does
    not give them (another Ray, or a controller that does not answer)."""
    try:
        client = _function(SERVE_CLIENT)()
        return dict(getattr(client, SERVE_DETAILS.name.rsplit(".", 1)[1])() or {})
    except Exception:  # noqa: BLE001 - nothing is said then: the callers go on as before
        return {}


def serve_app_sources() -> dict[str, str]:
    """Each Serve application's origin on this cluster, ``{app: "declarative" | "imperative" | "unknown"}``
    (:func:`serve_details`); {} where this Ray does not say."""
    apps = serve_details().get("applications") or {}
    return {str(name): str(getattr(app.get("source"), "value", app.get("source")) or "") for name, app in apps.items()}


def gcs_probe(address: str, timeout_s: float) -> None:
    """One key-value read from the GCS at ``address`` (host:port) by a client of its own, without this process
    joining Ray: Ray's AuthenticationError when that cluster wants a token this call does not carry; any other
    exception when it cannot be asked."""
    client = _function(GCS_CLIENT)(address=address)
    client.internal_kv_get(b"auth-probe", b"vitdeploy", timeout=timeout_s)


__all__ = [
    "APIS",
    "CLUSTER_ENABLED",
    "CLUSTER_ENV",
    "CONFIG_REFRESH",
    "DELETE_NOWAIT",
    "DEPLOYMENT_ID",
    "DEPLOYMENT_VERSION",
    "FIND_CLUSTERS",
    "FIND_RECORDED",
    "GCS_CLIENT",
    "GCS_CLIENT_KV",
    "GCS_KV_GET",
    "GCS_KV_PUT",
    "GRPC_HANDLER_FACTORY",
    "INIT_METRICS_PORT",
    "INIT_NODE_IP",
    "PROXY_CALLBACK_ENV",
    "RUN_NOWAIT",
    "SCALE_REPLICAS",
    "SERVE_CLIENT",
    "SERVE_CONTROLLER",
    "SERVE_NAMESPACE",
    "SERVE_DETAILS",
    "TRACING_ENABLED",
    "TRACING_EXPORTER_ENV",
    "TRACING_RATIO_ENV",
    "WORKER_NICENESS_ENV",
    "RayApi",
    "delete_nowait",
    "gcs_kv_get",
    "gcs_kv_put",
    "gcs_probe",
    "local_clusters",
    "local_ray_options",
    "missing",
    "refresh_ray_config",
    "run_nowait",
    "scale_in_place",
    "serve_app_sources",
    "serve_details",
    "set_imported",
    "tracing_enabled",
    "with_version",
    "wrap_grpc_handlers",
]
