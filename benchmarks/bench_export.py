"""What the default `vitdeploy export` costs: time and peak memory per stage, in the unit that compares
across machines (the export's own ``reference`` stage: eager PyTorch over the validation inputs).

Random-weight Hugging Face ViT checkpoints (``save_pretrained``: safetensors + config.json, built here
from the paper's configuration, no download) are exported with the defaults (``--engine skip``: no
TensorRT here), each in a subprocess; each manifest's stage records give each stage's seconds and peak
resident memory (the kernel's high-water mark, reset at each stage's start). One export is not every
model's: the INT8 autopilot's path depends on the weights and on the preprocessing (a checkpoint saved
with its ``ViTImageProcessor``, mean and std 0.5, gave other validation inputs, and cost 14.7 reference
stages where the benchmark's first checkpoint cost 9.7), so several are measured: ``--seeds`` x
``--processor`` (ViT-B/16 by default: seeds 0 and 1, each without and with a saved processor). Printed
for each: a row per stage, the whole export in reference-stage units, the INT8 stage against one FP32
validation (``validate-ort-optimized``) when INT8 does not ship, each stage's peak against the FP32
weights and over what the export holds without a model (the libraries and what they keep, recorded by
the export), and what other processes took of the CPU while it ran, with each stage's CPU seconds of the
export process itself (read from /proc at each stage's end: on a shared machine they move far less than
the wall seconds, so the ratio in them is printed too); then the worst of them against the goals (issue
41: every export <= 6 reference stages; the INT8 stage, when INT8 does not ship, <= one FP32 validation;
issue 29: every peak <= held + 4x the FP32 weights).

With ``--optimum``, ``optimum-cli export onnx`` exports the first checkpoint in the same run, for the
record (it exports and does not validate); it lives in the bench venv bench_ort_speed.py builds
(``.venv-bench``), created here if missing.

    .venv/bin/python benchmarks/bench_export.py                 # ViT-B/16: 4 checkpoints
    .venv/bin/python benchmarks/bench_export.py --model vit-l   # ViT-L/16 (1.2 GB of weights): seed 0
    .venv/bin/python benchmarks/bench_export.py --model vit-h --seeds 0,1 --processor both
    .venv/bin/python benchmarks/bench_export.py --model vit-g   # DINOv2 ViT-g/14, SwiGLU, headless (4.5 GB)
    .venv/bin/python benchmarks/bench_export.py --model clip-l14-336  # CLIP ViT-L/14-336 image tower (1.2 GB)
    .venv/bin/python benchmarks/bench_export.py --model siglip-so400m   # SigLIP so400m/14-384 tower (1.7 GB)
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _common import cpu_flags  # noqa: E402

from vitdeploy.base.machine import describe_cpu  # noqa: E402
from vitdeploy.base.memory import human  # noqa: E402

#: Dosovitskiy et al., Table 1; HF's defaults for the rest.
MODELS = {
    "vit-b": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, patch_size=16
    ),
    "vit-l": dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, patch_size=16
    ),
    "vit-h": dict(
        hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, intermediate_size=5120, patch_size=14
    ),
}
#: DINOv2's ViT-g/14 (Oquab et al., 2023): SwiGLU MLP, 1.1 B parameters, headless (an embedding export), its
#: hub processor's 224 px crop (transformers' Dinov2Model; the position table resampled from 518 px)
GIANT = dict(
    hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, mlp_ratio=4, use_swiglu_ffn=True, patch_size=14
)
MODELS["vit-g"] = GIANT
#: OpenAI CLIP ViT-L/14 at 336 px (openai/clip-vit-large-patch14-336): transformers' CLIPVisionModelWithProjection,
#: 577 tokens, QuickGELU, the projection to 768: an embedding export (issue 50), random weights
CLIP_L14_336 = dict(
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    patch_size=14,
    image_size=336,
    projection_dim=768,
    hidden_act="quick_gelu",
    layer_norm_eps=1e-5,
)
MODELS["clip-l14-336"] = CLIP_L14_336
#: SigLIP so400m/14 at 384 px (Alabdulmohsin et al., 2023; google/siglip-so400m-patch14-384), its image tower as
#: transformers' SiglipVisionModel: no class token, the attention-pooling head, headless (an embedding export), 384 px
#: off the 14 px grid (27 x 27 patches), SiglipImageProcessor (384 x 384, bicubic, mean/std 0.5)
SO400M = dict(hidden_size=1152, num_hidden_layers=27, num_attention_heads=16, intermediate_size=4304)
SO400M.update(patch_size=14, image_size=384)
MODELS["siglip-so400m"] = SO400M
REFERENCE_GOAL, MEMORY_GOAL = 6.0, 4.0
#: the checkpoints measured unless asked otherwise: (seeds, processor: "no" | "yes" | "both")
DEFAULT_VARIANTS = {"vit-b": ("0,1", "both")}


def make_checkpoint(name: str, folder: Path, seed: int = 0, processor: bool = False) -> int:
    """A random-weight ViTForImageClassification saved with save_pretrained (and, with ``processor``, the
    ``ViTImageProcessor`` transformers saves for a ViT: resize to 224, mean and std 0.5); returns its FP32
    weight bytes."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    if name == "vit-g":
        return _giant(folder)
    if name == "clip-l14-336":
        return _clip(folder)
    if name == "siglip-so400m":
        return _so400m(folder)
    cfg = ViTConfig(**MODELS[name], image_size=224, num_labels=1000, hidden_act="gelu", qkv_bias=True)
    model = ViTForImageClassification(cfg).eval()
    model.save_pretrained(folder)
    if processor:
        from transformers import ViTImageProcessor

        ViTImageProcessor(size={"height": 224, "width": 224}).save_pretrained(folder)
    return sum(p.numel() * 4 for p in model.parameters())


def save_dinov2_processor(folder: Path) -> None:
    """DINOv2's hub processor: bicubic resize of the short side to 256, 224 px centre crop, ImageNet mean/std."""
    from transformers import BitImageProcessor

    BitImageProcessor(
        size={"shortest_edge": 256},
        crop_size={"height": 224, "width": 224},
        resample=3,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder)


def _giant(folder: Path) -> int:
    """DINOv2 ViT-g/14 as the hub ships it (config image_size 518, processor crop 224), random weights."""
    from transformers import Dinov2Config, Dinov2Model

    model = Dinov2Model(Dinov2Config(**GIANT, image_size=518)).eval()
    model.save_pretrained(folder)
    save_dinov2_processor(folder)
    weights = sum(p.numel() * 4 for p in model.parameters())
    del model
    return weights


def _clip(folder: Path) -> int:
    """CLIP ViT-L/14-336's image tower as the hub's processor feeds it (shortest side 336, centre crop, bicubic,
    OpenAI's mean / std), random weights."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    model = CLIPVisionModelWithProjection(CLIPVisionConfig(**CLIP_L14_336)).eval()
    model.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}).save_pretrained(folder)
    weights = sum(p.numel() * 4 for p in model.parameters())
    del model
    return weights


def _so400m(folder: Path) -> int:
    """SigLIP so400m/14-384's image tower as transformers saves it, with its hub processor, random weights."""
    from transformers import SiglipImageProcessorPil, SiglipVisionConfig, SiglipVisionModel

    model = SiglipVisionModel(SiglipVisionConfig(**SO400M)).eval()
    model.save_pretrained(folder)
    SiglipImageProcessorPil(size={"height": 384, "width": 384}).save_pretrained(folder)
    weights = sum(p.numel() * 4 for p in model.parameters())
    del model
    return weights


#: a stage's end line on the export's stderr: "  <stage>  passed|failed|skipped  <seconds>s ..."
_STAGE_END = re.compile(r"^\s+(\S+)\s+(passed|failed|skipped)\s+[\d.]+s")


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of process ``pid`` (every thread of it) from /proc; None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_export(checkpoint: Path, out: Path, source: Path | None = None) -> tuple[float, list[dict], int | None]:
    """(wall seconds, the stage records, what the export held without the model) of one default export. Each
    record also gets ``cpu_seconds``: the export process's own CPU time while the stage ran (read at each
    stage's end line), which other processes on a shared machine change far less than its wall time.
    ``source``: a checkout whose ``vitdeploy`` runs the export instead of the one imported here."""
    config = out.parent / "pipeline.yaml"
    config.write_text(json.dumps({"model": {"checkpoint": str(checkpoint)}}))  # YAML reads JSON; the defaults
    cli = [sys.executable, "-m", "vitdeploy.cli", "export", "-c", str(config), "-o", str(out), "--engine", "skip"]
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if source is not None:  # another checkout's vitdeploy (--against): its code, this environment
        env["PYTHONPATH"] = os.pathsep.join([str(source), *filter(None, [os.environ.get("PYTHONPATH", "")])])
    proc = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    cpu, last, tail = {}, 0.0, collections.deque(maxlen=60)
    for line in proc.stderr:
        tail.append(line)
        end = _STAGE_END.match(line)
        now = _cpu_seconds(proc.pid) if end else None
        if end and now is not None and end.group(1) not in cpu:
            cpu[end.group(1)], last = now - last, now
    proc.wait()
    wall = time.perf_counter() - start
    sys.stderr.write("".join(tail) if proc.returncode else "")
    manifest = out / "manifest.json"
    report = out / "export-report.json"
    source = manifest if manifest.is_file() else report
    if not source.is_file():
        raise SystemExit(f"export failed (exit {proc.returncode}) and left no record")
    record = json.loads(source.read_text())
    memory = record.get("export", {}).get("memory") or record.get("memory") or {}
    stages = [{**s, "cpu_seconds": cpu.get(s["name"])} for s in record["stages"]]
    return wall, stages, memory.get("held_without_model_bytes")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_optimum(checkpoint: Path, out: Path) -> float | None:
    from bench_ort_speed import ensure_bench_venv

    py = ensure_bench_venv(HERE.parent / ".venv-bench")
    cli = py.with_name("optimum-cli")
    start = time.perf_counter()
    proc = subprocess.run(
        [str(cli), "export", "onnx", "--model", str(checkpoint), "--task", "image-classification", str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.stderr.write(proc.stderr[-3000:])
        return None
    return time.perf_counter() - start


def _variants(args: argparse.Namespace) -> list[tuple[int, bool]]:
    """The checkpoints to measure: (seed, with a saved image processor)."""
    seeds, processor = DEFAULT_VARIANTS.get(args.model, ("0", "no"))
    seeds, processor = args.seeds or seeds, args.processor or processor
    flags = {"no": (False,), "yes": (True,), "both": (False, True)}[processor]
    return [(int(seed), flag) for seed in seeds.split(",") for flag in flags]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="vit-b")
    ap.add_argument("--seeds", help="comma-separated weight seeds (default: 0,1 for vit-b, else 0)")
    ap.add_argument(
        "--processor", choices=("no", "yes", "both"), help="save a ViTImageProcessor beside the checkpoint"
    )
    ap.add_argument("--optimum", action="store_true", help="also time optimum-cli export onnx (bench venv)")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument(
        "--against",
        type=Path,
        help="another checkout (its folder): each repeat exports with its vitdeploy, then with this one's (A/B)",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="exports per checkpoint (> 1: each stage's spread in reference stages)"
    )
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-export-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        _bench(args, work)
    finally:  # a ViT-H checkpoint and its export are ~10 GB: never left behind unless --keep
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


@dataclasses.dataclass
class _Run:
    """One checkpoint's export: its stage records and what the goals read of them."""

    label: str
    weights: int
    wall: float
    stages: list[dict]
    held: int | None
    contention: str

    def seconds(self, name: str) -> float | None:
        return next((s["seconds"] for s in self.stages if s["name"] == name and s["seconds"]), None)

    @property
    def units(self) -> float | None:
        reference = self.seconds("reference")
        return sum(s["seconds"] for s in self.stages) / reference if reference else None

    @property
    def cpu_units(self) -> float | None:
        """The same ratio in the export process's CPU seconds (None when they could not be read)."""
        cpu = [s.get("cpu_seconds") for s in self.stages if s["status"] != "skipped"]
        reference = next((s.get("cpu_seconds") for s in self.stages if s["name"] == "reference"), None)
        return sum(cpu) / reference if reference and None not in cpu else None

    @property
    def int8_shipped(self) -> bool:
        return any(s["name"] == "speed-int8" and s["status"] == "passed" for s in self.stages)

    @property
    def int8_per_validation(self) -> float | None:
        """The int8 stage over one FP32 validation (validate-ort-optimized), when INT8 does not ship."""
        int8, validation = self.seconds("int8"), self.seconds("validate-ort-optimized")
        return int8 / validation if int8 and validation and not self.int8_shipped else None

    @property
    def over_held(self) -> tuple[float, str] | None:
        peaks = [s for s in self.stages if s.get("peak_rss_bytes")]
        if not peaks or not self.held:
            return None
        top = max(peaks, key=lambda s: s["peak_rss_bytes"])
        return (top["peak_rss_bytes"] - self.held) / self.weights, top["name"]


def _bench(args: argparse.Namespace, work: Path) -> None:
    print(f"cpu: {describe_cpu()}, {os.cpu_count()} logical CPUs, flags {' '.join(cpu_flags())}")
    runs = []
    for seed, processor in _variants(args):
        label = f"{args.model} seed {seed}" + (", ViTImageProcessor saved" if processor else "")
        checkpoint = work / f"{args.model}-s{seed}{'-processor' if processor else ''}-hf"
        weights = make_checkpoint(args.model, checkpoint, seed, processor)
        print(f"\nmodel: {label}, random weights, {human(weights)} of FP32 weights ({checkpoint})")
        sources = {"": None} if args.against is None else {" [against]": args.against.resolve(), " [this]": None}
        repeats: dict[str, list[_Run]] = {tag: [] for tag in sources}
        for i in range(max(1, args.repeat)):
            for tag, source in sources.items():  # alternating: the machine's drift hits both alike
                out = work / f"{checkpoint.name}-artifacts"
                shutil.rmtree(out, ignore_errors=True)
                name = label + tag + (f" #{i + 1}" if args.repeat > 1 else "")
                repeats[tag].append(_export_one(name, checkpoint, weights, out, source))
                _print_stages(repeats[tag][-1])
        for tag, done in repeats.items():
            if len(done) > 1:
                _print_spread(done)
            runs += done
        if args.optimum and len(runs) == sum(map(len, repeats.values())):
            seconds = run_optimum(checkpoint, work / "optimum")
            print(
                f"optimum-cli export onnx: {seconds:.1f} s (exports the FP32 graph, no validation)" if seconds else ""
            )
        if args.keep is None:  # one checkpoint's files at a time on disk
            shutil.rmtree(checkpoint, ignore_errors=True)
            shutil.rmtree(work / f"{checkpoint.name}-artifacts", ignore_errors=True)
    _print_summary(runs)


def _export_one(label: str, checkpoint: Path, weights: int, out: Path, source: Path | None = None) -> _Run:
    from vitdeploy.evaluate.reliability import contention, sample

    before, children, load = sample(), _children_cpu_s(), os.getloadavg()[0]
    wall, stages, held = run_export(checkpoint, out, source)
    window = contention(before, sample())
    print(f"load average (1 min): {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    if window is not None:  # the export runs in a child process: its CPU is the benchmark's own, not contention
        window = dataclasses.replace(window, others_s=max(0.0, window.others_s - (_children_cpu_s() - children)))
    said = window.describe() if window else "unknown (no /proc/stat)"
    print(f"contention while exporting: {said}")
    return _Run(label, weights, wall, stages, held, f"{window.competing_cores:.2f}" if window else "?")


def _print_stages(run: _Run) -> None:
    reference, held, weights = run.seconds("reference"), run.held, run.weights
    print(f"held without the model: {human(held)} (the libraries and what they keep; each stage's peak over it below)")
    head = f"{'stage':<24} {'status':<8} {'seconds':>8} {'x ref':>6} {'cpu s':>7} {'peak RSS':>10} {'x weights':>9}"
    print(f"\n{head} over held")
    for s in run.stages:
        peak, cpu = s.get("peak_rss_bytes"), s.get("cpu_seconds")
        ref = f"{s['seconds'] / reference:6.2f}" if reference else "     ?"
        ratio = f"{peak / weights:9.2f}" if peak else "        ?"
        over = f"{(peak - held) / weights:9.2f}" if peak and held else "        ?"
        spent = f"{cpu:7.1f}" if cpu is not None else "      ?"
        print(f"{s['name']:<24} {s['status']:<8} {s['seconds']:8.1f} {ref} {spent} {human(peak):>10} {ratio} {over}")
    for s in run.stages:  # why a stage failed: a refusal (the gate, the speed) is not an error (a full disk)
        if s["status"] == "failed":
            print(f"  {s['name']} failed: {str(s.get('reason', '?'))[:300]}")
    total = sum(s["seconds"] for s in run.stages)
    units = f" = {run.units:.1f} reference stages ({reference:.1f} s each)" if run.units else ""
    cpu = f"; in CPU seconds of the export: {run.cpu_units:.1f}" if run.cpu_units else ""
    print(f"\nexport: {run.wall:.1f} s wall, {total:.1f} s in stages{units}{cpu}")


def _print_spread(runs: list[_Run]) -> None:
    """Each stage of repeated exports of one checkpoint in units of its own run's reference stage: the median
    and the range over the runs (ratios within one run are what a shared machine's load moves least)."""
    print(f"\n{runs[0].label.rsplit(' #', 1)[0]}: {len(runs)} exports, each stage in its run's reference stages")
    print(f"{'stage':<24} {'median':>7} {'min':>6} {'max':>6}   {'median s':>8}")
    names = [s["name"] for s in runs[0].stages if s["status"] != "skipped"]
    for name in names:
        units = [s["seconds"] / r.seconds("reference") for r in runs for s in r.stages if s["name"] == name]
        secs = [s["seconds"] for r in runs for s in r.stages if s["name"] == name]
        if units:
            low, mid, high = min(units), statistics.median(units), max(units)
            print(f"{name:<24} {mid:7.2f} {low:6.2f} {high:6.2f}   {statistics.median(secs):8.1f}")
    totals = [r.units for r in runs if r.units]
    if totals:
        each = ", ".join(f"{t:.2f}" for t in totals)
        mid = statistics.median(totals)
        print(f"{'export':<24} {mid:7.2f} {min(totals):6.2f} {max(totals):6.2f}   (runs: {each})")
    print(f"contention (cores others took) per run: {', '.join(r.contention for r in runs)}")


def _print_summary(runs: list[_Run]) -> None:
    """One row per checkpoint, then the worst against each goal."""
    head = f"{'checkpoint':<40} {'export s':>8} {'ref s':>6} {'x ref':>6} {'cpu x':>6} {'int8 s':>7} {'/ valid.':>8}"
    print(f"\n{head} {'peak/held':>10} cont.")
    for r in runs:
        per = f"{r.int8_per_validation:8.2f}" if r.int8_per_validation is not None else "  ships "
        over = f"{r.over_held[0]:9.2f}x" if r.over_held else "         ?"
        units = f"{r.units:6.2f}" if r.units else "     ?"
        cpu = f"{r.cpu_units:6.2f}" if r.cpu_units else "     ?"
        ref, int8 = r.seconds("reference") or 0.0, r.seconds("int8") or 0.0
        total = sum(s["seconds"] for s in r.stages)
        print(f"{r.label:<40} {total:8.1f} {ref:6.1f} {units} {cpu} {int8:7.1f} {per} {over} {r.contention}")
    worst = max((r for r in runs if r.units), key=lambda r: r.units, default=None)
    if worst is not None:
        verdict = "meets" if worst.units <= REFERENCE_GOAL else "misses"
        goal = f"goal <= {REFERENCE_GOAL:g}: {verdict}"
        print(f"\nworst export: {worst.units:.1f} reference stages ({worst.label}; {goal})")
        cpu = max((r for r in runs if r.cpu_units), key=lambda r: r.cpu_units, default=None)
        if cpu is not None:  # the same in the export's own CPU seconds: what other work on the machine moves less
            print(f"worst export in CPU seconds: {cpu.cpu_units:.1f} reference stages ({cpu.label})")
    refused = [r for r in runs if r.int8_per_validation is not None]
    if refused:
        top = max(refused, key=lambda r: r.int8_per_validation)
        verdict = "meets" if top.int8_per_validation <= 1.0 else "misses"
        print(
            f"worst INT8 stage that did not ship: {top.int8_per_validation:.2f} FP32 validations ({top.label}; "
            f"goal <= 1: {verdict})"
        )
    peaks = [r for r in runs if r.over_held]
    if peaks:
        top = max(peaks, key=lambda r: r.over_held[0])
        over, stage = top.over_held
        verdict = "meets" if over <= MEMORY_GOAL else "misses"
        print(
            f"worst peak: held + {over:.2f}x the weights in {stage} ({top.label}; goal <= {MEMORY_GOAL:g}x: {verdict})"
        )


if __name__ == "__main__":
    main()
