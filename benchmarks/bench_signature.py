"""What checking an export's signature costs at load time, against the load itself, on a ViT-B/16 export.

Goal (issue 49, item 5): verifying ``model.sig`` (``--verify-key`` / ``runtime.verify``: runtime/signature.py,
through model-signing) costs < 1 s, or < 5% of the load, for a ViT-B export.

The export: ViT-B/16 at 224 with random weights (the file sizes are what matter), exported by vitdeploy's own
pipeline into a cache folder on first use (model.safetensors, model.onnx, model.ort.onnx, model.fp16.onnx: INT8
is left out, its ~90 MB would add ~7%), then signed with a P-256 key made here.

Timed, interleaved round by round (the order rotates, so other work on the machine falls on all alike), page
cache warm (the first, untimed call reads the files in):

* ``open``    ``Artifacts.open``: the manifest and every listed file's sha256 (what every load does anyway);
* ``load``    ``Predictor.from_artifacts(backend="ort")``: the whole load (``open`` + the ONNX Runtime session);
* ``verify``  ``verify_export`` alone: the signature and every covered file's sha256 (the files in parallel);
* ``load+verify``  ``Predictor.from_artifacts(..., public_key=...)``: the load as ``--verify-key`` runs it (the
  manifest check takes each file's sha256 from the signature's pass instead of reading the file again).

Printed: each one's median, min and max over the rounds; per round, what ``--verify-key`` adds to the load
(``load+verify`` - ``load``, in seconds and as a share of ``load``: the goal's figure) and ``verify`` alone as a
share of ``load``; once, in a fresh process, the import of model-signing (paid by a process's first check).

    .venv/bin/python benchmarks/bench_signature.py                    # ViT-B/16, 7 rounds
    .venv/bin/python benchmarks/bench_signature.py --rounds 11 --variant vit_small_patch16_224
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vitdeploy.base.machine import cpu_model  # noqa: E402

GOAL_S, GOAL_SHARE = 1.0, 0.05
DEFAULT_CACHE = Path(os.environ.get("VITDEPLOY_BENCH_CACHE", "/tmp/vitdeploy-bench"))


def random_vit_export(variant: str, cache: Path) -> Path:
    """``variant`` with random weights, exported once by vitdeploy's pipeline (no INT8, no engine)."""
    out = cache / f"{variant}-random-fp16"
    if (out / "manifest.json").is_file():
        return out
    import torch

    from vitdeploy.base.config import parse_config
    from vitdeploy.base.preprocess_spec import PreprocessSpec
    from vitdeploy.export.pipeline import run_export
    from vitdeploy.model.checkpoints import save_checkpoint
    from vitdeploy.model.vit import VARIANTS, VisionTransformer

    torch.manual_seed(0)
    cfg = VARIANTS[variant]
    ckpt = cache / f"{variant}-random-checkpoint"
    save_checkpoint(
        ckpt,
        VisionTransformer(cfg).eval(),
        [f"class_{i}" for i in range(cfg.num_classes)],
        PreprocessSpec(style="hf", height=cfg.image_size, width=cfg.image_size),
        f"{variant}-random",
    )
    config = parse_config(
        {
            "model": {"checkpoint": str(ckpt)},
            "export": {"int8": {"enabled": False}},
            "validation": {"max_images": 8, "noise_samples": 8},
        }
    )
    print(f"exporting {variant} (random weights) into {out} (once) ...", flush=True)
    start = time.perf_counter()
    run_export(config, out, engine="skip", validation_batch=(1, 8))
    print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def key_pair(folder: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / "bench.pem", folder / "bench.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def rounds_of(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call, one per round, the order rotating from round to round; one untimed call first."""
    names = list(fns)
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def import_seconds() -> float:
    """model-signing's import in a fresh process (what the first verification of a process pays)."""
    code = "import time; t = time.perf_counter(); import model_signing.verifying; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="vit_base_patch16_224")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()

    import model_signing
    import onnxruntime

    from vitdeploy.runtime.artifacts import Artifacts
    from vitdeploy.runtime.backends.base import BackendOptions
    from vitdeploy.runtime.predictor import Predictor
    from vitdeploy.runtime.signature import HASH, sign_export, verify_export

    print("== environment")
    print(f"cpu          : {cpu_model()} ({os.cpu_count()} logical CPUs, load average {os.getloadavg()[0]:.1f})")
    print(
        f"python       : {platform.python_version()}; model-signing {model_signing.__version__}; "
        f"onnxruntime {onnxruntime.__version__}; digest {HASH}"
    )
    args.cache.mkdir(parents=True, exist_ok=True)
    export = random_vit_export(args.variant, args.cache)
    files = sorted(p for p in export.iterdir() if p.is_file() and p.suffix in (".onnx", ".safetensors", ".json"))
    total = sum(p.stat().st_size for p in files)
    print(f"export       : {export}: {len(files)} files, {total / 1e6:.0f} MB")
    for p in files:
        print(f"  {p.name:<22} {p.stat().st_size / 1e6:8.1f} MB")

    with tempfile.TemporaryDirectory() as tmp:
        private, public = key_pair(Path(tmp))
        start = time.perf_counter()
        sign_export(export, private)
        print(f"signing      : {time.perf_counter() - start:.2f} s (vitdeploy sign, once)")
        options = BackendOptions()

        def load(key: Path | None = None) -> None:
            Predictor.from_artifacts(export, backend="ort", options=options, public_key=key).close()

        times = rounds_of(
            {
                "open": lambda: Artifacts.open(export),
                "load": load,
                "verify": lambda: verify_export(export, public),
                "load+verify": lambda: load(public),
            },
            args.rounds,
        )
    print(f"\n== {args.rounds} rounds, seconds (median [min - max])")
    for name, values in times.items():
        print(f"{name:<12} {statistics.median(values):7.3f}  [{min(values):.3f} - {max(values):.3f}]")
    pairs = list(zip(times["load+verify"], times["load"]))
    added_s = [lv - lo for lv, lo in pairs]
    added = [lv / lo - 1 for lv, lo in pairs]
    alone = [v / lo for v, lo in zip(times["verify"], times["load"])]
    print(
        f"--verify-key adds   : {statistics.median(added_s):+.3f} s median [{min(added_s):+.3f} - {max(added_s):+.3f}]"
        f" = {statistics.median(added):+.1%} of the load [{min(added):+.1%} - {max(added):+.1%}] per round"
    )
    print(f"verify alone / load : {statistics.median(alone):.1%} median [{min(alone):.1%} - {max(alone):.1%}]")
    print(f"import model-signing: {import_seconds():.2f} s, once per process (fresh interpreter)")
    cost, share = statistics.median(added_s), statistics.median(added)
    met = cost < GOAL_S or share < GOAL_SHARE
    print(
        f"goal (adds < {GOAL_S:.0f} s or < {GOAL_SHARE:.0%} of the load): {'met' if met else 'NOT met'} "
        f"({cost:+.3f} s, {share:+.1%}; the import once per process on top)"
    )


if __name__ == "__main__":
    main()
