"""The target's forward hooks: the aux layers' outputs through forward hooks
and the final (post-norm) state, without the LM head.

Sits under forward.py (HFTarget), which extract, online training and export run. Only
the needed layers are kept: a hook on `model.model.layers[k]` for each
canonical id k (the layer whose OUTPUT is captured, ops/layers.py), never
`output_hidden_states` for all layers. The base model (`model.model`) is
called, so the vocabulary-sized logits are never computed; its
`last_hidden_state` is the output of `model.model.norm`: post-norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

def decoder_layers(model) -> Sequence[torch.nn.Module]:
    base = base_model(model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layer list at model.model.layers; "
                         f"this architecture is not supported by the transformers backend")
    return layers


def base_model(model) -> torch.nn.Module:
    """The decoder stack without the LM head (model.model for *ForCausalLM)."""
    base = getattr(model, "model", None)
    if base is None:
        raise ValueError(f"{type(model).__name__}: no base model at model.model")
    # Multimodal wrappers keep the text stack one level down.
    if getattr(base, "layers", None) is None and getattr(base, "language_model", None) is not None:
        base = base.language_model
    return base


def compile_layers(model) -> int:
    """torch.compile each decoder layer in place (regional compilation, as
    PyTorch's recipe for repeated blocks): the layers share one graph, static
    for the first batch shape and dynamic in length from the second, so a
    corpus of many lengths compiles twice, not once a length. Fuses the
    norms, rotary and SiLU x up products the eager forward runs as separate
    memory-bound kernels. The forward hooks run inside the compiled call and
    still see each layer's output (tests/test_op_extract.py compares with the
    eager states). Returns the number of layers compiled."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)


class HiddenStateCapture:
    """Hooks on the aux layers; `__call__(input_ids, attention_mask)` returns
    (aux [B, L, len(ids) * H] in canonical order, final [B, L, H]) on the
    device of the last layer. A batch without padding passes no mask."""

    def __init__(self, model, layer_ids: Sequence[int]) -> None:
        self.model = model
        self.base = base_model(model)
        self.layer_ids = list(layer_ids)
        layers = decoder_layers(model)
        self._captured: dict[int, torch.Tensor] = {}
        self._handles = [layers[k].register_forward_hook(self._hook(k)) for k in self.layer_ids]

    def _hook(self, k: int):
        def hook(_module, _inputs, output):
            # Decoder layers return a tensor (transformers >= 5) or a tuple whose
            # first item is the hidden state (older releases).
            self._captured[k] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> "HiddenStateCapture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        self._captured.clear()
        try:
            out = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            final = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
            missing = [k for k in self.layer_ids if k not in self._captured]
            if missing:
                raise RuntimeError(f"layers {missing} ran no forward hook; is model.model.layers the decoder stack?")
            # With device_map="auto" the layers live on different GPUs.
            aux = torch.cat([self._captured[k].to(final.device) for k in self.layer_ids], dim=-1)
        finally:
            self._captured.clear()
        return aux, final
