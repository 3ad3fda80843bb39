"""Cold parameters: a model's weights live in a host tier and stream into HBM block by block.

``offload_parameters(model)`` moves the weights of each block (by default each child of the
model's largest ``nn.ModuleList``) into the tier copies of a tierflow session
(``tf_session``, include/tierflow/session.hpp), which plans the passes (forward over the
blocks, then backward over them in reverse), stages each block ``window`` blocks ahead, skips
blocks that did not run, starts a new pass when a forward goes back, and ends a pass after
block 0's backward. While block i runs forward, its params' ``.data`` are views of its HBM
staging; outside it they are placeholders of the param's shape and dtype (``requires_grad``
stays as it was, and autograd accumulates grads as usual): on the emulated device (CPU) a tensor
over the weight's tier copy itself, so a read outside the forward (a regularizer over
``model.parameters()``, a tied head, logging) sees the weight exactly; on CUDA a 1-element NaN
expanded to the shape (such a read is non-finite, never a finite wrong number). An in-place write
through the param outside a pass (``torch.no_grad(): p.mul_()``, ``torch.nn.init``) writes the
tier copy: the next forward uses it and ``OffloadAdamW`` re-reads its master from it
(``take_rewritten``), as after ``load_state_dict``; one while a pass is open (between a forward
and its backward) is refused at the block's next staging. The param's version counter tells. What
a block's forward saves for backward that is one of its weights is saved as a token
(``torch.autograd.graph.saved_tensors_hooks``) and re-staged when the backward pass reaches the
block, so the staging never holds more than the budget. ``OffloadAdamW`` finds an offloaded
weight here (``weight_of``) and makes its C optimizer in the session, which updates the tier
copy in place and never while the session may still stage it.
"""
from __future__ import annotations

import ctypes
import threading
import time
import weakref
from typing import Iterable, Optional

import torch
from torch import nn

from tierflow import _capi, _devices
from tierflow._model_state import _ModelState
from tierflow._views import _host_view, _view

__all__ = ["OffloadedParameters", "offload_parameters", "weight_of"]

_SUPPORTED = (torch.float32, torch.bfloat16, torch.float16)


def _storage_address(t: torch.Tensor) -> int:
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return storage.data_ptr()


def _default_blocks(model: nn.Module) -> list:
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if lists:
        return list(max(lists, key=len))
    return [m for m in model.modules()
            if not list(m.children()) and any(True for _ in m.parameters(recurse=False))]


def _collect(model, blocks):
    """The (block, params with elements) offload_parameters moves, checked."""
    chosen = _default_blocks(model) if blocks is None else list(blocks)
    seen = {}
    out = []
    for i, block in enumerate(chosen):
        if not isinstance(block, nn.Module):
            raise TypeError(f"blocks[{i}] is a {type(block).__name__}, not an nn.Module")
        params = [p for p in block.parameters() if p.numel() > 0]
        for p in params:
            if id(p) in seen:
                raise ValueError(f"blocks[{i}] and blocks[{seen[id(p)]}] share a param of "
                                 f"shape {tuple(p.shape)}: a weight lives in one block")
            if weight_of(p) is not None:
                raise ValueError(f"blocks[{i}]: a param is offloaded already")
            if p.dtype not in _SUPPORTED:
                raise TypeError(f"blocks[{i}]: a param is {p.dtype} (float32, bfloat16 or "
                                "float16)")
            if not p.is_contiguous():
                raise ValueError(f"blocks[{i}]: a param of shape {tuple(p.shape)} is not "
                                 "contiguous")
            seen[id(p)] = i
        if params:
            out.append((block, params))
    if not out:
        raise ValueError("offload_parameters: the blocks hold no params")
    devices = {p.device for _, ps in out for p in ps}
    if len(devices) != 1:
        raise ValueError(f"offload_parameters: params on {sorted(map(str, devices))}: "
                         "the offloaded params must share one device")
    return out

def _check_not_shared(model, blocks):
    """A weight of a block that a module outside the blocks also uses (tied weights: an
    embedding shared with a head in a block) would read the placeholder there: refused."""
    inside = {id(m) for block, _ in blocks for m in block.modules()}
    offloaded = {id(p) for _, ps in blocks for p in ps}
    for name, module in model.named_modules():
        if id(module) in inside:
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in offloaded:
                where = f"{name}.{pname}" if name else pname
                raise ValueError(
                    f"offload_parameters: {where} (shape {tuple(p.shape)}) is a weight of an "
                    "offloaded block that a module outside the blocks also uses (tied "
                    "weights): leave that block out, or list the sharing modules as one "
                    "block")


class _Saved:
    """A weight a block's forward saved for backward: which one, and the view of it saved."""

    __slots__ = ("block", "index", "offset", "size", "stride")

    def __init__(self, block, index, t):
        self.block, self.index = block, index
        self.offset, self.size, self.stride = t.storage_offset(), t.size(), t.stride()


# The weights live handles hold, by id(param): (weak handle, weight index). A step looks its
# params up here (weight_of): one dict read each, no lock (writes take it).
_offloaded: dict = {}
_offloaded_lock = threading.Lock()
# The figures a pass is measured by (metrics()["last_pass"]).
_PASS_KEYS = ("compute_s", "stall_s", "bytes_in", "bytes_out", "late_prefetches", "elapsed_s")
# Tests only: the placeholder CUDA gets (1-element NaN), on the emulated device too.
_NAN_PLACEHOLDERS = False


def _holder(param) -> Optional[tuple]:
    """(handle, weight index) of ``param`` if a live handle holds it."""
    entry = _offloaded.get(id(param))
    if entry is None:
        return None
    handle = entry[0]()
    if handle is None or handle._weights[entry[1]] is not param:
        return None  # a handle collected without remove(), or an id reused
    return handle, entry[1]


def weight_of(param) -> Optional[tuple]:
    """(session handle, weight index) of a weight that offload_parameters holds in a tier,
    else None: the optimizer makes its C optimizer in that session."""
    held = _holder(param)
    return None if held is None else (held[0]._session, held[1])


def rewritten(param) -> bool:
    """Whether ``param``'s weight was written since the optimizer last read it (load_state_dict,
    an in-place write or a new ``.data`` outside its block's forward); take_rewritten() takes
    it. An overlap announces no grad of such a weight: its update must start from the new
    master, which step() reads first."""
    held = _holder(param)
    if held is None:
        return False
    handle, i = held
    return bool(handle._note_writes((i,), idle=not handle._open)) or i in handle._rewritten


def take_rewritten(param) -> bool:
    """Whether ``param``'s weight was written since the last call (as rewritten()); the tier
    copy then holds the write (a new ``.data`` is copied in, ending a pass still open), and the
    optimizer re-reads its master weights from it."""
    held = _holder(param)
    if held is None:
        return False
    handle, i = held
    if handle._open and handle._replaced(i):
        handle._end_pass()  # the optimizer's step would end it first too
    handle._note_writes((i,), idle=True)
    if i not in handle._rewritten:
        return False
    handle._rewritten.discard(i)
    return True


class _TierCopies:
    """Owns the session: destroyed once the handle is removed and no tensor over a tier copy is
    left (a placeholder a user kept, ``w = p.detach()`` outside the forward, still reads memory
    the session holds)."""

    def __init__(self, session: ctypes.c_void_p, made_in: int):
        self.session, self.made_in = session, made_in
        self.removed = False  # a handle never removed keeps its session (as before)

    def __del__(self):
        # (in a forked child the session is the parent's: its threads are not here to join)
        if self.removed and self.session and _capi is not None and _devices is not None \
                and self.made_in == _devices.generation():
            _capi.lib.tf_session_destroy(self.session)
        self.session = None


_tier_copy_types: dict = {}  # bytes -> a ctypes array type whose instances take attributes


def _tier_view(address: int, like: torch.Tensor, owner: _TierCopies) -> torch.Tensor:
    """A tensor shaped and typed like ``like`` over a tier copy (no copy), which keeps ``owner``
    (the session) alive."""
    nbytes = like.numel() * like.element_size()
    kind = _tier_copy_types.get(nbytes)
    if kind is None:
        kind = _tier_copy_types[nbytes] = type("_TierCopy", (ctypes.c_uint8 * nbytes,), {})
    buffer = kind.from_address(address)
    buffer.owner = owner
    return torch.frombuffer(buffer, dtype=torch.uint8).view(like.dtype).view(like.shape)


class OffloadedParameters(_ModelState):
    """The handle ``offload_parameters`` returns (a context manager: leaving it removes)."""

    def __init__(self, model: nn.Module, blocks, window: int, hbm_budget: Optional[int],
                 placement: Optional[str], trace: bool):
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an int >= 0, not {window!r}")
        if hbm_budget is not None and (isinstance(hbm_budget, bool)
                                       or not isinstance(hbm_budget, int) or hbm_budget <= 0):
            raise ValueError(f"hbm_budget must be a byte count > 0, not {hbm_budget!r}")
        self._model = model
        self._made_in = _devices.generation()
        self._blocks = _collect(model, blocks)
        _check_not_shared(model, self._blocks)
        self._shapes = [[(p.shape, p.dtype) for p in ps] for _, ps in self._blocks]
        self._shapes_flat = [shape for shapes in self._shapes for shape in shapes]
        self._weights = [p for _, ps in self._blocks for p in ps]
        self._device = self._weights[0].device
        self._session = ctypes.c_void_p()
        self._build(window, hbm_budget, placement, trace)
        self._move_in()
        self._held = None  # (block, backward) staged now
        self._staged = {}  # block -> its params' staged views
        self._callback_queued = False
        self._pass_start = self._totals()
        self._last_pass = None
        self._wrap_forwards()
        self._weight_index = {id(p): i for i, p in enumerate(self._weights)}
        self._rewritten = set()  # weights whose tier copies were written since a step read them
        self._versions = [p._version for p in self._weights]  # as of the last look
        self._open = False  # a pass is open (from a block's staging to _end_pass)
        self._last_forward = -1  # the last block this pass ran forward
        self._backward_seen = False  # this pass has staged a block for backward
        self._loading = {}  # weight -> the scratch tensor load_state_dict copies into
        self._hooks = [h for block, _ in self._blocks for h in (
            block._register_state_dict_hook(self._state_dict_hook),
            block._register_load_state_dict_pre_hook(self._load_pre_hook, with_module=True),
            block.register_load_state_dict_post_hook(self._load_post_hook))]
        with _offloaded_lock:
            me = weakref.ref(self)
            _offloaded.update({id(p): (me, i) for i, p in enumerate(self._weights)})

    # --- set-up ---------------------------------------------------------------------------
    def _build(self, window, hbm_budget, placement, trace):
        """The session: its weights, block by block (the C library allocates the tier copies)."""
        options = _capi.SessionOptions()
        _capi.lib.tf_session_options_default(ctypes.byref(options))
        options.window = window
        options.hbm_budget_bytes = hbm_budget or 0
        options.trace = int(bool(trace))
        self._placement = placement.encode() if placement is not None else None
        options.placement = self._placement
        _capi.call("tf_session_create", _devices.device_handle(self._device),
                   ctypes.byref(options), ctypes.byref(self._session))
        names = [f"block{b}.p{j}".encode() for b, (_, ps) in enumerate(self._blocks)
                 for j in range(len(ps))]
        weights = (_capi.SessionWeight * len(names))(*[
            _capi.SessionWeight(name, p.numel() * p.element_size(), None)
            for name, p in zip(names, self._weights)])
        sizes = (ctypes.c_size_t * len(self._blocks))(*[len(ps) for _, ps in self._blocks])
        try:
            _capi.call("tf_session_set_blocks", self._session, weights, sizes, len(self._blocks))
        except BaseException:
            _capi.lib.tf_session_destroy(self._session)
            self._session = ctypes.c_void_p()
            raise

    def _move_in(self):
        """Copies each weight into its tier copy and leaves a placeholder in the param."""
        self._homes = []
        self._owner = _TierCopies(self._session, self._made_in)
        self._placeholders = []
        with torch.no_grad():
            for i, p in enumerate(self._weights):
                home = ctypes.c_void_p()
                _capi.call("tf_session_weight_host", self._session, i, ctypes.byref(home))
                _host_view(home.value, p).copy_(p.data)
                self._homes.append(home.value)
                self._placeholders.append(self._make_placeholder(i, p))
                p.data = self._placeholder(i)

    def _make_placeholder(self, i, p):
        if self._device.type == "cpu" and not _NAN_PLACEHOLDERS:
            # the weight itself: a read outside the block's forward is exact, an in-place write
            # writes the tier copy (seen by the param's version counter)
            return _tier_view(self._homes[i], p, self._owner)
        # CUDA: the tier copy is host memory the device's kernels cannot read. NaN, not zeros:
        # a read outside the block's forward gives NaN, never a finite wrong number
        return torch.full((1,), float("nan"), dtype=p.dtype, device=p.device).expand(p.shape)

    def _placeholder(self, i):
        """What weight ``i``'s param holds outside its block's forward."""
        return self._placeholders[i]

    def _wrap_forwards(self):
        for b, (block, _) in enumerate(self._blocks):
            original = block.forward

            def forward(*args, _b=b, _original=original, **kwargs):
                return self._run_forward(_b, _original, args, kwargs)

            block._tierflow_forward = original
            block.forward = forward

    # --- the passes (the session plans them: skipped blocks, restarts, the end) ------------
    def _acquire(self, block: int, backward: bool):
        if not self._open:
            # the session was idle since the last pass: writes through the params went to the
            # tier copies with nothing staging them, and this pass stages them
            self._note_writes(range(len(self._weights)), idle=True)
            self._open = True
        self._refuse_writes_in_pass(block)
        self._backward_seen |= backward
        params = self._blocks[block][1]
        pointers = (ctypes.c_void_p * len(params))()
        self._held = None  # the session releases the block held, after the caller's stream
        self._staged.clear()
        _capi.call("tf_session_acquire", self._session, block, int(backward),
                   _devices.native_stream(self._device), pointers, len(params))
        self._staged[block] = [_view(pointers[j], p, self._device)
                               for j, p in enumerate(params)]
        self._held = (block, backward)

    def _release(self):
        self._held = None
        self._staged.clear()
        _capi.call("tf_session_release", self._session, _devices.native_stream(self._device))

    def _end_pass(self):
        """After a backward pass or a forward pass without grad: the tier copies current."""
        if self._held is not None:
            self._release()
        _capi.call("tf_session_end_pass", self._session)
        self._open, self._last_forward, self._backward_seen = False, -1, False
        now = self._totals()
        if now["passes"] != self._pass_start["passes"]:
            self._last_pass = {k: now[k] - self._pass_start[k] for k in _PASS_KEYS}
            self._pass_start = now

    def _totals(self) -> dict:
        m = _capi.json_call("tf_session_metrics_json", self._session)
        out = {k: m["scheduler"][k] for k in _PASS_KEYS if k != "elapsed_s"}
        out["elapsed_s"] = time.perf_counter()
        out["passes"] = m["passes"]
        return out

    def _replaced(self, i) -> bool:
        """Whether weight i's param holds a tensor other than its placeholder (``p.data = t``
        outside the forward, ``vector_to_parameters``)."""
        return self._weights[i].data_ptr() != self._placeholders[i].data_ptr()

    def _changed(self, i) -> bool:
        return self._weights[i]._version != self._versions[i] or self._replaced(i)

    def _note_writes(self, indices, idle: bool) -> list:
        """The weights among ``indices`` written through their params since the last look: in
        place (their version counters moved: the tier copy holds the write) or given a new
        ``.data`` of the same shape and dtype (copied into the tier copy when ``idle``, no pass
        open, and the placeholder put back; another shape is refused at the block's forward).
        The optimizer re-reads its masters from their tier copies (_rewritten)."""
        written = []
        for i in indices:
            p = self._weights[i]
            if self._replaced(i):
                shape, dtype = self._shapes_flat[i]
                if p.shape != shape or p.dtype != dtype or p.device != self._device:
                    continue  # _check_unchanged names it
                written.append(i)
                if not idle:
                    continue  # copied in once the pass is over
                with torch.no_grad():
                    _host_view(self._homes[i], p).copy_(p.data)
                p.data = self._placeholder(i)
            elif p._version == self._versions[i]:
                continue
            else:
                written.append(i)
            self._versions[i] = p._version
            self._rewritten.add(i)
        return written

    def _refuse_writes_in_pass(self, b):
        """A weight written while its pass is open (between a forward and its backward) may
        have been staged before the write, or while it went on: refused before the block is
        staged again, the pass ended (the write stays: the optimizer re-reads it)."""
        first = self._weight_index[id(self._blocks[b][1][0])]
        written = self._note_writes(range(first, first + len(self._blocks[b][1])), idle=False)
        if written:
            j = written[0] - first
            p = self._weights[written[0]]
            self._end_pass()  # the forward or backward raises: the next forward starts anew
            self._note_writes(written, idle=True)  # a new .data into the tier copy now
            raise RuntimeError(
                f"offload_parameters: block {b} ({type(self._blocks[b][0]).__name__}) param {j} "
                f"(shape {tuple(p.shape)}) was written while a pass was open (after a forward, "
                "before its backward ended): the pass may have staged it before the write. "
                "Write offloaded weights between passes (after the backward pass or a forward "
                "without grad, before the next forward), as torch refuses a write to a weight "
                "that backward needs; the write is kept and the next forward starts a new pass")

    def _check_unchanged(self, b):
        """A block whose params were replaced or reshaped since offload_parameters cannot be
        staged from the tier copies: a clear error, not a wrong result."""
        block, params = self._blocks[b]
        now = [p for p in block.parameters() if p.numel() > 0]
        if [id(p) for p in now] != [id(p) for p in params]:
            raise RuntimeError(f"offload_parameters: block {b} ({type(block).__name__}) has "
                               "params that were replaced since it was offloaded: remove() "
                               "the handle before changing the model, then offload again")
        for j, (p, (shape, dtype)) in enumerate(zip(params, self._shapes[b])):
            if p.shape != shape or p.dtype != dtype:
                raise RuntimeError(
                    f"offload_parameters: block {b} param {j} is now {tuple(p.shape)} "
                    f"{p.dtype}, offloaded as {tuple(shape)} {dtype}: weights may not change "
                    "shape or dtype while offloaded")

    def _run_forward(self, b, original, args, kwargs):
        self._check_open()
        params = self._blocks[b][1]
        self._check_unchanged(b)
        if b == 0:
            # A new pass: a backward that raised never ran its end-of-pass callback.
            self._callback_queued = False
        if self._open and b <= self._last_forward and not self._backward_seen:
            # a forward that goes back starts a new pass (a forward whose backward never came):
            # weights written since are written between passes, once this one is ended
            if any(self._changed(i) for i in range(len(self._weights))):
                self._end_pass()
        self._acquire(b, False)
        self._last_forward = b
        try:
            for p, view in zip(params, self._staged[b]):
                p.data = view
            if torch.is_grad_enabled():
                with torch.autograd.graph.saved_tensors_hooks(self._pack_for(b), self._unpack):
                    return original(*args, **kwargs)
            return original(*args, **kwargs)
        finally:
            first = self._weight_index[id(params[0])]
            for j, p in enumerate(params):
                p.data = self._placeholder(first + j)
                # a write inside the forward went to the staging, which is dropped: not a write
                # of the tier copy
                self._versions[first + j] = p._version
            self._release()
            if not torch.is_grad_enabled() and b == len(self._blocks) - 1:
                self._end_pass()

    def _pack_for(self, b):
        starts = {_storage_address(v): j for j, v in enumerate(self._staged[b])}

        def pack(t):
            j = starts.get(_storage_address(t)) if t.device == self._device else None
            return t if j is None else _Saved(b, j, t)

        return pack

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._callback_queued = True
        if self._held != (saved.block, True):
            self._acquire(saved.block, True)
        base = self._staged[saved.block][saved.index]
        return base.reshape(-1).as_strided(saved.size, saved.stride, saved.offset)

    def _backward_done(self):
        self._callback_queued = False
        self._end_pass()

    # --- what users call ------------------------------------------------------------------
    def metrics(self) -> dict:
        """The scheduler's figures in total (``stall_fraction``, ``overlap_efficiency``,
        ``hbm_staging_peak_bytes``, ``bytes_in``, ``compute_s``, ``stall_s``, ... as in
        docs/scheduler.md), plus ``offloaded_bytes``, ``blocks``, ``tiers`` (bytes of weights
        per tier they live in), ``passes`` (passes ended: a backward pass, a forward pass
        without grad, or one left halfway) and ``last_pass``: ``compute_s``, ``stall_s``,
        ``bytes_in``, ``bytes_out``, ``late_prefetches`` and ``elapsed_s`` (wall time since
        the pass before ended) of the last pass (None before the first)."""
        self._check_open()
        session = _capi.json_call("tf_session_metrics_json", self._session)
        out = dict(session["scheduler"])
        out["offloaded_bytes"] = sum(p.numel() * p.element_size() for p in self._weights)
        out["blocks"] = len(self._blocks)
        out["tiers"] = _capi.json_call("tf_session_where_json", self._session)["tiers"]
        out["passes"] = session["passes"]
        out["last_pass"] = dict(self._last_pass) if self._last_pass is not None else None
        return out

    def trace_json(self) -> str:
        """A Chrome/Perfetto trace of the staging (``trace=True``), as JSON text."""
        self._check_open()
        return _capi.json_call("tf_session_trace_json", self._session, parse=False)

    def remove(self) -> None:
        """Puts every weight back as an ordinary tensor on its device (with the values of its
        tier copy) and the blocks' forward as it was. Idempotent. In a child of os.fork (the
        session is the parent's) it works too: the tier copies are host memory the child has."""
        if not self._session:
            return
        forked = self._made_in != _devices.generation()
        if self._held is not None and not forked:
            self._release()
        if not forked:
            _capi.call("tf_session_end_pass", self._session)
        with _offloaded_lock:
            for p in self._weights:
                held = _holder(p)
                if held is not None and held[0] is self:
                    del _offloaded[id(p)]
        for hook in self._hooks:
            hook.remove()
        with torch.no_grad():
            for p, home in zip(self._weights, self._homes):
                p.data = _host_view(home, p).to(self._device, copy=True)
            for block, _ in self._blocks:
                block.forward = block._tierflow_forward
                del block._tierflow_forward
        # An optimizer made in the session keeps it alive until it is rebuilt over the params'
        # own memory (its next step); a placeholder a user kept, until it is gone (_TierCopies).
        self._placeholders = []
        self._owner.removed = True
        self._owner = None
        self._session = ctypes.c_void_p()

    def _check_open(self):
        if not self._session:
            raise RuntimeError("offload_parameters: the handle was removed")
        _devices.check_process(self._made_in, "this offload_parameters handle")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def offload_parameters(model: nn.Module, *, blocks: Optional[Iterable[nn.Module]] = None,
                       window: int = 2, hbm_budget: Optional[int] = None,
                       placement: Optional[str] = None,
                       trace: bool = False) -> OffloadedParameters:
    """Moves the weights of ``model``'s blocks into a host tier and streams them into HBM
    ``window`` blocks ahead of the forward and the backward pass; the staging never holds more
    than ``hbm_budget`` bytes (default: the scheduler's, room for window + 2 of the largest
    block). ``placement`` is the session's placement spec (as TIERFLOW_PLACEMENT takes): it
    places the weights (class ``params``) and the state of an OffloadAdamW made over them. Train
    with ``tierflow.torch.OffloadAdamW`` over ``model.parameters()``: it updates the tier copies
    in place. See the module's comment for how it works."""
    return OffloadedParameters(model, blocks, window, hbm_budget, placement, trace)
