"""Every ``ray.init`` of vitdeploy goes through :func:`init_ray`: a Ray of our own, or a cluster joined by its
address, authenticated as Ray expects.

Ray 2.60 starts a new local cluster with token authentication on unless ``RAY_AUTH_MODE`` says otherwise (it writes
``~/.ray/auth_token`` when no token exists), and a process that joins an existing cluster turns token
authentication on by itself only when it finds that cluster without an address (``ray.init()``/``"auto"``): given
an explicit address (``--address host:port``, ``RAY_ADDRESS``), it connects without its token and the cluster
refuses it (Ray's ``InvalidAuthToken`` line). So, before Ray is asked to join by address, :func:`init_ray` asks
the cluster's GCS, without a token, whether it wants one (:func:`cluster_wants_token`), and turns token
authentication on for this process when it does, ``RAY_AUTH_MODE`` is unset and a token is available where Ray
reads one (:func:`token_source`: ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``).
A cluster started with ``RAY_AUTH_MODE=disabled`` is joined without one: a process with token authentication on
refuses the calls of that cluster's workers that carry none (a replica on another node fetching an object this
process owns fails as "owner died"). An explicit ``RAY_AUTH_MODE`` is always left as it is.

Before a Ray of our own starts (``address`` None or ``"local"``) with the mode unset and no token anywhere, the
token file is created here, whole or not at all: two `vitdeploy serve` started at once on one machine then share
one token (Ray's own writer truncates and rewrites the file, so two first starts could each keep another token).

Every join and every start of our own also stays on loopback where it was asked there (:func:`init_ray`,
base/ray_loopback.py). No Ray at import. The private Ray API it needs goes through base/ray_private.py: this
process's cached Ray configuration read again so that it sees the mode set in the environment (what Ray's own
``maybe_enable_token_auth_if_token_available`` does), and the GCS's own client for the question to the GCS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from . import ray_loopback
from .errors import BackendError, ConfigError
from .ray_private import INIT_NODE_IP, gcs_probe, local_clusters, refresh_ray_config

log = logging.getLogger(__name__)

AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
TOKEN = "token"
LOCAL = (None, "local")  # the addresses that start a Ray of this process's own
PROBE_S = 5.0  # the question to the GCS: a cluster that does not answer within this is left to ray.init to say


def default_token_path() -> Path:
    """Where Ray keeps a user's token when nothing else names one (``~/.ray/auth_token``)."""
    return Path.home() / ".ray" / "auth_token"


def _readable_token(path: Path) -> bool:
    try:
        return bool(path.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        return False


def token_source(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Where Ray would find this user's token, in Ray's order (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``'s file,
    ``~/.ray/auth_token``), as a word for messages; None when there is none."""
    env = os.environ if env is None else env
    if env.get(TOKEN_ENV, "").strip():
        return TOKEN_ENV
    named = env.get(TOKEN_PATH_ENV)
    if named:
        return f"{TOKEN_PATH_ENV} ({named})" if _readable_token(Path(named).expanduser()) else None
    path = default_token_path()
    return str(path) if _readable_token(path) else None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Ray's C++ client logs its refused call on file descriptor 2: not the user's business here."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cluster_wants_token(address: str) -> Optional[bool]:
    """Whether the Ray cluster whose GCS is at ``address`` (host:port) refuses a client without a token; None when
    it cannot be asked (nothing answers there, or another Ray)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
        from ray.exceptions import AuthenticationError
    except (OSError, ValueError, ImportError):
        return None
    try:
        with _quiet_stderr():
            gcs_probe(address, PROBE_S)
    except AuthenticationError:
        return True
    except Exception:  # noqa: BLE001 - not a GCS, or one that did not answer: ray.init says what is wrong
        return None
    return False


def use_cluster_token(address: Optional[str] = None) -> bool:
    """Turn Ray's token authentication on for this process when ``RAY_AUTH_MODE`` is unset, a token is available
    and the cluster at ``address`` (a GCS's host:port; None: not asked) does not say it has it off (see the
    module's docstring); whether this process now authenticates with a token."""
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None:
        return mode.strip().lower() == TOKEN
    source = token_source()
    if source is None:
        return False
    if address is not None and cluster_wants_token(address) is False:
        log.debug("the Ray cluster at %s has token authentication off: joined without a token", address)
        return False
    os.environ[AUTH_MODE_ENV] = TOKEN
    if not refresh_ray_config():  # another Ray: the environment alone must do
        log.debug("Ray's configuration was not refreshed (this Ray has no call for it)")
    log.debug("joining Ray with token authentication (token from %s)", source)
    return True


def ensure_local_token() -> None:
    """Before a Ray of our own starts with the mode unset: a token file when no token exists anywhere, created
    whole under its name (never rewritten: a token another process wrote first is kept)."""
    if os.environ.get(AUTH_MODE_ENV) is not None or token_source() is not None or os.environ.get(TOKEN_PATH_ENV):
        return
    path = default_token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".auth_token.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_hex(32))  # what Ray's own generator writes: 256 random bits, hex
        try:
            os.link(tmp, path)  # fails when the file exists: the first process's token stays
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def find_local_cluster() -> str:
    """The GCS address of the Ray cluster on this machine (:func:`choose_local_cluster`)."""
    return choose_local_cluster(*local_clusters())


def choose_local_cluster(recorded: Optional[str], running: list[str]) -> str:
    """The cluster to join when none was named (``address="auto"``, as Ray's tools search): the one `ray start`
    recorded last when it runs, else the only one running here; ConfigError in one line when none runs, or
    several do and none was recorded (Ray would take any of them)."""
    if recorded and (recorded in running or not running):
        return recorded
    if len(running) == 1:
        return running[0]
    where = "give --address or RAY_ADDRESS"
    if not running:
        raise ConfigError(f"no Ray cluster runs on this machine: {where} (the `Ray at ...` line of `vitdeploy serve`)")
    raise ConfigError(f"several Ray clusters run on this machine ({', '.join(running)}): {where}")


def init_ray(ray: Any, address: Optional[str] = None, **options: Any) -> Any:
    """``ray.init(address=address, **options)``, authenticated as the cluster expects (the module's docstring):
    ``address`` None or ``"local"`` starts a Ray of this process's own; any other joins that cluster.

    On loopback as asked (base/ray_loopback.py): a Ray of our own asked on 127.0.0.1
    (``ray_private.local_ray_options(..., loopback=True)``) keeps every port there, and one that took another
    address anyway is shut down and refused (BackendError); a cluster joined by a loopback address is looked for
    there."""
    loopback = address in LOCAL and options.get(INIT_NODE_IP.parameter) in ray_loopback.LOOPBACK
    if address in LOCAL:
        ensure_local_token()
        if loopback:
            ray_loopback.keep_on_loopback()
    else:
        ray_loopback.for_address(address)
        if address != "auto" and not str(address).startswith("ray://"):  # Ray decides for those itself
            use_cluster_token(str(address))
    ctx = ray.init(address=address, **options)
    if loopback:
        try:
            ray_loopback.check_node(ctx.address_info["node_ip_address"])
        except BackendError:
            ray.shutdown()
            raise
    return ctx


__all__ = [
    "AUTH_MODE_ENV",
    "cluster_wants_token",
    "default_token_path",
    "ensure_local_token",
    "choose_local_cluster",
    "find_local_cluster",
    "init_ray",
    "token_source",
    "use_cluster_token",
]
