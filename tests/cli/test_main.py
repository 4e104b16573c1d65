"""`python -m forgetwatch` is the `forgetwatch` command, for environments whose scripts directory is not on PATH."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_python_dash_m_forgetwatch_is_the_command():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "forgetwatch", "--version"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    from forgetwatch import __version__

    assert __version__ in proc.stdout
