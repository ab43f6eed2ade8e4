"""ctxstore: a persistent, memory-mapped KV cache for transformer inference.

A session is one conversation's KV cache in one file, laid out per layer as
``[2][n_kv_heads][capacity][head_dim]`` (K, then V) and mapped MAP_SHARED.
``Session.k(layer)`` and ``Session.v(layer)`` are NumPy arrays
``[n_kv_heads, capacity, head_dim]`` over that mapping, no copy: the
``[heads, seq, dim]`` that attention consumes. ``torch_k()``/``torch_v()``
are the same memory as PyTorch tensors. An engine reserves slots, writes
new keys and values into them (``write_layer()`` a layer at a time,
``write_token()``, or through the views), and commits; resuming after a
crash or a reboot is an open.

Example::

    import numpy as np, ctxstore

    model = ctxstore.Model(n_layers=2, n_kv_heads=2, head_dim=64)
    with ctxstore.Session.create("chat.ctxs", model, capacity=1024) as s:
        r = s.reserve(3)
        k = np.random.rand(2, 2, 64).astype(np.float32)
        for i in range(3):
            s.write_token(r, i, k, k)
        s.commit([101, 102, 103])
    with ctxstore.Session.open("chat.ctxs", model) as s:
        keys = s.k(0)[:, :s.n_tokens]          # float16 [heads, 3, 64], in place

Stores (``Store``) keep sessions by name in a directory with an LMDB index:
models, checkpoints, shared prefixes, metadata, pins, gc, export/import.

Errors: every failure of the library raises ``ctxstore.Error``, whose
``.code`` is the library's negative code (``ctxstore.EBUSY``, ``-errno``),
``.name`` its name ("CTXS_EBUSY", "ENOENT") and whose message ends with
``ctxs_strerror()``. Arguments of the wrong type, shape or range raise
TypeError/ValueError/IndexError before the library is called.

Lifetime of views: a view keeps the session's mapping alive. ``close()``
closes the Session for every call at once; the file itself is unmapped and
its lock released when the last view is gone too (see ``Session.close``).

Threads: a session is used by one call at a time (calls on one session
from several threads wait for each other); I/O releases the GIL. A store
may be used from any thread.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ctxstore
from ._ctxstore import (
    attention_isa,
    err_name,
    get_pressure,
    name_check,
    set_pressure,
    strerror,
    tokenizer_hash_strings,
    watcher_start,
    watcher_stop,
)

__all__ = [
    "Error", "Model", "Reservation", "Span", "Window", "AttnSpan", "AttnPlan",
    "AttentionWindows",
    "SessionInfo", "Session", "Store", "SessionEntry", "ModelEntry",
    "Checkpoint", "GcResult", "CompactResult", "Remote", "RemoteStats",
    "RemotePush", "RemotePull", "RemoteEntry", "RemoteInfo", "FileReport",
    "RecordReport", "inspect",
    "strerror", "err_name", "name_check", "set_pressure", "get_pressure",
    "watcher_start", "watcher_stop", "tokenizer_hash_strings", "attention_isa",
    "DTYPE_F16", "DTYPE_BF16", "DTYPE_Q8", "DTYPE_F32",
    "SYNC_NONE", "SYNC_ASYNC", "SYNC_FULL",
]

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

# Constants of the C header, without their CTXS_ prefix: DTYPE_*, SYNC_*,
# the error codes E* (ECORRUPT, EBUSY, ...), INFO_* flags, OPEN_*, STORE_*.
_g = globals()
for _name in dir(_ctxstore):
    if _name.isupper():
        _g[_name] = getattr(_ctxstore, _name)
        if _name.startswith("E") or _name.startswith("DTYPE_") or _name.startswith("SYNC_"):
            if _name not in __all__:
                __all__.append(_name)
del _g, _name

__version__ = f"{VERSION_MAJOR}.{VERSION_MINOR}.{VERSION_PATCH}"  # noqa: F821


class Error(Exception):
    """A failure reported by the library.

    Attributes:
        code: the negative return code: ``-errno`` (``-errno.ENOENT``) or one
            of the library's codes (``ctxstore.ECORRUPT``, ``EBUSY``, ...).
        name: the code's name, "CTXS_EBUSY" or "ENOENT" (``ctxs_err_name``).
        pos: for ``Session.verify()``, the first position that failed.

    ``str(e)`` says what was being done, then ``ctxs_strerror(code)``; for a
    refused name, why it is refused.
    """

    code: Optional[int] = None
    name: Optional[str] = None
    pos: Optional[int] = None


_ctxstore._set_error_class(Error)


def _error(code: int, message: str) -> Error:
    """An Error raised here rather than by the library, with its code."""
    e = Error(f"{message}: {strerror(code)}")
    e.code, e.name = code, err_name(code)
    return e


# --- Small types -------------------------------------------------------------

_DTYPE_NAMES = {1: "f16", 2: "bf16", 3: "q8", 4: "f32"}
_DTYPES = {"f16": 1, "float16": 1, "fp16": 1, "bf16": 2, "bfloat16": 2,
           "q8": 3, "int8": 3, "f32": 4, "float32": 4}
_DURABILITY = {"none": 0, "async": 1, "full": 2}
_DURABILITY_NAMES = {v: k for k, v in _DURABILITY.items()}


def _dtype(d: Union[int, str]) -> int:
    if isinstance(d, str):
        try:
            return _DTYPES[d.lower()]
        except KeyError:
            raise ValueError(f"unknown dtype {d!r}: one of f16, bf16, q8") from None
    return int(d)


class _ModelFields(NamedTuple):
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: int = 1
    model_hash: bytes = bytes(16)
    tokenizer_hash: bytes = bytes(16)
    schedule: Tuple[int, ...] = ()


class Model(_ModelFields):
    """What a session's KV belongs to: geometry, dtype, two hashes and the
    layer schedule.

    ``Model(n_layers, n_kv_heads, head_dim, dtype=DTYPE_F16,
    model_hash=bytes(16), tokenizer_hash=bytes(16), schedule=())``, a named
    tuple. ``dtype`` is ``DTYPE_F16`` (default), ``DTYPE_BF16`` or
    ``DTYPE_Q8`` (or "f16", "bf16", "q8"). ``model_hash`` is 16 bytes
    (``Store.hash_file()`` of the weights, or the app's own);
    ``tokenizer_hash`` likewise. ``schedule`` is the repeating pattern of
    sliding windows, one per layer of the pattern, 0 for a global layer (at
    most 8; layer ``l`` has ``schedule[l % len(schedule)]``): ``(512,) * 5 +
    (0,)`` for Gemma 3; ``()`` (default) makes every layer global. A windowed
    layer keeps a ring of its window plus the batch, and its views
    (``k(layer)``, ``v(layer)``) are that ring's slots. A session opened with
    another model fails with ``EMODEL``.
    """

    __slots__ = ()

    def __new__(cls, n_layers: int, n_kv_heads: int, head_dim: int,
                dtype: Union[int, str] = 1, model_hash: bytes = bytes(16),
                tokenizer_hash: bytes = bytes(16), schedule: Sequence[int] = ()) -> Model:
        # Checked here, not when a session is made with it much later.
        hashes = bytes(model_hash), bytes(tokenizer_hash)
        for what, h in zip(("model_hash", "tokenizer_hash"), hashes):
            if len(h) != 16:
                raise ValueError(f"{what} is 16 bytes (XXH3-128, as Store.hash_file() "
                                 f"gives), not {len(h)}")
        sched = tuple(int(w) for w in schedule)
        if len(sched) > 8 or any(w < 0 for w in sched) or (sched and not any(sched)):
            raise ValueError(f"a schedule is at most 8 windows, not below 0, at least one "
                             f"not 0 (() makes every layer global), not {sched!r}")
        return super().__new__(cls, int(n_layers), int(n_kv_heads), int(head_dim),
                               _dtype(dtype), *hashes, sched)

    @property
    def dtype_name(self) -> str:
        """"f16", "bf16" or "q8"."""
        return _DTYPE_NAMES.get(self.dtype, str(self.dtype))


class Span(NamedTuple):
    """A run of ``count`` slots from ``slot``."""
    slot: int
    count: int


class Reservation(NamedTuple):
    """Slots for tokens ``first_pos .. first_pos + n_tokens - 1``, in at most
    two spans (a ring wraps after the sinks). Token i of the reservation
    lives in slot ``spans[0].slot + i`` while i < ``spans[0].count``."""
    first_pos: int
    n_tokens: int
    spans: Tuple[Span, ...]

    def slot(self, i: int) -> int:
        """The slot of token i of the reservation."""
        if not 0 <= i < self.n_tokens:
            raise IndexError(f"token {i} of a reservation of {self.n_tokens}")
        for sp in self.spans:
            if i < sp.count:
                return sp.slot + i
            i -= sp.count
        raise IndexError(i)  # unreachable for a reservation from reserve()


class Window(NamedTuple):
    """The attention window: ``n_tokens`` slots in at most two spans."""
    n_tokens: int
    spans: Tuple[Span, ...]


class AttentionWindows(NamedTuple):
    """The sliding windows of a session's layers, given at open
    (``attention_windows=``) for a session whose file keeps every layer
    whole (a model schedule of period 0, as llama.cpp's ``swa_full``):
    layer ``l`` reads only its last ``window`` positions unless bit
    ``l % period`` of ``global_mask`` is set. ``attn_plan(layer=l)``
    plans it so, and the bring-in after an open reads only that. Nothing
    is kept less (``ctxs_open_options``' ``attn_*``)."""
    period: int
    window: int
    global_mask: int


class AttnSpan(NamedTuple):
    """Consecutive slots holding consecutive positions from ``pos``."""
    pos: int
    slot: int
    count: int


class AttnPlan(NamedTuple):
    """The slots one attention pass reads, in position order (ctxs_attn_plan)."""
    n_tokens: int
    first_query: int
    n_sink: int
    window: int
    n_keys: int
    spans: Tuple[AttnSpan, ...]

    def slots(self) -> np.ndarray:
        """The plan's slots in position order, as an index array."""
        if not self.spans:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(s.slot, s.slot + s.count) for s in self.spans])


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """``ctxs_session_info``: the state of an open session."""
    model: Model
    format_major: int
    format_minor: int
    capacity: int
    n_sink: int
    n_tokens: int
    ring_start: int
    n_held: int
    n_reserved: int
    window: int
    durability: str
    seq: int
    verified_from: int
    lost_tokens: int
    file_bytes: int
    created_unix_ms: int
    flags: int

    readonly = property(lambda self: bool(self.flags & INFO_READONLY),  # noqa: F821
                        doc="Opened read-only.")
    wrapped = property(lambda self: bool(self.flags & INFO_WRAPPED),  # noqa: F821
                       doc="The ring has evicted tokens.")
    recovered = property(lambda self: bool(self.flags & INFO_RECOVERED),  # noqa: F821
                         doc="The last open fell back to an older state.")
    verified = property(lambda self: bool(self.flags & INFO_VERIFIED),  # noqa: F821
                        doc="The last open verified tokens.")
    ring = property(lambda self: bool(self.flags & INFO_RING),  # noqa: F821
                    doc="The session has a ring.")
    partial_window = property(lambda self: bool(self.flags & INFO_PARTIAL_WINDOW),  # noqa: F821
                              doc="Attention reads fewer tokens than are held.")
    background = property(lambda self: bool(self.flags & INFO_BACKGROUND),  # noqa: F821
                          doc="The library's thread reads the window ahead after an open.")


class Checkpoint(NamedTuple):
    """A named token count of a session."""
    name: str
    n_tokens: int
    created_unix_ms: int
    stale: bool


class SessionEntry(NamedTuple):
    """A session as the store's index knows it (``ctxs_session_entry``)."""
    name: str
    id: int
    model_hash: bytes
    n_tokens: int
    disk_bytes: int
    created_unix_ms: int
    last_used_unix_ms: int
    parent_id: int
    fork_tokens: int
    pinned: bool


class ModelEntry(NamedTuple):
    """A registered model."""
    model: Model
    name: str
    registered_unix_ms: int


class GcResult(NamedTuple):
    """What ``Store.gc()`` deleted (or would delete, in a dry run)."""
    bytes_before: int
    bytes_after: int
    skipped_open: int
    skipped_pinned: int
    sessions: List[SessionEntry]

    @property
    def deleted(self) -> List[str]:
        """Names of the sessions deleted, least recently used first."""
        return [e.name for e in self.sessions]


class CompactResult(NamedTuple):
    """``ctxs_store_compact_result``."""
    sessions: int
    skipped_busy: int
    bytes_before: int
    bytes_after: int
    index_bytes_before: int
    index_bytes_after: int
    index_compacted: bool
    index_busy: bool
    orphans_removed: int


Progress = Callable[[int, int], Any]
"""A progress callable: ``progress(done, total)``, in the operation's units."""


class RecordReport(NamedTuple):
    """One of a session file's two commit records (``ctxs_record_report``)."""
    status: int
    current: bool
    seq: int
    n_tokens: int
    ring_start: int
    verified_from: int
    written_unix_ms: int
    this_boot: bool
    boot_known: bool


class FileReport(NamedTuple):
    """What a session file says of itself (``ctxs_file_report``): ``status``
    is 0 when it opens, else why not (``EFOREIGN``, ``EVERSION``,
    ``ECORRUPT``, ``-errno``); ``model`` is None when the header is bad."""
    status: int
    format_major: int
    format_minor: int
    header_status: int
    header_crc_ok: bool
    model: Optional[Model]
    capacity: int
    n_sink: int
    ring: bool
    created_unix_ms: int
    file_bytes: int
    size_bytes: int
    disk_bytes: int
    records: Tuple[RecordReport, RecordReport]
    label_status: int
    label_id: int
    label_name: str
    writer_open: bool
    reader_open: bool
    writer_pid: int
    writer_command: str


def inspect(path: PathLike) -> FileReport:
    """Describe the session file at ``path`` without opening it as a session
    (``ctxs_file_inspect``): its header, both commit records, its label, and
    whether a handle in any process has it open now (``writer_pid`` and
    ``writer_command`` name the writer's process where the system tells,
    else 0 and ""). Works on a file that
    does not open; takes no lock. ``Error`` (``-ENOENT``, ``-EACCES``, ...)
    only when the file cannot be read at all."""
    d = _ctxstore.inspect(path)
    d["model"] = None if d["model"] is None else Model(*d["model"])
    d["records"] = tuple(RecordReport(**r) for r in d["records"])
    return FileReport(**d)


class RemoteStats(NamedTuple):
    """The remote's counters since it was opened (``ctxs_remote_stats``)."""
    chunks_pushed: int
    chunks_present: int
    bytes_pushed: int
    records_pushed: int
    jobs_queued: int
    chunks_dropped: int
    retries: int
    last_error: int
    connected: bool


class RemotePush(NamedTuple):
    """What ``Remote.push()`` did (``ctxs_remote_push_result``)."""
    n_tokens: int
    chunks_sent: int
    chunks_present: int
    bytes_sent: int


class RemotePull(NamedTuple):
    """What a pull made (``ctxs_remote_pull_result``): ``n_tokens`` in the
    local session, ``rest_ids`` the token ids left to prefill (a chunk
    Redis evicted, or one that did not verify, ends a pull), ``session`` the
    new session when ``open=True``, else None."""
    n_tokens: int
    remote_tokens: int
    chunks_pulled: int
    chunks_missing: int
    chunks_refused: int
    rest_ids: np.ndarray
    model: Model
    session: Optional[Session]


class RemoteEntry(NamedTuple):
    """A session record Redis holds (``ctxs_remote_entry``); ``status``
    ``EREMOTE`` marks a damaged record."""
    name: str
    model_hash: bytes
    n_tokens: int
    updated_unix_ms: int
    tail_pushed: bool
    status: int


class RemoteInfo(NamedTuple):
    """What the server says of itself (``ctxs_remote_info``)."""
    server_version: str
    used_memory: int
    maxmemory: int
    maxmemory_policy: str
    evicted_keys: int
    keys: int


def _durability(d: Union[str, int]) -> int:
    if isinstance(d, str):
        try:
            return _DURABILITY[d.lower()]
        except KeyError:
            raise ValueError(f"durability {d!r}: one of 'none', 'async', 'full'") from None
    return int(d)


def _open_opts(window: int = 0, pressure_window: int = 0,
               durability: Union[str, int] = "async", background: bool = True,
               attention_windows: Optional[AttentionWindows] = None) -> Tuple[int, ...]:
    try:
        period, attn_window, mask = (0, 0, 0) if attention_windows is None else attention_windows
    except (TypeError, ValueError):
        raise ValueError(f"attention_windows {attention_windows!r}: "
                         "AttentionWindows(period, window, global_mask) or None") from None
    return (window, pressure_window, _durability(durability), 1 if background else 0,
            period, attn_window, mask)


def _create_opts(capacity: int = 2048, n_sink: int = 4, ring: bool = False,
                 **open_kw: Any) -> Tuple[int, int, int, Tuple[int, ...]]:
    return (capacity, n_sink, 1 if ring else 0, _open_opts(**open_kw))


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is optional
        raise ImportError("ctxstore's torch views need PyTorch (python3-torch)") from e
    return torch


def _to_torch(a: np.ndarray, bf16: bool):
    # torch has no read-only tensors: a tensor over a read-only session's
    # pages (mapped PROT_READ) would look writable, and a write into it
    # would kill the process with SIGSEGV. So there is none.
    if not a.flags.writeable:
        raise _error(EREADONLY, "torch views of a read-only session: torch has no read-only "
                     "tensors, and a write into one would kill the process (its pages are "
                     "mapped read-only); use the NumPy view (k(), v(): writes raise "
                     "ValueError), or torch.from_numpy(view.copy()) for a copy")  # noqa: F821
    torch = _torch()
    if bf16:  # torch has no uint16: int16 bits, reinterpreted
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# --- Session -----------------------------------------------------------------


class Session(_ctxstore.SessionBase):
    """An open session: one conversation's KV cache in one mapped file.

    Made by ``Session.create()``, ``Session.open()``, ``Store.create_session()``,
    ``Store.open_session()``, ``Store.fork(..., open=True)``; a context manager
    (``with`` closes it). Methods raise ``Error`` on a closed session.

    Write path: ``r = s.reserve(n)``; write the new K/V a layer at a time as
    a forward pass makes them (``write_layer``: never a page fault on the
    mapping, whatever the pause since the last turn), a token at a time
    (``write_token``), or into ``s.k(layer)[:, r.slot(i)]`` in the
    session's dtype; then ``s.commit(token_ids)``.
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kw: Any) -> None:
        raise TypeError("use Session.create(), Session.open() or a Store")

    @classmethod
    def create(cls, path: PathLike, model: Model, *, capacity: int = 2048,
               n_sink: int = 4, ring: bool = False, window: int = 0,
               pressure_window: int = 0, durability: Union[str, int] = "async",
               background: bool = True,
               attention_windows: Optional[AttentionWindows] = None) -> Session:
        """Create a session file at ``path`` for ``model`` and open it read-write.

        Args:
            capacity: slots in the file (sparse on disk until reserved).
            n_sink: leading slots a ring never overwrites.
            ring: True: when full, overwrite the oldest tokens after the
                sinks (they are lost); False (the default): ``reserve()``
                fails with ``EFULL`` and nothing is lost.
            window: recent tokens attention reads beside the sinks; 0 = all.
            pressure_window: the window under memory pressure; 0 = half.
            durability: "none", "async" (default) or "full" (survives power
                loss), or ``SYNC_*``.
            background: let the library's thread read ahead and allocate the
                next turn's slots off the caller's thread.
            attention_windows: the layers' sliding windows
                (``AttentionWindows``), for a session that keeps every layer
                whole; None: none.

        Raises ``Error`` (``-EEXIST`` if the file exists, ``EINVAL``, ...).
        """
        self = cls.__new__(cls)
        self._file(path, model, 0,
                   _create_opts(capacity, n_sink, ring, window=window,
                                pressure_window=pressure_window,
                                durability=durability, background=background,
                                attention_windows=attention_windows),
                   _open_opts())
        return self

    @classmethod
    def open(cls, path: PathLike, model: Optional[Model] = None, *,
             readonly: bool = False, verify: bool = False, window: int = 0,
             pressure_window: int = 0, durability: Union[str, int] = "async",
             background: bool = True,
             attention_windows: Optional[AttentionWindows] = None) -> Session:
        """Open a session file. A writer (default) takes the file's one
        writer lock (``EBUSY`` if another holds it) and needs ``model``
        (``EMODEL`` if it differs); ``readonly=True`` coexists with a writer
        and accepts ``model=None``. ``verify=True`` checks the tokens since
        the last durable point as after a power loss. Other options as for
        ``create()``."""
        flags = (RDONLY if readonly else 0) | (OPEN_VERIFY if verify else 0)  # noqa: F821
        self = cls.__new__(cls)
        self._file(path, model, flags, None,
                   _open_opts(window, pressure_window, durability, background,
                              attention_windows))
        return self

    def fork(self, path: PathLike, n_tokens: Optional[int] = None, *,
             window: int = 0, pressure_window: int = 0,
             durability: Union[str, int] = "async", background: bool = True,
             attention_windows: Optional[AttentionWindows] = None) -> Session:
        """A new session file at ``path`` holding this session's first
        ``n_tokens`` committed tokens (None: all), opened read-write."""
        new = type(self).__new__(type(self))
        self._fork_to(new, path, n_tokens,
                      _open_opts(window, pressure_window, durability, background,
                                 attention_windows))
        return new

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<ctxstore.Session closed>"
        m = self.model
        return (f"<ctxstore.Session {m.n_layers}x{m.n_kv_heads}x{m.head_dim} "
                f"{m.dtype_name} capacity={self.capacity} n_tokens={self.n_tokens}"
                f"{' readonly' if self.readonly else ''}>")

    # Geometry, from the layout read at open.
    @property
    def model(self) -> Model:
        """The session's model as stored in its file (hashes from info())."""
        return self.info().model

    @property
    def capacity(self) -> int:
        """Slots in the file: the second axis of the views."""
        return self._layout()[4]

    @property
    def n_sink(self) -> int:
        """Leading slots never overwritten by the ring."""
        return self._layout()[5]

    @property
    def shape(self) -> Tuple[int, int, int]:
        """The shape of one layer's view: (n_kv_heads, capacity, head_dim)."""
        L = self._layout()
        return (L[1], L[4], L[2])

    @property
    def dtype(self) -> int:
        """The session's dtype: DTYPE_F16, DTYPE_BF16 or DTYPE_Q8."""
        return self._layout()[3]

    def reserve(self, n: int) -> Reservation:
        """Reserve slots for ``n`` more tokens (allocating their disk blocks;
        in a full ring, evicting the oldest tokens after the sinks). The
        engine writes the tokens' K/V, then commits. Releases the GIL."""
        first, count, spans = self._reserve(n)
        return Reservation(first, count, tuple(Span(*s) for s in spans))

    def info(self) -> SessionInfo:
        """The session's state (``ctxs_session_get_info``)."""
        t = self._info()
        return SessionInfo(Model(*t[0]), *t[1:10],
                           _DURABILITY_NAMES.get(t[10], str(t[10])), *t[11:])

    def window(self) -> Window:
        """The current attention window: the slots beside the sinks attention reads."""
        n, spans = self._window()
        return Window(n, tuple(Span(*s) for s in spans))

    def attn_plan(self, n_pending: int = 0, layer: Optional[int] = None) -> AttnPlan:
        """The plan of the next attention passes: committed tokens plus the
        first ``n_pending`` reserved (and written) ones, in position order.
        With ``layer``, that layer's own (``ctxs_session_get_layer_attn``):
        a sliding-window layer of the model's schedule or of the open's
        ``attention_windows`` reads its last positions, no sinks. Valid
        until the next reserve, commit, rollback or refresh."""
        n, first, sink, window, n_keys, spans = self._attn_plan(n_pending, layer)
        return AttnPlan(n, first, sink, window, n_keys,
                        tuple(AttnSpan(*s) for s in spans))

    def checkpoints(self) -> List[Checkpoint]:
        """The session's checkpoints, in name order, each marked stale or not."""
        return [Checkpoint(*c) for c in self._checkpoints()]

    def write_token(self, reservation: Reservation, i: int, k: Any, v: Any) -> None:
        """Write token ``i`` of ``reservation``: ``k`` and ``v`` are
        [n_layers, n_kv_heads, head_dim] arrays (NumPy, or anything NumPy
        converts) of float32 (any session; rounded to its dtype) or float16,
        or torch.bfloat16 tensors on a bf16 session (copied as they are).
        Releases the GIL."""
        return super().write_token(reservation, i, self._token_in(k, "k"),
                                   self._token_in(v, "v"))

    def write_layer(self, reservation: Reservation, layer: int, i: int, k: Any,
                    v: Any) -> None:
        """Write one layer's K and V of tokens ``i`` onward of
        ``reservation``: [n, n_kv_heads, head_dim] arrays, in the forms
        ``write_token()`` takes (a torch.bfloat16 tensor on a bf16 session
        included). Releases the GIL."""
        return super().write_layer(reservation, layer, i, self._token_in(k, "k"),
                                   self._token_in(v, "v"))

    def _token_in(self, x: Any, what: str) -> Any:
        # NumPy has no bfloat16, so torch's cannot become an array: it goes
        # in as float32, which holds every bfloat16 exactly and which the
        # library rounds back to the same bits.
        if str(getattr(x, "dtype", "")) != "torch.bfloat16":
            return x
        if self.dtype != DTYPE_BF16:  # noqa: F821
            raise TypeError(f"{what} is a bfloat16 tensor, and this session holds "
                            f"{_DTYPE_NAMES.get(self.dtype, self.dtype)}: give float32 "
                            f"(rounded to the session's dtype) or float16")
        return x.detach().to("cpu").float().numpy()

    # PyTorch: the same memory as the NumPy views.
    def torch_k(self, layer: int):
        """``k(layer)`` as a torch.Tensor over the same memory (bf16 sessions
        as torch.bfloat16; Q8 as torch.int8, scales in torch_k_scales()).

        A read-only session has no torch views (``Error``, code
        ``EREADONLY``): torch has no read-only tensors, and its pages are
        mapped PROT_READ, so a write into such a tensor would kill the
        process. Read it through ``k()``, a read-only NumPy array."""
        return _to_torch(self.k(layer), self.dtype == DTYPE_BF16)  # noqa: F821

    def torch_v(self, layer: int):
        """``v(layer)`` as a torch.Tensor over the same memory."""
        return _to_torch(self.v(layer), self.dtype == DTYPE_BF16)  # noqa: F821

    def torch_k_scales(self, layer: int):
        """A Q8 session's ``k_scales(layer)`` as a float32 torch.Tensor."""
        return _to_torch(self.k_scales(layer), False)

    def torch_v_scales(self, layer: int):
        """A Q8 session's ``v_scales(layer)`` as a float32 torch.Tensor."""
        return _to_torch(self.v_scales(layer), False)


# --- Store -------------------------------------------------------------------


class Store(_ctxstore.StoreBase):
    """A directory of sessions known by name (an LMDB index + session files).

    ``Store(path)`` opens an existing store (``-ENOENT``/``EFOREIGN``
    otherwise); ``create=True`` makes it where there is none;
    ``readonly=True`` reads it without writing (every write: ``EREADONLY``).
    A context manager. Thread-safe. Sessions opened through it keep it
    open until they (and their views) are closed, even after ``close()``.
    """

    __slots__ = ()

    def __init__(self, path: PathLike, *, create: bool = False,
                 readonly: bool = False) -> None:
        flags = (STORE_CREATE if create else 0) | (RDONLY if readonly else 0)  # noqa: F821
        self._open(path, flags)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ctxstore.Store{' closed' if self.closed else ''}>"

    def models(self) -> List[ModelEntry]:
        """Registered models, in hash order."""
        return [ModelEntry(Model(*m), name, ms) for m, name, ms in self._models()]

    def create_session(self, name: str, model: Model, *, capacity: int = 2048,
                       n_sink: int = 4, ring: bool = False, window: int = 0,
                       pressure_window: int = 0, durability: Union[str, int] = "async",
                       background: bool = True,
                       attention_windows: Optional[AttentionWindows] = None) -> Session:
        """Create the session ``name`` for a registered ``model`` and open it
        read-write (options as ``Session.create()``). ``ETAKEN`` if the
        name is taken, ``ENOMODEL`` if the model is not registered."""
        s = Session.__new__(Session)
        self._session_create(s, name, tuple(model),
                             _create_opts(capacity, n_sink, ring, window=window,
                                          pressure_window=pressure_window,
                                          durability=durability, background=background,
                                          attention_windows=attention_windows))
        return s

    def open_session(self, name: str, model: Optional[Model] = None,
                     readonly: bool = False, *, verify: bool = False,
                     window: int = 0, pressure_window: int = 0,
                     durability: Union[str, int] = "async",
                     background: bool = True,
                     attention_windows: Optional[AttentionWindows] = None) -> Session:
        """Open the session ``name`` (as ``Session.open()``; ``model`` may be
        None only with ``readonly=True``). ``ENOTFOUND`` if there is none."""
        flags = (RDONLY if readonly else 0) | (OPEN_VERIFY if verify else 0)  # noqa: F821
        s = Session.__new__(Session)
        self._session_open(s, name, None if model is None else tuple(model), flags,
                           _open_opts(window, pressure_window, durability, background,
                                      attention_windows))
        return s

    def fork(self, src: str, name: str, n_tokens: Optional[int] = None,
             checkpoint: Optional[str] = None, *, open: bool = False,
             window: int = 0, pressure_window: int = 0,
             durability: Union[str, int] = "async", background: bool = True,
             attention_windows: Optional[AttentionWindows] = None) -> Optional[Session]:
        """Create session ``name`` from the first ``n_tokens`` tokens of
        ``src`` (None: all it holds), or from its ``checkpoint``: the source
        first, as ``ctxstore fork SRC DST`` and ``ctxs_store_session_fork()``
        take it. With ``open=True`` returns the new session open read-write,
        else None. Releases the GIL."""
        if n_tokens is not None and checkpoint is not None:
            raise ValueError("fork: n_tokens or checkpoint, not both")
        s = Session.__new__(Session) if open else None
        self._fork(s, name, src, n_tokens, checkpoint,
                   _open_opts(window, pressure_window, durability, background,
                              attention_windows))
        return s

    def sessions(self) -> List[SessionEntry]:
        """Every session, in name order."""
        return [SessionEntry(**e) for e in self._sessions()]

    def session(self, name: str) -> SessionEntry:
        """The index's entry of one session (``ENOTFOUND`` without it)."""
        return SessionEntry(**self._session(name))

    def __contains__(self, name: str) -> bool:
        try:
            self._session(name)
        except Error as e:
            if e.code == ENOTFOUND:  # noqa: F821
                return False
            raise
        return True

    def gc(self, budget_bytes: int, dry_run: bool = False) -> GcResult:
        """Delete least recently used sessions (never pinned or open ones)
        until the session files take at most ``budget_bytes``; ``dry_run``
        deletes nothing and says what would go. Releases the GIL."""
        d = self._gc(budget_bytes, dry_run)
        d["sessions"] = [SessionEntry(**e) for e in d["sessions"]]
        return GcResult(**d)

    def compact(self, name: Optional[str] = None, *,
                progress: Optional[Progress] = None) -> CompactResult:
        """Give back the disk blocks sessions do not use; with no name, every
        session and then the index itself (no other thread may use the store
        meanwhile). ``progress``: a callable(done, total), in sessions,
        called now and then and once at the end (an exception it raises is
        raised when compact returns; the compaction is not stopped).
        Releases the GIL (taken back only to call progress)."""
        return CompactResult(**self._compact(name, progress))

    def remote(self, url: str, *, timeout_ms: int = DEFAULT_REMOTE_TIMEOUT_MS,  # noqa: F821
               retries: int = DEFAULT_REMOTE_RETRIES,  # noqa: F821
               backoff_ms: int = DEFAULT_REMOTE_BACKOFF_MS,  # noqa: F821
               queue_max: int = DEFAULT_REMOTE_QUEUE_MAX,  # noqa: F821
               push_on_commit: bool = True, pull_on_open: bool = True,
               key_prefix: Optional[str] = None, call_ms: int = 0) -> Remote:
        """Attach the Redis server at ``url`` to this store (``ctxs_remote_open``).

        ``url`` is ``redis://[[user]:password@]host[:port][/db]`` or
        ``unix:///path/redis.sock[?db=N]``. With ``push_on_commit`` (default)
        read-write sessions opened through this store push each 64-token
        chunk their commits complete, on the library's background thread,
        and their tail and record at close; with ``pull_on_open`` (default)
        ``open_session()`` of a name the store lacks pulls it from Redis
        first. ``timeout_ms``: connect and per-command timeout; ``call_ms``:
        the deadline of one whole call (0: 5 minutes); ``retries``,
        ``backoff_ms``, ``queue_max``: the background pusher's;
        ``key_prefix``: every key's prefix ("ctxs"). The connection is
        checked before this returns. One remote per store; a context
        manager. Errors: ``Error`` with ``-ECONNREFUSED``, ``-ETIMEDOUT``,
        ``-EACCES`` (password), ``EREMOTE`` (the server's error), ``EBUSY``
        (the store has a remote), ``EINVAL`` (the url); the message ends
        with what the library found."""
        r = Remote.__new__(Remote)
        r._open(self, url, (timeout_ms, retries, backoff_ms, queue_max, push_on_commit,
                            pull_on_open, key_prefix, call_ms))
        return r


# --- Remote ------------------------------------------------------------------


class Remote(_ctxstore.RemoteBase):
    """A Redis server attached to a Store (``Store.remote()``): the fleet's
    shared tier. Thread-safe; a context manager (``close()`` at the end).

    Every call runs without the GIL and ends within the remote's deadline;
    a failure is ``Error`` with the library's code and, at the end of the
    message, what it found (``ctxs_get_last_error()``).
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kw: Any) -> None:
        raise TypeError("use Store.remote(url)")

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ctxstore.Remote{' closed' if self.closed else ''}>"

    def push(self, name: str, *, progress: Optional[Progress] = None) -> RemotePush:
        """Push the local session ``name`` now: every chunk Redis lacks, its
        tail, its record. ``progress(done, total)`` counts tokens."""
        return RemotePush(**self._push(name, progress))

    def pull(self, remote_name: str, local_name: Optional[str] = None, *,
             open: bool = False, capacity: Optional[int] = None, n_sink: int = 4,
             ring: bool = False, progress: Optional[Progress] = None) -> RemotePull:
        """Make the local session ``local_name`` (default: ``remote_name``)
        from the remote session ``remote_name``, every chunk verified before
        it is written; the first chunk missing or refused ends it (see
        ``RemotePull.rest_ids``). The capacity is raised to hold the remote
        tokens unless ``capacity`` is given. ``open=True``: the result's
        ``session`` is the new session, open read-write."""
        s = Session.__new__(Session) if open else None
        opts = None if capacity is None else _create_opts(capacity, n_sink, ring)
        d = self._pull(s, remote_name, local_name, opts, progress)
        return RemotePull(**d, session=s)._replace(model=Model(*d["model"]))

    def pull_prefix(self, local_name: str, model: Model, tokens: Any, *,
                    open: bool = False, capacity: Optional[int] = None, n_sink: int = 4,
                    ring: bool = False) -> RemotePull:
        """Make the local session ``local_name`` from the longest prefix of
        ``tokens`` that Redis holds for ``model`` (``ENOTFOUND``: not even
        its first chunk)."""
        s = Session.__new__(Session) if open else None
        opts = None if capacity is None else _create_opts(capacity, n_sink, ring)
        d = self._pull_prefix(s, local_name, tuple(model), tokens, opts)
        return RemotePull(**d, session=s)._replace(model=Model(*d["model"]))

    def ls(self) -> List[RemoteEntry]:
        """Every session record Redis holds under the key prefix, in name order."""
        return [RemoteEntry(**e) for e in self._list()]

    def stats(self) -> RemoteStats:
        """The counters since the remote was opened (pushes, drops, retries)."""
        return RemoteStats(**self._stats())

    def info(self) -> RemoteInfo:
        """The server's version, memory, maxmemory and policy, evictions, keys."""
        return RemoteInfo(**self._info())

    def flush(self, timeout_ms: int = DEFAULT_REMOTE_TIMEOUT_MS) -> RemoteStats:  # noqa: F821
        """Wait until the background queue is empty (``-ETIMEDOUT`` with jobs
        left after ``timeout_ms``); the counters."""
        return RemoteStats(**self._flush(timeout_ms))

    def close(self, timeout_ms: int = DEFAULT_REMOTE_TIMEOUT_MS) -> Optional[RemoteStats]:  # noqa: F821
        """Flush for at most ``timeout_ms``, stop the push thread, detach from
        the store: the final counters (None when already closed, or when a
        call on another thread is still running: it closes when that ends).
        ``-ETIMEDOUT`` when jobs were left (counted in chunks_dropped).
        Close the sessions opened through the store first: their close
        queues their tail and record. Idempotent."""
        d = self._close(timeout_ms)
        return None if d is None else RemoteStats(**d)
