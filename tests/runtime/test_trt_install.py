"""The TensorRT extras install a (tensorrt, torch) pair of one CUDA major in one documented command,
and the CUDA-major check names the command that fixes a mismatch.

What this checks: pyproject's extras, the README's install lines and the check agree (the torch each
line installs satisfies its extra's pin and is accepted by the check); mixed or doubled wheels are
refused with the exact command. What it cannot check here: that PyTorch's index really serves the
CUDA 12 build named in vitdeploy.base.vocab.TENSORRT_TORCH (download.pytorch.org is unreachable from this
machine), or that PyPI's torch 2.13.0 is a CUDA 13 build (read once from its wheel's METADATA:
``cuda-toolkit[...]==13.0.3``, ``nvidia-cudnn-cu13``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from vitdeploy.base.vocab import TENSORRT_TORCH, tensorrt_install_command, torch_fix_command
from vitdeploy.runtime.backends import trt as trt_backend
from vitdeploy.runtime.backends.trt.log import cuda_major_mismatch

ROOT = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[Requirement]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {k: [Requirement(r) for r in v] for k, v in data["project"]["optional-dependencies"].items()}


def torch_cuda_of(version: str) -> str:
    """The CUDA version a torch wheel version is built for, as torch.version.cuda reports it."""
    local = re.fullmatch(r"[\d.]+\+cu(\d+)(\d)", version)
    return f"{local.group(1)}.{local.group(2)}" if local else "13.0"  # PyPI's 2.13.0 (Linux): CUDA 13.0


@pytest.mark.parametrize("major", sorted(TENSORRT_TORCH))
def test_each_extra_installs_a_pair_the_check_accepts(major):
    reqs = {r.name: r for r in extras()[f"tensorrt-cu{major}"]}
    assert f"tensorrt-cu{major}" in reqs
    torch_version, index = TENSORRT_TORCH[major]
    command = tensorrt_install_command(major)
    assert reqs["torch"].specifier.contains(torch_version)  # the command's torch satisfies the extra's pin
    if index is not None:  # a torch that is not PyPI's is named exactly, so pip cannot fall back to PyPI's build
        assert f'"torch=={torch_version}"' in command and f"--extra-index-url {index}" in command
    assert cuda_major_mismatch(major, torch_cuda_of(torch_version), torch_version) is None
    other = 13 if major == 12 else 12
    assert cuda_major_mismatch(other, torch_cuda_of(torch_version), torch_version) is not None


def test_readme_shows_the_one_command_per_extra():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for major in TENSORRT_TORCH:
        assert tensorrt_install_command(major) in readme, f"README lacks the install line of tensorrt-cu{major}"


@pytest.mark.parametrize(
    "trt_major, torch_cuda, torch_version", [(12, "13.0", "2.13.0"), (13, "12.8", "2.13.0+cu128")]
)
def test_mismatch_names_the_command_that_fixes_it(trt_major, torch_cuda, torch_version):
    why = cuda_major_mismatch(trt_major, torch_cuda, torch_version)
    assert (
        f"CUDA {trt_major} (tensorrt-cu{trt_major})" in why
        and f"torch {torch_version} is built for CUDA {torch_cuda}" in why
    )
    assert f"Fix: {torch_fix_command(trt_major)}" in why
    fixed_torch = TENSORRT_TORCH[trt_major][0]
    assert f'"torch=={fixed_torch}"' in torch_fix_command(trt_major)  # ... which installs the build the check accepts
    assert cuda_major_mismatch(trt_major, torch_cuda_of(fixed_torch), fixed_torch) is None


def test_wheels_of_both_cuda_majors_are_refused(monkeypatch):
    from importlib import metadata

    installed = {"tensorrt-cu12-bindings", "tensorrt-cu12-libs", "tensorrt-cu13-bindings", "tensorrt-cu13-libs"}

    def version(name):
        if name in installed:
            return "10.13.3.9" if "cu12" in name else "11.4.0.106"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    assert trt_backend.tensorrt_cuda_major() == (12, 13)
    why = cuda_major_mismatch((12, 13), "13.0", "2.13.0")
    assert "tensorrt-cu12 and tensorrt-cu13" in why
    assert why.endswith("pip uninstall -y tensorrt-cu12 tensorrt-cu12-bindings tensorrt-cu12-libs")
    assert cuda_major_mismatch((12, 13), None) is not None  # refused even where torch's CUDA is unknown
    installed -= {"tensorrt-cu12-bindings", "tensorrt-cu12-libs"}
    assert trt_backend.tensorrt_cuda_major() == 13
