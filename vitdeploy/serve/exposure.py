"""Who may call the server `vitdeploy serve` starts (or writes a config for), decided before anything starts.

* **Exposed**: a non-loopback host, or a RayService (its pods listen on 0.0.0.0).
* Exposed without a serve token (``VITDEPLOY_SERVE_TOKEN`` or ``serve.token_file``): refused, since anyone
  who reaches the port could call the model, unless ``--allow-unauthenticated``.
* Exposed with a token: the token must not travel in clear text (:func:`tls.check_transport`): ``serve.tls``,
  or ``--allow-insecure`` when a TLS-terminating ingress is in front. ``serve.tls``'s files are read first.

Each refusal is a ConfigError: one line, exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.errors import ConfigError
from . import tls
from .auth import read_token
from .runner import LOOPBACK

#: How a refusal names a RayService: it listens on every address, whatever --host says.
RAYSERVICE = "the RayService (0.0.0.0)"


@dataclass(frozen=True)
class Exposure:
    """What `serve` was asked for: the host it listens on, the files it writes instead, what the user allowed."""

    host: str
    write_config: bool = False
    write_rayservice: bool = False
    allow_unauthenticated: bool = False
    allow_insecure: bool = False

    @property
    def exposed(self) -> bool:
        """Reachable from other machines: a RayService, or a host that is not loopback."""
        return self.write_rayservice or self.host not in LOOPBACK


def serve_token(cfg: Any, exposure: Exposure) -> str | None:
    """The serve token (None: none set), once the policy allows serving as asked; ConfigError otherwise."""
    token = read_token(cfg.resolve(cfg.serve.token_file) if cfg.serve.token_file else None)
    if exposure.exposed and token is None and not exposure.allow_unauthenticated:
        only_rayservice = exposure.write_rayservice and not exposure.write_config
        where = RAYSERVICE if only_rayservice else f"--host {exposure.host}"
        raise ConfigError(
            f"{where} lets anyone who reaches the port call the model: set VITDEPLOY_SERVE_TOKEN (or "
            f"serve.token_file) to require a token, or pass --allow-unauthenticated"
        )
    tls.check_files(cfg)
    where = RAYSERVICE if exposure.write_rayservice and exposure.host in LOOPBACK else None
    tls.check_transport(cfg, exposure.host, exposure.exposed, token is not None, exposure.allow_insecure, where)
    return token
