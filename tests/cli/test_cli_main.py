import subprocess
import sys

from featuredp.cli import build_parser


def test_every_issue_command_is_registered():
    choices = build_parser()._subparsers._group_actions[0].choices
    for name in ("account", "calibrate", "train", "demo", "compare", "audit", "data", "benchmark", "convex"):
        assert name in choices


def test_building_the_parser_imports_no_torch():
    # `featuredp account` must start fast: no subcommand may import torch while registering.
    code = "import sys, featuredp.cli as c; c.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
