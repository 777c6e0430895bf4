"""What a Hub checkpoint turned out to be: the repo, the revision asked for, the commit it resolved to, and
each file read from it with its sha256 (the manifest's ``model.source.hub``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ...base.hub_name import HubName

#: what ``model.source.hub.source`` says
SOURCE = "hub"


@dataclass(frozen=True)
class HubFile:
    path: str  # as named in the repo
    sha256: str
    bytes: int


@dataclass(frozen=True)
class HubSnapshot:
    name: HubName  # the repo id and the revision asked for (None: the default branch)
    commit: str  # what the revision resolved to, once, at the start
    folder: Path  # the cache's snapshot folder of that commit (the files are links into its blobs)
    files: tuple[HubFile, ...]
    endpoint: str  # the Hub (or mirror, HF_ENDPOINT) it came from
    client: str = ""  # "huggingface_hub <version>"
    offline: bool = False  # read from the cache alone (HF_HUB_OFFLINE=1)

    @property
    def pinned(self) -> str:
        """``org/name@<commit>``: what reproduces these weights (``vitdeploy export org/name@<commit>``)."""
        return f"{self.name.repo_id}@{self.commit}"

    def record(self) -> dict[str, Any]:
        return {
            "source": SOURCE,
            "endpoint": self.endpoint,
            "repo_id": self.name.repo_id,
            "revision": self.name.revision,
            "commit": self.commit,
            "files": [{"path": f.path, "sha256": f.sha256, "bytes": f.bytes} for f in self.files],
            "client": self.client,
            "offline": self.offline,
        }


def revision_text(revision: Optional[str]) -> str:
    return revision if revision is not None else "the default branch"
