"""HTTPS for `vitdeploy serve` through Ray Serve's own HTTP options (``ssl_certfile``, ``ssl_keyfile``,
``ssl_ca_certs``: the proxy's uvicorn serves TLS), and the refusal to send a bearer token in clear text.

* :func:`check_files` reads the certificate and its key once, before Ray starts: a missing file or a key that
  does not match is one line naming ``serve.tls.*``, never the key's content.
* :func:`http_options` is what ``serve.start`` and the written Serve config get; a RayService gets the files
  from a Kubernetes Secret mounted in every Ray container (:func:`mount_secret`), as the token comes from one.
* :func:`check_transport`: a token on a non-loopback host travels in clear text over plain HTTP (and over
  gRPC, for which Ray Serve's gRPC proxy has no TLS option): refused unless ``--allow-insecure`` (a
  TLS-terminating ingress or load balancer in front of the server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..base.errors import ConfigError

#: Where a RayService mounts the TLS Secret (``kubectl create secret tls``: keys tls.crt, tls.key, ca.crt).
MOUNT = "/etc/vitdeploy/tls"
_SECRET_KEYS = {"certfile": "tls.crt", "keyfile": "tls.key", "ca_certs": "ca.crt"}
_RAY_KEYS = {"certfile": "ssl_certfile", "keyfile": "ssl_keyfile", "ca_certs": "ssl_ca_certs"}


def tls_files(cfg: Any) -> dict[str, str]:
    """{certfile, keyfile[, ca_certs]}: ``serve.tls``'s paths resolved against the config's folder; {} = no TLS."""
    tls = cfg.serve.tls
    if tls is None:
        return {}
    files = {"certfile": tls.certfile, "keyfile": tls.keyfile, "ca_certs": tls.ca_certs}
    return {k: str(Path(cfg.resolve(v)).resolve()) for k, v in files.items() if v}


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
    if "ca_certs" in files:
        try:
            ctx.load_verify_locations(files["ca_certs"])
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"serve.tls.ca_certs: {files['ca_certs']} is not a PEM CA bundle ({exc})") from None
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
    """``service`` (a RayService) with the TLS Secret mounted read-only at :data:`MOUNT` in every Ray container."""
    cluster = service["spec"]["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        pod = group["template"]["spec"]
        volume = {"name": "serve-tls", "secret": {"secretName": secret_name(name), "defaultMode": 0o400}}
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
    sources = " ".join(f"--from-file={_SECRET_KEYS[k]}={path}" for k, path in files.items())
    return (
        f"# HTTPS: the certificate and its key come from a Secret mounted at {MOUNT} (never from this file);\n"
        f"# create it first:\n#   kubectl create secret generic {secret_name(name)} {sources}\n"
    )


def check_transport(
    cfg: Any, host: str, exposed: bool, token: bool, allow_insecure: bool, what: Optional[str] = None
) -> None:
    """ConfigError (exit 2, one line) when a serve token would travel in clear text: plain HTTP, or gRPC (Ray
    Serve's gRPC proxy has no TLS), on a non-loopback host; ``allow_insecure``: a TLS-terminating ingress
    or load balancer is in front."""
    if not (exposed and token) or allow_insecure:
        return
    where = what or f"--host {host}"
    if cfg.serve.tls is None:
        raise ConfigError(
            f"{where} would send the serve token in clear text over plain HTTP: set serve.tls.certfile and "
            f"serve.tls.keyfile to serve HTTPS, or pass --allow-insecure when a TLS-terminating ingress or load "
            f"balancer is in front"
        )
    if cfg.serve.grpc_port is not None:
        raise ConfigError(
            f"{where}: gRPC (serve.grpc_port) has no TLS in Ray Serve, so the serve token would travel in clear "
            f"text; unset serve.grpc_port (serve.tls covers HTTP only), or pass --allow-insecure when a "
            f"TLS-terminating ingress is in front"
        )


__all__ = [
    "MOUNT",
    "check_files",
    "check_transport",
    "http_options",
    "mount_secret",
    "scheme",
    "secret_comment",
    "secret_name",
    "tls_files",
]
