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
import math
import os
import weakref
from collections import defaultdict
from typing import Optional

import torch

from tierflow import _capi, _devices, _dtensor, _params, _state
from tierflow._params import OffloadedParameters, offload_parameters

__all__ = ["OffloadAdam", "OffloadAdamW", "OffloadedParameters", "offload_parameters"]

_DTYPES = {
    torch.float32: _capi.DTYPE_F32,
    torch.bfloat16: _capi.DTYPE_BF16,
    torch.float16: _capi.DTYPE_F16,
}
# overlap= values, in the order of tf_adam_options.overlap (0, 1, 2). "backward_publish" also
# writes (or sends up) each param's new values as soon as its update is done, before step():
# read no param between backward() and step().
_OVERLAPS = ("none", "backward", "backward_publish")
# Flags of torch's Adam(W) that tierflow's step does not implement: name -> what is accepted.
_UNSUPPORTED = ("amsgrad", "maximize", "capturable", "differentiable", "fused")

_stream = _devices.native_stream


def _label(param, index: int, group: int) -> str:
    shape = tuple(param.shape) if isinstance(param, torch.Tensor) else "?"
    dtype = str(param.dtype).replace("torch.", "") if isinstance(param, torch.Tensor) else "?"
    return f"param {index} (group {group}, shape {shape}, {dtype})"


def _check_param(param, label: str) -> None:
    """Refuses a param the step cannot run, naming it. @raises TypeError, ValueError"""
    if not isinstance(param, torch.Tensor):
        raise TypeError(f"{label}: optimizer can only optimize Tensors, not "
                        f"{type(param).__name__}")
    if _dtensor.is_dtensor(param):
        layout = _dtensor.unsupported_layout(param)
        if layout is not None:
            raise TypeError(f"{label}: the param is a DTensor with {layout}; tierflow steps "
                            "each rank's shard of FSDP2's Shard(0) on a 1-D mesh only, see "
                            "docs/distributed.md")
        param = _dtensor.local(param)  # the rest is about the storage this rank updates
    if param.layout != torch.strided:
        raise ValueError(f"{label}: sparse params are not supported ({param.layout})")
    if param.is_complex():
        raise TypeError(f"{label}: complex params are not supported (use torch.view_as_real)")
    if param.dtype not in _DTYPES:
        raise TypeError(f"{label}: dtype {param.dtype} is not supported "
                        "(float32, bfloat16 or float16)")
    if not param.is_contiguous() and _params.weight_of(param) is None:
        raise ValueError(f"{label}: the param is not contiguous")
    if param.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{label}: params on {param.device} are not supported (cpu or cuda)")


def _home(param) -> tuple:
    """Where the step updates ``param``: ("weight", session, index) for a weight that
    offload_parameters holds in a tier (its tier copy, in that session), else ("memory",
    address) (in place)."""
    weight = _params.weight_of(param)
    if weight is not None:
        return ("weight", weight[0].value, weight[1])
    return ("memory", _dtensor.local(param).data_ptr())


def _holds_elements(param) -> bool:
    """Whether this process holds any element of ``param`` (a DTensor's shard may be empty)."""
    return _dtensor.local(param).numel() > 0


def _check_group(group: dict, index: int) -> None:
    """Refuses hyper-parameters or flags the step cannot run (the values by the library's own
    check, tf_adam_check). @raises ValueError"""
    where = f"group {index}"
    for flag in _UNSUPPORTED:
        if group.get(flag):
            raise ValueError(f"{where}: {flag}={group[flag]!r} is not supported by tierflow")
    betas = group["betas"]
    if len(betas) != 2:
        raise ValueError(f"{where}: invalid betas {tuple(betas)} (two values)")
    hyper = _capi.AdamHyper(float(group["lr"]), float(betas[0]), float(betas[1]),
                            float(group["eps"]), float(group["weight_decay"]), 1, 1)
    _capi.call("tf_adam_check", ctypes.byref(hyper), index, None)


def _torch_defaults(torch_class, **hyper) -> dict:
    """The defaults torch's own optimizer puts in each param group, in this torch version."""
    probe = torch_class([torch.zeros(1, requires_grad=True)], **hyper)
    return dict(probe.defaults)


class _HeldState(defaultdict):
    """``opt.state``: empty (the state lives in the C library) but true once the C optimizer
    holds a stepped state, as a torch optimizer's state is then. torch.distributed.checkpoint's
    get/set_optimizer_state_dict run one step with zero grads on an optimizer whose ``state``
    is false (to create its state), which would advance this one's moments and step count."""

    held = False

    def __bool__(self):
        return self.held or len(self) > 0


class _OffloadAdamBase(torch.optim.Optimizer):
    _torch_class = None  # torch.optim.AdamW or torch.optim.Adam
    _decoupled = 1

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, max_grad_norm=None, mode="auto",
                 placement=None, chunk_elements=None, threads=None, overlap="none",
                 release_grads=None):
        hyper = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        flags = {"amsgrad": amsgrad, "maximize": maximize, "capturable": capturable,
                 "differentiable": differentiable, "fused": fused}
        _check_group({**hyper, **flags}, 0)
        self._options = self._make_options(max_grad_norm, mode, placement, chunk_elements,
                                           threads, overlap, release_grads)
        self._init_runtime()
        defaults = _torch_defaults(self._torch_class, **hyper)
        if "foreach" in defaults:
            defaults["foreach"] = foreach
        super().__init__(params, defaults)

    # --- construction -------------------------------------------------------------------
    @staticmethod
    def _make_options(max_grad_norm, mode, placement, chunk_elements, threads, overlap="none",
                      release_grads=None):
        if release_grads is not None and not isinstance(release_grads, bool):
            raise TypeError(f"release_grads must be True, False or None, not {release_grads!r}")
        if overlap not in _OVERLAPS:
            raise ValueError("overlap must be 'none', 'backward' or 'backward_publish', not "
                             f"{overlap!r}")
        if release_grads and (overlap == "none" or mode == "streamed"):
            raise ValueError("release_grads=True needs overlap='backward' or 'backward_publish' "
                             "and the cpu mode: the grads are copied to the host as they come")
        if mode not in _capi.ADAM_MODES:
            raise ValueError(f"mode must be one of {sorted(_capi.ADAM_MODES)}, not {mode!r}")
        if max_grad_norm is not None and not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be finite and > 0 (or None), not {max_grad_norm}")
        for name, value in (("chunk_elements", chunk_elements), ("threads", threads)):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive int (or None), not {value!r}")
        if placement is not None and not isinstance(placement, str):
            raise TypeError(f"placement must be a spec string, not {type(placement).__name__}")
        options = _capi.AdamOptions()
        _capi.lib.tf_adam_options_default(ctypes.byref(options))
        options.mode = _capi.ADAM_MODES[mode]
        options.chunk_elements = chunk_elements or 0
        options.threads = threads or 0
        options.max_grad_norm = max_grad_norm or 0.0
        options.overlap = _OVERLAPS.index(overlap)
        _capi.call("tf_adam_check", None, 0, ctypes.byref(options))  # the ranges: the library's
        return {"max_grad_norm": max_grad_norm, "mode": mode, "placement": placement,
                "chunk_elements": chunk_elements, "threads": threads, "overlap": overlap,
                "release_grads": release_grads}

    def _init_runtime(self) -> None:
        self._adam = None  # tf_adam*, created by _ensure_built
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
        out = super().__getstate__()
        out["_options"] = self._options
        return out

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
            seen[id(p)] = (gi, base + j)
            device = device or p.device
        super().add_param_group(group)
        if self._options.get("overlap", "none") != "none":
            for p in params:
                self._hook(p)

    # --- overlap="backward": each grad announced as soon as autograd has accumulated it ---
    def _hook(self, p) -> None:
        if not p.requires_grad or id(p) in self._hooked:
            return
        ref = weakref.ref(self)

        def announce(*_args, _p=p):
            opt = ref()
            if opt is not None:
                opt._grad_ready(_p)

        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            self._hooked[id(p)] = p.register_post_accumulate_grad_hook(announce)
        else:  # torch 1.13: a post-hook on the param's AccumulateGrad node, as DDP does
            with torch.enable_grad():
                node = p.expand_as(p).grad_fn.next_functions[0][0]
            node.register_hook(announce)
            self._hooked[id(p)] = node

    def _grad_ready(self, p) -> None:
        if self.accumulating:
            return  # step() takes the accumulated grads
        if self._adam is None and self._releases(p):
            self._ensure_built()  # the first backward pass frees its grads too
        i = self._entry_of.get(id(p))
        if self._adam is None or i is None:
            return  # the first step (no C optimizer yet): step() does it
        g, shard = _dtensor.grad(p), _dtensor.local(p)  # this rank's, for a DTensor
        if (g is None or g.layout != torch.strided or g.dtype != shard.dtype
                or g.shape != shard.shape or g.device != shard.device or not g.is_contiguous()):
            return  # step() checks it and says what is wrong
        if i in self._released:
            label = self._label_of(p)
            raise RuntimeError(f"{label}: a second backward pass made a grad before step() took "
                               "the first, which was released to the optimizer; set "
                               "opt.accumulating = True for the passes that accumulate")
        _capi.call("tf_adam_grad_ready", self._adam, i, g.data_ptr(), _stream(self._device))
        if self._releases(p):
            self._release(i, p, g)

    # --- release_grads: an announced grad freed once the optimizer has its copy -----------
    def _releases(self, p) -> bool:
        """Whether p's announced grad is freed: release_grads=None frees the grads of weights
        that offload_parameters moved into a tier, on CUDA (their grads would fill HBM)."""
        release = self._options.get("release_grads")
        if release is None:
            return p.device.type == "cuda" and _params.weight_of(p) is not None
        return release

    def _release(self, i: int, p, g) -> None:
        if self._copy_stream is None:
            native, copies = ctypes.c_void_p(), ctypes.c_int(0)
            _capi.call("tf_adam_grad_copy_stream", self._adam, ctypes.byref(native),
                       ctypes.byref(copies))
            stream = None
            if native.value is not None and self._device.type == "cuda":
                stream = torch.cuda.ExternalStream(native.value, device=self._device)
            self._copy_stream = (stream, copies.value == 1)
        stream, copies = self._copy_stream
        if not copies:
            return  # streamed mode: the step reads the grads itself
        if stream is not None:
            g.record_stream(stream)  # the allocator reuses it after the optimizer's copy
        else:
            self._keep.append(g)  # the emulated device copies on its own threads
        self._released[i] = g.data_ptr()
        self._lost.discard(i)
        p.grad = None

    def _label_of(self, p) -> str:
        """The label of optimizer param ``p`` (one of the groups' params), for an error."""
        return next(_label(p, index, gi) for gi, index, q in self._flat() if q is p)

    def _flat(self):
        """(group, flat index, param) over every group, in state_dict order."""
        index = 0
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                yield gi, index, p
                index += 1

    # --- the C optimizer ----------------------------------------------------------------
    def _check_all(self) -> torch.device:
        """Checks every group and param as they are now. @returns their device"""
        device = None
        for gi, group in enumerate(self.param_groups):
            _check_group(group, gi)
        for gi, index, p in self._flat():
            label = _label(p, index, gi)
            _check_param(p, label)
            device = device or p.device
            if p.device != device:
                raise ValueError(f"{label} is on {p.device}, the others on {device}: an "
                                 "optimizer's params must share one device")
        return device

    def _ensure_built(self) -> None:
        """Creates the C optimizer, or re-creates it when the params changed (membership,
        storage or dtype), carrying every param's state over."""
        key = tuple((gi, id(p), _home(p), p.dtype) for gi, _, p in self._flat())
        if self._adam is not None and key == self._layout_key:
            return
        device = self._check_all()
        if self._released:
            raise RuntimeError(f"the optimizer's params changed after the backward pass released "
                               f"{len(self._released)} grads to it: call step() (or zero_grad()) "
                               "before changing the params or their groups")
        carried = {}
        if self._adam is not None:
            carried = {id(p): _state.read(self._adam, i, p) for i, (_, p) in
                       enumerate(self._entries)}
        self._check_sharded()
        groups = [gi for gi, g in enumerate(self.param_groups)
                  if any(_holds_elements(p) for p in g["params"])]
        if not groups and self._all_sharded():
            self._hold_nothing(key)
            return
        if not groups:
            raise ValueError("the optimizer has no param with elements")
        c_group = {gi: ci for ci, gi in enumerate(groups)}
        entries = [(c_group[gi], p) for gi, _, p in self._flat()
                   if _holds_elements(p)]
        adam = self._create(device, entries, groups)
        self.close()
        self._adam, self._device, self._entries, self._groups = adam, device, entries, groups
        self._entry_of = {id(p): i for i, (_, p) in enumerate(entries)}
        self._copy_stream = None
        self._lost.clear()
        self._hypers = {}
        for i, (_, p) in enumerate(entries):
            if id(p) in carried:
                state = carried[id(p)]
                if state.step > 0:
                    _state.write(adam, i, p, state)
        self._layout_key = key
        self._record_versions()

    def _all_sharded(self) -> bool:
        """Every param is a DTensor (and there is one): FSDP2 may give a rank no row of any."""
        flat = [p for _, _, p in self._flat()]
        return bool(flat) and all(_dtensor.is_dtensor(p) for p in flat)

    def _check_sharded(self) -> None:
        """Refuses what a rank-local step gets wrong over DTensor shards. @raises ValueError"""
        if self._options["max_grad_norm"] and any(_dtensor.is_dtensor(p)
                                                  for _, _, p in self._flat()):
            raise ValueError("max_grad_norm clips by the norm of this rank's shards, not the "
                             "model's: with DTensor params (FSDP2) clip with "
                             "torch.nn.utils.clip_grad_norm_ before step() instead")

    def _hold_nothing(self, key) -> None:
        """This rank holds no element of any (DTensor) param: no C optimizer, and step() has
        nothing to do. State it held before (params that had rows here) is dropped."""
        self.close()
        self._device, self._entries, self._groups, self._entry_of = None, [], [], {}
        self._copy_stream = None
        self._lost.clear()
        self._hypers = {}
        self._layout_key = key
        self._record_versions()

    def _mark_held(self) -> None:
        """``self.state`` reads true from now on (see _HeldState)."""
        if not isinstance(self.state, _HeldState):
            self.state = _HeldState(dict, self.state)
        self.state.held = True

    def _built(self, what: str) -> None:
        """_ensure_built, for a call that needs the C optimizer. @raises ValueError on a rank
        that holds no element of any param (FSDP2 gave it only empty shards)"""
        self._ensure_built()
        if self._adam is None:
            raise ValueError(f"{what}: this rank holds no element of any param (FSDP2 gave it "
                             "only empty shards), so it has no tierflow state")

    def _hyper(self, group: dict) -> _capi.AdamHyper:
        beta1, beta2 = group["betas"]
        # torch >= 2.7 names the decay in the group (AdamW is Adam with it True)
        decoupled = int(bool(group.get("decoupled_weight_decay", self._decoupled)))
        return _capi.AdamHyper(float(group["lr"]), float(beta1), float(beta2),
                               float(group["eps"]), float(group["weight_decay"]), decoupled, 1)

    def _create(self, device, entries, groups) -> ctypes.c_void_p:
        """The C optimizer: in the session of the offloaded weights among the params (which
        updates their tier copies), else on the params' device."""
        params = (_capi.AdamParam * len(entries))()
        weights = (ctypes.c_size_t * len(entries))()
        sessions = set()
        names = []
        for i, (ci, p) in enumerate(entries):
            names.append(f"param {i}".encode())
            home = _home(p)
            weights[i] = home[2] if home[0] == "weight" else _capi.NO_WEIGHT
            if home[0] == "weight":
                sessions.add(_params.weight_of(p)[0].value)
            # No grad pointer at creation: step_on gives each step's grads (NULL for a param
            # without one).
            address = home[1] if home[0] == "memory" else None
            params[i] = _capi.AdamParam(names[-1], address, None, _DTYPES[p.dtype],
                                        _dtensor.local(p).numel(), ci, 0)
        if len(sessions) > 1:
            raise ValueError("the params hold weights of several offload_parameters handles: "
                             "one optimizer updates the weights of one handle")
        hypers = (_capi.AdamHyper * len(groups))(*[self._hyper(self.param_groups[gi])
                                                     for gi in groups])
        options = _capi.AdamOptions()
        _capi.lib.tf_adam_options_default(ctypes.byref(options))
        o = self._options
        options.mode = _capi.ADAM_MODES[o["mode"]]
        options.chunk_elements = o["chunk_elements"] or 0
        options.threads = o["threads"] or 0
        options.overlap = _OVERLAPS.index(o.get("overlap", "none"))
        options.max_grad_norm = o["max_grad_norm"] or 0.0
        adam = ctypes.c_void_p()
        if sessions:
            if o["placement"] is not None:
                raise ValueError("placement= cannot apply to an optimizer over weights that "
                                 "offload_parameters holds: their handle's placement places "
                                 "the state (offload_parameters(..., placement=...))")
            _capi.call("tf_session_adam_create", ctypes.c_void_p(sessions.pop()), params,
                       len(entries), weights, hypers, len(groups), ctypes.byref(options),
                       ctypes.byref(adam))
            return adam
        placement = o["placement"].encode() if o["placement"] is not None else None
        options.placement = placement
        _capi.call("tf_adam_create", _devices.device_handle(device), params, len(entries),
                   hypers, len(groups), ctypes.byref(options), ctypes.byref(adam))
        return adam

    def _push_hypers(self) -> None:
        for ci, gi in enumerate(self._groups):
            hyper = self._hyper(self.param_groups[gi])
            values = tuple(getattr(hyper, f) for f, _ in hyper._fields_)
            if self._hypers.get(ci) != values:
                _capi.call("tf_adam_set_hyper", self._adam, ci, ctypes.byref(hyper))
                self._hypers[ci] = values

    def _record_versions(self) -> None:
        self._versions = [_dtensor.version(p) for _, p in self._entries]

    def _refresh_changed(self) -> None:
        """Re-reads the masters of params changed outside the optimizer (an in-place write
        bumps the tensor's version: model.load_state_dict, a manual edit)."""
        for i, (_, p) in enumerate(self._entries):
            if _home(p)[0] == "weight":
                continue  # a weight in a tier changes only by the step
            if _dtensor.version(p) != self._versions[i]:
                _capi.call("tf_adam_refresh_master", self._adam, i)
        self._record_versions()

    def _absorb_outside_state(self) -> None:
        """Moves state that a wrapper wrote into ``self.state`` into the C optimizer.

        The state lives in the C library and ``self.state`` stays empty; wrappers that restore
        a checkpoint by writing ``optim.state[param]`` directly (torch.distributed's
        ZeroRedundancyOptimizer.load_state_dict does) would otherwise be ignored."""
        if not any(self.state.values()):
            return
        where = {id(p): (gi, index) for gi, index, p in self._flat()}
        entry = {id(p): i for i, (_, p) in enumerate(self._entries)}
        loaded = {}
        for p, value in self.state.items():
            if value and id(p) in entry:
                gi, index = where[id(p)]
                loaded[entry[id(p)]] = (p, _state.from_torch(p, value, _label(p, index, gi)))
        for i, (p, state) in loaded.items():
            _state.write(self._adam, i, p, state)
            self._versions[i] = _dtensor.version(p)
        self.state.clear()
        if any(state.step > 0 for _, state in loaded.values()):
            self._mark_held()

    def _grads(self):
        """This step's grad pointers (None: no grad), checked before anything changes."""
        grads = (ctypes.c_void_p * len(self._entries))()
        any_grad = False
        for i, (_, p) in enumerate(self._entries):
            g, shard = _dtensor.grad(p), _dtensor.local(p)  # this rank's, for a DTensor
            if g is None and i in self._released:
                grads[i] = self._released[i]  # the optimizer reads its own copy
                any_grad = True
                continue
            if g is None and i in self._lost:
                label = self._label_of(p)
                raise RuntimeError(f"{label}: its grad was released to the optimizer, and the step "
                                   "that should have used it failed: run the backward pass again "
                                   "(or zero_grad() to step without it)")
            if g is None or not p.requires_grad:
                continue
            if (g.layout == torch.strided and g.dtype == shard.dtype and g.shape == shard.shape
                    and g.device == shard.device and g.is_contiguous()):
                grads[i] = g.data_ptr()
                any_grad = True
                continue
            label = self._label_of(p)
            if g.layout != torch.strided:
                raise ValueError(f"{label}: sparse grads are not supported")
            if g.dtype != p.dtype:
                raise TypeError(f"{label}: the grad is {g.dtype}, the param {p.dtype}")
            if g.shape != shard.shape or g.device != shard.device:
                raise ValueError(f"{label}: the grad is {tuple(g.shape)} on {g.device}, the "
                                 f"param {tuple(shard.shape)} on {shard.device}")
            raise ValueError(f"{label}: the grad is not contiguous")
        return grads, any_grad

    # --- torch.optim.Optimizer ----------------------------------------------------------
    def step(self, closure=None):
        """One Adam step over every param with a grad; returns the closure's loss.

        ``last_grad_norm`` gets the global norm of the grads, ``last_step_applied`` False when
        a non-finite grad skipped the step (nothing changed then)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._ensure_built()
        self._absorb_outside_state()
        for gi, group in enumerate(self.param_groups):
            _check_group(group, gi)
        grads, any_grad = self._grads()
        if not any_grad:
            return loss
        self._push_hypers()
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
        self._keep.clear()  # the step waited for every copy
        self.last_grad_norm = norm.value
        if self.last_step_applied:
            self._mark_held()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's zero_grad; grads announced to the optimizer (overlap) are discarded too."""
        super().zero_grad(set_to_none=set_to_none)
        if self._adam is not None and self._options.get("overlap", "none") != "none":
            _capi.call("tf_adam_discard_grads", self._adam)
            self._keep.clear()
        self._released.clear()
        self._lost.clear()

    def state_dict(self) -> dict:
        """torch's layout: ``state[i]`` = step, exp_avg, exp_avg_sq (fp32, on the CPU), and
        ``master`` for bf16/fp16 params; params never stepped have no entry. For a DTensor
        param (FSDP2) they are DTensors laid out like it, holding this rank's shard."""
        exported = defaultdict(dict)
        if self._adam is not None or any(self.state.values()):
            self._ensure_built()
            self._absorb_outside_state()
            for i, (_, p) in enumerate(self._entries):
                state = _state.read(self._adam, i, p)
                if state.step > 0:
                    exported[p] = state.to_torch(p)
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
        _capi.call("tf_adam_save", self._adam, os.fsencode(path))

    def load(self, path) -> None:
        """Reads a file written by save() for the same params; a corrupted or mismatched file
        raises tierflow.InputError with the state untouched. The hyper-parameters stay those
        of param_groups (restore an lr scheduler's own state_dict beside it)."""
        self._built("load()")
        _capi.call("tf_adam_load", self._adam, os.fsencode(path))
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

    def close(self) -> None:
        """Frees the C optimizer (the next call that needs it makes a fresh one)."""
        adam, self._adam = getattr(self, "_adam", None), None
        if adam is not None and _capi is not None:
            _capi.lib.tf_adam_destroy(adam)  # waits for its copies: then the grads may go
        if hasattr(self, "_keep"):
            self._keep.clear()
            self._released.clear()

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
    """

    _torch_class = torch.optim.AdamW
    _decoupled = 1

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, **kwargs):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kwargs)


class OffloadAdam(_OffloadAdamBase):
    """torch.optim.Adam (L2 weight decay) with its state offloaded by tierflow; arguments as
    OffloadAdamW's."""

    _torch_class = torch.optim.Adam
    _decoupled = 0

