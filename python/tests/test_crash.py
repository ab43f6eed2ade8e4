"""A writer SIGKILLed mid-turn loses no committed token."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ctxstore
from conftest import D, H, L, token_kv

CHILD = textwrap.dedent("""
    import sys, numpy as np, ctxstore
    sys.path.insert(0, sys.argv[3])
    from conftest import append, token_kv
    path, mode = sys.argv[1], sys.argv[2]
    model = ctxstore.Model(2, 2, 16, model_hash=b"m" * 16)
    # Room for a thousand turns and no ring: a kill that lands a moment
    # after the parent asked for it still finds every token from the first.
    s = ctxstore.Session.create(path, model, capacity=8192, n_sink=4, ring=False)
    turn = 0
    while True:
        ids = [turn * 100 + i for i in range(7)]
        append(s, ids)
        turn += 1
        print("committed", s.n_tokens, flush=True)
        if mode == "midturn" and turn == 5:
            r = s.reserve(9)          # a turn under way: reserved, half written
            for i in range(4):
                s.write_token(r, i, *token_kv(r.first_pos + i))
            print("midturn", flush=True)
            sys.stdin.read()          # wait here to be killed
""")


def expected_ids(n):
    return [t * 100 + i for t in range(n // 7 + 1) for i in range(7)][:n]


def check(path, model, at_least, exactly=None):
    with ctxstore.Session.open(path, model) as s:
        n = s.n_tokens
        assert n >= at_least
        if exactly is not None:
            assert n == exactly
        assert n % 7 == 0  # whole turns only
        assert s.tokens().tolist() == expected_ids(n)
        for pos in range(n):
            k, v = s.read_token(pos)
            np.testing.assert_array_equal(k, token_kv(pos)[0])
            np.testing.assert_array_equal(v, token_kv(pos)[1])
        s.verify()
        # The session goes on where it stopped.
        r = s.reserve(1)
        assert r.first_pos == n
        s.write_token(r, 0, *token_kv(n))
        s.commit([1])
        assert s.n_tokens == n + 1


def spawn(path, mode):
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(path), mode, here],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_sigkill_mid_turn_loses_no_committed_token(tmp_path, model):
    path = tmp_path / "k.ctxs"
    p = spawn(path, "midturn")
    last = 0
    for line in p.stdout:
        if line.startswith("committed"):
            last = int(line.split()[1])
        elif line.startswith("midturn"):
            break
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert p.returncode == -signal.SIGKILL and last == 35
    check(path, model, at_least=35, exactly=35)


@pytest.mark.parametrize("after", [1, 3, 9])
def test_sigkill_anywhere_loses_no_committed_token(tmp_path, model, after):
    path = tmp_path / "a.ctxs"
    p = spawn(path, "loop")
    last = 0
    for line in p.stdout:
        last = int(line.split()[1])
        if last >= after * 7:
            break
    os.kill(p.pid, signal.SIGKILL)  # while it keeps writing turns
    p.wait()
    p.stdout.close()
    p.stdin.close()
    check(path, model, at_least=last)
