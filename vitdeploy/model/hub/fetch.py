"""Resolve a Hub name to one commit, fetch the files an export reads from that commit, hash them.

Online: ``HfApi.resolve_revision`` (one API call; the branch -> commit mapping lands in the cache's
``refs/``), then ``hf_hub_download`` of each file at that commit (a file already in the cache costs no
request). The weights are looked for in the readers' order of preference (``WEIGHTS``): a file that is
not in the repo answers 404 and huggingface_hub records that in the cache, so HF_HUB_OFFLINE=1 later
makes the very same choice from the cache alone (``try_to_load_from_cache``), with no network call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ...base._deps import require
from ...base.errors import HubError
from ...base.hub_name import HubName
from ..formats.hf.convert import MODEL_TYPES, WEIGHTS_PREFERENCE
from ..formats.hf.convert_siglip import NAFLEX_TYPES, naflex_reason
from ..formats.open_clip.convert import CONFIG_FILE as OPEN_CLIP_CONFIG
from ..formats.open_clip.convert import WEIGHT_FILES as OPEN_CLIP_WEIGHTS
from ..formats.timm.convert import TIMM_ARCH_PREFIXES
from .failures import explained, offline_not_cached
from .settings import HubSettings, hub_settings
from .snapshot import HubFile, HubSnapshot, revision_text

log = logging.getLogger(__name__)

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
#: the weights, in the readers' order of preference (safetensors first; a .bin only through weights_only)
WEIGHTS = WEIGHTS_PREFERENCE
#: what a repo may hold instead, and why vitdeploy does not read it
REFUSED = {
    ".h5": "TensorFlow (Keras) weights",
    ".msgpack": "Flax weights",
    ".onnx": "an ONNX graph (vitdeploy exports from PyTorch weights, to validate what it ships)",
    ".ckpt": "a training checkpoint",
    ".pth": "a PyTorch pickle that is not a transformers / timm weights file",
    ".pt": "a PyTorch pickle that is not a transformers / timm weights file",
    ".gguf": "GGUF weights",
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_HASH_CHUNK = 1 << 22


@dataclass
class _Repo:
    """One commit of one repo, and how to reach it."""

    name: HubName
    commit: str
    settings: HubSettings

    @property
    def label(self) -> str:
        return f"{self.name.repo_id}@{self.commit[:12]}"

    def get(self, filename: str, required: bool = False) -> Optional[Path]:
        """The file in the cache (downloaded first when online); None when the repo does not have it."""
        hf = require("huggingface_hub", "downloading a checkpoint from the Hugging Face Hub")
        s = self.settings
        if s.offline:
            found = hf.try_to_load_from_cache(self.name.repo_id, filename, cache_dir=s.cache_dir, revision=self.commit)
            if isinstance(found, str):
                return Path(found)
            if found is None:  # never asked for: unknown, not absent
                raise offline_not_cached(self.name, s, f"{filename} of commit {self.commit[:12]}")
            path = None
        else:
            with explained(self.name, s, filename):
                try:
                    log.info("%s: %s", self.label, filename)
                    path = Path(
                        hf.hf_hub_download(
                            self.name.repo_id,
                            filename,
                            revision=self.commit,
                            cache_dir=s.cache_dir,
                            endpoint=s.endpoint,
                        )
                    )
                except hf.errors.RemoteEntryNotFoundError:
                    path = None
        if path is None and required:
            raise HubError(f"{self.label}: the repo has no {filename}; {_NOT_A_MODEL}")
        return path

    def listing(self) -> list[str]:
        """The repo's files at the commit (online only; for the message of a repo without usable weights)."""
        if self.settings.offline:
            return []
        hf = require("huggingface_hub", "listing a Hub repo")
        with explained(self.name, self.settings):
            api = hf.HfApi(endpoint=self.settings.endpoint)
            return api.list_repo_files(self.name.repo_id, revision=self.commit)


_NOT_A_MODEL = (
    "vitdeploy reads transformers ViT / DeiT / DINOv2 / CLIP / SigLIP repos (config.json with model_type), timm's "
    f"hub repos (config.json with architecture) and OpenCLIP's ({OPEN_CLIP_CONFIG} without a config.json)"
)


def fetch(name: HubName) -> HubSnapshot:
    """Resolve ``name`` once and fetch what an export reads, from that commit; HubError (one line) otherwise."""
    hf = require("huggingface_hub", "downloading a checkpoint from the Hugging Face Hub")
    settings = hub_settings()
    repo = _Repo(name, _resolve(name, settings), settings)
    config = repo.get(CONFIG)
    if config is None:  # OpenCLIP's own repos: open_clip_config.json beside open_clip_model.safetensors / .bin
        config = repo.get(OPEN_CLIP_CONFIG)
        if config is None:
            raise HubError(f"{repo.label}: the repo has no {CONFIG} (nor {OPEN_CLIP_CONFIG}); {_NOT_A_MODEL}")
        fetched = [config, _open_clip_weights(repo)]
    else:
        _check_architecture(config, repo)  # before the weights: no gigabytes for a model that cannot load
        fetched = [config, repo.get(PREPROCESSOR)]
        fetched += _weights(repo)
    files = tuple(_hashed(p, repo) for p in fetched if p is not None)
    log.info("%s: %d files from %s", repo.label, len(files), settings.shown_endpoint)
    return HubSnapshot(
        name=name,
        commit=repo.commit,
        folder=config.parent,
        files=files,
        endpoint=settings.shown_endpoint,
        client=f"huggingface_hub {hf.__version__}",
        offline=settings.offline,
    )


def fetch_more(snapshot: HubSnapshot, filenames: Sequence[str]) -> HubSnapshot:
    """``snapshot`` with more files of its commit (those of ``filenames`` the repo has; the others skipped), each
    hashed into its record: what a zero-shot export reads beside the weights (the tokenizer's files)."""
    repo = _Repo(snapshot.name, snapshot.commit, hub_settings())
    have = {f.path for f in snapshot.files}
    found = [p for p in (repo.get(name) for name in filenames if name not in have) if p is not None]
    if found:
        log.info("%s: %s", repo.label, ", ".join(p.name for p in found))
    return dataclasses.replace(snapshot, files=snapshot.files + tuple(_hashed(p, repo) for p in found))


def _resolve(name: HubName, settings: HubSettings) -> str:
    hf = require("huggingface_hub", "resolving a Hugging Face Hub revision")
    with explained(name, settings):
        api = hf.HfApi(endpoint=settings.endpoint)
        resolved = api.resolve_revision(
            name.repo_id, revision=name.revision, cache_dir=settings.cache_dir, local_files_only=settings.offline
        )
    log.info("%s: %s is commit %s", name.repo_id, revision_text(name.revision), resolved.resolved)
    return resolved.resolved


def _read_json(path: Path, repo: _Repo) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubError(f"{repo.label}: {path.name} is not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise HubError(f"{repo.label}: {path.name} is not a JSON object")
    return data


def _check_architecture(config: Path, repo: _Repo) -> None:
    meta = _read_json(config, repo)
    supported = (
        f"supported: transformers {', '.join(MODEL_TYPES)} (model_type) and timm "
        f"{' / '.join(p + '*' for p in TIMM_ARCH_PREFIXES)} (vision_transformer, eva)"
    )
    if "model_type" in meta:
        if meta["model_type"] in NAFLEX_TYPES:
            raise HubError(f"{repo.label}: {naflex_reason(meta['model_type'])}")
        if meta["model_type"] not in MODEL_TYPES:
            kind = meta["model_type"]
            raise HubError(
                f"{repo.label}: a transformers {kind!r} model, which vitdeploy does not export; {supported}"
            )
    elif "architecture" in meta:
        arch = str(meta["architecture"])
        if not arch.startswith(TIMM_ARCH_PREFIXES):
            raise HubError(f"{repo.label}: a timm {arch!r} model, which vitdeploy does not export; {supported}")
    else:
        raise HubError(
            f"{repo.label}: config.json is neither transformers' (model_type) nor timm's (architecture); {supported}"
        )


def _weights(repo: _Repo) -> list[Path]:
    for filename in WEIGHTS:
        path = repo.get(filename)
        if path is None:
            continue
        if not filename.endswith(".index.json"):
            return [path]
        return [path, *(repo.get(shard, required=True) for shard in _shards(path, repo))]
    raise HubError(f"{repo.label}: {_no_weights(repo.listing())}")


def _open_clip_weights(repo: _Repo) -> Path:
    """The OpenCLIP weights open_clip itself would read (safetensors first)."""
    for filename in OPEN_CLIP_WEIGHTS:
        path = repo.get(filename)
        if path is not None:
            return path
    raise HubError(f"{repo.label}: {OPEN_CLIP_CONFIG} but no weights vitdeploy reads ({', '.join(OPEN_CLIP_WEIGHTS)})")


def _shards(index: Path, repo: _Repo) -> list[str]:
    weight_map = _read_json(index, repo).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise HubError(f"{repo.label}: {index.name} has no weight_map")
    shards = sorted({str(v) for v in weight_map.values()})
    bad = [s for s in shards if "/" in s or "\\" in s or s.startswith(".") or not s]
    if bad:
        raise HubError(f"{repo.label}: {index.name} names shards outside the repo's top folder: {bad[:3]}")
    return shards


def _no_weights(files: list[str]) -> str:
    """Why there is nothing to load: the weights vitdeploy reads, and what the repo has instead."""
    wanted = f"no weights vitdeploy reads ({', '.join(WEIGHTS)})"
    others = sorted({f"{f} ({why})" for f in files for suffix, why in REFUSED.items() if f.endswith(suffix)})
    if others:
        return (
            f"{wanted}; it has {', '.join(others[:4])}, which vitdeploy does not load: pick a repo or a revision "
            "with safetensors weights"
        )
    return f"{wanted}; pick a repo or a revision that has them (a model repo saved by transformers or timm)"


def _hashed(path: Path, repo: _Repo) -> HubFile:
    """The file's sha256; a cached blob named by its sha256 (huggingface_hub names LFS blobs so) must match it."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    sha = digest.hexdigest()
    blob = path.resolve()
    if _SHA256.match(blob.name) and blob.name != sha:
        raise HubError(
            f"{repo.label}: the cached {path.name} is corrupt (sha256 {sha[:12]}..., the Hub's {blob.name[:12]}...): "
            f"delete {blob} and run again"
        )
    return HubFile(path=path.name, sha256=sha, bytes=path.stat().st_size)
