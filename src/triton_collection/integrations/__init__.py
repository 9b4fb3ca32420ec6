"""Integrations that put the collection's Hub layers into other libraries' models.

- :mod:`.transformers`: ``kernelize(model, mode=...)`` swaps every norm module for the
  triton-norms layer with the same numerics (works on transformers, diffusers and plain
  torch modules).
- :mod:`.families`: the numerics families and the bitwise probe that assigns a class to one.
- :mod:`.transformers_attention`: triton-attention as ``attn_implementation="triton"`` and the kernelized
  rotary function.
- :mod:`.diffusers`: ``kernelize(pipe)`` swaps diffusers' attention processors, norms, adaLN modulation and
  feed-forward projections for the collection's kernels.

Nothing heavy is imported here; import the submodule you need.
"""

__all__: list[str] = []
