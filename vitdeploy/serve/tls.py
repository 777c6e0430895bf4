"""HTTPS for `vitdeploy serve` through Ray Serve's own HTTP options (``ssl_certfile``, ``ssl_keyfile``: the proxy's
uvicorn serves TLS). Which ports need it is serve/exposure.py's decision.

* :func:`check_files` reads the certificate and its key once, before Ray starts: a missing file or a key that
  does not match is one line naming ``serve.tls.*``, never the key's content.
* :func:`http_options` is what ``serve.start`` and the written Serve config get; a RayService gets the files
  from a Kubernetes Secret mounted in every Ray container (:func:`mount_secret`), readable by the container's
  user (the rayproject/ray images' ``ray``, uid 1000, group 100), as the token comes from one.

No client certificates: Ray Serve 2.60's proxy hands uvicorn a CA bundle (``ssl_ca_certs``) but never its
``ssl_cert_reqs``, so uvicorn never asks a client for a certificate; ``serve.tls.ca_certs`` is refused
(base/serving_sections.py) rather than accepted and ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..base.errors import ConfigError

#: Where a RayService mounts the TLS Secret (``kubectl create secret tls``: keys tls.crt, tls.key).
MOUNT = "/etc/vitdeploy/tls"
_SECRET_KEYS = {"certfile": "tls.crt", "keyfile": "tls.key"}
_RAY_KEYS = {"certfile": "ssl_certfile", "keyfile": "ssl_keyfile"}
#: The user the rayproject/ray images run as (``ray``: uid 1000, primary group 100, ``users``).
RAY_UID, RAY_GID = 1000, 100
#: The Secret's files: owner root, group the pod's fsGroup (RAY_GID), read by owner and group (the key's owner-only
#: 0400 would be root's alone: the Ray container could not read it and HTTPS would not start).
SECRET_MODE = 0o440


def tls_files(cfg: Any) -> dict[str, str]:
    """{certfile, keyfile}: ``serve.tls``'s paths resolved against the config's folder; {} = no TLS."""
    tls = cfg.serve.tls
    if tls is None:
        return {}
    files = {"certfile": tls.certfile, "keyfile": tls.keyfile}
    return {k: str(Path(cfg.resolve(v)).resolve()) for k, v in files.items()}


def check_files(cfg: Any) -> dict[str, str]:
    """:func:`tls_files`, each one read here: ConfigError naming the key when a file is missing or unreadable,
    or the key does not belong to the certificate (the message never holds the key)."""
    import ssl

    files = tls_files(cfg)
    for key, path in files.items():
        if not Path(path).is_file():
            raise ConfigError(f"serve.tls.{key}: {path} is not a file; give the PEM file's path")
    if not files:
        return files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(files["certfile"], files["keyfile"])
    except ssl.SSLError as exc:
        raise ConfigError(
            f"serve.tls: cannot use {files['certfile']} with the key serve.tls.keyfile names ({exc.reason or exc}); "
            f"the key must be the certificate's, unencrypted PEM"
        ) from None
    except OSError as exc:
        raise ConfigError(f"serve.tls: cannot read the certificate or its key ({exc.strerror})") from None
    return files


def http_options(cfg: Any, mounted: bool = False) -> dict[str, str]:
    """Ray Serve's ``http_options`` for HTTPS (none without ``serve.tls``); ``mounted``: the paths where a
    RayService mounts the TLS Secret, instead of this machine's."""
    files = tls_files(cfg)
    if mounted:
        files = {k: f"{MOUNT}/{_SECRET_KEYS[k]}" for k in files}
    return {_RAY_KEYS[k]: v for k, v in files.items()}


def scheme(cfg: Any) -> str:
    return "https" if cfg.serve.tls is not None else "http"


def secret_name(name: str) -> str:
    """The Kubernetes TLS Secret a RayService mounts (``kubectl create secret tls``)."""
    return f"{name.lower().replace('_', '-')}-serve-tls"


def mount_secret(service: dict[str, Any], name: str) -> dict[str, Any]:
    """``service`` (a RayService) with the TLS Secret mounted read-only at :data:`MOUNT` in every Ray container,
    readable by the container's user: each pod runs as :data:`RAY_UID` with fsGroup :data:`RAY_GID`, the files
    mode :data:`SECRET_MODE` (as KubeRay's pod-security guide sets runAsUser and fsGroup)."""
    cluster = service["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        context = pod.setdefault("securityContext", {})
        context.update({"runAsUser": RAY_UID, "runAsGroup": RAY_GID, "fsGroup": RAY_GID, "runAsNonRoot": True})
        volume = {"name": "serve-tls", "secret": {"secretName": secret_name(name), "defaultMode": SECRET_MODE}}
        pod.setdefault("volumes", []).append(volume)
        for container in pod["containers"]:
            mount = {"name": "serve-tls", "mountPath": MOUNT, "readOnly": True}
            container.setdefault("volumeMounts", []).append(mount)
    return service


def secret_comment(cfg: Any, name: str) -> str:
    """The RayService comment that says how to create the TLS Secret (empty without ``serve.tls``)."""
    files = tls_files(cfg)
    if not files:
        return ""
    return (
        f"# HTTPS: the certificate and its key come from a Secret mounted at {MOUNT} (never from this file);\n"
        f"# create it first:\n#   kubectl create secret tls {secret_name(name)} --cert={files['certfile']} "
        f"--key={files['keyfile']}\n"
    )


__all__ = [
    "MOUNT",
    "RAY_GID",
    "RAY_UID",
    "SECRET_MODE",
    "check_files",
    "http_options",
    "mount_secret",
    "scheme",
    "secret_comment",
    "secret_name",
    "tls_files",
]
