"""An offloaded model's state_dict() and load_state_dict() see its weights: the values of their
tier copies, not the placeholders the params hold outside their block's forward."""
from __future__ import annotations

import torch

from tierflow._views import _host_view


class _ModelState:
    """Mixin of OffloadedParameters: the block hooks of state_dict and load_state_dict (it
    holds _weights, _weight_index, _homes, _device, _loading, _rewritten, _versions, _end_pass
    and _placeholder)."""

    def _offloaded_keys(self, module, prefix):
        for name, p in module.named_parameters():
            i = self._weight_index.get(id(p))
            if i is not None and self._weights[i] is p:
                yield prefix + name, i, p

    def _state_dict_hook(self, module, state_dict, prefix, _local_metadata):
        """The weights' values (their tier copies), not the placeholders the params hold
        outside their block's forward."""
        for key, i, p in self._offloaded_keys(module, prefix):
            if key in state_dict:
                with torch.no_grad():
                    state_dict[key] = _host_view(self._homes[i], p).to(self._device, copy=True)

    def _load_pre_hook(self, module, state_dict, prefix, *_args):
        """torch copies each loaded value into its param: into a scratch tensor holding the
        weight's values (so a value torch refuses leaves them as they were), which the post
        hook writes into the tier copy."""
        for key, i, p in self._offloaded_keys(module, prefix):
            if key in state_dict and i not in self._loading:
                with torch.no_grad():
                    scratch = _host_view(self._homes[i], p).to(self._device, copy=True)
                self._loading[i] = scratch
                p.data = scratch

    def _load_post_hook(self, module, _incompatible_keys):
        mine = [i for _, i, _ in self._offloaded_keys(module, "") if i in self._loading]
        if not mine:
            return
        self._end_pass()  # nothing staged or in flight while the tier copies change
        with torch.no_grad():
            for i in mine:
                p = self._weights[i]
                _host_view(self._homes[i], p).copy_(self._loading.pop(i))
                p.data = self._placeholder(i)
                self._rewritten.add(i)
                self._versions[i] = p._version  # torch's copy into the scratch: taken here
