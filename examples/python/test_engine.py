"""The PyTorch engine of llama.py over real session files: the same tokens
must come out whether a run is uninterrupted, closed and reopened, or
SIGKILLed mid-turn in a real child process (chat.py) and resumed; a session
of another model is refused; and the streams must vary, for those
comparisons to mean something.

The kill points come from CTXS_TEST_SEED when set, else from the clock, and
are printed (pytest shows them on a failure).
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import numpy as np
import torch

import ctxstore

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama  # noqa: E402

PROMPT = b"Once upon a time, in a session file,"
N_GEN = 48
CAPACITY = 256  # the whole run fits: no ring wrap, full window


@pytest.fixture(scope="module", autouse=True)
def deterministic():
    llama.make_deterministic()


@pytest.fixture(scope="module")
def model():
    return llama.Model(llama.small())


def held_tokens(path, m):
    with ctxstore.Session.open(path, readonly=True) as s:
        return [int(t) for t in s.tokens(0, s.n_tokens)]


def uninterrupted(path, m, n_gen=N_GEN):
    """The reference: prompt, then n_gen tokens in one open. Returns the
    session's tokens and the prediction after them."""
    with llama.Engine(m, llama.create_session(path, m, capacity=CAPACITY)) as e:
        e.feed(list(PROMPT))
        e.generate(n_gen)
        return [int(t) for t in e.session.tokens(0, e.session.n_tokens)], e.next_id


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ref") / "ref.ctxs")
    return uninterrupted(path, model)


def test_stream_varies_and_depends_on_the_seed(reference, tmp_path):
    toks, _ = reference
    gen = toks[len(PROMPT):]
    assert len(gen) == N_GEN
    assert len(set(gen)) >= 8, gen
    other = llama.Model(llama.small(seed=2))
    toks2, _ = uninterrupted(str(tmp_path / "seed2.ctxs"), other)
    assert toks2[len(PROMPT):] != gen


def test_prompt_in_one_batch_gives_the_logits_of_steps(model, tmp_path):
    """The batch path and the one-token path agree to float32 rounding (the
    resumes do not rely on it: a prompt's last token is computed alone)."""
    with llama.Engine(model, llama.create_session(str(tmp_path / "a.ctxs"), model,
                                                  capacity=CAPACITY)) as ea, \
            llama.Engine(model, llama.create_session(str(tmp_path / "b.ctxs"), model,
                                                     capacity=CAPACITY)) as eb:
        ea.feed(list(PROMPT))
        for t in PROMPT:
            eb.step(t)
        assert torch.allclose(ea.logits, eb.logits, rtol=1e-4, atol=1e-5)
        assert ea.next_id == eb.next_id


def test_kv_is_in_the_session_views(model, tmp_path):
    """What the engine attends over is the mapping: a read-only open in the
    same process sees the K/V the writer stored, slot for slot."""
    path = str(tmp_path / "v.ctxs")
    with llama.Engine(model, llama.create_session(path, model, capacity=CAPACITY)) as e:
        e.feed(list(PROMPT))
        n = e.session.n_tokens
        with ctxstore.Session.open(path, readonly=True) as r:
            for layer in (0, model.cfg.n_layers - 1):
                # A read-only session has NumPy views only (torch has no
                # read-only tensors): its bits, against the writer's view.
                got = r.k(layer)[:, :n].view(np.int16)
                want = e.views[layer][0][:, :n].contiguous().view(torch.int16).numpy()
                assert np.array_equal(got, want)
                assert np.abs(r.k(layer)[:, :n].astype(np.float32)).sum() > 0


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_close_and_reopen_resumes_exactly(dtype, tmp_path):
    m = llama.Model(llama.small(dtype=dtype))
    ref, ref_next = uninterrupted(str(tmp_path / "ref.ctxs"), m)
    path = str(tmp_path / "chat.ctxs")
    with llama.Engine(m, llama.create_session(path, m, capacity=CAPACITY)) as e:
        e.feed(list(PROMPT))
        e.generate(5)
    left = N_GEN - 5
    while left:
        with llama.Engine(m, llama.open_session(path, m)) as e:
            e.resume()
            n = min(left, 11)
            e.generate(n)
            left -= n
            nxt = e.next_id
    assert held_tokens(path, m) == ref
    assert nxt == ref_next


def chat(args, **kw):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "chat.py")] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_sigkill_mid_turn_resumes_exactly(model, reference, tmp_path):
    """chat.py generates the reply; it is SIGKILLed at random moments (often
    in the middle of a token's forward pass, with a reservation out), and
    each next run resumes. No committed token is lost, every printed token
    is committed, and the whole conversation is the uninterrupted one."""
    seed = int(os.environ.get("CTXS_TEST_SEED", time.time_ns() % 1000003))
    print(f"CTXS_TEST_SEED={seed}")
    rng = random.Random(seed)
    ref, _ = reference
    path = str(tmp_path / "killed.ctxs")
    args = ["--session", path, "--capacity", str(CAPACITY)]
    first = True
    kills = 0
    while kills < 3:
        committed = len(PROMPT) if first else len(held_tokens(path, model))
        left = len(ref) - committed
        if left < 4:
            break
        p = chat(args + (["--prompt", PROMPT.decode()] if first else [])
                 + ["--generate", str(left)])
        want = rng.randrange(1, left - 1)  # tokens to see printed before the kill
        printed = []
        for _ in range(want):
            line = p.stdout.readline()
            assert line, p.stderr.read().decode()
            printed.append(int(line))
        # A step of the small model takes about 3 ms, mostly its forward
        # pass: most kills land in one, a reservation out.
        time.sleep(rng.uniform(0, 0.004))
        p.send_signal(signal.SIGKILL)
        p.wait()
        printed += [int(x) for x in p.stdout.read().split()]
        p.stdout.close()
        p.stderr.close()
        assert p.returncode == -signal.SIGKILL
        kills += 1
        first = False
        held = held_tokens(path, model)
        # Printed only once committed: at most the token being printed when
        # the kill came is committed and not printed.
        assert held[committed:committed + len(printed)] == printed
        assert len(printed) <= len(held) - committed <= len(printed) + 1
        assert held == ref[:len(held)], f"seed {seed}"
    p = chat(args + ["--generate", str(len(ref) - len(held_tokens(path, model)))])
    out, err = p.communicate()
    assert p.returncode == 0, err.decode()
    assert held_tokens(path, model) == ref, f"seed {seed}"


def test_a_wrong_model_is_refused(model, reference, tmp_path):
    path = str(tmp_path / "chat.ctxs")
    uninterrupted(path, model, n_gen=2)
    for other in (llama.small(seed=2), llama.small(dtype="bf16"), llama.small(d_model=32)):
        with pytest.raises(ctxstore.Error) as e:
            llama.open_session(path, llama.Model(other))
        assert e.value.name == "CTXS_EMODEL"
    p = chat(["--session", path, "--seed", "2", "--generate", "3"])
    out, err = p.communicate()
    assert p.returncode == 1
    assert out == b""
    assert b"CTXS_EMODEL" in err or b"another model" in err, err


def test_resume_with_another_window_is_caught(model, tmp_path):
    """The K/V a resume recomputes depend on what the earlier layers read:
    a session reopened with another window recomputes other bits, and the
    engine says so instead of going on with another conversation."""
    path = str(tmp_path / "w.ctxs")
    uninterrupted(path, model, n_gen=20)
    with llama.Engine(model, llama.open_session(path, model, window=8)) as e:
        with pytest.raises(llama.ResumeMismatch):
            e.resume()
