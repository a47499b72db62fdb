"""A `file://` document, read only from a regular file under DOCUMENT_ROOT and only up to MAX_DOCUMENT_BYTES.

A message names the path, so without a root any file the pod can read would be readable by whoever can enqueue a
record: /proc/self/environ (the pod's secrets), a mounted key, the service account's token; and /dev/zero would be
read until the pod is killed. The path is resolved first (`..` and every symlink), then it must lie under the
root, outside /proc, /sys and /dev, and be a regular file. A symlink swapped in after the check is not followed
(O_NOFOLLOW); whoever can rewrite the document root's directories is trusted, as its owner.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from phoenix.stages.documents import Document, DocumentNotFoundError, DocumentRefusedError, too_large

_SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))
_CHUNK = 1 << 20


def read_document_file(url: str, root: Path | None, max_bytes: int) -> Document:
    """Blocking: run it in a thread (BaseProcessor.run_blocking). `root` is resolved already (RouterSettings)."""
    parts = urlsplit(url)
    requested = unquote(parts.path)
    if root is None:
        raise DocumentRefusedError(f"file:// URLs are refused ({requested}): DOCUMENT_ROOT is not set")
    if parts.netloc not in ("", "localhost"):
        raise DocumentRefusedError(f"file://{parts.netloc}/...: a file URL names no host")
    try:
        real = Path(os.path.realpath(requested))
    except ValueError:  # an embedded NUL
        raise DocumentRefusedError(f"{requested!r} is not a file path") from None
    if not real.is_relative_to(root) or any(real.is_relative_to(tree) for tree in _SYSTEM_TREES):
        raise DocumentRefusedError(f"{requested} is not a file under DOCUMENT_ROOT ({root})")
    try:
        # O_NONBLOCK: opening a FIFO waits for a writer otherwise; a regular file ignores it.
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DocumentNotFoundError(f"no document at {requested}") from None
    except PermissionError:
        raise DocumentRefusedError(f"{requested} is not readable by the router") from None
    except OSError as exc:  # ELOOP: a symlink put in place after the check
        raise DocumentRefusedError(f"{requested} cannot be opened: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DocumentRefusedError(f"{requested} is not a regular file")
        return Document(name=real.name, content=_read_at_most(fd, max_bytes))
    finally:
        os.close(fd)


def _read_at_most(fd: int, max_bytes: int) -> bytes:
    """The file's bytes, reading no more than one byte past the cap (a file may grow after its size was read)."""
    chunks, size = [], 0
    while chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
    return b"".join(chunks)
