"""graphc.utils: helpers beside the tensor library, as `torch.utils` (data loading)."""
