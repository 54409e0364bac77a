"""Errors of bad user input.

Every problem a user can make in a topology file, a generator parameter, an ibnetdiscover dump (and later a
scenario or a REST body) is reported as an `InputError` that names the file, the line and the field, so the
CLI can print one line and exit 2, and the REST layer can answer 422 with the same text.
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from pathlib import Path

#: How much of a user's value an error message repeats: enough to recognise it, never a megabyte.
ECHO_CHARS = 80


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as an error message may echo it: at most `limit` characters, then "…" and the full length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


#: Seeds are what NumPy's generators take whole: 0 .. 2**32 - 1 (negative seeds are an error there).
SEED_MAX = 2**32 - 1


def clip_words(message: str, limit: int = ECHO_CHARS, total: int = 600) -> str:
    """`message` with every run of more than `limit` non-blank characters clipped (see `clip`), and at
    most `total` characters in all: what an error repeats of its input stays short however long it was."""
    clipped = re.sub(rf"\S{{{limit + 1},}}", lambda m: clip(m.group(0), limit), message)
    return clip(clipped, total)


class InputError(ValueError):
    """Bad input.  `str()` gives `file:line: field: message` with the parts that are known."""

    def __init__(
        self, message: str, *, file: str | None = None, line: int | None = None, field: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.field = field

    def located(self, file: str | None = None, line: int | None = None) -> InputError:
        """The same error with a file/line filled in where it was not known yet."""
        return type(self)(
            self.message,
            file=self.file or file,
            line=self.line if self.line is not None else line,
            field=self.field,
        )

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line is not None else "") + ": "
        elif self.line is not None:
            where = f"line {self.line}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


#: The largest file fabriclab reads: a generated k=64 fat-tree (65,536 hosts) is 13 MB of YAML.
MAX_INPUT_BYTES = 64 * 2**20


def read_input_bytes(
    path: str | Path,
    error: type[InputError] = InputError,
    max_bytes: int = MAX_INPUT_BYTES,
    *,
    head: bool = False,
) -> bytes:
    """A user's file as bytes, or one located error: only regular files (a FIFO or `/dev/zero` would block
    or never end), at most `max_bytes` (with `head`, the first `max_bytes` of a file of any size)."""
    file = str(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}", file=file) from None
    try:
        info = os.fstat(fd)  # of what was opened, not of what the name pointed to a moment earlier
        if stat.S_ISDIR(info.st_mode):
            raise error("is a directory, not a file", file=file)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"not a regular file (a {_file_kind(info.st_mode)})", file=file)
        if info.st_size > max_bytes and not head:
            raise error(f"too large: {info.st_size:,} bytes (at most {max_bytes:,})", file=file)
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}", file=file) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        if head:
            return data[:max_bytes]
        raise error(f"too large: more than {max_bytes:,} bytes", file=file)  # it grew while being read
    return data


def read_input_file(
    path: str | Path, error: type[InputError] = InputError, max_bytes: int = MAX_INPUT_BYTES
) -> str:
    """A user's text file (UTF-8; gzip-compressed if it ends in .gz), or one located error saying why it
    cannot be read.  A compressed file is held to `max_bytes` after decompression too (no gzip bombs)."""
    data = read_input_bytes(path, error, max_bytes)
    if str(path).endswith(".gz"):
        data = _gunzip(data, str(path), error, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error("not a text file (UTF-8 expected)", file=str(path)) from None
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise error("not a text file: a NUL byte (binary data?)", file=str(path), line=line)
    return text


def _gunzip(data: bytes, file: str, error: type[InputError], max_bytes: int) -> bytes:
    """Decompress a gzip member stream, stopping as soon as the output passes `max_bytes`."""
    out = bytearray()
    try:
        while data:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            out += inflater.decompress(data, max_bytes + 1 - len(out))
            if len(out) > max_bytes:
                raise error(f"too large: more than {max_bytes:,} bytes once decompressed", file=file)
            if not inflater.eof:
                if inflater.unconsumed_tail:
                    raise error(f"too large: more than {max_bytes:,} bytes once decompressed", file=file)
                raise error("not a gzip file (truncated)", file=file)
            data = inflater.unused_data  # concatenated members, as gzip(1) writes them
    except zlib.error:
        raise error("not a gzip file", file=file) from None
    return bytes(out)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "named pipe"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


class TopologyError(InputError):
    """Bad topology input (file, generator parameters, ibnetdiscover dump)."""
