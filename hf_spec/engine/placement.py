"""Where a model computes, whether it sits on one device or was placed by accelerate (``device_map=``).

A model loaded with a device map may hold its parameters on "meta" (offloaded to disk, or to the CPU while it
runs on a GPU) or across several devices. accelerate's hooks then move each block's inputs to the block's
execution device (loading offloaded weights for the forward), and the hook on the top module moves the outputs
back to the device its inputs came from. So a model is fed on its execution device, never on ``model.device`` (the
first parameter's device: "meta" when that parameter is offloaded), and its logits and hidden states come back
there. e.g. every layer offloaded to disk on a CPU machine: parameters on "meta", execution device "cpu".
"""
from __future__ import annotations

import torch
from torch import nn


def execution_device(module: nn.Module) -> torch.device:
    """The device ``module``'s forward takes its inputs on: its accelerate hook's execution device where it has
    one, else that of its input embeddings' hook (a model whose blocks alone were hooked), else the device of its
    first parameter that holds data."""
    candidates = [module]
    if hasattr(module, "get_input_embeddings"):
        candidates.append(module.get_input_embeddings())
    for candidate in candidates:
        device = _hook_device(getattr(candidate, "_hf_hook", None))
        if device is not None:
            return device
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.device.type != "meta":
            return tensor.device
    raise ValueError(f"Every weight of the {type(module).__name__} is on the 'meta' device and no accelerate hook "
                     "says where it runs: load it with from_pretrained (device_map= places it), or materialise it.")


def placed_by_accelerate(model: nn.Module) -> bool:
    """True where accelerate's hooks place ``model`` (a device map with several devices, or offloaded weights):
    it must not be moved with ``.to()``."""
    return any(hasattr(module, "_hf_hook") for module in model.modules())


def _hook_device(hook) -> torch.device | None:
    """An ``AlignDevicesHook``'s execution device (inside a ``SequentialHook`` too), or None."""
    if hook is None:
        return None
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    for inner in getattr(hook, "hooks", ()):
        device = _hook_device(inner)
        if device is not None:
            return device
    return None
