"""The numpy core of featuredp.attacks must not import torch (pinned in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys


def test_attacks_core_does_not_import_torch():
    code = (
        "import sys, featuredp.attacks, featuredp.attacks.report;"
        "import featuredp.attacks.canaries, featuredp.attacks.extraction, featuredp.attacks.text;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
