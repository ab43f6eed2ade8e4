#!/usr/bin/env python3
"""llama_cpp_chat — a chat on stdin with llama-cpp-python, kept in a ctxstore
store through ctxstore.llama: every token the Llama evaluates is saved as it
is decoded, so the process may be killed at any moment and run again to
continue.

    python3 llama_cpp_chat.py --model SmolLM2-135M-Instruct.Q4_1.gguf --store chats trip

Each line of stdin is a user message; the reply (greedy) goes to stdout.
Run again with the same name and the same lines: the lines the session
already answered are checked against it and skipped, a prefill or a reply
cut short is finished, and the chat goes on. A new name whose first message
starts like a stored chat (the same system prompt) forks that chat's shared
tokens instead of decoding them again.

What an app copies from here: ctxstore.llama.load() (or prepare()), a
Conversation over the store, then the Llama as usual (generate() here;
create_chat_completion() saves the same way). Events on stderr ("resumed
N", "forked N from NAME", "saved N", "reply done N") are what the tests
read; --tokens-out FILE writes the conversation's token ids at exit.
"""
import argparse
import sys

import ctxstore
import ctxstore.llama


def parse():
    p = argparse.ArgumentParser(prog="llama_cpp_chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the GGUF file")
    p.add_argument("--store", required=True, help="the store directory (made if missing)")
    p.add_argument("--system", default="You are a helpful assistant.", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens per reply at most (48)")
    p.add_argument("--ctx", type=int, default=2048, help="context length (2048)")
    p.add_argument("--batch", type=int, default=32, help="tokens per llama_decode (32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens-out", help="write the conversation's token ids here at exit")
    p.add_argument("name", help="the chat's name in the store")
    return p.parse_args()


def turn_text(llm, system, message, first):
    """The chat template of one user message (and the system prompt in the
    first turn), up to the assistant's turn."""
    msgs = ([{"role": "system", "content": system}] if first else []) + \
        [{"role": "user", "content": message}]
    fmt = llm.metadata.get("tokenizer.chat_template")
    if fmt:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        f = Jinja2ChatFormatter(template=fmt, eos_token="", bos_token="")
        return f(messages=msgs).prompt
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + \
        "<|im_start|>assistant\n"


def main():
    o = parse()
    llm = ctxstore.llama.load(o.model, n_ctx=o.ctx, n_batch=o.batch, n_ubatch=o.batch,
                              n_threads=o.threads, n_threads_batch=o.threads, verbose=False)
    eos = llm.token_eos()
    lines = [line.rstrip("\n") for line in sys.stdin]
    if not lines:
        return
    first = llm.tokenize(turn_text(llm, o.system, lines[0], True).encode(), add_bos=True,
                         special=True)
    def saved(n):
        print(f"saved {n}", file=sys.stderr, flush=True)

    with ctxstore.Store(o.store, create=True) as store, \
            ctxstore.llama.Conversation(llm, store, o.name, first, on_save=saved) as conv:
        held = conv.tokens()
        if conv.how == "resumed":
            print(f"resumed {len(held)}", file=sys.stderr, flush=True)
        elif conv.how == "forked":
            print(f"forked {len(held)} from {conv.forked_from}", file=sys.stderr, flush=True)
        t = []  # the conversation's tokens, as this run goes through it
        for k, message in enumerate(lines):
            t += first if k == 0 else llm.tokenize(
                turn_text(llm, o.system, message, False).encode(), add_bos=False, special=True)
            if held[:len(t)] != t[:len(held)]:
                sys.exit(f"llama_cpp_chat: the session '{o.name}' holds another conversation")
            reply = []  # what the session holds of this reply
            while len(t) + len(reply) < len(held) and len(reply) < o.max_tokens:
                reply.append(held[len(t) + len(reply)])
                if reply[-1] == eos:
                    break
            t += reply
            if not reply or (reply[-1] != eos and len(reply) < o.max_tokens):
                # Generate on: the Llama evaluates what it lacks of t (one
                # token again after a resume, for its logits).
                for tok in llm.generate(t, temp=0.0, repeat_penalty=1.0):
                    t.append(tok)
                    reply.append(tok)
                    if tok == eos or len(reply) >= o.max_tokens:
                        break
            print(llm.detokenize([x for x in reply if x != eos]).decode(errors="replace"),
                  flush=True)
            print(f"reply done {len(t)}", file=sys.stderr, flush=True)
        # The last token sampled is evaluated (and saved) too.
        if llm.n_tokens < len(t):
            llm.eval(t[llm.n_tokens:])
        if o.tokens_out:
            with open(o.tokens_out, "w") as f:
                f.write("".join(f"{x}\n" for x in conv.tokens()))


if __name__ == "__main__":
    main()
