"""ctxstore.llama with llama-cpp-python and real models (SmolLM2-135M;
Gemma 3 270M, whose window layers hold 512 positions): a Python chat
(examples/python/llama_cpp_chat.py) SIGKILLed mid-generation and resumed
gives the tokens of a chat that never stopped; prefix reuse; regenerating
from a checkpoint; one libllama in the process; the context it needs.

Run in build/python-venv (scripts/python-env.sh: llama-cpp-python built
without its own llama.cpp) with the build tree's package: meson sets
PYTHONPATH, LLAMA_CPP_LIB_PATH, CTXS_SMOLLM2 and CTXS_GEMMA3; a test skips,
saying why, where a model or llama-cpp-python is missing. CTXS_TEST_SEED
replays a run's kill points.
"""
import os
import random
import signal
import subprocess
import sys
import tempfile

import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed "
                                "(scripts/python-env.sh makes build/python-venv)")
import ctxstore  # noqa: E402
import ctxstore.llama as cl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "..", "..", "examples", "python", "llama_cpp_chat.py")
MODELS = {"smollm2": os.environ.get("CTXS_SMOLLM2", ""), "gemma3": os.environ.get("CTXS_GEMMA3", "")}
# The conversation of the C adapter's tests (tests/test_llama.py), four turns
# of it. Gemma 3's window layers see 512 positions: its chat goes past them,
# where what they hold and what the session holds part ways.
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests"))
from test_llama import MESSAGES as C_MESSAGES, SYSTEM  # noqa: E402

MESSAGES = C_MESSAGES[:4]
LONG_SYSTEM = SYSTEM + " " + " ".join(["Keep a friendly tone."] * 60)


def model_path(name):
    path = MODELS[name]
    if not path or not os.path.exists(path):
        pytest.skip(f"{name}: no GGUF file ({path or 'not configured'}); "
                    "scripts/build-llama.sh installs it")
    return path


def seed():
    s = int(os.environ.get("CTXS_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"seed {s} (CTXS_TEST_SEED={s} replays it)")
    return s


def chat(model, store, name, extra=(), messages=MESSAGES, kill_when=None):
    """One llama_cpp_chat process; its stderr events read as they come, and
    SIGKILLed once kill_when(event) holds. Returns (events, killed)."""
    system = LONG_SYSTEM if model == MODELS["gemma3"] else SYSTEM
    args = [sys.executable, CHAT, "--model", model, "--store", store, "--system", system,
            "--max-tokens", "40", "--batch", "32", *extra, name]
    with tempfile.TemporaryFile("w+") as stdin:
        stdin.write("".join(m + "\n" for m in messages))
        stdin.seek(0)
        p = subprocess.Popen(args, stdin=stdin, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    events, killed = [], False
    for line in p.stderr:
        events.append(line.rstrip("\n"))
        if kill_when and kill_when(events[-1]):
            p.send_signal(signal.SIGKILL)
            killed = True
            break
    rc = p.wait()
    if not killed:
        assert rc == 0, f"llama_cpp_chat exited {rc}: {events[-8:]}"
    return events, killed


def numbers(events, word):
    return [int(e.split()[len(word.split())]) for e in events if e.startswith(word + " ")]


def read_ids(path):
    with open(path) as f:
        return [int(x) for x in f.read().split()]


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_killed_generation_resumes_token_identical(name, tmp_path):
    model = model_path(name)
    rng = random.Random(seed())
    ref_ids = str(tmp_path / "ref.ids")
    events, _ = chat(model, str(tmp_path / "ref"), "chat", ["--tokens-out", ref_ids])
    saved = numbers(events, "saved")
    # Mid-reply: a save of one generated token, with at least one before it
    # in the same reply, so that the resumed chat decodes the last saved
    # token again alone, as it was decoded.
    mid_reply = [n for i, n in enumerate(saved[2:], 2)
                 if n - saved[i - 1] == 1 and saved[i - 1] - saved[i - 2] == 1]
    points = sorted(rng.sample(mid_reply, 2))
    print(f"kills at {points} of {saved[-1]}")
    store = str(tmp_path / "killed")
    resumed = []
    for at in points:
        events, killed = chat(model, store, "chat",
                              kill_when=lambda e, at=at: e.startswith("saved ") and
                              int(e.split()[1]) >= at)
        assert killed, "the chat ended before the kill point"
        resumed += numbers(events, "resumed")
    got_ids = str(tmp_path / "got.ids")
    events, _ = chat(model, store, "chat", ["--tokens-out", got_ids])
    resumed += numbers(events, "resumed")
    assert len(resumed) == 2 and resumed[0] >= points[0] and resumed[-1] >= points[1]
    ref, got = read_ids(ref_ids), read_ids(got_ids)
    assert len(ref) > (600 if name == "gemma3" else 200)
    first_diff = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b),
                      min(len(got), len(ref)))
    assert got == ref, f"the resumed chat diverges at token {first_diff} (resumed at {resumed})"


def test_prefix_is_forked_and_the_reply_matches_a_cold_prefill(tmp_path):
    model = model_path("smollm2")
    store = str(tmp_path / "s")
    chat(model, store, "first", messages=MESSAGES[:1])
    ids = str(tmp_path / "b.ids")
    events, _ = chat(model, store, "second", ["--tokens-out", ids],
                     messages=["Tell me about Spain."])
    forked = [e for e in events if e.startswith("forked ")]
    assert forked and forked[0].endswith(" from first"), events[:3]
    shared = int(forked[0].split()[1])
    assert shared >= 64
    # Only what follows the shared tokens was decoded.
    assert numbers(events, "saved")[0] - shared <= 32
    cold = str(tmp_path / "c.ids")
    chat(model, str(tmp_path / "cold"), "second", ["--tokens-out", cold],
         messages=["Tell me about Spain."])
    assert read_ids(ids) == read_ids(cold)


@pytest.fixture
def llm():
    path = model_path("smollm2")
    m = cl.load(path, n_ctx=1024, n_batch=32, n_ubatch=32, n_threads=2, verbose=False)
    yield m
    m.close()


def test_one_libllama_and_the_context_it_needs(llm, tmp_path):
    paths = cl.libllama_paths()
    assert len(paths) == 1
    assert paths[0] == os.path.realpath(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"],
                                                     "libllama.so"))
    p = llm.context_params
    assert p.n_seq_max >= 2 and p.kv_unified and p.swa_full
    plain = llama_cpp.Llama(model_path("smollm2"), n_ctx=256, verbose=False)
    with ctxstore.Store(tmp_path / "s", create=True) as st:
        with pytest.raises(ValueError, match="n_seq_max"):
            cl.Conversation(plain, st, "x")
        cl.prepare(plain)
        with cl.Conversation(plain, st, "x", "Hello") as conv:
            assert conv.how == "created"
            out = plain.create_completion("Hello", max_tokens=4, temperature=0)
            assert out["choices"][0]["text"] is not None
            assert conv.n_tokens == plain.n_tokens > 0
        plain.close()
        with pytest.raises(ValueError, match="evaluates"):
            used = llama_cpp.Llama(model_path("smollm2"), n_ctx=256, verbose=False)
            try:
                used.eval([1, 2])
                cl.prepare(used)
            finally:
                used.close()


def reply(llm, prompt, n=12):
    out = []
    for tok in llm.generate(prompt, temp=0.0, repeat_penalty=1.0):
        out.append(tok)
        if len(out) == n:
            break
    return out


def test_checkpoint_regenerates_and_a_new_prompt_rolls_back(llm, tmp_path):
    prompt = llm.tokenize(b"<|im_start|>user\nName three colours.<|im_end|>\n"
                          b"<|im_start|>assistant\n", special=True)
    with ctxstore.Store(tmp_path / "s", create=True) as st:
        with cl.Conversation(llm, st, "c", prompt) as conv:
            llm.eval(prompt)
            assert conv.n_tokens == len(prompt)
            conv.checkpoint("asked")
            first = reply(llm, prompt)
            assert conv.n_tokens == len(prompt) + len(first) - 1  # the last is not evaluated
            conv.restore("asked")
            assert conv.n_tokens == llm.n_tokens == len(prompt)
            again = reply(llm, prompt)
            assert again == first
            # A prompt that differs after the first tokens: the Llama rewinds
            # to what it shares, and the session follows.
            other = prompt[:5] + llm.tokenize(b" something else", add_bos=False)
            reply(llm, other, n=2)
            assert conv.tokens()[:len(other)] == other
            assert conv.n_tokens == len(other) + 1
            with pytest.raises(ctxstore.Error) as e:
                conv.restore("never-made")
            assert e.value.code == ctxstore.ENOTFOUND
        with cl.Conversation(llm, st, "c") as conv:  # resumed where it ended
            assert conv.how == "resumed" and conv.n_tokens == len(other) + 1
            assert llm.n_tokens == conv.n_tokens
            assert list(llm.input_ids[:llm.n_tokens]) == conv.tokens()


def test_background_off_opens_the_session_without_the_thread_and_resumes(llm, tmp_path):
    """background=False: the session is created, opened and forked without
    the library's thread, and a chat resumed so continues as before."""
    prompt = llm.tokenize(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
                          "Name a fruit.<|im_end|>\n<|im_start|>assistant\n".encode(),
                          special=True)
    with ctxstore.Store(tmp_path / "s", create=True) as st:
        with cl.Conversation(llm, st, "c", prompt, background=False) as conv:
            assert not conv.session.info().background
            first = reply(llm, prompt)
            n = conv.n_tokens
        with cl.Conversation(llm, st, "c", background=False) as conv:
            assert conv.how == "resumed" and conv.n_tokens == n
            assert not conv.session.info().background
            assert list(llm.input_ids[:llm.n_tokens]) == conv.tokens()
        with cl.Conversation(llm, st, "c") as conv:
            assert conv.how == "resumed" and conv.session.info().background
        with cl.Conversation(llm, st, "d", prompt, capacity=512, background=False) as conv:
            assert conv.how == "forked" and not conv.session.info().background
            assert reply(llm, prompt) == first


def mapped_library(prefix):
    """The file of a shared library the process has mapped, by name."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(prefix):
                return parts[5].strip()
    pytest.fail(f"no {prefix}* mapped")


def test_attention_windows_are_the_models(llm):
    """ctxs_llama_attention_windows(): none for SmolLM2; Gemma 3's window
    layers read 512 positions, every sixth layer global; version 1 options
    and NULL refused."""
    import ctypes
    lib = ctypes.CDLL(mapped_library("libctxstore_llama."))
    lib.ctxs_llama_attention_windows.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    class OpenOptions(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("window", ctypes.c_uint32),
                    ("pressure_window", ctypes.c_uint32), ("durability", ctypes.c_uint32),
                    ("background", ctypes.c_uint32), ("attn_period", ctypes.c_uint32),
                    ("attn_window", ctypes.c_uint32), ("attn_global_mask", ctypes.c_uint32),
                    ("reserved", ctypes.c_uint8 * 16)]

    def windows(ctx, version=2):
        o = OpenOptions(version=version, attn_period=7, attn_window=7, attn_global_mask=7)
        rc = lib.ctxs_llama_attention_windows(ctypes.byref(o), ctx)
        return rc, (o.attn_period, o.attn_window, o.attn_global_mask)

    assert ctypes.sizeof(OpenOptions) == 48
    assert windows(llm._ctx.ctx) == (0, (0, 0, 0))
    g = cl.load(model_path("gemma3"), n_ctx=1024, verbose=False)
    try:
        assert windows(g._ctx.ctx) == (0, (6, 512, 1 << 5))
        einval = -32008  # CTXS_EINVAL
        assert windows(g._ctx.ctx, version=1) == (einval, (7, 7, 7))
        assert lib.ctxs_llama_attention_windows(None, g._ctx.ctx) == einval
    finally:
        g.close()


def test_gemma_sessions_plan_their_window_layers_created_or_resumed(tmp_path):
    """Gemma 3's window layers read their last 512 positions: its
    conversation's session, created with the context's capacity or with
    one of the app's (create options of its own), and resumed, plans them
    so (ctxs_llama_start() gives the handle the model's attention
    windows), and its global layers over every position."""
    g = cl.load(model_path("gemma3"), n_ctx=1024, verbose=False)
    try:
        prompt = g.tokenize(b"one two three four five six seven " * 100)
        assert 512 < len(prompt) < 1000

        def expect_windows(s, n):
            window, whole = s.attn_plan(layer=0), s.attn_plan(layer=5)
            assert (window.n_keys, window.spans[0].pos) == (512, n - 512), window
            assert (whole.n_keys, whole.spans[0].pos) == (n, 0), whole

        with ctxstore.Store(tmp_path / "s", create=True) as st:
            for name, capacity in [("a", None), ("b", 1000)]:
                g.reset()
                with cl.Conversation(g, st, name, capacity=capacity) as conv:
                    assert conv.how == "created"
                    g.eval(prompt)
                    expect_windows(conv.session, len(prompt))
            with cl.Conversation(g, st, "b") as conv:
                assert conv.how == "resumed" and conv.n_tokens == len(prompt)
                expect_windows(conv.session, len(prompt))
    finally:
        g.close()


def test_a_session_of_another_model_is_refused(tmp_path, llm):
    gemma = model_path("gemma3")
    with ctxstore.Store(tmp_path / "s", create=True) as st:
        with cl.Conversation(llm, st, "chat", "Hi") as conv:
            llm.eval(llm.tokenize(b"Hi"))
            assert conv.n_tokens > 0
        g = cl.load(gemma, n_ctx=512, verbose=False)
        try:
            with pytest.raises(ctxstore.Error) as e:
                cl.Conversation(g, st, "chat")
            assert e.value.code == ctxstore.EMODEL
        finally:
            g.close()


def readme_llama_block():
    root = os.path.join(HERE, "..", "..")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("\n## Python\n"):]
    section = section[:section.index("\n## ", 1)]
    blocks = [b.split("\n```", 1)[0] for b in section.split("```python\n")[1:]]
    [block] = [b for b in blocks if "ctxstore.llama" in b]
    return block


def test_readme_llama_block_runs_and_resumes(tmp_path):
    model = model_path("smollm2")
    os.symlink(model, tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    code = readme_llama_block()
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        outs.append(p.stdout.splitlines())
    assert outs[0][0] == "created 0"
    how, n = outs[1][0].split()
    assert how == "resumed" and int(n) > 10
    assert outs[0][1:] == outs[1][1:] and outs[0][1].strip()
