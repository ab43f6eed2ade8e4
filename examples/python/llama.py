"""A small Llama-architecture decoder in plain PyTorch whose KV cache IS a
ctxstore session.

The model: token embedding; per layer RMSNorm, Q/K/V projections, rotary
position encoding (NeoX halves, by absolute position) on Q and K, grouped-
query attention, output projection, residual, RMSNorm, SwiGLU MLP,
residual; final RMSNorm and an untied unembedding; greedy decoding (ties go
to the lowest id). Weights are float32 drawn from a seeded torch.Generator,
so the model says nothing worth reading: what it shows is the engine side
of ctxstore from Python.

The cache: a session's layer l is, for K and for V, one
[kv_heads, capacity, head_dim] tensor over the session's mapping
(session.torch_k(l), torch_v(l)), exactly the [heads, seq, dim] that
attention consumes. Each step reserves a slot, writes the new token's K and
V into those tensors layer by layer (layer l's before layer l's attention
reads them: a token's own key is among those its query reads), attends over
the attention plan's slots where they lie, and commits the token id. K is
stored after the rotation, in the session's dtype (fp16 or bf16); all
arithmetic is float32.

Exact resumes. After a close, or a SIGKILL at any point, a resume
recomputes the last committed token's forward pass (its K/V are in the
session already: recomputed, they must match the stored bits, or the
session was not written by this model, and ResumeMismatch is raised) and
continues with exactly the tokens an uninterrupted run makes. That holds
because every token whose logits are used is computed alone, by the same
code with the same tensor shapes, whether it was generated, ended a prompt,
or is recomputed after a resume:

- a prompt is one reservation and one commit: its tokens but the last in
  one batch, then the last one alone, so a kill never leaves half a prompt
  and the prediction after a prompt always comes from a one-token pass;
- deterministic kernels, one thread (torch.use_deterministic_algorithms,
  torch.set_num_threads(1)): a one-token pass at position p over the same
  keys gives the same bits in every process on the same machine and build;
- the session is opened with the same window every time (ctxstore does not
  store it), and, once the ring wraps, the window is shorter than the ring
  (capacity - n_sink - 1 at most; the default full window is not): a
  reservation that made the ring evict, then lost its commit to a kill,
  then never removes a key the resumed token reads.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import List, Optional, Sequence, Tuple

import torch

import ctxstore

RMS_EPS = 1e-6


def make_deterministic() -> None:
    """The process-wide settings exact resumes rely on (see the module)."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


class ResumeMismatch(Exception):
    """The last token's K/V recomputed differ from those in the session: it
    was written by another model, window or build."""


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256          # token ids 0 .. vocab - 1 (256: bytes)
    d_model: int = 64         # residual stream width
    n_layers: int = 4
    n_heads: int = 4          # query heads, a multiple of n_kv_heads
    n_kv_heads: int = 2       # KV heads (GQA)
    head_dim: int = 16        # even (rotary pairs)
    ffn: int = 128            # SwiGLU hidden width
    rope_theta: float = 10000.0
    seed: int = 1             # the weights
    dtype: str = "f16"        # how the session keeps K/V: "f16" or "bf16"

    def __post_init__(self) -> None:
        if min(self.vocab, self.d_model, self.n_layers, self.n_heads,
               self.n_kv_heads, self.head_dim, self.ffn) <= 0:
            raise ValueError("every size must be positive")
        if self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError("n_heads must be a multiple of n_kv_heads, head_dim even")
        if self.dtype not in STORAGE:
            raise ValueError(f"dtype is one of {sorted(STORAGE)}, not {self.dtype!r}")


def small(**over) -> Config:
    """The test model: 4 layers, 2 KV heads of 16 dims."""
    return Config(**over)


def qwen3_4b_kv(**over) -> Config:
    """Qwen3-4B's KV geometry (36 layers, 8 KV heads, head_dim 128; 16 query
    heads, as tinychat) around a small d_model and ffn: a session as big as a
    real one per token (147,456 bytes in fp16), with a model cheap enough to
    run anywhere."""
    base = dict(n_layers=36, n_heads=16, n_kv_heads=8, head_dim=128,
                d_model=256, ffn=512)
    base.update(over)
    return Config(**base)


CONFIGS = {"small": small, "qwen3-4b-kv": qwen3_4b_kv}

# Session dtype -> (ctxstore's constant name, the torch dtype K/V are stored as).
STORAGE = {"f16": ("DTYPE_F16", torch.float16), "bf16": ("DTYPE_BF16", torch.bfloat16)}


def ctxs_model(cfg: Config) -> "ctxstore.Model":
    """What a session of this model is: its KV geometry, and hashes of the
    whole configuration (seed included: two seeds never share a session) and
    of the byte tokenizer."""
    ident = json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()
    model_hash = hashlib.blake2b(b"ctxstore-pychat-v1\0" + ident, digest_size=16).digest()
    tok_hash = hashlib.blake2b(b"ctxstore-pychat-bytes-v1\0%d" % cfg.vocab,
                               digest_size=16).digest()
    return ctxstore.Model(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                          getattr(ctxstore, STORAGE[cfg.dtype][0]), model_hash, tok_hash)


def _storage_view(t: torch.Tensor, want: torch.dtype) -> torch.Tensor:
    """A view, checked to hold the element type the model writes."""
    if t.dtype != want:
        raise TypeError(f"a view of dtype {t.dtype} for a model that stores {want}")
    return t


def _spans(obj) -> List[Tuple[int, ...]]:
    """A reservation's spans as (slot, count), a plan's as (pos, slot, count)."""
    return [tuple(sp) for sp in obj.spans]


class Model:
    """The weights of cfg and the passes over a session. One thread at a time."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d, qd, kvd = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim

        def uniform(rows: int, cols: int, scale: float) -> torch.Tensor:
            return (torch.rand(rows, cols, generator=g) * 2 - 1) * scale

        # Matrices are [in][out]: y = x @ W.
        self.embed = uniform(cfg.vocab, d, 1.0)
        self.layers = []
        for _ in range(cfg.n_layers):
            self.layers.append(dict(
                attn_norm=torch.ones(d), ffn_norm=torch.ones(d),
                wq=uniform(d, qd, d ** -0.5), wk=uniform(d, kvd, d ** -0.5),
                wv=uniform(d, kvd, d ** -0.5), wo=uniform(qd, d, qd ** -0.5),
                w_gate=uniform(d, cfg.ffn, d ** -0.5), w_up=uniform(d, cfg.ffn, d ** -0.5),
                w_down=uniform(cfg.ffn, d, cfg.ffn ** -0.5)))
        self.out_norm = torch.ones(d)
        self.unembed = uniform(d, cfg.vocab, d ** -0.5)
        half = cfg.head_dim // 2
        self.inv_freq = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
        self.store_dtype = STORAGE[cfg.dtype][1]
        self.identity = ctxs_model(cfg)

    # --- per-token pieces -------------------------------------------------

    @staticmethod
    def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [n, heads, head_dim]; element i pairs with i + half.
        half = self.cfg.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)

    def _angles(self, pos0: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        ang = torch.arange(pos0, pos0 + n, dtype=torch.float64)[:, None] * self.inv_freq
        return torch.cos(ang).float(), torch.sin(ang).float()

    # --- the pass -----------------------------------------------------------

    def forward(self, views, plan, pos0: int, ids: Sequence[int],
                slots: Sequence[Tuple[int, int]], check: bool = False) -> torch.Tensor:
        """Runs ids at positions pos0.. through every layer; their K/V go to
        the slot runs `slots` ([(slot, count)], in order) of the session's
        views (or, with check, are compared with what those slots hold);
        attention reads the plan's keys in place. Returns the last token's
        logits [vocab]."""
        cfg = self.cfg
        n, H, KV, hd = len(ids), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        G = H // KV
        spans = _spans(plan)
        kpos = torch.cat([torch.arange(p, p + c) for p, _, c in spans])
        qpos = torch.arange(pos0, pos0 + n)
        window = plan.window if plan.window else plan.n_tokens
        visible = (kpos[None, :] <= qpos[:, None]) & (
            (kpos[None, :] < plan.n_sink) | (kpos[None, :] > qpos[:, None] - window))
        masked = not bool(visible.all())
        cos, sin = self._angles(pos0, n)
        differ = False

        x = self.embed[torch.tensor(list(ids))]
        for l, L in enumerate(self.layers):
            K, V = views[l]
            h = self._rmsnorm(x, L["attn_norm"])
            q = self._rope((h @ L["wq"]).view(n, H, hd), cos, sin)
            k = self._rope((h @ L["wk"]).view(n, KV, hd), cos, sin)
            v = (h @ L["wv"]).view(n, KV, hd)
            # [KV, n, hd] in the session's dtype, into the reserved slots.
            ks = k.transpose(0, 1).to(self.store_dtype)
            vs = v.transpose(0, 1).to(self.store_dtype)
            t = 0
            for slot, count in slots:
                if check:
                    differ |= not (torch.equal(K[:, slot:slot + count], ks[:, t:t + count])
                                   and torch.equal(V[:, slot:slot + count], vs[:, t:t + count]))
                else:
                    K[:, slot:slot + count] = ks[:, t:t + count]
                    V[:, slot:slot + count] = vs[:, t:t + count]
                t += count
            # The plan's keys where they lie: one [KV, count, hd] slice of
            # the mapping per span (one span until the ring wraps), widened
            # to float32 for the arithmetic.
            keys = _gather(K, spans)
            vals = _gather(V, spans)
            qg = q.view(n, KV, G, hd).permute(1, 2, 0, 3)            # [KV, G, n, hd]
            scores = qg @ keys.transpose(1, 2).unsqueeze(1) * (hd ** -0.5)  # [KV, G, n, T]
            if masked:
                scores = scores.masked_fill(~visible, float("-inf"))
            att = torch.softmax(scores, dim=-1) @ vals.unsqueeze(1)  # [KV, G, n, hd]
            att = att.permute(2, 0, 1, 3).reshape(n, H * hd)
            x = x + att @ L["wo"]
            h = self._rmsnorm(x, L["ffn_norm"])
            x = x + (torch.nn.functional.silu(h @ L["w_gate"]) * (h @ L["w_up"])) @ L["w_down"]
        if differ:
            raise ResumeMismatch(
                f"the K/V of position {pos0 + n - 1} recompute to other bits than the "
                "session holds: written by another model, window or build")
        # One row, the same code whatever n was.
        return (self._rmsnorm(x[n - 1:], self.out_norm) @ self.unembed)[0]


def create_session(path: str, model: Model, capacity: int = 2048, window: int = 0,
                   durability: str = "async") -> "ctxstore.Session":
    """A new session file for model: a ring of capacity slots, 4 sinks,
    attention over the sinks and the last `window` tokens (0: all held)."""
    return ctxstore.Session.create(path, model.identity, capacity=capacity,
                                   window=window, durability=durability)


def open_session(path: str, model: Model, window: int = 0,
                 durability: str = "async") -> "ctxstore.Session":
    """Opens path read-write for model (ctxstore.Error CTXS_EMODEL if it was
    written for another), with the window it was created with."""
    return ctxstore.Session.open(path, model.identity, window=window,
                                 durability=durability)


def greedy(logits: torch.Tensor) -> int:
    """The most likely id, the lowest on ties (torch.argmax's rule)."""
    return int(torch.argmax(logits))


class Engine:
    """A model generating into one open read-write session. A context
    manager: close() lets go of the views, then closes the session (a view
    keeps a session's mapping, and its writer lock, alive)."""

    def __init__(self, model: Model, session: "ctxstore.Session"):
        self.model = model
        self.session = session
        # Each layer's K and V: [kv_heads, capacity, head_dim] over the
        # mapping, made once; they stay valid while the session is open.
        self.views = [(_storage_view(session.torch_k(l), model.store_dtype),
                       _storage_view(session.torch_v(l), model.store_dtype))
                      for l in range(model.cfg.n_layers)]
        self.next_id: Optional[int] = None
        self.logits: Optional[torch.Tensor] = None

    def close(self) -> None:
        self.views = []
        self.session.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _pass(self, plan, pos0, ids, slots, check=False) -> int:
        with torch.no_grad():
            self.logits = self.model.forward(self.views, plan, pos0, ids, slots, check)
        self.next_id = greedy(self.logits)
        return self.next_id

    def feed(self, ids: Sequence[int]) -> int:
        """Appends ids (a prompt, or one generated token) in one reservation
        and one commit, and returns the greedy prediction after the last. All
        but the last are computed as one batch, the last alone (see the
        module on exact resumes). One reservation holds at most the ring
        (capacity - n_sink tokens; ctxstore.Error CTXS_EINVAL beyond)."""
        ids = [int(i) for i in ids]
        if not ids or any(not 0 <= i < self.model.cfg.vocab for i in ids):
            raise ValueError(f"ids must be 1 or more values in [0, {self.model.cfg.vocab})")
        s = self.session
        # On an error after the reserve, the reservation stays: close and
        # reopen the session before going on (what a kill does anyway).
        r = s.reserve(len(ids))
        flat = [slot + i for slot, count in _spans(r) for i in range(count)]
        pos0, n = r.first_pos, len(ids)
        if n > 1:
            self._pass(s.attn_plan(n - 1), pos0, ids[:-1], _runs(flat[:-1]))
        self._pass(s.attn_plan(n), pos0 + n - 1, ids[-1:], [(flat[-1], 1)])
        s.commit(ids)
        return self.next_id

    def step(self, token: int) -> int:
        """Commits token and predicts the one after it. A kill loses at most
        this token."""
        return self.feed([token])

    def resume(self) -> int:
        """The prediction after the last committed token, recomputed with
        one token's forward pass, writing nothing; its K/V must recompute to
        the stored bits (ResumeMismatch)."""
        s = self.session
        n = s.n_tokens
        if n == 0:
            raise ValueError("the session holds no token to resume from")
        plan = s.attn_plan(0)  # serves the last committed position
        pos = n - 1
        slot = next(sl + pos - p for p, sl, c in _spans(plan) if p <= pos < p + c)
        token = int(s.tokens(pos, 1)[0])
        return self._pass(plan, pos, [token], [(slot, 1)], check=True)

    def generate(self, n: int, on_token=None) -> List[int]:
        """Feeds the pending prediction n times (each committed before
        on_token(id) hears of it); returns the ids."""
        if self.next_id is None:
            raise ValueError("nothing to generate from: feed() or resume() first")
        out = []
        for _ in range(n):
            tok = self.next_id
            self.step(tok)
            out.append(tok)
            if on_token:
                on_token(tok)
        return out


def _gather(kv: torch.Tensor, spans) -> torch.Tensor:
    """The plan's slots of one layer's K or V ([KV, capacity, hd]) as float32
    [KV, n_keys, hd]: read from the mapping, widened on the way."""
    if len(spans) == 1:
        _, s, c = spans[0]
        return kv[:, s:s + c].float()
    return torch.cat([kv[:, s:s + c] for _, s, c in spans], dim=1).float()


def _runs(flat: Sequence[int]) -> List[Tuple[int, int]]:
    """Consecutive slots as (slot, count) runs."""
    runs: List[Tuple[int, int]] = []
    for sl in flat:
        if runs and runs[-1][0] + runs[-1][1] == sl:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((sl, 1))
    return runs
