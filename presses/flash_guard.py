"""Flash attention hands each layer the forward's 2-D padding mask, over every position the sequence has had: once
a press has evicted cached keys, that mask no longer says which of them are padding, so such a forward cannot be
masked as the model would mask it. ``FlashGuard`` refuses it before the forward runs (no layer has run, nothing is
cached or compressed)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from presses.model_hooks import WrapperBound, input_ids_of, language_model


def check_flash_padding(model: PreTrainedModel, args: tuple, kwargs: dict) -> None:
    """Refuse (``ValueError``) a decoder-stack call under flash attention whose 2-D mask holds padding and does not
    line up with the cache's keys and the new rows."""
    mask = kwargs.get("attention_mask")
    if not model.config._attn_implementation.startswith("flash") or mask is None or mask.ndim != 2:
        return
    ids = input_ids_of(args, kwargs)
    rows = (ids if ids is not None else kwargs["inputs_embeds"]).shape[1]
    cache = kwargs.get("past_key_values")
    keys = (cache.get_seq_length() if cache is not None else 0) + rows
    if mask.shape[-1] != keys and not bool(mask.all()):
        raise ValueError(
            f"a padding mask over {mask.shape[-1]} positions does not line up with a cache of {keys} keys, which a "
            "press compressed: flash attention cannot mask this padded batch; refused before the forward. Compress "
            "padded batches under sdpa or eager attention, or run the sequences one at a time"
        )


class FlashGuard(WrapperBound):
    """A pre-hook on the decoder stack (``check_flash_padding``), alive as long as the press that runs ``owner``."""

    def attach(self, model: PreTrainedModel, owner: object) -> None:
        self.detach()
        self.handles = [
            language_model(model).register_forward_pre_hook(
                lambda module, args, kwargs: self._check(model, owner, args, kwargs), with_kwargs=True
            )
        ]

    def _check(self, model: PreTrainedModel, owner: object, args: tuple, kwargs: dict) -> None:
        if self._bind_to_wrapper(model, owner):
            with torch.no_grad():
                check_flash_padding(model, args, kwargs)
