"""Grads as OffloadAdamW's step takes them: announced to the C optimizer as autograd
accumulates them (overlap="backward"), freed once the optimizer holds its copy
(release_grads), or read at step() from each param's ``.grad``."""
from __future__ import annotations

import ctypes
import weakref

import torch

from tierflow import _capi, _devices, _dtensor, _params

_stream = _devices.native_stream


class _Announcing:
    """Mixin of _OffloadAdamBase: the grads of a step."""

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
        if self._adam is not None:
            _devices.check_process(self._made_in, "this optimizer's C state")
        i = self._entry_of.get(id(p))
        if self._adam is None or i is None:
            return  # the first step (no C optimizer yet): step() does it
        g, shard = _dtensor.grad(p), _dtensor.local(p)  # this rank's, for a DTensor
        if (g is None or g.layout != torch.strided or g.dtype != shard.dtype
                or g.shape != shard.shape or g.device != shard.device or not g.is_contiguous()):
            return  # step() checks it and says what is wrong
        if _params.rewritten(p) or (_params.weight_of(p) is None
                                    and _dtensor.version(p) != self._versions[i]):
            # written since the optimizer last read it (an in-place write, load_state_dict):
            # step() re-reads the master from it first, then updates it from this grad; an
            # update started now would start from the old master (and backward_publish would
            # write its result over the written values)
            return
        if i in self._released:
            label = self._label_of(p)
            raise RuntimeError(f"{label}: a second backward pass made a grad before step() took "
                               "the first, which was released to the optimizer; set "
                               "opt.accumulating = True for the passes that accumulate")
        _capi.call("tf_adam_grad_ready", self._adam, i, g.data_ptr(), _stream(self._device))
        if self._releases(p):
            self._release(i, p, g)
        else:
            self._announced.setdefault(i, (g.data_ptr(), g._version))

    def _drop_changed_announcements(self) -> None:
        """The step uses the grads as they are at step(): when one changed after it was
        announced (a second backward pass, clip_grad_norm_, GradScaler.unscale_, any in-place
        write, a new tensor), the C optimizer forgets the announcements (restoring what their
        updates changed) and reads every grad now. @raises RuntimeError when released grads
        (which it cannot read again) are among them: nothing changed then"""
        changed = [i for i, (address, version) in self._announced.items()
                   if (g := _dtensor.grad(self._entries[i][1])) is None
                   or g.data_ptr() != address or g._version != version]
        if not changed:
            return
        if self._released:
            label = self._label_of(self._entries[changed[0]][1])
            raise RuntimeError(f"{label}: its grad changed after the backward pass announced it, "
                               f"and {len(self._released)} other grads were released to the "
                               "optimizer (release_grads), so the step cannot read them again: "
                               "change grads before they are announced (set opt.accumulating = "
                               "True for passes that accumulate), or use release_grads=False")
        _capi.call("tf_adam_discard_grads", self._adam)
        self._announced.clear()

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
