"""The TCP sockets a process and its descendants listen on, read from /proc (Linux; no psutil needed): which ports
a server really opened, at which address.

    for sock in listening(pid):   # Listening(host="127.0.0.1", port=8000, pid=1234, command="ray::ProxyActor")
        ...
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # the state column of /proc/net/tcp{,6}
LOOPBACK_V4 = "127."


@dataclass(frozen=True)
class Listening:
    host: str  # as the kernel has it: "127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1" ...
    port: int
    pid: int
    command: str

    @property
    def loopback(self) -> bool:
        host = self.host.removeprefix("::ffff:")
        return host.startswith(LOOPBACK_V4) or host == "::1"


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it (children found through /proc/<pid>/stat's parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _socket_inodes(pids: list[int]) -> dict[int, int]:
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(PROC / str(pid) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(PROC / str(pid) / "fd" / fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[int(target[8:-1])] = pid
    return inodes


def _address(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host order
    return socket.inet_ntop(family, raw)


def _command(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def listening(root: int) -> list[Listening]:
    """Every TCP socket in LISTEN state held by ``root`` or a descendant."""
    inodes = _socket_inodes(process_tree(root))
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            rows = (PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            inode = int(fields[9])
            if fields[3] != LISTEN or inode not in inodes:
                continue
            address, port = fields[1].split(":")
            pid = inodes[inode]
            found.append(Listening(_address(address, family), int(port, 16), pid, _command(pid)[:100]))
    return found


def network_address() -> str | None:
    """An address of this machine that is not loopback (the one a default route leaves from), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, the kernel only picks a source
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith(LOOPBACK_V4) else address
