"""recap-portable: reproducible release bundles and a resumable runner for RECAP.

Importing this package imports nothing heavy (no torch, ray, transformers, pyarrow): the control
plane must start in well under a second on a bare server Python.
"""

__version__ = "0.1.0"
