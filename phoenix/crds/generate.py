"""Writes manifests/crds/phoenix.io_phoenixstages.yaml from the models, and the Helm chart's copy of it
(charts/phoenix/files/, as a chart cannot read files outside its directory): `python -m phoenix.crds.generate`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from phoenix.crds.definition import CRD_NAME, custom_resource_definition

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = REPO_ROOT / "manifests" / "crds" / f"{CRD_NAME.split('.', 1)[1]}_{CRD_NAME.split('.', 1)[0]}.yaml"
CHART_CRD_PATH = REPO_ROOT / "charts" / "phoenix" / "files" / CRD_PATH.name
HEADER = "# Generated from phoenix/crds by `python -m phoenix.crds.generate` (`make manifests`). Do not edit.\n"


class _PlainDumper(yaml.SafeDumper):
    """Repeated sub-schemas are written out in full: YAML anchors would confuse readers and some tools."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def render_crd() -> str:
    """The CRD as committed YAML text."""
    body = yaml.dump(custom_resource_definition(), Dumper=_PlainDumper, sort_keys=False, width=120)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed CRD is out of date")
    parser.add_argument("--output", type=Path, default=CRD_PATH, help=f"default: {CRD_PATH}")
    args = parser.parse_args(argv)
    text = render_crd()
    outputs = [args.output, *([CHART_CRD_PATH] if args.output == CRD_PATH else [])]
    if args.check:
        stale = [path for path in outputs if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run `make manifests`", file=sys.stderr)
        return 1 if stale else 0
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
