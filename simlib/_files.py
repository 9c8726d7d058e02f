"""Files written whole: every file simlib writes (results, figures, checkpoints) goes to a
temporary file beside it, is flushed to disk, then renamed onto it, so that a reader (or a
resumed run) sees the old file or the new one, never half.

The temporary file is created as ``open(path, "w")`` would create ``path``: mode 0666 less
the umask (and the folder's default ACL, where it has one), applied by the system at
creation. ``tempfile.mkstemp`` would give 0600, and the rename would carry that to the
result. Asking the system to apply the umask, rather than reading it with
``os.umask``, is also safe while other threads run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

__all__ = ["atomic_write", "check_writable"]

_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
          | getattr(os, "O_BINARY", 0))
_TRIES = 100  # tempfile's TMP_MAX is 10000; 8 random hex digits rarely collide


def _temporary(path: Path) -> str:
    """A new empty file beside ``path`` (``.NAME.XXXXXXXX.tmp``), for writing then renaming,
    with the mode ``open(path, "w")`` would give (0666 less the umask)."""
    for _ in range(_TRIES):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, _FLAGS, 0o666))
        except FileExistsError:
            continue
        return str(tmp)
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(path.parent))


def atomic_write(path: str | os.PathLike, write) -> None:
    """``write(tmp)`` to a temporary file beside ``path`` (creating its missing folders),
    flushed to disk, then renamed onto ``path``: a reader sees the old file or the new one,
    never half. ``path`` gets the mode ``open(path, "w")`` would give a new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_writable(path: str | os.PathLike) -> None:
    """Raise the ``OSError`` that :func:`atomic_write` would meet at ``path``, without
    writing it: the missing parent folders and a temporary file beside ``path`` are created
    and removed again. For a long run, to find an unwritable output before the work."""
    path = Path(path).absolute()
    created = []
    try:
        for folder in reversed(path.parents):
            if not folder.exists():
                folder.mkdir()
                created.append(folder)
        os.unlink(_temporary(path))
    finally:
        for folder in reversed(created):
            with contextlib.suppress(OSError):
                folder.rmdir()
