"""The bearer token a server of the CLI (`phoenix ui`, `phoenix ingest`) requires, read from a file (a mounted
Secret's key): one word, never printed."""

from __future__ import annotations

from pathlib import Path

from phoenix.errors import ConfigError


def token_from_file(path: Path, error: type[ConfigError]) -> str:
    """The token `path` holds; `error` (the command's own ConfigError) when it cannot be read or holds none."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise error(f"cannot read --token-file {str(path)!r}: {exc.strerror}") from None
    if not token or any(c.isspace() for c in token):
        raise error(f"--token-file {str(path)!r} holds no token (one word, no whitespace)")
    return token
