"""Errors of bad user input.

Every problem a user can make in a topology file, a generator parameter, an ibnetdiscover dump (and later a
scenario or a REST body) is reported as an `InputError` that names the file, the line and the field, so the
CLI can print one line and exit 2, and the REST layer can answer 422 with the same text.
"""

from __future__ import annotations

import gzip
from pathlib import Path


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


def read_input_file(path: str | Path, error: type[InputError] = InputError) -> str:
    """A user's text file (gzip-compressed if it ends in .gz), or one located error saying why it cannot be
    read."""
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                return handle.read()
        return Path(path).read_text(encoding="utf-8")
    except (gzip.BadGzipFile, EOFError):
        raise error("not a gzip file", file=str(path)) from None
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError:
        raise error("not a text file (UTF-8 expected)", file=str(path)) from None


class TopologyError(InputError):
    """Bad topology input (file, generator parameters, ibnetdiscover dump)."""
