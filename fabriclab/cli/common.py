"""Helpers shared by CLI commands: loading a fabric from any supported file, writing outputs, and the
validators every option goes through (numbers, listen addresses), so bad input of any kind is one line on
stderr and exit 2 before anything starts."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import secrets
import socket
import stat
import sys
import tempfile
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from topologies.errors import SEED_MAX, TopologyError, clip_words, read_input_bytes
from topologies.ibnet import load_ibnet
from topologies.loader import load_topology
from topologies.model import Fabric

_IBNET_LINE = re.compile(r"^\s*(switchguid|caguid|Switch\s+\d+|Ca\s+\d+|vendid|sysimgguid)\b", re.MULTILINE)


class CliError(Exception):
    """A usage problem found after argument parsing (exit code 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2) like every other bad input; the usage
    itself is one `--help` away."""

    def error(self, message: str) -> typing.NoReturn:
        message = clip_words(message)  # argparse repeats the bad value: a 5,000-digit one stays short here
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def real(low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """argparse type: a finite number in [low, high] (`nan`, `inf`, `1e-9` seconds are refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be a number from {low:g} to {high:g}{unit}, got {text!r}")
        return value

    return parse


def integer(low: int, high: int, *, base: int = 10, show: Callable[[int], str] = str) -> Callable[[str], int]:
    """argparse type: an integer in [low, high] (`base=0` also takes 0x.. and 0o..)."""

    def parse(text: str) -> int:
        try:
            value = int(text, base)
        except ValueError:  # also what Python refuses to convert (more than 4,300 digits)
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {show(low)}..{show(high)}, got {text[:40]!r}")
        return value

    return parse


#: argparse type of every `--seed`.
SEED = integer(0, SEED_MAX)


def endpoint(text: str, option: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host may be bracketed: [::1]:8080)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536 or not host:
        raise CliError(f"{option}: expected HOST:PORT, got {text!r}")
    return host, int(port)


def check_distinct(listeners: Sequence[tuple[str, tuple[str, int]]]) -> None:
    """Refuse two listeners of one process on the same address (`--api` = `--openflow`, or one of them on
    0.0.0.0 and the other on the same port): a clear error before anything starts, not one listener
    started and announced and the other failing."""
    resolved: list[tuple[str, tuple[str, int], set[str]]] = []
    for option, (host, port) in listeners:
        addresses = {str(info[4][0]) for info in _resolve(option, host, port)}
        for other, (other_host, other_port), other_addresses in resolved:
            wildcard = {"0.0.0.0", "::"} & (addresses | other_addresses)
            if port == other_port and (addresses & other_addresses or wildcard):
                raise CliError(
                    f"{option}: {host}:{port} is also the {other} address ({other_host}:{other_port}); "
                    "give each listener its own port"
                )
        resolved.append((option, (host, port), addresses))


def check_bindable(listeners: Sequence[tuple[str, tuple[str, int]]]) -> None:
    """Fail with a clear message before starting anything if an address is taken or invalid."""
    for option, (host, port) in listeners:
        family, kind, proto, _, address = _resolve(option, host, port)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise CliError(f"{option}: cannot listen on {host}:{port}: {exc.strerror}") from None


def _resolve(option: str, host: str, port: int) -> list[typing.Any]:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise CliError(
            f"{option}: cannot resolve {host!r}: {getattr(exc, 'strerror', None) or exc}"
        ) from None


def sniff_format(path: Path) -> str:
    if path.suffix.lower() in (".yaml", ".yml"):
        return "yaml"
    head = read_input_bytes(path, TopologyError, 65536, head=True).decode("utf-8", errors="replace")
    return "ibnet" if _IBNET_LINE.search(head) else "yaml"


def load_fabric(path: str, fmt: str = "auto") -> Fabric:
    """A topology file (YAML) or an ibnetdiscover/ibsim dump, validated."""
    file = Path(path)
    if not file.exists():
        raise TopologyError("no such file", file=str(path))
    kind = sniff_format(file) if fmt == "auto" else fmt
    if kind == "ibnet":
        return load_ibnet(file)
    return load_topology(file)


def write_text(text: str, output: str | Path | None, option: str = "-o/--output") -> None:
    """Write to a file (atomically, so a failed run never leaves half a file) or to stdout."""
    if output is None or str(output) == "-":
        sys.stdout.write(text)
        return
    with output_file(output, option) as tmp:
        tmp.write_text(text, encoding="utf-8")


def check_output_file(output: str | Path, option: str = "-o/--output") -> None:
    """Before the work: `output` can become a file (not a folder; its folder exists or can be made)."""
    path = Path(output)
    if path.is_dir():
        raise CliError(f"{option}: {output} is a directory; give a file name")
    parent = next((p for p in Path(os.path.abspath(path)).parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise CliError(f"{option}: cannot write {output}: {parent} is not a directory")
    try:  # files can be made there (not read-only, not /proc)
        os.rmdir(tempfile.mkdtemp(prefix=".fabriclab-probe.", dir=parent))
    except OSError as exc:
        raise CliError(f"{option}: cannot write {output}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def output_file(output: str | Path, option: str = "-o/--output") -> Iterator[Path]:
    """A path to write `output` through: a new file beside it that replaces it only when the block ends
    without an error, and is removed otherwise, so a failed or interrupted run leaves neither half a file
    nor a temporary one.  Problems of the file system (no such directory, a directory given, read-only)
    are one `CliError` naming the option.  A device or pipe (`-o /dev/stdout`) is written in place."""
    target = Path(os.path.realpath(output))  # replace a symlink's target, not the symlink
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise CliError(f"{option}: cannot write {output}: {exc.strerror or exc}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise CliError(f"{option}: {output} is a directory; give a file name")
    if mode is not None and not stat.S_ISREG(mode):
        try:
            yield target
        except OSError as exc:
            raise CliError(f"{option}: cannot write {output}: {exc.strerror or exc}") from None
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        raise CliError(f"{option}: cannot write {output}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


#: `--cc` of `emulate up`, `scenario run` and `compare`.
CC_CHOICES = ("none", "dcqcn")
CC_HELP = "congestion control of the RoCE senders (default: the file's `cc:`; docs/congestion.md)"
