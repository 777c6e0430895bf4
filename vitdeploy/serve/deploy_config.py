"""`vitdeploy serve --write-config` / `--write-rayservice`: the same application, run by Ray itself.

* :func:`build` is the application builder a Ray Serve config imports
  (``import_path: vitdeploy.serve.deploy_config:build``): its ``args`` carry the artifacts' URI
  (``file://``, ``s3://``, ``gs://``; each node downloads them once into a cache keyed by the
  manifest's hash, every sha256 verified), the backend, the name and the pipeline config's
  ``runtime`` and ``serve`` sections.
* :func:`serve_config` is that config (``serve deploy serve.yaml``); :func:`rayservice` wraps it in a
  KubeRay ``RayService`` whose containers carry the environment of the proxy's guard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base.errors import ConfigError
from . import tls, tracing

BUILDER = "vitdeploy.serve.deploy_config:build"
#: The image of the RayService: one with vitdeploy[serve] installed (a placeholder to replace).
IMAGE = "your-registry/vitdeploy-serve:latest"


def artifacts_uri(source: str | Path) -> str:
    """A URI the replicas can read: a URI as given, a local path as ``file://`` + its absolute path."""
    text = str(source)
    if "://" in text:
        return text
    return Path(text).expanduser().resolve().as_uri()


def app_args(cfg: Any, settings: Any, name: str, secret: bool = False) -> dict[str, Any]:
    """The builder's ``args``: plain YAML data, never the serve token (``secret``: it comes from a
    Kubernetes Secret in the environment, so ``serve.token_file`` is left out)."""
    sections = cfg.model_dump(mode="json", include={"runtime", "serve"})
    if secret:
        sections["serve"]["token_file"] = None
        sections["serve"]["tls"] = None  # the proxy's, from a Secret (serve/tls.py); replicas need none
    return {
        "artifacts": artifacts_uri(settings.artifacts),
        "backend": settings.backend,
        "name": name,
        "replicas": settings.replicas,
        "pipeline": sections,
    }


def build(args: dict[str, Any]) -> Any:
    """Ray Serve's application builder: ``args`` (from :func:`app_args`) -> the bound application."""
    from dataclasses import replace

    from ..base.config import parse_config
    from ..runtime.backends.base import BackendOptions
    from .auth import digest, read_token
    from .ray_app import build_app
    from .runner import ServeSettings, replica_spec

    missing = [k for k in ("artifacts", "backend", "name") if k not in args]
    if missing:
        raise ConfigError(
            f"vitdeploy application args: missing {', '.join(missing)} (write them with "
            f"`vitdeploy serve --write-config`)"
        )
    cfg = parse_config(args.get("pipeline") or {})
    settings = ServeSettings(
        artifacts=Path("."),
        backend=str(args["backend"]),
        host=cfg.serve.host,
        port=cfg.serve.port,
        replicas=int(args.get("replicas", cfg.serve.replicas)),
        name=str(args["name"]),
    )
    token = read_token(cfg.serve.token_file)  # this node's VITDEPLOY_SERVE_TOKEN (a Secret) or token file
    settings = replace(settings, token_digest=digest(token) if token else None)
    spec = replica_spec(
        cfg, settings, BackendOptions.from_runtime(cfg.runtime), source=str(args["artifacts"]), name=str(args["name"])
    )
    return build_app(spec, cfg.serve, settings.replicas)


def serve_config(cfg: Any, settings: Any, name: str, host: str | None = None, secret: bool = False) -> dict[str, Any]:
    """A Ray Serve config file (``serve deploy``) for one model."""
    from .runner import route_prefix

    sv = cfg.serve
    return {
        "proxy_location": "EveryNode",
        "http_options": {
            "host": host or settings.host,
            "port": settings.port,
            "request_timeout_s": sv.request_timeout_s,
            **tls.http_options(cfg, mounted=secret),
        },
        "logging_config": {"log_level": "WARNING", "enable_access_log": bool(settings.access_log)},
        **({"tracing_config": traces} if (traces := tracing.config(sv.tracing.sampling_ratio)) else {}),
        "applications": [
            {
                "name": name,
                "route_prefix": route_prefix(name),
                "import_path": BUILDER,
                "args": app_args(cfg, settings, name, secret),
            }
        ],
    }


def rayservice(cfg: Any, settings: Any, name: str) -> dict[str, Any]:
    """A KubeRay RayService: the Serve config above, a head and a worker group whose containers
    carry the guard's environment (Ray's proxy reads it when it starts), and Ray's tracing where traces are on."""
    from .auth import TOKEN_ENV

    sv = cfg.serve
    env = [{"name": k, "value": v} for k, v in _node_env(sv).items()]
    if settings.token_digest:  # the token from a Secret the cluster's owner creates, never from this file
        env.append({"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": token_secret(name), "key": "token"}}})
    if _traces_need_credentials(sv):  # the collector's, from a Secret too
        ref = {"secretKeyRef": {"name": otlp_secret(name), "key": "headers"}}
        env.append({"name": tracing.HEADERS_ENVS[-1], "valueFrom": ref})
    container = {
        "image": IMAGE,
        "env": env,
        "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "2", "memory": "4Gi"}},
    }
    import yaml

    config = serve_config(cfg, settings, name, host="0.0.0.0", secret=True)
    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name.lower().replace("_", "-")},
        "spec": {
            "serveConfigV2": yaml.safe_dump(config, sort_keys=False),
            "rayClusterConfig": {
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "ray-head", **container, "ports": [{"containerPort": 8000, "name": "serve"}]}
                            ]
                        }
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "replicas",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": max(1, sv.autoscaling.max_replicas if sv.autoscaling else settings.replicas),
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [{"name": "ray-worker", **container}]}},
                    }
                ],
            },
        },
    }
    return tls.mount_secret(service, name) if cfg.serve.tls is not None else service


def _node_env(sv: Any) -> dict[str, str]:
    """What every node's Ray needs in its environment: the proxy's guard, and Ray's tracing when traces are on
    (OTEL_EXPORTER_OTLP_ENDPOINT set where this file is written: serve/tracing.py), each endpoint without its
    credentials (a file holds none: they come from a secret, as OTEL_EXPORTER_OTLP_HEADERS)."""
    from .proxy_guard import env_for

    guard = env_for(int(sv.max_request_mb * 1024 * 1024), sv.body_timeout_s)
    return {**guard, **tracing.ray_env(tracing.config(sv.tracing.sampling_ratio), written=True)}


def _traces_need_credentials(sv: Any) -> bool:
    return tracing.config(sv.tracing.sampling_ratio) is not None and tracing.credentials()


def token_secret(name: str) -> str:
    """The Kubernetes Secret the RayService reads the serve token from (key ``token``)."""
    return f"{name.lower().replace('_', '-')}-serve-token"


def otlp_secret(name: str) -> str:
    """The Kubernetes Secret the RayService reads the trace collector's headers from (key ``headers``)."""
    return f"{name.lower().replace('_', '-')}-otlp"


#: What a written file says when the trace collector's credentials were left out of it.
OTLP_CREDENTIALS = (
    "# Traces: the collector's credentials are not in this file (an endpoint's user:password or query is left\n"
    "# out); give them as OTEL_EXPORTER_OTLP_HEADERS (e.g. Authorization=Basic <base64 of user:password>)"
)


def rayservice_comment(cfg: Any, settings: Any, name: str) -> str:
    if not settings.token_digest:
        text = (
            "# KubeRay RayService written by `vitdeploy serve --write-rayservice`\n"
            "# (--allow-unauthenticated: no serve token, anyone who reaches the service may call the model)\n"
        )
    else:
        text = (
            "# KubeRay RayService written by `vitdeploy serve --write-rayservice`. The serve token comes from a\n"
            "# Secret (never from this file); create it first, with the token you call the model with:\n"
            f'#   kubectl create secret generic {token_secret(name)} --from-literal=token="$VITDEPLOY_SERVE_TOKEN"\n'
        )
    if _traces_need_credentials(cfg.serve):
        text += (
            f"{OTLP_CREDENTIALS}, read from a Secret:\n"
            f"#   kubectl create secret generic {otlp_secret(name)} "
            '--from-literal=headers="$OTEL_EXPORTER_OTLP_HEADERS"\n'
        )
    return text


def guard_comment(cfg: Any) -> str:
    """The YAML comment that says how to install the proxy's guard on a cluster started by hand."""
    env = " ".join(f"{k}={v}" for k, v in _node_env(cfg.serve).items())
    return (
        "# Ray Serve config written by `vitdeploy serve --write-config`: `serve deploy` this file.\n"
        "# Start each node's Ray with the proxy's guard (body deadline and byte limit, health routes,\n"
        "# JSON errors), and Ray's tracing where traces are on, in its environment:\n"
        f"#   {env} ray start ...\n"
        "# With a serve token, give every node VITDEPLOY_SERVE_TOKEN (from your secret store) too: the guard and\n"
        "# the replicas read it there; this file never holds it.\n"
        + (f"{OTLP_CREDENTIALS} in each node's environment too.\n" if _traces_need_credentials(cfg.serve) else "")
    )


def write_deploy_files(
    cfg: Any, settings: Any, config_path: Path | None = None, rayservice_path: Path | None = None
) -> list[Path]:
    """Write the files asked for (atomically); the artifacts are checked first when they are local."""
    import yaml

    from ..base._files import write_bytes_atomic
    from ..runtime.artifact_transfer import fetch_uri
    from ..runtime.artifacts import Artifacts
    from ..runtime.signature import verify_uri
    from .runner import app_name

    if "://" in str(settings.artifacts) and cfg.verify_key is not None:
        verify_uri(str(settings.artifacts), cfg.verify_key)
    if "://" in str(settings.artifacts):
        manifest_name = str(settings.artifacts).rstrip("/").rsplit("/", 1)[-1]
        if str(settings.artifacts).startswith("file://"):
            manifest_name = fetch_uri(str(settings.artifacts)).name
    else:
        manifest_name = Artifacts.open(settings.artifacts, public_key=cfg.verify_key).name
    name = app_name(cfg, settings, manifest_name)
    written = []
    if config_path is not None:
        text = guard_comment(cfg) + yaml.safe_dump(serve_config(cfg, settings, name), sort_keys=False)
        written.append(write_bytes_atomic(config_path, text.encode()))
    if rayservice_path is not None:
        text = (
            rayservice_comment(cfg, settings, name)
            + tls.secret_comment(cfg, name)
            + yaml.safe_dump(rayservice(cfg, settings, name), sort_keys=False)
        )
        written.append(write_bytes_atomic(rayservice_path, text.encode()))
    return written


__all__ = ["BUILDER", "app_args", "artifacts_uri", "build", "rayservice", "serve_config", "write_deploy_files"]
