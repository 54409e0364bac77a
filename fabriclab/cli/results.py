"""Results folders (`-o DIR` of `sim`, `sweep`, `scenario run`, `compare`): never destroy what fabriclab did
not write.

The rule, checked before any work starts (one line, exit 2):

* `DIR` does not exist, or is an empty folder: the results go there;
* `DIR` is a folder holding an earlier result of the same command (it carries `MARKER`, which every
  results folder gets): it is replaced — whole, once the new results are complete;
* anything else (a file, a folder with other things in it, the current folder or one containing it) is
  refused, unless `--force` says to replace a folder anyway (never a file, never the current folder).

Results are written to a temporary folder beside `DIR` and renamed into place at the end, so a run that
fails or is interrupted (Ctrl-C, SIGTERM) leaves neither half a results folder nor the temporary one, and
the folder it would have replaced is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fabriclab.cli.common import CliError

#: `--force` of every command that writes a results folder.
FORCE_HELP = "replace -o even if it is a folder of other things (never a file, never the current folder)"

#: The file that says a folder is a fabriclab result, and of which command.
MARKER = ".fabriclab-result.json"


def marker(folder: Path) -> dict[str, Any]:
    """What a results folder's marker says ({} for a folder without one, or with a damaged one)."""
    try:
        if (folder / MARKER).stat().st_size > 65536:
            return {}
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _marker_command(folder: Path) -> str | None:
    command = marker(folder).get("command")
    return command if isinstance(command, str) else None


def check(output: Path, command: str, force: bool = False, option: str = "-o/--output") -> None:
    """Refuse (CliError) a results folder this command may not write (see the module doc)."""
    target = Path(os.path.abspath(output))
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        _probe(target, output, option)
        return
    except OSError as exc:
        raise CliError(f"{option}: cannot use {output}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):  # replacing it would replace the link, not what it points to
        raise CliError(f"{option}: {output} is a symbolic link: give the folder's own path")
    if not stat.S_ISDIR(mode):
        raise CliError(f"{option}: {output} exists and is not a folder: give a new folder for the results")
    here = Path(os.path.abspath(os.getcwd()))
    if target == here or target in here.parents:
        raise CliError(
            f"{option}: {output} is the current folder or contains it: give a folder for the results"
        )
    try:
        empty = not any(target.iterdir())
    except OSError as exc:
        raise CliError(f"{option}: cannot read {output}: {exc.strerror or exc}") from None
    if empty or force:
        return
    found = _marker_command(target)
    if found == command:
        return
    what = f"a `fabriclab {found}` result" if found else "not a fabriclab result"
    raise CliError(
        f"{option}: {output} is a folder with other things in it ({what}): give a new folder, or --force to "
        f"replace it"
    )


def _probe(target: Path, output: Path, option: str) -> None:
    """A folder that cannot be created fails now, not after the run: make and remove a folder in the
    nearest existing ancestor (creating nothing else)."""
    parent = next((p for p in target.parents if p.exists()), Path("/"))
    if not parent.is_dir():
        raise CliError(f"{option}: cannot create {output}: {parent} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fabriclab-probe.", dir=parent))
    except OSError as exc:
        raise CliError(f"{option}: cannot create {output}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def results_dir(
    output: Path,
    command: str,
    force: bool = False,
    option: str = "-o/--output",
    meta: dict[str, Any] | None = None,
    on_failure: Callable[[Path], None] | None = None,
) -> Iterator[Path]:
    """A fresh temporary folder for the results, which replaces `output` when the block succeeds; `meta`
    goes into its marker beside the command; `on_failure` sees the folder before it is removed."""
    check(output, command, force, option)
    target = Path(os.path.abspath(output))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    except OSError as exc:
        raise CliError(f"{option}: cannot write {output}: {exc.strerror or exc}") from None
    try:
        note = {"command": command, "written": time.time(), **(meta or {})}
        (tmp / MARKER).write_text(json.dumps(note) + "\n")
        yield tmp
        check(output, command, force, option)  # what was there may have changed meanwhile
        _replace(tmp, target)
    except BaseException:
        try:
            if on_failure is not None:
                on_failure(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        target.rename(old / "previous")
    try:
        tmp.rename(target)
    except OSError:
        if old is not None:  # put the previous result back
            (old / "previous").rename(target)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


__all__ = ["FORCE_HELP", "MARKER", "check", "marker", "results_dir"]
