"""The package as pip builds and installs it: a wheel built from this
repository by meson-python (pyproject.toml), installed into a new virtual
environment with pip's NumPy and no torch, where the README's Python
section runs as written and python/tests pass against the installed
package; where the wheel has ctxstore.llama, llama-cpp-python built without
its own llama.cpp is installed beside it and a conversation is saved and
resumed.

The wheel is built once per state of its sources: it is kept in the build
tree (CTXS_BUILD_DIR/python/wheel/<hash of the sources>/) with
meson-python's build directory, so a rebuild after a change is incremental.
PyPI is reached for the build's tools and the venv's packages (pinned:
pyproject.toml, python/requirements/); pip's cache keeps them.
"""
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("CTXS_BUILD_DIR") or os.path.join(ROOT, "build")
REQS = os.path.join(ROOT, "python", "requirements")
LLAMA_PREFIX = os.path.join(BUILD, "llama.cpp", "prefix")
LLAMA_SDIST = os.path.join(BUILD, "llama.cpp", "dl", "llama_cpp_python-0.3.36.tar.gz")
SMOLLM2 = os.environ.get("CTXS_SMOLLM2", "")
# The README's block as examples/python/test_readme.py takes it.
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
from test_readme import readme_python_block  # noqa: E402

# What goes into the wheel; its hash names the cached wheel.
SOURCES = ["meson.build", "meson_options.txt", "pyproject.toml", "include", "src",
           "python/meson.build", "python/ctxstore", "python/README.md",
           "examples", "bench", "fuzz"]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}: exit {p.returncode}\n" \
                              f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def sources_hash():
    h = hashlib.sha256()
    for top in SOURCES:
        path = os.path.join(ROOT, top)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
            if "__pycache__" not in d)
        for f in files:
            h.update(os.path.relpath(f, ROOT).encode() + b"\0")
            with open(f, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
    h.update(b"llama" if os.path.exists(os.path.join(LLAMA_PREFIX, "lib", "pkgconfig")) else b"")
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def wheel():
    cache = os.path.join(BUILD, "python", "wheel")
    out = os.path.join(cache, sources_hash())
    found = glob.glob(os.path.join(out, "ctxstore-*.whl"))
    if found:
        return found[0]
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
           "-w", out, "--config-settings=build-dir=" + os.path.join(cache, "build"), ROOT]
    pc = os.path.join(LLAMA_PREFIX, "lib", "pkgconfig")
    if os.path.isdir(pc):  # the llama.cpp adapter too: ctxstore.llama
        cmd.append(f"--config-settings=setup-args=-Dpkg_config_path={pc}")
    run(cmd, timeout=1500)
    [whl] = glob.glob(os.path.join(out, "ctxstore-*.whl"))
    # Older wheels of other sources: gone.
    for d in os.listdir(cache):
        if d not in ("build", os.path.basename(out)):
            shutil.rmtree(os.path.join(cache, d), ignore_errors=True)
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    d = tmp_path_factory.mktemp("venv") / "v"
    run([sys.executable, "-m", "venv", str(d)], timeout=300)
    py = str(d / "bin" / "python")
    run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", wheel,
         "-r", os.path.join(REQS, "wheel-test.txt")], timeout=900)
    return py


def test_wheel_holds_the_library_and_the_version(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "ctxstore/__init__.py" in names and "ctxstore/libctxstore.so" in names
    assert any(re.match(r"ctxstore/_ctxstore\..*\.so$", n) for n in names)
    assert not any(n.endswith((".h", ".pc", ".a")) or "/bin/" in n for n in names), names
    with open(os.path.join(ROOT, "meson.build")) as f:
        version = re.search(r"version: '([^']+)'", f.read()).group(1)
    assert os.path.basename(wheel).startswith(f"ctxstore-{version}-")


def test_installs_with_pips_numpy_and_no_torch(venv, tmp_path):
    p = run([venv, "-c", "import ctxstore, numpy, importlib.util, sys; "
             "print(ctxstore.__file__); print(numpy.__version__, numpy.__file__); "
             "print(ctxstore.__version__); print(importlib.util.find_spec('torch'))"],
            cwd=tmp_path, timeout=120)
    where, numpy_line, version, torch = p.stdout.split("\n")[:4]
    venv_dir = os.path.dirname(os.path.dirname(venv))
    assert where.startswith(venv_dir), where
    assert numpy_line.split()[1].startswith(venv_dir) and numpy_line.startswith("2.")
    assert torch == "None"
    assert version == "0.1.0" or re.match(r"\d+\.\d+\.\d+$", version)


def test_readme_python_section_runs_in_the_venv(venv, tmp_path):
    p = subprocess.run([venv, "-c", readme_python_block()], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() and "Traceback" not in p.stderr


def test_package_tests_pass_against_the_installed_wheel(venv, tmp_path):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(tmp_path))
    env.pop("PYTHONPATH", None)
    p = subprocess.run([venv, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(ROOT, "python", "tests")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    tail = p.stdout[-3000:] + p.stderr[-2000:]
    assert p.returncode == 0, tail
    summary = p.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, summary
    print("python/tests in the venv:", summary)


LLAMA_SMOKE = r"""
import sys, ctxstore, ctxstore.llama as cl
llm = cl.load(sys.argv[1], n_ctx=512, n_batch=32, n_ubatch=32, n_threads=2, verbose=False)
with ctxstore.Store(sys.argv[2], create=True) as st:
    with cl.Conversation(llm, st, "chat", "Hello") as c:
        first = c.how
        llm.eval(llm.tokenize(b"Hello there, how are you?"))
        n = c.n_tokens
    with cl.Conversation(llm, st, "chat") as c:
        print(first, n, c.how, c.n_tokens, llm.n_tokens, cl.libllama_paths()[0])
"""


def test_llama_conversation_from_the_wheel(wheel, venv, tmp_path):
    if "ctxstore/llama.py" not in zipfile.ZipFile(wheel).namelist() or \
            not any("_llama." in n for n in zipfile.ZipFile(wheel).namelist()):
        pytest.skip("the wheel has no llama.cpp adapter (llama.cpp was not found)")
    if not os.path.exists(LLAMA_SDIST) or not os.path.exists(SMOLLM2):
        pytest.skip("no llama-cpp-python source or SmolLM2 (scripts/build-llama.sh)")
    env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF",
               PIP_CONSTRAINT=os.path.join(REQS, "llama.txt"))
    env.pop("LLAMA_CPP_LIB_PATH", None)  # ctxstore.llama points it at the adapter's
    env.pop("PYTHONPATH", None)
    run([venv, "-m", "pip", "install", "--disable-pip-version-check", "-q",
         "-r", os.path.join(REQS, "llama.txt")], env=env, timeout=900)
    run([venv, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
         LLAMA_SDIST], env=env, timeout=900)
    p = run([venv, "-c", LLAMA_SMOKE, SMOLLM2, str(tmp_path / "s")], env=env, cwd=tmp_path,
            timeout=300)
    first, n, how, m, llm_n, lib = p.stdout.split()
    assert first == "created" and how == "resumed" and int(n) > 3
    assert int(m) == int(n) == int(llm_n)
    assert os.path.realpath(lib).startswith(os.path.realpath(LLAMA_PREFIX))
