"""The llama.cpp adapter with real models (SmolLM2-135M, Llama architecture;
Gemma 3 270M, with sliding-window layers) through the real llama-chat
program: SIGKILLed at seeded random moments and resumed, prefix reuse, a
session of another model, a flipped byte.

meson sets LLAMA_CHAT_BIN, CTXSTORE_BIN, CTXS_SMOLLM2 and CTXS_GEMMA3 (the
GGUF files scripts/build-llama.sh installs); a test skips, saying why, where
a model is absent. CTXS_TEST_SEED replays a run's kill points.
"""
import json
import os
import random
import signal
import struct
import subprocess
import tempfile

import pytest

LLAMA_CHAT = os.environ.get("LLAMA_CHAT_BIN", "")
CTXSTORE = os.environ.get("CTXSTORE_BIN", "")
MODELS = {"smollm2": os.environ.get("CTXS_SMOLLM2", ""), "gemma3": os.environ.get("CTXS_GEMMA3", "")}

SYSTEM = ("You are a careful travel assistant. " * 12 +
          "Answer in one short sentence. Use plain words. " * 6).strip()
# Gemma 3's window layers see 512 tokens, and llama.cpp's cache for them
# holds 2 x 512 + a batch, rounded up to 256 (1280 cells here) when it keeps
# only their window (--swa-full off): a conversation past that is where a
# window layer's save and restore, and a cache that reuses its cells, can go
# wrong.
GEMMA_WINDOW = 512
GEMMA_WINDOW_CELLS = 1280
LONG_SYSTEM = SYSTEM + " " + ("Mention the weather only when asked. Keep a friendly tone. " * 90).strip()
MESSAGES = [
    "What is the capital of France?",
    "Name a river that flows through it.",
    "What is the capital of Italy, and which river runs through it?",
    "Which of the two cities is older?",
    "Suggest one museum in each city.",
]
COMMON = ["--max-tokens", "40", "--batch", "32", "--ctx", "2048"]


def model_path(name):
    path = MODELS[name]
    if not path or not os.path.exists(path):
        pytest.skip(f"{name}: no GGUF file ({path or 'not configured'}); "
                    "scripts/build-llama.sh installs it")
    if not os.access(LLAMA_CHAT, os.X_OK):
        pytest.skip("llama-chat is not built (llama.cpp was not found)")
    return path


def seed():
    s = int(os.environ.get("CTXS_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"seed {s} (CTXS_TEST_SEED={s} replays it)")
    return s


class Run:
    """One llama-chat process over a store, its stderr events read as they
    come; killed with SIGKILL once a predicate on an event holds."""

    def __init__(self, model, store, name, extra=(), messages=MESSAGES, flash="on", swa="on"):
        system = LONG_SYSTEM if model == MODELS["gemma3"] else SYSTEM
        self.args = [LLAMA_CHAT, "--model", model, "--store", store, "--flash-attn", flash,
                     "--swa-full", swa, "--system", system, *COMMON, *extra, name]
        self.messages = messages

    def run(self, kill_when=None):
        with tempfile.TemporaryFile("w+") as stdin:
            stdin.write("".join(m + "\n" for m in self.messages))
            stdin.flush()
            stdin.seek(0)
            p = subprocess.Popen(self.args, stdin=stdin, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        events, killed = [], False
        for line in p.stderr:
            line = line.rstrip("\n")
            events.append(line)
            if kill_when and kill_when(line):
                p.send_signal(signal.SIGKILL)
                killed = True
                break
        out = p.stdout.read()
        rc = p.wait()
        if not killed:
            assert rc == 0, f"llama-chat exited {rc}: {events[-5:]}"
        return events, out, killed

    @staticmethod
    def numbers(events, word):
        return [int(e.split()[len(word.split())]) for e in events if e.startswith(word + " ")]


def read_tokens(path):
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def parse_state(path):
    """llama.cpp's sequence state (the layout of src/llama/seq_state.h) as
    {block: {position: [(k_row, v_row) per layer]}}: cells in position
    order, whatever order llama.cpp's cache keeps them in."""
    data = open(path, "rb").read()
    magic, _seq = struct.unpack_from("<Ii", data, 0)
    assert magic == 0xAF143CD8
    at, blocks = 8, []
    while at < len(data):
        n_stream, cells = struct.unpack_from("<II", data, at)
        at += 8
        assert n_stream == 1
        block = {}
        blocks.append(block)
        if not cells:
            continue
        pos = [struct.unpack_from("<iIi", data, at + 12 * i)[0] for i in range(cells)]
        at += 12 * cells
        v_trans, n_layer = struct.unpack_from("<II", data, at)
        at += 8
        ks = []
        for _ in range(n_layer):
            _t, row = struct.unpack_from("<iQ", data, at)
            at += 12
            ks.append([data[at + i * row:at + (i + 1) * row] for i in range(cells)])
            at += row * cells
        vs = []
        for _ in range(n_layer):
            if not v_trans:
                _t, row = struct.unpack_from("<iQ", data, at)
                at += 12
                vs.append([data[at + i * row:at + (i + 1) * row] for i in range(cells)])
                at += row * cells
            else:
                _t, el, n_embd = struct.unpack_from("<iII", data, at)
                at += 12
                runs = [data[at + e * el * cells:at + (e + 1) * el * cells] for e in range(n_embd)]
                vs.append([b"".join(r[i * el:(i + 1) * el] for r in runs) for i in range(cells)])
                at += el * n_embd * cells
        for i, p in enumerate(pos):
            block[p] = [(ks[l][i], vs[l][i]) for l in range(n_layer)]
    return blocks


def run_with_kills(model, store, name, kills, extra=(), flash="on", swa="on"):
    """Runs the chat to its end, killed once at each of `kills` (a predicate
    on an event, in order), restarted after each. Returns the breaks and
    restart counts the resumed runs reported, and the dumps taken at each
    restart."""
    breaks, restarts = [], []
    for k, when in enumerate(kills + [None]):
        dump = os.path.join(store, f"resumed-{k}.state")
        events, _out, killed = Run(model, store, name, ["--dump-resumed", dump, *extra],
                                   flash=flash, swa=swa).run(when)
        breaks += Run.numbers(events, "batch break")
        resumed = Run.numbers(events, "resumed")
        if resumed:
            restarts.append((resumed[0], dump))
        assert killed or when is None, "the chat ended before the kill point"
    return breaks, restarts


def kill_points(model, rng, swa="on"):
    """Three kill predicates, from a calibration run's events: mid-prefill
    (after a batch of a message's prefill that is not its last), mid-reply,
    and between turns (right after a reply)."""
    with tempfile.TemporaryDirectory() as d:
        events, _out, _k = Run(model, d, "calibration", swa=swa).run()
    saved = Run.numbers(events, "saved")
    prefill = [n for i, n in enumerate(saved[1:-1], 1)
               if n - saved[i - 1] > 1 and saved[i + 1] - n > 1]
    reply = [n for i, n in enumerate(saved[1:], 1) if n - saved[i - 1] == 1]
    turns = Run.numbers(events, "reply done")[:-1]
    assert prefill and reply and turns
    points = sorted([rng.choice(prefill), rng.choice(reply), rng.choice(turns)])
    preds = []
    for n in points:
        preds.append(lambda e, n=n: (e.startswith("saved ") and int(e.split()[1]) >= n) or
                     (e.startswith("reply done ") and int(e.split()[2]) >= n))
    return points, preds


def same_state(mine, theirs, n, windowed):
    """The resumed run's state against the uninterrupted run's at n tokens.
    A window layer of a windowed context holds positions attention no
    longer reads (below n - window) that a session does not keep: only the
    window's are compared there, and the rest must be among the reference's."""
    assert len(mine) == len(theirs)
    for b, (m, t) in enumerate(zip(mine, theirs)):
        if windowed and b == 1:
            assert set(m) <= set(t), f"block {b} at {n} tokens: positions the run never held"
            assert len(t) <= GEMMA_WINDOW_CELLS
            m = {p: kv for p, kv in m.items() if p >= n - GEMMA_WINDOW}
            t = {p: kv for p, kv in t.items() if p >= n - GEMMA_WINDOW}
        assert sorted(m) == sorted(t), f"block {b} at {n} tokens: other positions"
        assert m == t, f"block {b} at {n} tokens: K/V differ from the run that never stopped"


@pytest.mark.parametrize("name,flash,swa", [("smollm2", "on", "on"), ("smollm2", "off", "on"),
                                            ("gemma3", "on", "on"), ("gemma3", "on", "off")])
def test_killed_chat_resumes_exactly(name, flash, swa, tmp_path):
    model = model_path(name)
    rng = random.Random(seed())
    points, preds = kill_points(model, rng, swa)
    print(f"kills at {points}")
    resumed_store, ref_store = str(tmp_path / "resumed"), str(tmp_path / "reference")
    breaks, restarts = run_with_kills(model, resumed_store, "chat", preds, flash=flash, swa=swa)
    assert len(restarts) == 3
    # The run that never stopped, with the batches the resumed run decoded.
    extra = []
    for b in breaks:
        extra += ["--break-at", str(b)]
    for n, _dump in restarts:
        extra += ["--dump-state-at", f"{n}:{ref_store}-{n}.state"]
    ref_tokens, got_tokens = str(tmp_path / "ref.ids"), str(tmp_path / "got.ids")
    Run(model, ref_store, "chat", [*extra, "--tokens-out", ref_tokens], flash=flash, swa=swa).run()
    Run(model, resumed_store, "chat", ["--tokens-out", got_tokens], flash=flash, swa=swa).run()
    ref, got = read_tokens(ref_tokens), read_tokens(got_tokens)
    assert got == ref, f"the resumed chat diverges at token {next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b) if len(got) == len(ref) else min(len(got), len(ref))}"
    assert len(ref) > (1400 if name == "gemma3" else 200)
    for n, dump in restarts:
        same_state(parse_state(dump), parse_state(f"{ref_store}-{n}.state"), n, swa == "off")
    if name == "gemma3" and swa == "off":
        # Restarts past the window layers' cache, where llama.cpp reuses its cells.
        assert any(n > GEMMA_WINDOW_CELLS for n, _dump in restarts), restarts


def test_prefix_is_reused_and_matches_a_cold_prefill(tmp_path):
    model = model_path("smollm2")
    store = str(tmp_path / "s")
    Run(model, store, "first", messages=MESSAGES[:1]).run()
    second = ["Tell me about Spain."]
    events, _o, _k = Run(model, store, "second", ["--tokens-out", str(tmp_path / "b.ids")],
                         messages=second).run()
    forked = [e for e in events if e.startswith("forked ")]
    assert forked and forked[0].endswith(" from first"), events[:3]
    shared = int(forked[0].split()[1])
    assert shared >= 64
    saved = Run.numbers(events, "saved")
    cold_events, _o, _k = Run(model, str(tmp_path / "cold"), "second",
                              ["--tokens-out", str(tmp_path / "c.ids"), "--break-at", str(shared)],
                              messages=second).run()
    # Decoded only what came after the shared tokens: the first save after
    # the fork is a batch that starts there.
    prompt_end = Run.numbers(cold_events, "saved")[0]
    assert saved[0] - shared <= 32 and saved[0] > shared
    assert read_tokens(tmp_path / "b.ids") == read_tokens(tmp_path / "c.ids")
    assert prompt_end <= saved[0] or prompt_end > shared


def test_another_models_session_is_refused(tmp_path):
    smol, gemma = model_path("smollm2"), model_path("gemma3")
    store = str(tmp_path / "s")
    Run(smol, store, "chat", messages=MESSAGES[:1]).run()
    p = subprocess.run([LLAMA_CHAT, "--model", gemma, "--store", store, "--system", SYSTEM,
                        *COMMON, "chat"],
                       input=MESSAGES[0] + "\n", capture_output=True, text=True)
    assert p.returncode == 1
    assert "another model" in p.stderr or "geometry" in p.stderr, p.stderr


def test_flipped_byte_rolls_back_and_generation_matches_a_fresh_prefill(tmp_path):
    model = model_path("smollm2")
    store = str(tmp_path / "s")
    Run(model, store, "chat", messages=MESSAGES[:2]).run()
    info = json.loads(subprocess.run([CTXSTORE, "--store", store, "info", "chat", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    n, path, head_dim = info["n_tokens"], info["path"], info["geometry"]["head_dim"]
    assert info["verified_from"] < n // 2, "nothing to verify: the tokens are durable"
    # One byte of layer 0's K, head 0, at a token in the middle: the
    # header's kv_off (u64 at byte 104), then slot = position (no ring).
    victim = n // 2
    with open(path, "r+b") as f:
        kv_off = struct.unpack("<Q", f.read(112)[104:112])[0]
        at = kv_off + victim * head_dim * 2 + 1
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))
    v = subprocess.run([CTXSTORE, "--store", store, "verify", "chat"], capture_output=True, text=True)
    assert v.returncode == 5, v.stdout + v.stderr
    # Opened as after a power loss, the chat keeps what verifies and goes on
    # from there exactly as a fresh prefill of those tokens does.
    events, _o, _k = Run(model, store, "chat", ["--verify", "--tokens-out", str(tmp_path / "a.ids")],
                         messages=MESSAGES[:3]).run()
    resumed = Run.numbers(events, "resumed")[0]
    assert resumed <= victim
    extra = ["--tokens-out", str(tmp_path / "b.ids")]
    for b in Run.numbers(events, "batch break") + [resumed]:
        extra += ["--break-at", str(b)]
    Run(model, str(tmp_path / "fresh"), "chat", extra, messages=MESSAGES[:3]).run()
    assert read_tokens(tmp_path / "a.ids") == read_tokens(tmp_path / "b.ids")


def drop_from_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_pages(path):
    """How many of the file's pages are in the page cache (mincore)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_a_cold_resume_without_the_background_thread_reads_the_session_ahead(name, tmp_path):
    """A session opened without the library's thread (background off) is
    restored from a cold page cache by reads ahead of the gather, not one
    4 KiB fault and disk read at a time (the KV is mapped for random
    access): the resumed process's major faults are a small part of the
    session's pages, and it resumes the same tokens. Gemma 3's window
    layers are read from n - n_swa on only (below, the restore gives
    zeros), which must still be all that the gather reads."""
    import resource
    model = model_path(name)
    store = str(tmp_path / "s")
    Run(model, store, "chat", messages=MESSAGES[:3]).run()
    info = json.loads(subprocess.run([CTXSTORE, "--store", store, "info", "chat", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    n, path = info["n_tokens"], info["path"]
    g = info["geometry"]
    kv_pages = n * g["n_layers"] * 2 * g["n_kv_heads"] * g["head_dim"] * 2 // 4096
    drop_from_page_cache(path)
    if resident_pages(path) > kv_pages // 8:
        pytest.skip(f"{path}: its pages stay in the page cache after POSIX_FADV_DONTNEED "
                    "(tmpfs?): a cold resume cannot be made here")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt
    events, _o, _k = Run(model, store, "chat", ["--background", "off"],
                         messages=MESSAGES[:3]).run()
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_majflt - before
    print(f"{n} tokens, {kv_pages} pages of K/V: {faults} major faults in the resumed process")
    assert Run.numbers(events, "resumed") == [n]
    assert faults < kv_pages // 8, f"{faults} major faults for {kv_pages} pages of K/V"


def test_a_cold_resume_brings_in_only_what_the_window_layers_read(tmp_path):
    """Gemma 3's session kept with swa_full = true holds every position of
    every layer, and its window layers read only their last 512: resumed
    from a cold page cache with the library's thread on, the session's
    pages read in are those of the global layers' tokens and the window
    layers' windows (ctxs_llama_start() opens it with the model's attention
    windows), not the whole file, and the chat resumes."""
    model = model_path("gemma3")
    store = str(tmp_path / "s")
    Run(model, store, "chat", messages=MESSAGES[:3]).run()
    info = json.loads(subprocess.run([CTXSTORE, "--store", store, "info", "chat", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    n, path, g = info["n_tokens"], info["path"], info["geometry"]
    assert n > 2 * GEMMA_WINDOW, f"{n} tokens: the window layers would be read whole"
    token_pages = g["n_kv_heads"] * g["head_dim"] * 2 * 2 / 4096  # K and V of one layer
    n_global = g["n_layers"] // 6  # every sixth layer
    read = token_pages * (n_global * n + (g["n_layers"] - n_global) * GEMMA_WINDOW)
    whole = token_pages * g["n_layers"] * n
    drop_from_page_cache(path)
    if resident_pages(path) > whole / 8:
        pytest.skip(f"{path}: its pages stay in the page cache after POSIX_FADV_DONTNEED "
                    "(tmpfs?): a cold resume cannot be made here")
    events, _o, _k = Run(model, store, "chat", messages=MESSAGES[:4]).run()
    assert Run.numbers(events, "resumed") == [n]
    after = json.loads(subprocess.run([CTXSTORE, "--store", store, "info", "chat", "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    written = token_pages * g["n_layers"] * (after["n_tokens"] - n)  # the new turn's
    got = resident_pages(path)
    print(f"{n} tokens: {got} pages in after the resume and a turn; the restore reads "
          f"{read:.0f}, the turn writes {written:.0f}, the whole K/V is {whole:.0f}")
    assert got < read + written + (whole - read) / 4, f"{got} pages in, {read:.0f} read"


def test_window_layers_keep_their_window_and_roll_back_within_it(tmp_path):
    """Gemma 3 with llama.cpp's window layers keeping their window
    (--swa-full off): the session's window layers are rings of llama.cpp's
    cache length, a context that keeps every position refuses the session,
    a rollback past the ring is refused and one within it continues as a
    run that stopped there."""
    model = model_path("gemma3")
    store = str(tmp_path / "s")
    first = str(tmp_path / "first.ids")
    Run(model, store, "chat", ["--tokens-out", first], messages=MESSAGES[:2], swa="off").run()
    n = len(read_tokens(first))
    assert n > GEMMA_WINDOW_CELLS and n % GEMMA_WINDOW_CELLS, n  # a ring restored wrapped
    info = json.loads(subprocess.run([CTXSTORE, "--store", store, "info", "chat", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    sched = info["geometry"]["schedule"]
    assert sched == {"period": 6, "window": [GEMMA_WINDOW] * 5 + [0]}, sched
    # Another kind of context: refused, saying why.
    p = subprocess.run(Run(model, store, "chat", swa="on").args, input=MESSAGES[0] + "\n",
                       capture_output=True, text=True)
    assert p.returncode == 1 and "swa_full" in p.stderr, p.stderr
    # Back past what the ring keeps (its batch: 1280 - 512 slots): refused,
    # the session untouched.
    p = subprocess.run(Run(model, store, "chat", ["--rollback-to", str(n - 1000)], swa="off").args,
                       input=MESSAGES[0] + "\n", capture_output=True, text=True)
    assert p.returncode == 1 and "no longer hold position" in p.stderr, p.stderr
    # Back within it, across the end of llama.cpp's ring of cells, then on
    # with a third message: as a run whose batch broke there.
    m = n // GEMMA_WINDOW_CELLS * GEMMA_WINDOW_CELLS - 50
    assert 0 < n - m <= GEMMA_WINDOW_CELLS - GEMMA_WINDOW
    got = str(tmp_path / "got.ids")
    events, _o, _k = Run(model, store, "chat", ["--rollback-to", str(m), "--tokens-out", got],
                         messages=MESSAGES[:3], swa="off").run()
    assert Run.numbers(events, "rolled back") == [m]
    extra = ["--tokens-out", str(tmp_path / "ref.ids")]
    for b in [m] + Run.numbers(events, "batch break"):
        extra += ["--break-at", str(b)]
    Run(model, str(tmp_path / "ref"), "chat", extra, messages=MESSAGES[:3], swa="off").run()
    assert read_tokens(got) == read_tokens(tmp_path / "ref.ids")
    assert len(read_tokens(got)) > n


@pytest.mark.parametrize("swa", ["on", "off"])
def test_a_resumed_chat_rolled_back_continues_as_a_run_that_stopped_there(swa, tmp_path):
    """Gemma 3 resumed (a restore, which gives the window layers zeros for
    the positions attention no longer reads), then rolled back within its
    window layers' cells without crossing the end of llama.cpp's ring:
    attention then reads positions below the restore's window again, which
    must be the session's K/V, not the zeros."""
    model = model_path("gemma3")
    store = str(tmp_path / "s")
    first = str(tmp_path / "first.ids")
    events, _o, _k = Run(model, store, "chat", ["--tokens-out", first], messages=MESSAGES[:2],
                         swa=swa).run()
    n = len(read_tokens(first))
    # Back into the last reply, whose tokens were decoded one at a time, so
    # that the run that stops there decodes every kept token as this one
    # did (llama.cpp's bits depend on the batch); never across the end of
    # the windowed cache's ring, which restores from the session anyway.
    saved = Run.numbers(events, "saved")
    reply = [b for a, b in zip(saved, saved[1:]) if b - a == 1]
    most = min(n % GEMMA_WINDOW_CELLS, 100) if swa == "off" else 100
    m = min(x for x in reply + [n] if n - x <= most)
    assert n > GEMMA_WINDOW + 100 and n - m >= 20, (n, m)
    # llama.cpp's state 30 tokens on: their K/V came from attention over
    # the window, which reaches below the restore's window.
    later = m + 30
    got, got_state = str(tmp_path / "got.ids"), str(tmp_path / "got.state")
    events, _o, _k = Run(model, store, "chat",
                         ["--rollback-to", str(m), "--tokens-out", got,
                          "--dump-state-at", f"{later}:{got_state}"],
                         messages=MESSAGES[:3], swa=swa).run()
    assert Run.numbers(events, "resumed") and Run.numbers(events, "rolled back") == [m]
    ref_state = str(tmp_path / "ref.state")
    extra = ["--tokens-out", str(tmp_path / "ref.ids"), "--dump-state-at", f"{later}:{ref_state}"]
    for b in [m] + Run.numbers(events, "batch break"):
        extra += ["--break-at", str(b)]
    Run(model, str(tmp_path / "ref"), "chat", extra, messages=MESSAGES[:3], swa=swa).run()
    same_state(parse_state(got_state), parse_state(ref_state), later, swa == "off")
    assert read_tokens(got) == read_tokens(tmp_path / "ref.ids")
    assert len(read_tokens(got)) > later


def test_options_init_serves_a_binding_without_macros():
    """ctxs_llama_options_init() gives CTXS_LLAMA_OPTIONS_INIT to a caller
    that cannot expand it (a ctypes binding), writes only the fields of the
    version it is asked for, and refuses a version it does not know, as
    attach and start do."""
    import ctypes
    lib_path = os.environ.get("CTXS_LLAMA_LIB", "")
    if not lib_path or not os.path.exists(lib_path):
        pytest.skip("CTXS_LLAMA_LIB is not set: libctxstore_llama is not built (llama.cpp was "
                    "not found), or built with sanitizers, which a plain python cannot load")
    lib = ctypes.CDLL(lib_path)

    class Options(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("seq_id", ctypes.c_int32),
                    ("spare_seq_id", ctypes.c_int32), ("open_flags", ctypes.c_uint32),
                    ("create", ctypes.c_void_p), ("open", ctypes.c_void_p)]

    def fields(o):
        return (o.version, o.seq_id, o.spare_seq_id, o.open_flags, o.create, o.open)

    o = Options(7, 7, 7, 7, 7, 7)
    assert lib.ctxs_llama_options_init(ctypes.byref(o), 2) == 0
    assert fields(o) == (2, 0, -1, 0, None, None)
    # A caller built against version 1 has no `open`: nothing is written there.
    o = Options(7, 7, 7, 7, 7, 7)
    assert lib.ctxs_llama_options_init(ctypes.byref(o), 1) == 0
    assert fields(o) == (1, 0, -1, 0, None, 7)
    einval = -32008  # CTXS_EINVAL
    assert lib.ctxs_llama_options_init(ctypes.byref(o), 3) == einval
    assert lib.ctxs_llama_options_init(ctypes.byref(o), 0) == einval
    assert lib.ctxs_llama_options_init(None, 2) == einval
    # attach and start refuse options of an unknown version, saying so, and
    # take version 1's (to their next check: here, the NULL context).
    lib.ctxs_get_last_error.restype = ctypes.c_char_p
    out = ctypes.c_void_p(7)
    for version, refused in ((3, True), (1, False), (2, False)):
        o = Options(version, 0, -1, 0, None, None)
        assert lib.ctxs_llama_attach(ctypes.byref(out), None, None, ctypes.byref(o)) == einval
        assert out.value is None
        said = lib.ctxs_get_last_error().decode()
        assert ("version is 3" in said) == refused, said
        assert lib.ctxs_llama_start(ctypes.byref(out), None, None, None, None, None, 0,
                                    ctypes.byref(o), None) == einval
        said = lib.ctxs_get_last_error().decode()
        assert ("version is 3" in said) == refused, said
