"""Crash-safe file writing and strict JSON / JSON-lines reading.

Conventions: text is UTF-8.  A write goes to a temporary file in the target's
own directory (so ``os.replace`` is an atomic rename on the same file system),
is flushed and fsynced, then renamed over the target; on any failure the
temporary file is removed and the target keeps its previous bytes (or stays
absent).  New files get the usual ``0o666 & ~umask`` permissions (the
temporary file is created with mode ``0o666`` and the system applies the
process's umask, which is never read or changed here); a replaced file keeps
its permission bits.  JSON is written strictly (``NaN`` and
``Infinity`` are refused: store non-finite numbers as ``null``).  Readers name
the path, and for JSON lines the 1-based line number, of anything unreadable.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from sphyr_jax.errors import UserInputError

PathLike = str | os.PathLike


class CorruptFileError(UserInputError):
    """A file that exists but does not hold what its format promises.

    Attributes:
        path: the offending file.
        line: 1-based line number of the problem, or None for the whole file.
    """

    def __init__(self, message: str, path: PathLike, line: int | None = None):
        super().__init__(message)
        self.path = os.fspath(path)
        self.line = line


def _fsync_dir(directory: str) -> None:
    """Persist a rename on POSIX; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _existing_mode(path: str) -> int | None:
    """The permission bits of ``path``, or None if there is no such file."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


_OPEN_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def _create_temp(path: str, suffix: str) -> tuple[int, str]:
    """Create a new hidden sibling of ``path`` with mode ``0o666`` less the umask.

    Like :func:`tempfile.mkstemp` (a fresh random name, created exclusively),
    but the system applies the process's umask (and a directory's default
    ACL), as for any new file, instead of mkstemp's fixed ``0o600``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    for _ in range(100):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(4)}{suffix}")
        try:
            return os.open(tmp, _OPEN_FLAGS, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def _write_temp(path: str, writer: Callable[[Any], None], encoding: str | None) -> str:
    """Write a temporary sibling of ``path`` with ``writer(file)``; return its name.

    The temporary file is flushed and fsynced; it is removed if anything fails.
    ``encoding=None`` opens it in binary mode.
    """
    fd, tmp = _create_temp(path, ".tmp")
    try:
        binary = encoding is None
        with (os.fdopen(fd, "wb") if binary else
              os.fdopen(fd, "w", encoding=encoding, newline="")) as handle:
            writer(handle)
            handle.flush()
            os.fsync(handle.fileno())
        mode = _existing_mode(path)
        if mode is not None:
            os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _atomic_write(path: PathLike, writer: Callable[[Any], None], encoding: str | None) -> None:
    path = os.fspath(path)
    tmp = _write_temp(path, writer, encoding)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> None:
    """Replace the contents of ``path`` with ``text`` atomically.

    Readers see either the old file or the complete new one, never a mix.

    Args:
        path: target file; its directory must exist.
        text: the new contents (written as is, no newline translation).
        encoding: text encoding.

    Raises:
        OSError: if the file cannot be written; the target is then unchanged.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    _atomic_write(path, lambda handle: handle.write(text), encoding)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Replace the contents of ``path`` with ``data`` atomically (as
    :func:`atomic_write_text`, for binary files such as figures)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, not {type(data).__name__}")
    _atomic_write(path, lambda handle: handle.write(data), None)


def atomic_write_json(path: PathLike, obj: Any, indent: int | None = 2,
                      allow_nan: bool = False) -> None:
    """Serialise ``obj`` as strict JSON into ``path`` atomically.

    The object is streamed into the temporary file, so an error raised part
    way through serialisation (an unserialisable value, a NaN) leaves the
    target untouched and no temporary file behind.

    Args:
        path: target file; its directory must exist.
        obj: a JSON-serialisable value (no NaN / infinity).
        indent: ``json.dump`` indentation (None for one line).
        allow_nan: write NaN/Infinity tokens (Python's JSON dialect) instead of
            raising; used to keep values a caller read from such a file.

    Raises:
        TypeError: for values JSON cannot represent.
        ValueError: for NaN or infinite floats.
        OSError: if the file cannot be written.
    """

    def writer(handle) -> None:
        json.dump(obj, handle, indent=indent, allow_nan=allow_nan, ensure_ascii=False)
        handle.write("\n")

    _atomic_write(path, writer, "utf-8")


def atomic_write_files(contents: Mapping[PathLike, str], encoding: str = "utf-8") -> None:
    """Write several text files as one all-or-nothing operation.

    Every new file is first written to a temporary sibling (flushed, fsynced);
    only when all of them exist are they renamed into place.  Existing targets
    are kept as hard-link (or copy) backups during the renames, so a failure
    part way through restores every target to its previous bytes, removes
    targets that did not exist before, and deletes all temporary files.

    Args:
        contents: mapping from target path to its new text.  Directories must
            exist.
        encoding: text encoding.

    Raises:
        OSError: if anything cannot be written; no target is then changed.
    """
    items = [(os.fspath(path), text) for path, text in contents.items()]
    if len({os.path.abspath(p) for p, _ in items}) != len(items):
        raise ValueError("atomic_write_files: the same target appears twice")
    temps: dict[str, str] = {}
    backups: dict[str, str | None] = {}
    replaced: list[str] = []
    try:
        for path, text in items:
            if not isinstance(text, str):
                raise TypeError(f"contents for {path} must be str")
            temps[path] = _write_temp(path, lambda h, t=text: h.write(t), encoding)
        for path, _ in items:
            backups[path] = _backup(path)
            os.replace(temps[path], path)
            replaced.append(path)
    except BaseException:
        for path in reversed(replaced):
            with contextlib.suppress(OSError):
                previous = backups.get(path)
                if previous is None:
                    os.unlink(path)
                else:
                    os.replace(previous, path)
                    backups[path] = None
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for backup in backups.values():
            if backup is not None:
                with contextlib.suppress(OSError):
                    os.unlink(backup)
        raise
    for backup in backups.values():
        if backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(backup)
    for directory in {os.path.dirname(os.path.abspath(p)) for p, _ in items}:
        _fsync_dir(directory)


def _missing_dirs(directory: str) -> list[str]:
    """The directories ``os.makedirs(directory)`` would create, deepest first."""
    missing = []
    current = os.path.abspath(directory)
    while not os.path.exists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def commit_files(contents: Mapping[PathLike, str], encoding: str = "utf-8") -> None:
    """Write several text files all or nothing, creating their folders.

    As :func:`atomic_write_files`, after creating every missing folder the
    targets need (parents included).  On failure no target is changed and the
    folders this call created are removed again (those still empty).

    Args:
        contents: mapping from target path to its new text.
        encoding: text encoding.

    Raises:
        OSError: if a folder or a file cannot be written; nothing is then changed.
    """
    folders = sorted({os.path.dirname(os.path.abspath(os.fspath(p))) for p in contents})
    created: list[str] = []
    try:
        for folder in folders:
            missing = _missing_dirs(folder)
            os.makedirs(folder, exist_ok=True)
            created.extend(missing)
        atomic_write_files(contents, encoding)
    except BaseException:
        for folder in sorted(created, key=len, reverse=True):  # deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def _backup(path: str) -> str | None:
    """A hidden second name for an existing file (None if there is no file)."""
    if not os.path.exists(path):
        return None
    directory = os.path.dirname(os.path.abspath(path))
    fd, backup = tempfile.mkstemp(
        dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".bak"
    )
    os.close(fd)
    os.unlink(backup)
    try:
        os.link(path, backup)
    except OSError:
        import shutil

        shutil.copy2(path, backup)
    return backup


def _read_text(path: PathLike) -> str:
    try:
        with open(path, encoding="utf-8-sig") as handle:  # tolerate a BOM
            return handle.read()
    except UnicodeDecodeError as exc:
        raise CorruptFileError(f"{os.fspath(path)}: not valid UTF-8 text ({exc})", path) from exc


def read_json(path: PathLike) -> Any:
    """Parse a JSON file.

    Args:
        path: the file.

    Returns:
        The decoded value.

    Raises:
        FileNotFoundError: if the file does not exist.
        CorruptFileError: if it is not UTF-8 JSON (the message names the path,
            line and column); the file itself is never modified.
    """
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptFileError(
            f"{os.fspath(path)}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            path,
            exc.lineno,
        ) from exc


def read_jsonl_numbered(path: PathLike) -> list[tuple[int, Any]]:
    """Like :func:`read_jsonl`, but pairs each value with its 1-based line number."""
    text = _read_text(path)
    values = []
    # split on "\n" only: str.splitlines would also break at U+2028 and
    # friends, which JSON allows unescaped inside strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise CorruptFileError(
                f"{os.fspath(path)}, line {number}: invalid JSON: {exc.msg}", path, number
            ) from exc
    return values


def read_jsonl(path: PathLike) -> list[Any]:
    """Parse a JSON-lines file (one JSON value per line; blank lines skipped).

    Args:
        path: the file.

    Returns:
        The decoded values in file order.

    Raises:
        FileNotFoundError: if the file does not exist.
        CorruptFileError: naming the path and 1-based line of the first line
            that is not valid JSON.
    """
    return [value for _, value in read_jsonl_numbered(path)]


class LockedError(UserInputError):
    """A lock file held by another process (see :func:`exclusive_lock`)."""


@contextlib.contextmanager
def exclusive_lock(path: PathLike, busy: str | None = None):
    """Hold an advisory lock on ``path`` for the ``with`` block; the file is removed after.

    One process at a time: a second one (or a second lock in this process)
    fails at once with :class:`LockedError` instead of waiting.  The lock
    dies with its process (``flock``), so a killed run never leaves a stale
    lock; a clean release removes the lock file.  A lock taken on a file that
    another process removed in the meantime is let go and taken again on the
    new file, so two processes never both hold one.  Without ``fcntl`` (not
    POSIX) nothing is locked.

    Args:
        path: the lock file (created if missing; its folder must exist).
        busy: the error's message when the lock is held (default: names the path).

    Raises:
        LockedError: another holder has the lock.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path = os.fspath(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise LockedError(busy or f"{path} is locked by another process") from exc
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(current, os.fstat(fd)):
            break
        os.close(fd)  # the holder before us removed the file: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a waiting opener retries on a new file
        os.close(fd)
