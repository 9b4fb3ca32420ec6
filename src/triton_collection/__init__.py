"""Tooling for the triton-collection Hub kernels: build, install locally, demo, integrations.

The kernels themselves live in ``torch-ext/<python_name>/`` and reach users as Hub
packages (``kernels.get_kernel("<org>/triton-norms", version=1)``); this package only
builds, installs and drives them.
"""

DEFAULT_ORG = "triton-collection"
"""Hub organisation the packages are built and installed under unless told otherwise."""

__version__ = "0.1.0"

__all__ = ["DEFAULT_ORG", "__version__"]
