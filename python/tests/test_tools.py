"""Progress callbacks (export, import, compact), file inspection, tokenizer
hashes of token strings, the memory-pressure watcher, and torch views of a
read-only session."""
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import ctxstore
from conftest import append


@pytest.fixture
def store(tmp_path, model):
    with ctxstore.Store(tmp_path / "store", create=True) as st:
        st.register_model(model, "tiny")
        yield st


class Calls:
    """A progress callable that records its calls and the thread they came
    on, and whether it held the GIL (it runs Python: it must)."""

    def __init__(self, fail_at=None):
        self.calls, self.threads, self.fail_at = [], set(), fail_at

    def __call__(self, done, total):
        self.calls.append((done, total))
        self.threads.add(threading.get_ident())
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyError("stop here")


def test_export_and_import_report_progress(store, model, tmp_path):
    with store.create_session("src", model, capacity=512) as s:
        for turn in range(5):
            append(s, range(turn * 60, turn * 60 + 60))
    out = tmp_path / "src.ctxe"
    exp = Calls()
    store.export("src", out, progress=exp)
    assert exp.calls[-1] == (300, 300), exp.calls
    assert all(d <= t for d, t in exp.calls)
    assert [d for d, _ in exp.calls] == sorted(d for d, _ in exp.calls)
    assert exp.threads == {threading.get_ident()}
    imp = Calls()
    with ctxstore.Store(tmp_path / "other", create=True) as st2:
        assert st2.import_(out, name="copy", progress=imp) == "copy"
        assert imp.calls[-1] == (2 * out.stat().st_size, 2 * out.stat().st_size)
        with st2.open_session("copy", model) as s:
            assert s.n_tokens == 300


def test_progress_exception_is_raised_after_the_operation(store, model, tmp_path):
    with store.create_session("src", model, capacity=512) as s:
        append(s, range(200))
    out = tmp_path / "src.ctxe"
    cb = Calls(fail_at=1)
    with pytest.raises(KeyError, match="stop here"):
        store.export("src", out, progress=cb)
    assert len(cb.calls) == 1  # not called again after it raised
    assert out.exists()  # the export itself was not stopped
    with pytest.raises(TypeError, match="progress"):
        store.export("src", tmp_path / "again.ctxe", progress=42)


def test_compact_reports_sessions(store, model):
    for name in ("a", "b", "c"):
        with store.create_session(name, model, capacity=64) as s:
            append(s, range(10))
    cb = Calls()
    r = store.compact(progress=cb)
    assert r.sessions == 3
    assert cb.calls[-1] == (3, 3)
    one = Calls()
    store.compact("a", progress=one)
    assert one.calls[-1] == (1, 1)


def session_file(tmp_path, store, name):
    """A session's file: sessions/<id as 16 hex digits>.ctxs of the store."""
    return tmp_path / "store" / "sessions" / f"{store.session(name).id:016x}.ctxs"


def test_inspect_a_good_a_damaged_and_a_missing_file(store, model, tmp_path):
    with store.create_session("chat", model, capacity=64) as s:
        append(s, range(7))
        live = ctxstore.inspect(session_file(tmp_path, store, "chat"))
        assert live.writer_open and live.status == 0
        assert live.writer_pid == os.getpid()
        with open("/proc/self/comm") as f:
            assert live.writer_command == f.read().strip()
    path = session_file(tmp_path, store, "chat")
    r = ctxstore.inspect(path)
    assert r.status == 0 and r.header_status == 0 and r.header_crc_ok
    assert r.model == model and r.capacity == 64 and not r.writer_open
    assert r.writer_pid == 0 and r.writer_command == ""
    assert r.label_name == "chat" and r.label_status == 0
    cur = [rec for rec in r.records if rec.current]
    assert len(cur) == 1 and cur[0].n_tokens == 7 and cur[0].status == 0
    # The header damaged: the report still comes, and says why it won't open.
    bad = tmp_path / "bad.ctxs"
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    bad.write_bytes(bytes(data))
    rb = ctxstore.inspect(bad)
    assert rb.status != 0 and not rb.header_crc_ok and rb.model is None
    with pytest.raises(ctxstore.Error) as e:
        ctxstore.inspect(tmp_path / "missing.ctxs")
    assert e.value.code == -errno.ENOENT


def test_tokenizer_hash_strings():
    h = ctxstore.tokenizer_hash_strings(["ab", "c", "<|end|>"])
    assert isinstance(h, bytes) and len(h) == 16
    assert ctxstore.tokenizer_hash_strings([b"ab", b"c", "<|end|>"]) == h
    assert ctxstore.tokenizer_hash_strings(["a", "bc", "<|end|>"]) != h  # lengths count
    assert ctxstore.tokenizer_hash_strings(["é"]) == ctxstore.tokenizer_hash_strings(["é".encode()])
    assert ctxstore.tokenizer_hash_strings([]) != h
    with pytest.raises(TypeError, match="token 1"):
        ctxstore.tokenizer_hash_strings(["a", 3])


def test_watcher_sets_and_stops(tmp_path):
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo: the watcher has no source here")
    ctxstore.set_pressure(False)
    # A floor above any machine's memory: pressure at the first look.
    ctxstore.watcher_start(poll_ms=20, min_available=1 << 62, psi_some_avg10=0)
    try:
        deadline = time.monotonic() + 5
        while not ctxstore.get_pressure() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ctxstore.get_pressure()
        with pytest.raises(ctxstore.Error) as e:
            ctxstore.watcher_start()
        assert e.value.code == -errno.EALREADY
    finally:
        ctxstore.watcher_stop()
        ctxstore.set_pressure(False)
    assert not ctxstore.get_pressure()
    # A floor of 0 and no PSI: never pressure.
    ctxstore.watcher_start(poll_ms=20, min_available=0, psi_some_avg10=0)
    time.sleep(0.1)
    ctxstore.watcher_stop()
    assert not ctxstore.get_pressure()


READONLY_TORCH = textwrap.dedent("""
    import sys, ctxstore
    model = ctxstore.Model(2, 2, 16, model_hash=b"m" * 16)
    s = ctxstore.Session.open(sys.argv[1], model, readonly=True)
    try:
        t = s.torch_k(0)
    except ctxstore.Error as e:
        print("refused", e.code, e)
        sys.exit(0)
    t[0, 0, 0] = 1.0   # the pages are PROT_READ: this kills the process
    print("wrote")
""")


def test_torch_view_of_a_read_only_session_is_refused(tmp_path, model):
    pytest.importorskip("torch")
    path = tmp_path / "ro.ctxs"
    with ctxstore.Session.create(path, model, capacity=64) as s:
        append(s, range(3))
    # In a child: where a writable-looking tensor were handed out, the
    # write would kill that process.
    p = subprocess.run([sys.executable, "-c", READONLY_TORCH, str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert p.stdout.startswith(f"refused {ctxstore.EREADONLY} "), p.stdout
    assert "NumPy view" in p.stdout
    with ctxstore.Session.open(path, model, readonly=True) as s:
        assert not s.k(0).flags.writeable
        with pytest.raises(ValueError):
            s.k(0)[0, 0, 0] = 1
    with ctxstore.Session.open(path, model) as s:  # a writer's views: torch is fine
        s.torch_k(0)
