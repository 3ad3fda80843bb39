"""torch.optim optimizers whose Adam state lives in tierflow's memory tiers.

``OffloadAdamW`` and ``OffloadAdam`` behave as ``torch.optim.AdamW`` and ``torch.optim.Adam``
(the same update, in fp32 without fused multiply-adds; see include/tierflow/offload_adam.hpp):
swap the constructor and nothing else. The state (fp32 master weights, exp_avg, exp_avg_sq) is
held by the C library, not in ``opt.state``; ``state_dict()`` gathers it in torch's layout.

Params on CUDA run on that GPU's tierflow CUDA device, ordered with
``torch.cuda.current_stream()``; params on CPU run on the emulated device, whose "device memory"
is the tensors' own. The C optimizer is created at the first ``step()`` (or the first call that
needs it) and again when the groups' membership changes, carrying the state over. DTensor
params (FSDP2's ``fully_shard``): each rank steps the shard it holds (see _dtensor.py).
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections import defaultdict
from typing import Optional

import torch

from tierflow import _capi, _devices, _dtensor, _state
from tierflow._announce import _Announcing
from tierflow._binding import ParamResizedError, _Binding
from tierflow._checks import _MemoryIndex, _check_group, _check_param, _holds_elements, _label, \
    _torch_defaults, make_options
from tierflow._params import OffloadedParameters, offload_parameters

__all__ = ["OffloadAdam", "OffloadAdamW", "OffloadedParameters", "ParamResizedError",
           "offload_parameters"]

_stream = _devices.native_stream


class _OffloadAdamBase(_Binding, _Announcing, torch.optim.Optimizer):
    _torch_class = None  # torch.optim.AdamW or torch.optim.Adam
    _decoupled = 1

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, max_grad_norm=None, mode="auto",
                 placement=None, chunk_elements=None, threads=None, overlap="none",
                 release_grads=None, state_dtype="fp32", master="fp32"):
        hyper = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        flags = {"amsgrad": amsgrad, "maximize": maximize, "capturable": capturable,
                 "differentiable": differentiable, "fused": fused}
        _check_group({**hyper, **flags}, 0)
        self._options = make_options(max_grad_norm, mode, placement, chunk_elements, threads,
                                     overlap, release_grads, state_dtype, master)
        self._init_runtime()
        defaults = _torch_defaults(self._torch_class, **hyper)
        if "foreach" in defaults:
            defaults["foreach"] = foreach
        super().__init__(params, defaults)

    # --- construction -------------------------------------------------------------------
    def _init_runtime(self) -> None:
        self._adam = None  # tf_adam*, created by _ensure_built
        self._made_in = _devices.generation()  # the process (fork generation) it was made in
        self._build_lock = threading.RLock()  # the first step may come from two threads
        self._device = None  # the torch.device of every param
        self._layout_key = None
        self._entries = []  # (C group, param) in the C optimizer's order
        self._groups = []  # C group -> index in param_groups (groups with elements)
        self._versions = []  # each param's _version after our last write or read
        self._hypers = {}  # C group -> the hyper tuple last pushed
        self.last_grad_norm = None
        self.last_step_applied = None
        self._entry_of = {}  # id(param) -> its index in _entries
        self._hooked = {}  # id(param) -> the hook handle (or AccumulateGrad node) kept alive
        #: True while the backward passes are not the last before step() (gradient
        #: accumulation): overlap="backward" then announces no grad.
        self.accumulating = False
        self._released = {}  # entry -> the pointer of its grad, announced and released
        self._announced = {}  # entry -> (address, version) of its grad when announced
        self._lost = set()  # entries whose released grads a failed step lost
        self._keep = []  # released grads the emulated device's copies may still read
        self._copy_stream = None  # (torch stream or None, copies) of the C optimizer

    def __setstate__(self, state):
        super().__setstate__(state)
        if "_options" in state:
            self._init_runtime()
            if self._options.get("overlap", "none") != "none":
                for _, _, p in self._flat():
                    self._hook(p)

    def __getstate__(self):
        """What copy.deepcopy and pickling (torch.save) keep: torch's fields, the options and
        the state in torch's layout keyed by the params, as torch's optimizers keep it (the
        copy moves it into its own C optimizer at its first use)."""
        out = super().__getstate__()
        out["_options"] = self._options
        if getattr(self, "_adam", None) is not None or any(self.state.values()):
            out["state"] = self._exported_state()
        return out

    def _exported_state(self) -> defaultdict:
        """Each stepped param's state in torch's layout (step, exp_avg, exp_avg_sq, master for
        16-bit params), keyed by the param."""
        exported = defaultdict(dict)
        if self._adam is not None or any(self.state.values()):
            try:
                self._ensure_built()
            except ParamResizedError:
                return self._stale_state()  # as torch's state_dict keeps a stale state
            self._absorb_outside_state()
            self._refresh_changed()  # a param written since the last step is its master now
            steps = []
            for i, (_, p) in enumerate(self._entries):
                state = _state.read(self._adam, i, p)
                if state.step > 0:
                    exported[p] = state.to_torch(p)
                    steps.append(state.step)
            # A param this rank holds no element of (an empty FSDP2 shard) has torch's entry
            # too: its step and empty moments (torch.distributed.checkpoint >= 2.x refuses a
            # param that requires grad and has no state).
            if steps:
                empty = torch.empty(0, dtype=torch.float32)
                for _, _, p in self._flat():
                    if not _holds_elements(p):
                        exported[p] = _state.ParamState(max(steps), empty, empty).to_torch(p)
        return exported

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, refusing first what the step cannot run (naming it)."""
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections,"
                            " not a set")
        group["params"] = params = list(params)
        gi = len(self.param_groups)
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        _check_group(group, gi)
        seen = {id(p): (g, i) for g, i, p in self._flat()}
        first = next(self._flat(), None)
        device = first[2].device if first else None
        base = len(seen)
        memory = _MemoryIndex()
        for g, i, q in self._flat():
            memory.add(q, g, i, _label(q, i, g))
        for j, p in enumerate(params):
            label = _label(p, base + j, gi)
            if isinstance(p, torch.Tensor) and device is not None and p.device != device:
                raise ValueError(f"{label} is on {p.device}, the others on {device}: an "
                                 "optimizer's params must share one device")
            _check_param(p, label)
            if id(p) in seen:
                g, i = seen[id(p)]
                raise ValueError(f"{label} is already param {i} of group {g}: a tensor may be in"
                                 " one group once")
            memory.add(p, gi, base + j, label)
            seen[id(p)] = (gi, base + j)
            device = device or p.device
        super().add_param_group(group)
        if self._options.get("overlap", "none") != "none":
            for p in params:
                self._hook(p)

    # torch.amp.GradScaler gives a step that says it handles scaling its scale and whether it
    # found an inf or NaN (the grad_scale and found_inf attributes), instead of unscaling the
    # grads in place first, which it does without bumping their version counters: an
    # overlap's announced grads would then look unchanged and the step would use them scaled.
    _step_supports_amp_scaling = hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")

    def _take_grad_scaler(self) -> bool:
        """What a GradScaler handed this step: True when it found an inf or NaN (the step is
        skipped, as torch's fused AdamW skips it: the announced grads are discarded, nothing
        changes); else the grads unscaled here (the same float32 multiply as the scaler's,
        which bumps their versions, so announcements made with the scaled values are redone)."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:
            return False
        grad_scale = getattr(self, "grad_scale", None)
        if float(found_inf) != 0:
            if self._adam is not None and self._options.get("overlap", "none") != "none":
                _capi.call("tf_adam_discard_grads", self._adam)
            self._keep.clear()
            self._released.clear()
            self._announced.clear()
            self.last_step_applied = False
            return True
        if grad_scale is None:
            # scaler.unscale_(opt) ran before (clipping): the grads changed in place without a
            # version bump, so every announcement is redone from the grads as they are now
            if self._adam is not None and self._announced:
                self._announced = {i: (address, -1) for i, (address, _) in
                                   self._announced.items()}
            return False
        inv_scale = float(grad_scale.double().reciprocal().float())  # the scaler's float32
        with torch.no_grad():
            for _, _, p in self._flat():
                g = _dtensor.grad(p)
                if g is not None:
                    g.mul_(inv_scale)
        return False

    # --- torch.optim.Optimizer ----------------------------------------------------------
    def step(self, closure=None):
        """One Adam step over every param with a grad; returns the closure's loss.

        ``last_grad_norm`` gets the global norm of the grads, ``last_step_applied`` False when
        a non-finite grad skipped the step (nothing changed then)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._take_grad_scaler():
            return loss
        self._ensure_built()
        self._absorb_outside_state()
        for gi, group in enumerate(self.param_groups):
            _check_group(group, gi)
        grads, any_grad = self._grads()
        if not any_grad:
            return loss
        self._push_hypers()
        self._drop_changed_announcements()
        self._refresh_changed()
        applied = ctypes.c_int(0)
        norm = ctypes.c_double(0.0)
        try:
            _capi.call("tf_adam_step_on", self._adam, grads, len(self._entries),
                       _stream(self._device), ctypes.byref(applied), ctypes.byref(norm))
        except BaseException:
            self._lost.update(self._released)  # the next step must not read freed grads
            raise
        finally:
            self.last_step_applied = applied.value == 1
            self._released.clear()
            self._announced.clear()
        self._keep.clear()  # the step waited for every copy
        self.last_grad_norm = norm.value
        if self.last_step_applied:
            self._mark_held()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; grads announced to the optimizer (overlap) are discarded too."""
        super().zero_grad(set_to_none=set_to_none)
        if self._adam is not None and self._options.get("overlap", "none") != "none":
            _devices.check_process(self._made_in, "this optimizer's C state")
            _capi.call("tf_adam_discard_grads", self._adam)
            self._keep.clear()
        self._released.clear()
        self._announced.clear()
        self._lost.clear()

    def state_dict(self) -> dict:
        """torch's layout: ``state[i]`` = step, exp_avg, exp_avg_sq (fp32, on the CPU), and
        ``master`` for bf16/fp16 params; params never stepped have no entry. For a DTensor
        param (FSDP2) they are DTensors laid out like it, holding this rank's shard."""
        exported = self._exported_state()  # (it may replace self.state: read it after)
        kept, self.state = self.state, exported
        try:
            return super().state_dict()
        finally:
            self.state = kept

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a state_dict of this class or of torch.optim.AdamW/Adam, checking all of it
        before changing anything. Params without an entry start fresh; masters not in it are
        read from the params (an fp32 param is always its own master)."""
        groups = self.param_groups
        saved = state_dict["param_groups"]
        if len(groups) != len(saved):
            raise ValueError("loaded state dict has a different number of parameter groups")
        id_map = {}
        new_groups = []
        for gi, (group, saved_group) in enumerate(zip(groups, saved)):
            if len(group["params"]) != len(saved_group["params"]):
                raise ValueError(f"loaded state dict's group {gi} has "
                                 f"{len(saved_group['params'])} params, the optimizer's "
                                 f"{len(group['params'])}")
            id_map.update(zip(saved_group["params"], group["params"]))
            new_group = {k: v for k, v in saved_group.items() if k != "params"}
            for name, default in self.defaults.items():
                new_group.setdefault(name, default)
            new_group["params"] = group["params"]
            _check_group(new_group, gi)
            new_groups.append(new_group)
        where = {id(p): (gi, index) for gi, index, p in self._flat()}
        loaded = {}
        for key, value in state_dict["state"].items():
            p = id_map.get(key)
            if p is not None and _holds_elements(p):
                loaded[id(p)] = _state.from_torch(p, value, _label(p, where[id(p)][1],
                                                                   where[id(p)][0]))
        self.param_groups = new_groups
        self._ensure_built()
        self._drop_reads()  # the state is replaced: an opt.state[p] read before is not written
        for i, (_, p) in enumerate(self._entries):
            _state.write(self._adam, i, p, loaded.get(id(p)))
        self._record_versions()
        if any(state.step > 0 for state in loaded.values()):
            self._mark_held()

    # --- tierflow's own -----------------------------------------------------------------
    def save(self, path) -> None:
        """Writes the state to tierflow's CRC-checked file (atomically)."""
        self._built("save()")
        self._push_hypers()
        self._refresh_changed()
        _capi.call("tf_adam_save", self._adam, os.fsencode(path))

    def load(self, path) -> None:
        """Reads a file written by save() for the same params; a corrupted or mismatched file
        raises tierflow.InputError with the state untouched. The hyper-parameters stay those
        of param_groups (restore an lr scheduler's own state_dict beside it)."""
        self._built("load()")
        _capi.call("tf_adam_load", self._adam, os.fsencode(path))
        self._drop_reads()
        self._record_versions()
        self._mark_held()

    def metrics(self) -> dict:
        """The C optimizer's metrics: ``{"schema_version": 1, "adam": {...}}``."""
        self._built("metrics()")
        return _capi.json_call("tf_adam_metrics_json", self._adam)

    def where(self) -> dict:
        """Which NUMA nodes (and tiers) hold the state's pages."""
        self._built("where()")
        return _capi.json_call("tf_adam_where_json", self._adam)

    @property
    def mode(self) -> str:
        """The mode in force: ``cpu`` or ``streamed``."""
        return self.metrics()["adam"]["mode"]

    @property
    def mode_reason(self) -> str:
        """Why that mode was chosen."""
        return self.metrics()["adam"]["mode_reason"]

    @property
    def max_grad_norm(self) -> Optional[float]:
        return self._options["max_grad_norm"]

    def __del__(self):
        self.close()


class OffloadAdamW(_OffloadAdamBase):
    """torch.optim.AdamW with its state offloaded by tierflow.

    Args beyond torch's: ``max_grad_norm`` (global grad-norm clipping in the step; the norm in
    ``last_grad_norm``), ``mode`` (``"auto"``, ``"cpu"`` or ``"streamed"``), ``placement`` (a
    spec as TIERFLOW_PLACEMENT takes), ``chunk_elements``, ``threads``, ``overlap``
    (``"none"``, ``"backward"``: each param's update starts as soon as autograd has its grad;
    ``"backward_publish"``: and its new values are written then) and ``release_grads``.

    ``release_grads`` (with an overlap, cpu mode): once a grad is announced, the optimizer has
    its own host copy, and the param's ``.grad`` is freed (set to None; on CUDA the memory goes
    back to torch's allocator after the copy). ``None`` (the default) does so for the weights
    ``offload_parameters`` moved into a tier, on CUDA, whose grads would otherwise fill HBM;
    ``True`` for every param; ``False`` for none. A freed grad is not in ``.grad``: clip with
    ``max_grad_norm``, not ``torch.nn.utils.clip_grad_norm_``; ``zero_grad()`` discards it; a
    step that fails loses it (the next step() asks for a new backward pass).

    ``state_dtype``: how the moments ``exp_avg`` and ``exp_avg_sq`` are stored:
    ``"fp32"`` (torch's numbers, 8 B per param), ``"bf16"`` (4 B) or ``"int8"`` (8-bit codes
    with a scale per block of 256 elements, ~2 B; params under 4096 elements keep fp32). The
    update runs in fp32 from the decoded moments. A param group may set its own
    (``{"params": ..., "state_dtype": "fp32"}``). ``state_dict()`` gives the moments as fp32
    tensors, which torch's AdamW loads; ``load_state_dict`` quantizes them.

    ``master`` (cpu mode, no overlap): where a bf16 param's fp32 master weights are kept:
    ``"fp32"`` (a separate fp32 copy, 4 B per param) or ``"remainder"`` (the param itself holds
    the master's high 16 bits and tierflow the low 16 beside it, 2 B per param; the master,
    moments and ``state_dict()`` are bit for bit those of ``"fp32"``). The bf16 param is then
    the master rounded to nearest with ties away from zero, where torch's ``.to(bfloat16)``
    rounds ties to even: one bf16 ulp apart on an exact tie only (1 value in 65536). It applies
    to bf16 CPU params and to the bf16 weights ``offload_parameters`` holds; fp32 params keep an
    fp32 master either way. ``"remainder"`` is refused with an overlap or ``mode="streamed"``
    (here), and for an fp16 param or a CUDA param (at the first step, naming the param);
    nothing is changed.
    """

    _torch_class = torch.optim.AdamW
    _decoupled = 1

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, max_grad_norm=None, mode="auto",
                 placement=None, chunk_elements=None, threads=None, overlap="none",
                 release_grads=None, state_dtype="fp32", master="fp32"):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused, max_grad_norm=max_grad_norm,
                         mode=mode, placement=placement, chunk_elements=chunk_elements,
                         threads=threads, overlap=overlap, release_grads=release_grads,
                         state_dtype=state_dtype, master=master)


class OffloadAdam(_OffloadAdamBase):
    """torch.optim.Adam (L2 weight decay) with its state offloaded by tierflow; arguments as
    OffloadAdamW's."""

    _torch_class = torch.optim.Adam
    _decoupled = 0

