"""A command's output file: an export written beside the file and renamed over it once complete.

``crawler export`` and ``crawler crawl -o``: a failed export leaves the file as it was; a pipe,
a device or ``/dev/stdout`` is written as it is; text is UTF-8 whatever the locale.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from ..errors import ConfigError
from ..store.database import Store
from ..store.export import BINARY_FORMATS, SURROGATES, ItemNotWritten, keyed_items, write_items
from .context import Context


def _export(
    obj: Context,
    site: str,
    output: str | None,
    fmt: str,
    history: bool = False,
    raw_csv: bool = False,
    fields: list[str] | None = None,
) -> int:
    """Write ``site``'s items to ``output`` (None or '-': stdout) in ``fmt``; the number written.

    ConfigError naming the site and the item's key for an item the format cannot hold;
    a regular file is then left as it was (``_open_output``).
    """
    store = Store(obj.settings.database_url)
    try:
        with _open_output(output, binary=fmt in BINARY_FORMATS) as out:
            return write_items(lambda: keyed_items(store, site, history), out, fmt, raw_csv=raw_csv, fields=fields)
    except ItemNotWritten as exc:
        raise ConfigError(f"{site}: {exc}") from None
    finally:
        store.close()


#: Paths of a process's open files (``/dev/stdout``, ``/proc/self/fd/1``): written where the shell opened them.
OPEN_FILE_PATHS = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|\d+)/fd/\d+")


def check_output(path: str | None) -> None:
    """ConfigError naming ``path`` now if an export cannot be written there (a crawl's ``-o``: before it crawls).

    Nothing is opened: opening a named pipe and closing it would end its reader.
    """
    if path is None or path == "-":
        return
    if _in_place(path):
        if os.path.isdir(path):
            raise ConfigError(f"cannot write {path!r}: Is a directory")
        if not os.access(path, os.W_OK):
            raise ConfigError(f"cannot write {path!r}: Permission denied")
        return
    target = os.path.realpath(path)
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise ConfigError(f"cannot write {path!r}: Permission denied")
    fd, part = _part_file(path, target)
    os.close(fd)
    os.unlink(part)


def _in_place(path: str) -> bool:
    """Whether ``path`` is written as it is: a pipe, a device, a folder, ``/dev/stdout``; not a regular file."""
    if OPEN_FILE_PATHS.fullmatch(os.path.abspath(path)):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:  # none yet (or unreachable: the part file says why)
        return False


def _part_file(path: str, target: str) -> tuple[int, str]:
    """A new file beside ``target`` (mode as umask allows), open to write; ConfigError naming ``path``."""
    part = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{secrets.token_hex(4)}.part")
    try:
        return os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), part
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror or exc}") from None


@contextmanager
def _open_output(path: str | None, binary: bool = False) -> Iterator[IO[Any]]:
    """``path`` open to write UTF-8 text, or bytes if ``binary`` (stdout for None or '-', left open).

    A regular file (or a new one) is written beside it and renamed over it once complete:
    an export that fails leaves the file as it was. A pipe, a device or ``/dev/stdout`` is
    opened once, to append, and written as it is. Text is UTF-8 whatever the locale, with
    lone surrogates as U+FFFD (``export.SURROGATES``). ConfigError naming ``path`` when it
    cannot be written.
    """
    try:
        if path is None or path == "-":
            with _stdout(binary) as out:
                yield out
        elif _in_place(path):
            with _opened(os.open(path, os.O_WRONLY | os.O_APPEND), binary) as out:
                yield out
        else:
            target = os.path.realpath(path)
            fd, part = _part_file(path, target)
            try:
                with _opened(fd, binary) as out:
                    yield out
                if os.path.exists(target):
                    shutil.copymode(target, part)
                os.replace(part, target)
            finally:
                if os.path.exists(part):
                    os.unlink(part)
    except OSError as exc:  # the disk full, a pipe's reader gone
        where = "stdout" if path is None or path == "-" else repr(path)
        raise ConfigError(f"cannot write {where}: {exc.strerror or exc}") from None


def _opened(fd: int, binary: bool) -> IO[Any]:
    return open(fd, "wb") if binary else open(fd, "w", encoding="utf-8", errors=SURROGATES, newline="")


@contextmanager
def _stdout(binary: bool) -> Iterator[IO[Any]]:
    """Standard output's bytes, or UTF-8 text over them (``SURROGATES``), flushed but left open."""
    sys.stdout.flush()
    if binary or not hasattr(sys.stdout, "buffer"):
        yield sys.stdout.buffer if binary else sys.stdout
        return
    text = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors=SURROGATES, newline="")
    try:
        yield text
        text.flush()
    finally:
        text.detach()
