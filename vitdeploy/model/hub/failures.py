"""Each way a Hub checkpoint cannot be had, as one line naming the repo and what to do (exit 2).

``huggingface_hub`` raises its own error types; :func:`explained` turns each into a :class:`HubError`
whose message never holds the token (it says whether one was sent, never its value).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from ...base.errors import HubError, first_line
from ...base.hub_name import HubName
from .settings import HubSettings, scrub

LOGIN = "set HF_TOKEN to a token of an account that has access (or run `hf auth login`)"


def _token_said(settings: HubSettings) -> str:
    return "a token was sent but has no access" if settings.token_set else "no token is set"


def offline_not_cached(name: HubName, settings: HubSettings, what: str) -> HubError:
    return HubError(
        f"{name}: {what} is not in the Hugging Face cache ({settings.cache_dir}) and HF_HUB_OFFLINE=1 forbids "
        "downloading it; run once with network access (HF_HUB_OFFLINE unset), or point HF_HOME / HF_HUB_CACHE at "
        "a cache that has it"
    )


def hub_error(
    exc: BaseException, name: HubName, settings: HubSettings, file: Optional[str] = None
) -> Optional[HubError]:
    """The HubError for ``exc`` (raised by huggingface_hub while fetching ``file`` of ``name``), or None for an
    error that is not the Hub's (a bug: it propagates as it is)."""
    from huggingface_hub import errors as hf

    where = settings.shown_endpoint
    if isinstance(exc, hf.GatedRepoError):
        return HubError(
            f"{name.repo_id} is a gated repo on {where} and {_token_said(settings)}: accept its conditions at "
            f"{where}/{name.repo_id} with your account, then {LOGIN}"
        )
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubError(
            f"{name.repo_id}: no such model repo on {where}, or it is private and {_token_said(settings)}; check "
            f"the name (org/name, as on {where}), or {LOGIN}"
        )
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubError(
            f"{name.repo_id} has no revision {name.revision!r} (a branch, a tag or a commit) on {where}; see its "
            f"branches and tags at {where}/{name.repo_id}/tree/main, or drop @{name.revision} for the default branch"
        )
    if isinstance(exc, (hf.RevisionResolutionError, hf.LocalEntryNotFoundError, hf.OfflineModeIsEnabled)):
        what = file or (
            f"the commit of revision {name.revision!r}" if name.revision else "the commit of the default branch"
        )
        if settings.offline:
            return offline_not_cached(name, settings, what)
        return HubError(
            f"{name}: cannot reach {where} ({type(exc.__cause__ or exc).__name__}) and {what} is not in "
            f"the Hugging Face cache ({settings.cache_dir}); check the network and HF_ENDPOINT, then run again"
        )
    if isinstance(exc, hf.HfHubHTTPError) or _is_transfer_error(exc):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        reason = f"the Hub answered {status}" if status else scrub(first_line(exc, 200))
        doing = f"downloading {file}" if file else "asking for the revision"
        return HubError(
            f"{name}: {doing} from {where} failed ({reason}); nothing half-downloaded was kept (huggingface_hub "
            "writes a temporary file and renames it only when complete): run the command again"
        )
    return None


def _is_transfer_error(exc: BaseException) -> bool:
    """A network failure (the HTTP client's own errors) or huggingface_hub's consistency check of a download's size."""
    module = type(exc).__module__.split(".")[0]
    return module.startswith(("httpx", "httpcore")) or (isinstance(exc, OSError) and "Consistency check" in str(exc))


@contextmanager
def explained(name: HubName, settings: HubSettings, file: Optional[str] = None) -> Iterator[None]:
    """Run the block; a Hub failure inside it leaves as one HubError."""
    try:
        yield
    except HubError:
        raise
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's and its HTTP client's errors, sorted by hub_error
        error = hub_error(exc, name, settings, file)
        if error is None:
            raise
        raise error from exc
