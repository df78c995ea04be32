"""load_into: make a torch module's parameters BE shared tensors."""


def load_into(module, state, strict=True, requires_grad=False):
    """Makes `module`'s parameters and buffers the tensors of `state` (a
    Module or any mapping name -> torch tensor, e.g. Client.call's result)
    without copying: afterwards `param.data_ptr()` is the shared tensor's.
    torch >= 2.1 uses load_state_dict(state, assign=True); older ones
    replace each parameter with nn.Parameter(t) and each buffer in place.
    Shapes must match; with `strict`, keys must match exactly (KeyError
    otherwise). Parameters get requires_grad=`requires_grad` (default
    False: shared weights are for inference). Returns the module."""
    import torch
    own = dict(module.state_dict(keep_vars=True))
    if strict:
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise KeyError("load_into: missing keys %s, unexpected keys %s"
                           % (missing, unexpected))
    if _has_assign(torch):
        module.load_state_dict(state, strict=strict, assign=True)
        for p in module.parameters():
            p.requires_grad_(requires_grad)
        return module
    for full, t in state.items():
        if full not in own:
            continue
        if tuple(own[full].shape) != tuple(t.shape):
            raise ValueError("load_into: %s has shape %s, the module wants %s"
                             % (full, tuple(t.shape), tuple(own[full].shape)))
        owner_path, _, leaf = full.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(t, requires_grad=requires_grad)
        elif leaf in owner._buffers:
            owner._buffers[leaf] = t
        else:
            raise KeyError("load_into: %s is neither a parameter nor a buffer" % full)
    return module


def _has_assign(torch):
    import inspect
    try:
        return "assign" in inspect.signature(torch.nn.Module.load_state_dict).parameters
    except (TypeError, ValueError):
        return False
