"""Hub layers for ``kernels.kernelize`` (none yet for attention modules)."""
