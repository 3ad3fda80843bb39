"""The C optimizer behind OffloadAdamW: made on the params' device, or in the session of the
weights offload_parameters holds; made again (the state carried over) when the params change;
its hyper-parameters and the params' outside writes pushed before each step."""
from __future__ import annotations

import ctypes
import math
import warnings
import weakref
from collections import defaultdict

import torch

from tierflow import _capi, _devices, _dtensor, _params, _state
from tierflow._checks import (_DTYPES, _check_group, _check_param, _holds_elements, _home,
                              _label, _state_dtype_index, c_options)


class _ReadState(dict):
    """``opt.state[p]`` as read from the C optimizer, with each tensor's identity and version
    when read: the next step writes back only what was changed since (an in-place edit, a
    value replaced), so an unchanged read costs no copy and undoes nothing."""

    def __init__(self, values: dict):
        super().__init__(values)
        self.marks = {k: (id(v), v._version) for k, v in values.items()
                      if isinstance(v, torch.Tensor)}

    def edited(self) -> set:
        """The keys changed since the read (added, removed, replaced or written in place)."""
        out = set()
        for key in set(self) | set(self.marks):
            value = self.get(key)
            if key not in self.marks or not isinstance(value, torch.Tensor) or \
                    (id(value), value._version) != self.marks[key]:
                out.add(key)
        return out


class _HeldState(defaultdict):
    """``opt.state``: empty (the state lives in the C library) but true once the C optimizer
    holds a stepped state, as a torch optimizer's state is then. torch.distributed.checkpoint's
    get/set_optimizer_state_dict run one step with zero grads on an optimizer whose ``state``
    is false (to create its state), which would advance this one's moments and step count.

    ``opt.state[p]`` for a stepped param reads its state from the C optimizer in torch's
    layout (``step``, ``exp_avg``, ``exp_avg_sq``, and ``master`` for a 16-bit param), as
    logging code reads a torch optimizer's. The dict read stays here until the next step,
    which first writes back what was changed in it: an in-place edit
    (``opt.state[p]["exp_avg"].mul_(0.5)``) is what that step starts from, as with torch's
    optimizers; an unchanged read is dropped. It is a copy: read it again after a step for
    the new values. load_state_dict() and load() drop the reads (they replace the state)."""

    held = False
    owner = None  # weakref to the optimizer

    def __bool__(self):
        return self.held or len(self) > 0

    def __getitem__(self, key):
        owner = self.owner() if self.owner is not None else None
        if owner is not None and isinstance(key, torch.Tensor) and not self.get(key):
            read = owner._state_of(key)
            if read:
                read = _ReadState(read)
                self[key] = read
                return read
        return super().__getitem__(key)


class ParamResizedError(ValueError):
    """A stepped param's ``.data`` changed size: its state no longer fits it."""


class _Binding:
    """Mixin of _OffloadAdamBase: the C optimizer (``self._adam``) over ``self._entries``."""

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
        storage or dtype), carrying every param's state over. Thread-safe: a second thread
        waits for the first's build. @raises RuntimeError in a child of os.fork for a C
        optimizer made in the parent"""
        with self._build_lock:
            if self._adam is not None:
                _devices.check_process(self._made_in, "this optimizer's C state")
            self._build()

    def _build(self) -> None:
        key = tuple((gi, id(p), _home(p), p.dtype) for gi, _, p in self._flat())
        if self._adam is not None and key == self._layout_key:
            return
        device = self._check_all()
        if self._released:
            raise RuntimeError(f"the optimizer's params changed after the backward pass released "
                               f"{len(self._released)} grads to it: call step() (or zero_grad()) "
                               "before changing the params or their groups")
        carried = {}
        homes = {pid: home for _, pid, home, _ in (self._layout_key or ())}
        if self._adam is not None:
            self._refuse_resized()
            carried = {id(p): _state.read(self._adam, i, p) for i, (_, p) in
                       enumerate(self._entries) if not self._resized(i)}
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
        self._warn_idle_overlap(adam)
        self.close()
        self._adam, self._device, self._entries, self._groups = adam, device, entries, groups
        # The C optimizer steps an fp32 CPU param where it is (it is its own master): its
        # storage stays alive while the C optimizer may read it, even when .data is replaced.
        self._storages = [_dtensor.local(p).detach() for _, p in entries]
        self._shapes = [tuple(_dtensor.local(p).shape) for _, p in entries]
        self._made_in = _devices.generation()
        self._entry_of = {id(p): i for i, (_, p) in enumerate(entries)}
        self._copy_stream = None
        self._lost.clear()
        self._hypers = {}
        for i, (_, p) in enumerate(entries):
            if id(p) in carried:
                state = carried[id(p)]
                if state.step > 0:
                    _state.write(adam, i, p, state)
                    if homes.get(id(p)) != _home(p):
                        # .data replaced (vector_to_parameters, a manual swap): the new values
                        # are the param's now, read into its master as an in-place write of
                        # them is (where one differs from the master rounded to its dtype)
                        _capi.call("tf_adam_refresh_master", adam, i)
        self._layout_key = key
        self._record_versions()

    def _resized(self, i: int) -> bool:
        """Entry ``i``'s param holds another number of elements than when the C optimizer
        took it (its ``.data`` was replaced by a tensor of another size)."""
        return _dtensor.local(self._entries[i][1]).numel() != math.prod(self._shapes[i])

    def _refuse_resized(self) -> None:
        """@raises ParamResizedError naming the first stepped param whose size changed (the
        C optimizer and its state stay as they were: state_dict() still saves them)."""
        for i, (_, p) in enumerate(self._entries):
            if not self._resized(i):
                continue
            old = math.prod(self._shapes[i])
            state = _state.read(self._adam, i, p, elements=old)
            if state.step > 0:
                raise ParamResizedError(
                    f"{self._label_of(p)}: its .data changed size after {state.step} steps "
                    f"({tuple(self._shapes[i])} when the optimizer took it, "
                    f"{tuple(_dtensor.local(p).shape)} now), so its exp_avg and exp_avg_sq no "
                    "longer fit it (torch.optim.AdamW fails the same way): put back a tensor "
                    "of its shape, or make a new optimizer for the new shape; state_dict() "
                    "still saves the state as it was")

    def _stale_state(self) -> defaultdict:
        """The state as the C optimizer holds it, shaped as its params were when it took
        them (for state_dict() after a param was resized)."""
        exported = defaultdict(dict)
        for i, (_, p) in enumerate(self._entries):
            state = _state.read(self._adam, i, p, elements=math.prod(self._shapes[i]))
            if state.step > 0:
                exported[p] = state.to_torch(p, shape=self._shapes[i])
        return exported

    def _warn_idle_overlap(self, adam) -> None:
        """mode='auto' chose streamed mode, where an overlap does nothing: said once."""
        if self._options.get("overlap", "none") == "none":
            return
        mode = ctypes.c_int(0)
        _capi.call("tf_adam_mode_in_force", adam, ctypes.byref(mode))
        if mode.value == _capi.ADAM_STREAMED:
            warnings.warn(f"overlap={self._options['overlap']!r} does nothing here: mode='auto' "
                          "chose streamed mode, which streams the state at step(); pass "
                          "mode='cpu' to overlap the update with the backward pass",
                          RuntimeWarning, stacklevel=4)

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
        self.state.owner = weakref.ref(self)

    def _drop_reads(self) -> None:
        """Forgets the ``opt.state[p]`` reads (before the state is replaced)."""
        for p in [p for p, v in self.state.items() if isinstance(v, _ReadState)]:
            del self.state[p]

    def _state_of(self, p) -> dict:
        """``p``'s state in torch's layout from the C optimizer; {} when it has none (not
        stepped, not this optimizer's, or the C optimizer is not built)."""
        i = self._entry_of.get(id(p)) if self._adam is not None else None
        if i is None or self._entries[i][1] is not p or self._resized(i):
            return {}
        _devices.check_process(self._made_in, "this optimizer's C state")
        self._refresh_changed()  # as the next step would: a written param is its master
        state = _state.read(self._adam, i, p)
        return state.to_torch(p) if state.step > 0 else {}

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
                               float(group["eps"]), float(group["weight_decay"]), decoupled, 1,
                               _state_dtype_index(group.get("state_dtype"), "param group"))

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
        self._built_state_dtypes = [h.state_dtype for h in hypers]
        o = self._options
        options = c_options(o)
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

    def _state_dtype_name(self, index: int) -> str:
        if index < 0:
            return f"the optimizer's ({self._options.get('state_dtype', 'fp32')!r})"
        return repr(_capi.STATE_DTYPES[index])

    def _push_hypers(self) -> None:
        for ci, gi in enumerate(self._groups):
            hyper = self._hyper(self.param_groups[gi])
            built = getattr(self, "_built_state_dtypes", [])
            if ci < len(built) and hyper.state_dtype != built[ci]:
                raise ValueError(
                    f"param_groups[{gi}]['state_dtype'] is now "
                    f"{self._state_dtype_name(hyper.state_dtype)}, but the group's moments were "
                    f"made {self._state_dtype_name(built[ci])}: a group's state_dtype is fixed "
                    "once the optimizer is built (at its first step); nothing was changed")
            values = tuple(getattr(hyper, f) for f, _ in hyper._fields_)
            if self._hypers.get(ci) != values:
                _capi.call("tf_adam_set_hyper", self._adam, ci, ctypes.byref(hyper))
                self._hypers[ci] = values

    def _record_versions(self) -> None:
        self._versions = [_dtensor.version(p) for _, p in self._entries]

    def _refresh_changed(self) -> None:
        """Re-reads the masters of params changed outside the optimizer (an in-place write
        bumps the tensor's version: model.load_state_dict, a manual edit): before a step, and
        before the state is given out (state_dict(), opt.state[p], a copy, save()), which
        would otherwise hold the master from before the write (with master="remainder", the
        written high half joined to the old low half)."""
        for i, (_, p) in enumerate(self._entries):
            if _home(p)[0] == "weight":
                # a weight in a tier changes only by the step, or by the model's
                # load_state_dict (which writes its tier copy)
                if _params.take_rewritten(p):
                    _capi.call("tf_adam_refresh_master", self._adam, i)
                continue
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
        edits = {}
        for p, value in self.state.items():
            if not value or id(p) not in entry:
                continue
            gi, index = where[id(p)]
            if isinstance(value, _ReadState):
                edited = value.edited()
                if edited:  # an unchanged read is dropped: nothing to write
                    edits[entry[id(p)]] = (p, _state.from_torch(p, value, _label(p, index, gi)),
                                           edited)
            else:
                loaded[entry[id(p)]] = (p, _state.from_torch(p, value, _label(p, index, gi)))
        for i, (p, state) in loaded.items():
            _state.write(self._adam, i, p, state)
            self._versions[i] = _dtensor.version(p)
        for i, (p, state, edited) in edits.items():
            # only what was edited: a master not edited stays the C optimizer's (a write to
            # the param since is still seen by its version), and nothing else is undone
            _state.write_parts(self._adam, i, p, state, edited)
        self.state.clear()
        if any(state.step > 0 for _, state in loaded.values()):
            self._mark_held()

    def close(self) -> None:
        """Frees the C optimizer (the next call that needs it makes a fresh one)."""
        adam, self._adam = getattr(self, "_adam", None), None
        if adam is not None and _capi is not None and \
                getattr(self, "_made_in", 0) == _devices.generation():
            _capi.lib.tf_adam_destroy(adam)  # waits for its copies: then the grads may go
        # (one made before os.fork is the parent's: its threads are not here to join)
        self._storages = []
        if hasattr(self, "_keep"):
            self._keep.clear()
            self._released.clear()
            self._announced.clear()
