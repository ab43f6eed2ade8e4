"""ctxstore.llama: a llama-cpp-python ``Llama``'s conversation kept in a session.

Every token the ``Llama`` evaluates is saved into a named session of a
``ctxstore.Store`` as it is decoded (its K/V as llama.cpp holds them, bit for
bit, and a commit: the cost of the new tokens, not of the context), through
the C adapter ``libctxstore_llama`` (``include/ctxstore_llama.h``,
``docs/LLAMA.md``). Starting a conversation of a name the store holds puts
its tokens back into the ``Llama`` (the next token is what it would have been
had the process never stopped); a new name whose prompt starts like a stored
conversation forks that one's shared tokens instead of decoding them again.

Example::

    import ctxstore, ctxstore.llama

    llm = ctxstore.llama.load("SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=2048,
                              verbose=False)
    with ctxstore.Store("chats", create=True) as store, \\
            ctxstore.llama.Conversation(llm, store, "trip") as chat:
        reply = llm.create_chat_completion(messages, temperature=0)
        # killed here or not: the next Conversation(llm, store, "trip")
        # resumes with every token evaluated so far

What it needs of llama-cpp-python (0.3.36, the version whose llama.cpp the
adapter is built against):

- One llama.cpp in the process. llama-cpp-python is installed without its
  own build (``CMAKE_ARGS="-DLLAMA_BUILD=OFF"``) and loads the libllama the
  adapter links (``LLAMA_CPP_LIB_PATH``; this module sets it, where unset,
  to the directory the adapter was built against). Importing this module
  checks that the process maps exactly one libllama.
- A context made with ``n_seq_max >= 2`` and ``kv_unified = True`` (the
  adapter reads new tokens through a spare sequence) and ``swa_full = True``
  (sliding-window models resume bit for bit). ``Llama()`` has no argument for
  the first two: ``load()`` makes a ``Llama`` and ``prepare()`` gives an
  existing one, before it has decoded anything, a new context made with
  those parameters from its own ``context_params``.
- ``Llama.eval()`` is the one place where tokens are decoded (``generate()``,
  ``create_completion()`` and ``create_chat_completion()`` call it): a
  ``Conversation`` wraps the instance's ``eval`` so that each batch is saved
  right after ``llama_decode`` returns, and follows the ``Llama`` when it
  rewinds (a regenerated answer, a prompt that differs from the cached one)
  by rolling the session back. The session mirrors the ``Llama``'s sequence:
  a prompt that shares nothing with the conversation rewinds it to zero.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, List, Optional, Sequence, Union

from . import Error, Model, Session, Store

try:
    from . import _llama
except ImportError as e:  # the adapter was not built (no llama.cpp found)
    raise ImportError(
        "ctxstore.llama needs ctxstore built with the llama.cpp adapter "
        f"(llama.cpp's llama.pc found at build time): {e}") from e

# llama-cpp-python loads libllama from LLAMA_CPP_LIB_PATH: the adapter's,
# unless the app says otherwise (then the check below decides).
os.environ.setdefault("LLAMA_CPP_LIB_PATH", _llama.LLAMA_LIBDIR)

try:
    import llama_cpp
    from llama_cpp import _internals
except ImportError as e:
    raise ImportError(
        "ctxstore.llama needs llama-cpp-python==0.3.36 built without its own "
        "llama.cpp: CMAKE_ARGS=\"-DLLAMA_BUILD=OFF\" pip install "
        f"llama-cpp-python==0.3.36 (see python/README.md): {e}") from e

__all__ = ["Conversation", "load", "prepare", "model_of", "libllama_paths"]


def libllama_paths() -> List[str]:
    """The distinct libllama files the process has mapped (``/proc/self/maps``)."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libllama."):
                paths.add(os.path.realpath(parts[5].strip()))
    return sorted(paths)


def _check_one_llama() -> None:
    paths = libllama_paths()
    if len(paths) != 1:
        raise ImportError(
            f"the process holds {len(paths)} libllama files ({', '.join(paths) or 'none'}): "
            "llama-cpp-python must load the libllama the adapter links "
            f"({_llama.LLAMA_LIBDIR}): install it with CMAKE_ARGS=\"-DLLAMA_BUILD=OFF\" "
            "and set LLAMA_CPP_LIB_PATH to that directory")


_check_one_llama()


def _needs_new_context(p: Any) -> bool:
    return p.n_seq_max < 2 or not p.kv_unified or not p.swa_full


def prepare(llm: "llama_cpp.Llama") -> "llama_cpp.Llama":
    """Gives ``llm`` a context the adapter can use, if it has none yet.

    The new context is made by llama-cpp-python (``_internals.LlamaContext``)
    from the ``Llama``'s own ``context_params`` with ``n_seq_max >= 2``,
    ``kv_unified = True`` and ``swa_full = True``; the old one is freed
    first. Only before the ``Llama`` has evaluated anything (``ValueError``
    after). Returns ``llm``.
    """
    p = llm.context_params
    if not _needs_new_context(p):
        return llm
    if llm.n_tokens:
        raise ValueError("prepare() a Llama before it evaluates tokens: its context is made anew")
    if getattr(llm, "_lora_adapter", None) is not None:
        raise ValueError("prepare() a Llama without a LoRA adapter (it is bound to the "
                         "context), or create it with ctxstore.llama.load()")
    p.n_seq_max = max(2, p.n_seq_max)
    p.kv_unified = True
    p.swa_full = True
    llm._ctx.close()
    llm._ctx = _internals.LlamaContext(model=llm._model, params=p, verbose=llm.verbose)
    return llm


def load(model_path: str, **kwargs: Any) -> "llama_cpp.Llama":
    """``llama_cpp.Llama(model_path, **kwargs)`` with the context the adapter
    needs (see ``prepare()``)."""
    kwargs.setdefault("swa_full", True)
    return prepare(llama_cpp.Llama(model_path, **kwargs))


def model_of(llm: "llama_cpp.Llama", store: Optional[Store] = None) -> Model:
    """The ``ctxstore.Model`` of ``llm``'s sessions: geometry and dtype from the
    model and its context, the weights hash of its GGUF file (cached by
    ``store``), the tokenizer hash of its vocabulary."""
    return Model(*_llama.model_init(store, llm.model_path, llm._model.model,
                                    ctypes.addressof(llm.context_params)))


def _token_ids(llm: "llama_cpp.Llama", prompt: Union[None, str, bytes, Sequence[int]]) -> List[int]:
    if prompt is None:
        return []
    if isinstance(prompt, str):
        prompt = prompt.encode("utf-8")
    if isinstance(prompt, bytes):
        return llm.tokenize(prompt, add_bos=True, special=True)
    return [int(t) for t in prompt]


class Conversation(_llama.ConversationBase):
    """The conversation ``name`` of ``store``, kept from ``llm``'s sequence.

    ``Conversation(llm, store, name, prompt=None, *, model_name=None,
    capacity=None, verify=False, background=True)``:

    - ``store`` holds ``name``: it is opened and put back into ``llm``
      (``how == "resumed"``; ``prompt`` is not looked at);
    - else, where a stored conversation of the same model starts like
      ``prompt`` (token ids, or text tokenized as ``llm.tokenize(...,
      special=True)`` does), ``name`` is forked from its shared tokens
      (``how == "forked"``, ``forked_from`` its name) and those are put back;
    - else ``name`` is created empty (``how == "created"``) with a capacity
      of ``llm.n_ctx()`` tokens (``capacity`` to say otherwise; never a ring).

    The model is registered in ``store`` (``model_name``: its display name,
    the GGUF file's name by default). ``llm`` then holds the conversation's
    tokens (``llm.n_tokens``, ``llm.input_ids``) and evaluates the rest of a
    prompt only. From then on every token ``llm`` evaluates is saved as it
    is decoded, until ``close()`` (or the ``with`` block's end), which
    leaves ``llm`` as it is and closes the session. ``verify=True`` opens a
    stored conversation as after a power loss (every token not yet durable
    checked, the longest part that verifies kept). ``background=False``
    opens the session without the library's thread (``Session.info()``'s
    ``background``): the restore then reads ahead what it needs itself, and
    saves and their writeback run on the caller's thread. ``on_save(n_tokens)``
    is called after each batch is saved.

    ``session`` is the ``ctxstore.Session`` (read its ``tokens()``,
    ``info()``, checkpoints); write to it only through this object.
    Errors are ``ctxstore.Error`` with the adapter's explanation.
    """

    def __init__(self, llm: "llama_cpp.Llama", store: Store, name: str,
                 prompt: Union[None, str, bytes, Sequence[int]] = None, *,
                 model_name: Optional[str] = None, capacity: Optional[int] = None,
                 verify: bool = False, background: bool = True,
                 on_save: Optional[Callable[[int], Any]] = None) -> None:
        if getattr(llm, "_ctxstore_conversation", None) is not None:
            raise ValueError("this Llama already keeps a conversation: close() it first")
        if _needs_new_context(llm.context_params):
            raise ValueError("the Llama's context needs n_seq_max >= 2, kv_unified and "
                             "swa_full: make it with ctxstore.llama.load() or prepare()")
        self.llm = llm
        self.name = name
        self.on_save = on_save
        self.model = model_of(llm, store)
        store.register_model(self.model, model_name or os.path.basename(llm.model_path))
        self.session: Session = Session.__new__(Session)
        n, how, src = self._start(self.session, store, name, llm._ctx.ctx, tuple(self.model),
                                  _token_ids(llm, prompt), capacity, verify, background)
        self.how: str = how
        self.forked_from: Optional[str] = src or None
        self._eval = llm.eval  # the Llama's own, bound
        self._follow(n)
        llm.eval = self._save_eval
        llm._ctxstore_conversation = self

    # --- the Llama's side ----------------------------------------------------

    def _follow(self, n: int) -> None:
        """The Llama's state after the session went to n tokens: the
        session's token ids, and no logits (the next evaluation decodes the
        last token again, as llama-cpp-python does after load_state)."""
        llm = self.llm
        if n:
            llm.input_ids[:n] = self.session.tokens(0, n)
        llm.n_tokens = n
        llm._requires_eval = True

    def _save_eval(self, tokens: Sequence[int]) -> None:
        """Llama.eval, each batch saved as soon as it is decoded."""
        llm = self.llm
        at = llm.n_tokens
        held = self.session.n_tokens
        if at < held:  # the Llama rewound (a new answer, another prompt)
            self.rollback(at)
        elif at > held:
            raise Error(f"the Llama holds {at} tokens, the session {held}: "
                        "tokens were evaluated outside the conversation")
        tokens = list(tokens)
        step = max(1, llm.n_batch)
        for i in range(0, len(tokens), step):
            piece = tokens[i:i + step]
            self._eval(piece)  # one llama_decode
            self.save(piece)
            if self.on_save is not None:
                self.on_save(at + i + len(piece))

    # --- the conversation ------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens saved in the session (the Llama's ``n_tokens`` after an eval)."""
        return self.session.n_tokens

    def tokens(self) -> List[int]:
        """The conversation's token ids."""
        return self.session.tokens().tolist()

    def checkpoint(self, name: str) -> None:
        """Names the conversation's current length (``Session.checkpoint``)."""
        self.session.checkpoint(name)

    def restore(self, name: str) -> None:
        """Takes the conversation and the Llama back to checkpoint ``name``:
        the tokens after it are gone from both (a regenerated answer)."""
        self.checkpoint_restore(name)
        self._follow(self.session.n_tokens)

    def rollback(self, n_tokens: int) -> None:
        """Takes the conversation and the Llama back to ``n_tokens`` tokens."""
        super().rollback(n_tokens)
        self._follow(n_tokens)

    def resume(self) -> None:
        """Puts the session back into the Llama's sequence again (after the
        app changed the sequence behind the conversation's back)."""
        super().restore()
        self._follow(self.session.n_tokens)

    def close(self) -> None:
        """Stops saving: ``llm.eval`` is the Llama's own again, the session
        closed; ``llm`` keeps what it holds. Idempotent."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        if llm.__dict__.get("eval") == self._save_eval:
            del llm.eval
        if getattr(llm, "_ctxstore_conversation", None) is self:
            llm._ctxstore_conversation = None
        self.detach()
        self.session.close()
        self.llm = None

    def __enter__(self) -> "Conversation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if getattr(self, "llm", None) is None:
            return f"<ctxstore.llama.Conversation {self.name!r} closed>"
        return f"<ctxstore.llama.Conversation {self.name!r} {self.how} n_tokens={self.n_tokens}>"
