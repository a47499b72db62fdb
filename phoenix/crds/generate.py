"""Writes the CRDs under manifests/crds/ (phoenix.io_phoenixstages.yaml, phoenix.io_phoenixpipelines.yaml) from the
models, and the Helm chart's copies of them (charts/phoenix/files/, as a chart cannot read files outside its
directory): `python -m phoenix.crds.generate`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from phoenix.crds.definition import CRD_NAME, custom_resource_definition, pipeline_custom_resource_definition
from phoenix.crds.pipeline import PIPELINE_CRD_NAME

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "manifests" / "crds"
CHART_FILES_DIR = REPO_ROOT / "charts" / "phoenix" / "files"
HEADER = "# Generated from phoenix/crds by `python -m phoenix.crds.generate` (`make manifests`). Do not edit.\n"


def file_name(crd_name: str) -> str:
    """`<group>_<plural>.yaml`, as controller-gen names them."""
    plural, group = crd_name.split(".", 1)
    return f"{group}_{plural}.yaml"


CRD_PATH = CRD_DIR / file_name(CRD_NAME)
CHART_CRD_PATH = CHART_FILES_DIR / CRD_PATH.name
PIPELINE_CRD_PATH = CRD_DIR / file_name(PIPELINE_CRD_NAME)
# Each CRD's file under manifests/crds/ and what it is made from.
DEFINITIONS: dict[Path, Callable[[], dict[str, Any]]] = {
    CRD_PATH: custom_resource_definition,
    PIPELINE_CRD_PATH: pipeline_custom_resource_definition,
}


class _PlainDumper(yaml.SafeDumper):
    """Repeated sub-schemas are written out in full: YAML anchors would confuse readers and some tools."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def render_crd(definition: Callable[[], dict[str, Any]] = custom_resource_definition) -> str:
    """A CRD (the PhoenixStage's unless given) as committed YAML text."""
    body = yaml.dump(definition(), Dumper=_PlainDumper, sort_keys=False, width=120)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed CRD is out of date")
    parser.add_argument(
        "--output", type=Path, default=None, help=f"write only the PhoenixStage CRD there (default: {CRD_DIR}/*)"
    )
    args = parser.parse_args(argv)
    if args.output is not None:
        outputs = {args.output: render_crd()}
    else:
        outputs = {}
        for path, definition in DEFINITIONS.items():
            outputs[path] = outputs[CHART_FILES_DIR / path.name] = render_crd(definition)
    if args.check:
        stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run `make manifests`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
