"""The remote tier from Python, against a real redis-server on the loopback
(as tests/redis_server.c starts one): push, pull, pull_prefix, ls, stats,
info, the background pusher, and errors with the library's codes."""
import errno
import os
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

import ctxstore
from conftest import append, token_kv

REDIS = os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server") or "/usr/bin/redis-server"
PASSWORD = "s3cret-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ping(port, password):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
            c.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            got = b""
            while got.count(b"\r\n") < 2:
                chunk = c.recv(100)
                if not chunk:
                    return False
                got += chunk
            return got.endswith(b"+PONG\r\n")
    except OSError:
        return False


class Redis:
    """A redis-server of our own: no persistence, loopback only, a
    password; stopped at the end. A port another process took meanwhile
    makes it exit: then another port is tried."""

    def __init__(self, tmp_path, maxmemory=0):
        if not os.access(REDIS, os.X_OK):
            pytest.skip(f"no redis-server ({REDIS}); scripts/bootstrap.sh installs it")
        for _ in range(5):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", PASSWORD,
                 "--maxmemory", str(maxmemory), "--maxmemory-policy", "allkeys-lru",
                 "--logfile", "redis.log"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                if ping(self.port, PASSWORD):
                    return
                time.sleep(0.02)
            self.stop()
        pytest.fail("redis-server did not start")

    @property
    def url(self):
        return f"redis://:{PASSWORD}@127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.stop()


def make_store(path, model):
    st = ctxstore.Store(path, create=True)
    st.register_model(model, "tiny")
    return st


def test_push_then_pull_on_another_store(tmp_path, model, redis):
    with make_store(tmp_path / "a", model) as a, \
            a.remote(redis.url, push_on_commit=False) as ra:
        with a.create_session("chat", model, capacity=512) as s:
            append(s, range(150))  # two whole chunks and a tail of 22
        calls = []
        pushed = ra.push("chat", progress=lambda d, t: calls.append((d, t)))
        assert pushed.n_tokens == 150 and pushed.chunks_sent == 3 and pushed.bytes_sent > 0
        assert calls[-1] == (150, 150)
        again = ra.push("chat")
        assert again.chunks_sent <= 1 and again.chunks_present >= 2  # shared, not resent
        [e] = ra.ls()
        assert e.name == "chat" and e.n_tokens == 150 and e.tail_pushed and e.status == 0
        assert e.model_hash == model.model_hash
        st = ra.stats()
        assert st.chunks_pushed >= 3 and st.chunks_dropped == 0
        info = ra.info()
        assert info.server_version and info.keys >= 4
        assert info.maxmemory_policy == "allkeys-lru"
    with make_store(tmp_path / "b", model) as b, b.remote(redis.url) as rb:
        r = rb.pull("chat", "mine", open=True)
        assert r.n_tokens == 150 and r.remote_tokens == 150 and r.chunks_pulled == 3
        assert r.chunks_missing == 0 and r.chunks_refused == 0 and len(r.rest_ids) == 0
        assert r.model == model
        with r.session as s:
            assert s.tokens().tolist() == list(range(150))
            k, v = s.read_token(149)
            np.testing.assert_array_equal(k, token_kv(149)[0])
            np.testing.assert_array_equal(v, token_kv(149)[1])
        assert "mine" in b and "chat" not in b
        # pull_on_open: opening a name the store lacks pulls it.
        with b.open_session("chat", model) as s:
            assert s.n_tokens == 150


def test_pull_prefix_and_a_background_push(tmp_path, model, redis):
    with make_store(tmp_path / "a", model) as a, a.remote(redis.url) as ra:
        with a.create_session("sys", model, capacity=512) as s:
            append(s, range(1000, 1130))  # pushed by the background thread
        stats = ra.flush(10000)
        assert stats.jobs_queued == 0 and stats.chunks_pushed >= 2
    prompt = list(range(1000, 1130)) + [7, 8, 9]
    with make_store(tmp_path / "b", model) as b, b.remote(redis.url) as rb:
        r = rb.pull_prefix("new", model, prompt)
        assert r.session is None and r.n_tokens == 128  # the whole chunks it shares
        with b.open_session("new", model) as s:
            assert s.tokens().tolist() == prompt[:128]
        with pytest.raises(ctxstore.Error) as e:
            rb.pull_prefix("none", model, [5] * 100)
        assert e.value.code == ctxstore.ENOTFOUND


def test_evicted_chunk_ends_the_pull_with_the_rest_to_prefill(tmp_path, model, redis):
    with make_store(tmp_path / "a", model) as a, \
            a.remote(redis.url, push_on_commit=False, key_prefix="evict") as ra:
        with a.create_session("chat", model, capacity=512) as s:
            append(s, range(200))
        ra.push("chat")
    # Evict the second chunk the way Redis would: its key is gone.
    keys = redis_cmd(redis, "KEYS", "evict:chunk:*")
    assert len(keys) == 4
    with make_store(tmp_path / "probe", model) as p, \
            p.remote(redis.url, key_prefix="evict") as rp:
        full = rp.pull("chat", "probe")
        assert full.n_tokens == 200
    # Which key is which chunk is the chain's business: drop each in turn
    # until a pull stops short, and check what it says is left.
    for key in keys:
        value = redis_cmd(redis, "DUMP", key)
        redis_cmd(redis, "DEL", key)
        with make_store(tmp_path / f"b-{key[-8:]}", model) as b, \
                b.remote(redis.url, key_prefix="evict") as rb:
            r = rb.pull("chat")
            assert r.chunks_missing == 1 and r.n_tokens < 200 and r.n_tokens % 64 == 0
            assert r.rest_ids.tolist() == list(range(r.n_tokens, 200))
        redis_cmd(redis, "RESTORE", key, "0", value)


def redis_cmd(redis, *args):
    """One command through redis-cli-less RESP on a socket: its reply
    (a list of keys, bytes, or a status)."""
    def enc(a):
        a = a if isinstance(a, bytes) else str(a).encode()
        return b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as c:
        f = c.makefile("rb")
        c.sendall(b"*2\r\n" + enc("AUTH") + enc(PASSWORD))
        assert f.readline() == b"+OK\r\n"
        c.sendall(b"*%d\r\n" % len(args) + b"".join(enc(a) for a in args))
        return read_reply(f)


def read_reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":"):
        return rest.decode()
    if kind == b"-":
        raise AssertionError(rest.decode())
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        return [x.decode() if isinstance(x, bytes) else x
                for x in (read_reply(f) for _ in range(int(rest)))]
    raise AssertionError(line)


def test_errors_carry_the_library_codes(tmp_path, model, redis):
    with make_store(tmp_path / "a", model) as a:
        with pytest.raises(ctxstore.Error) as e:
            a.remote(f"redis://:wrong@127.0.0.1:{redis.port}")
        assert e.value.code == -errno.EACCES and e.value.name == "EACCES"
        with pytest.raises(ctxstore.Error) as e:
            a.remote(f"redis://127.0.0.1:{free_port()}", timeout_ms=500)
        assert e.value.code == -errno.ECONNREFUSED
        with pytest.raises(ctxstore.Error) as e:
            a.remote("rediss://127.0.0.1:1")
        assert e.value.code == ctxstore.EINVAL
        with a.remote(redis.url) as ra:
            with pytest.raises(ctxstore.Error) as e:
                a.remote(redis.url)
            assert e.value.code == ctxstore.EBUSY
            with pytest.raises(ctxstore.Error) as e:
                ra.push("missing")
            assert e.value.code == ctxstore.ENOTFOUND and "push 'missing'" in str(e.value)
            with pytest.raises(ctxstore.Error) as e:
                ra.pull("missing")
            assert e.value.code == ctxstore.ENOTFOUND
            with a.create_session("taken", model, capacity=64) as s:
                append(s, range(3))
            ra.push("taken")
            with pytest.raises(ctxstore.Error) as e:
                ra.pull("taken")  # the local name exists
            assert e.value.code == ctxstore.ETAKEN
        assert ra.closed
        with pytest.raises(ctxstore.Error, match="closed"):
            ra.ls()
        # The server gone: a call ends with the network's error.
        ra2 = a.remote(redis.url, timeout_ms=500, call_ms=2000)
        redis.stop()
        with pytest.raises(ctxstore.Error) as e:
            ra2.ls()
        assert e.value.code in (-errno.ECONNREFUSED, -errno.ECONNRESET, -errno.EPIPE,
                                -errno.ETIMEDOUT)
        ra2.close(0)
