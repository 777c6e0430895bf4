"""What this machine's CPU is: its model name, its flags and the instruction set its INT8 matrix products use.

Both are read from /proc/cpuinfo (Linux); elsewhere :mod:`platform` says what it knows. Messages that
depend on the CPU (INT8 that does not pay here) and reports name them, so a figure from one machine
is never mistaken for another's.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

#: The INT8 dot-product instructions, best first: (cpuinfo flag, the name people know it by).
INT8_ISAS = (
    ("amx_int8", "AMX-INT8"),
    ("avx512_vnni", "AVX512-VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512bw", "AVX512 (no VNNI)"),
    ("avx2", "AVX2 (no VNNI)"),
    ("asimddp", "Arm dot product"),
)


def _cpuinfo(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_model(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    text = _cpuinfo(cpuinfo)
    for key in ("model name", "Model", "Hardware", "Processor", "cpu model"):
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo ``flags``, ``Features`` on Arm); empty where it does not say."""
    flags: set[str] = set()
    for line in _cpuinfo(cpuinfo).splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            flags |= set(value.split())
    return frozenset(flags)


def int8_isa(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """The best INT8 dot-product instruction set the CPU has (``AVX512-VNNI``, ``AVX2 (no VNNI)``, ...)."""
    flags = cpu_flags(cpuinfo)
    return next((label for flag, label in INT8_ISAS if flag in flags), platform.machine() or "unknown")


def cpu_key(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """This CPU in a few characters: its model and flags, hashed (the same kind of machine gives the same key;
    another model, or the same model with other instructions exposed, another). Keys what is measured per CPU."""
    text = cpu_model(cpuinfo) + "\n" + " ".join(sorted(cpu_flags(cpuinfo)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def describe_cpu(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """``<model>, <INT8 ISA>``: one phrase for messages."""
    return f"{cpu_model(cpuinfo)}, {int8_isa(cpuinfo)}"


__all__ = ["INT8_ISAS", "cpu_flags", "cpu_key", "cpu_model", "describe_cpu", "int8_isa"]
