"""README.md's Python section runs as written: its first ```python block is
taken from the file as it stands and run by a fresh interpreter in an
empty directory, with the build tree's package on PYTHONPATH (the
llama-cpp-python block runs in python/tests_llama, the first block again in
a fresh venv with the wheel: python/tests_wheel)."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("CTXSTORE_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))


def readme_python_block() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^## Python\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "README.md has no '## Python' section"
    blocks = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    assert blocks, "no python block in README's Python section"
    return blocks[0]


def test_readme_python_example_runs_as_written(tmp_path):
    code = readme_python_block()
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # The example prints what it read back after the reopen.
    assert p.stdout.strip(), "the example printed nothing"
    assert "Traceback" not in p.stderr
