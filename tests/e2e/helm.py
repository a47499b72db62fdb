"""helm for the e2e suite (the binary of hack/build-helm.sh), with its cache, config and data in a directory of the
caller's, never $HOME."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.fixtures.control_plane import REPO_ROOT
from tests.fixtures.helm import helm_binary

CHART = REPO_ROOT / "charts" / "phoenix"


def helm(*args: str, home: Path, input: str | None = None) -> str:
    """helm's stdout; a failure raises with helm's own message."""
    env = {**os.environ, **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}}
    result = subprocess.run(
        [str(helm_binary()), *args], env=env, input=input, capture_output=True, text=True, check=False, timeout=600
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout
