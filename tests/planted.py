"""Tokens planted in a run's environment, which nothing the run writes or prints may hold (tests/test_run_secrets.py).

An HF-shaped token in HF_TOKEN and HUGGING_FACE_HUB_TOKEN (redacted by shape and by value), a plain secret in a
credential-named variable (RECAP_UPLOAD_TOKEN: redacted by value only), and the Ray client address carrying a
credential (RAY_CLIENT_ADDRESS=ray://<RAY_AUTH_TOKEN's value>@...).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HF = "hf_PlantedFakeTokenAbCdEf0123456789xyz"
UPLOAD = "planted-upload-secret-42"
RAY = "planted-ray-secret-77"
PLANTED = (HF, UPLOAD, RAY)


def planted_env() -> dict[str, str]:
    """This process's environment with the tokens planted, one OpenMP thread and the repository importable."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "RAY_AUTH_MODE": "disabled",
        "HF_TOKEN": HF,
        "HUGGING_FACE_HUB_TOKEN": HF,
        "RECAP_UPLOAD_TOKEN": UPLOAD,
        "RAY_AUTH_TOKEN": RAY,
        "RAY_CLIENT_ADDRESS": f"ray://{RAY}@127.0.0.1:10001",
    }
