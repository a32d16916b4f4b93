"""The README's Python API example runs as written (its first ```python block), on the shipped models."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_python_api_example_runs_as_written(tmp_path):
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    story, figures, sampled = done.stdout.splitlines()[-3:]
    assert story.startswith(", there was") and len(story.split()) > 20
    assert re.fullmatch(r"\d+\.\d\d tokens per verification, alpha \d\.\d\d", figures)
    assert len(sampled.split()) > 3
