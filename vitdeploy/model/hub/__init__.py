"""Checkpoints named on the Hugging Face Hub, downloaded as the Hugging Face ecosystem downloads them.

``fetch(HubName)`` goes through ``huggingface_hub`` itself: the user's cache (``HF_HOME`` / ``HF_HUB_CACHE``,
shared with transformers and timm), ``HF_TOKEN`` or ``hf auth login`` for gated and private repos,
``HF_HUB_OFFLINE=1`` (a warm cache, no network call), ``HF_ENDPOINT`` for a mirror, its progress bars
and its temporary files (a cut download never lands under its final name). The revision is resolved
once, at the start; every file then comes from that one commit. Only the files an export reads are
fetched (``config.json``, ``preprocessor_config.json``, the weights: ``model.safetensors`` first, then its
sharded index, then ``pytorch_model.bin`` -- read with ``torch.load(weights_only=True)`` only). What was
fetched, from where, at which commit, with each file's sha256 is the :class:`HubSnapshot`, recorded in the
manifest.

``settings.py`` (the environment, read at each call), ``fetch.py`` (resolve, choose, download, hash),
``failures.py`` (each failure as one line naming the repo and what to do), ``snapshot.py`` (the record).
"""

from __future__ import annotations

from .fetch import fetch
from .snapshot import HubFile, HubSnapshot

__all__ = ["HubFile", "HubSnapshot", "fetch"]
