#!/usr/bin/env python3
"""Generate with the PyTorch decoder of llama.py, its KV cache a ctxstore
session; stop it any way you like (even SIGKILL) and run it again to go on.

    chat.py --session FILE [--prompt TEXT] [--generate N] [--config small|qwen3-4b-kv]
            [--seed S] [--dtype f16|bf16] [--capacity N] [--window W]
            [--sync none|async|full] [--text]

A new FILE is created and needs --prompt. An existing FILE is opened and
continued: with --prompt, the prompt is appended (one commit); without it,
the prediction after its last token is recomputed and generation goes on
with the tokens an uninterrupted run would have made. Each generated token
is committed, then printed: its id, one a line (--text: the byte). So after
a kill the output stops at the last committed token (or the one before it)
and the next run prints the next one. Pass the same --window every time.

Exit status: 0, 1 on an error (ctxstore's or a resume mismatch), 2 on bad
usage.
"""
from __future__ import annotations

import argparse
import os
import sys

try:
    import ctxstore
except ImportError as e:  # pragma: no cover - a message, not a feature
    sys.exit(f"chat.py: {e}: put the build tree's ctxstore package on PYTHONPATH "
             "(meson builds it under build/python)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402

SYNC = {"none", "async", "full"}


def parse(argv):
    p = argparse.ArgumentParser(prog="chat.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--session", required=True, help="the session file")
    p.add_argument("--prompt", help="text to append (bytes are the token ids)")
    p.add_argument("--generate", type=int, default=50, help="tokens to generate (50)")
    p.add_argument("--config", choices=sorted(llama.CONFIGS), default="small")
    p.add_argument("--seed", type=int, default=1, help="the weights (1)")
    p.add_argument("--dtype", choices=sorted(llama.STORAGE), default="f16")
    p.add_argument("--capacity", type=int, default=2048, help="slots of a new session (2048)")
    p.add_argument("--window", type=int, default=0,
                   help="recent tokens attention reads; 0 (default): all held")
    p.add_argument("--sync", choices=sorted(SYNC), default="async")
    p.add_argument("--text", action="store_true", help="print bytes, not ids")
    o = p.parse_args(argv)
    if o.generate < 0:
        p.error("--generate must be 0 or more")
    if o.prompt == "":
        p.error("--prompt is empty")
    return o


def main(argv=None) -> int:
    o = parse(argv)
    llama.make_deterministic()
    cfg = llama.CONFIGS[o.config](seed=o.seed, dtype=o.dtype)
    model = llama.Model(cfg)
    try:
        if os.path.exists(o.session):
            s = llama.open_session(o.session, model, window=o.window, durability=o.sync)
        elif o.prompt is None:
            print(f"chat.py: {o.session} does not exist: a new session needs --prompt",
                  file=sys.stderr)
            return 2
        else:
            s = llama.create_session(o.session, model, capacity=o.capacity,
                                     window=o.window, durability=o.sync)
        with llama.Engine(model, s) as eng:
            if o.prompt is not None:
                eng.feed([b % cfg.vocab for b in o.prompt.encode()])
            else:
                eng.resume()

            def show(tok: int) -> None:
                if o.text:
                    sys.stdout.buffer.write(bytes([tok & 0xFF]))
                    sys.stdout.flush()
                else:
                    print(tok, flush=True)

            eng.generate(o.generate, show)
            print(f"chat.py: {o.session}: {s.n_tokens} tokens, next {eng.next_id}",
                  file=sys.stderr)
    except ctxstore.Error as e:
        hint = ("; was it written with another --config, --seed or --dtype?"
                if e.name == "CTXS_EMODEL" else "")
        print(f"chat.py: {o.session}: {e}{hint}", file=sys.stderr)
        return 1
    except llama.ResumeMismatch as e:
        print(f"chat.py: {o.session}: {e}; another --window?", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
