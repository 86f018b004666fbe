"""`portable check`'s LIBERO row: which headless rendering backend LIBERO's cameras will use here.

LIBERO's envs render through robosuite and mujoco, which pick their OpenGL platform from `MUJOCO_GL` once, at
their first import; the simulator sets `MUJOCO_GL=egl` on Linux unless the user chose one (reproduction/sim).
So the choice is: the user's `MUJOCO_GL` if set (when it does not render but another backend does, the row
says which to set), else EGL when an EGL context renders here, else OSMesa (the row's fix then says to set
`MUJOCO_GL=osmesa`, since EGL would be tried first). Each backend is tried in its own
child of the target interpreter (a failed EGL attempt in a process leaves PyOpenGL bound to it), rendering one
8x8 frame of an empty MuJoCo model. The row is skipped when the `[libero]` extra is not installed, and is only a
warning when nothing renders: a camera-free (privileged state) evaluation still works.
"""

from __future__ import annotations

import json

from reproduction.checks.context import CheckContext
from reproduction.checks.probe import ProbeResult, ok, skip, warn

NAME = "libero.render"
BACKENDS = ("egl", "osmesa")
LABELS = {"egl": "EGL", "osmesa": "OSMesa", "glfw": "GLFW"}
TIMEOUT_S = 60.0

RENDER_SCRIPT = r"""# portable-probe: libero render
import importlib.util, json, os, sys
if not all(importlib.util.find_spec(m) is not None for m in ("libero", "robosuite")):
    print(json.dumps({"installed": False})); sys.exit(0)
if os.environ.get("MUJOCO_GL") == "osmesa":
    os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
try:
    import mujoco
    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='1'/></worldbody></mujoco>")
    renderer = mujoco.Renderer(model, 8, 8)
    renderer.update_scene(mujoco.MjData(model))
    frame = renderer.render()
    renderer.close()
    print(json.dumps({"installed": True, "ok": frame.shape == (8, 8, 3)}))
except Exception as exc:
    print(json.dumps({"installed": True, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}))
"""


def _try(ctx: CheckContext, backend: str) -> dict:
    env = {**ctx.env, "MUJOCO_GL": backend}
    if backend != "osmesa":
        env.pop("PYOPENGL_PLATFORM", None)
    res = ctx.run([str(ctx.python), "-c", RENDER_SCRIPT], timeout=TIMEOUT_S, env=env)
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = "timed out" if res.timed_out else f"exit {res.returncode}: {res.tail(200)}"
        return {"installed": True, "ok": False, "error": why}
    return out if isinstance(out, dict) else {"installed": True, "ok": False, "error": "no answer"}


def probe_libero_render(ctx: CheckContext) -> ProbeResult:
    """One row: skip (no `[libero]` extra), ok naming the backend LIBERO will render with, or a warning naming
    what failed and what to install."""
    chosen = ctx.env.get("MUJOCO_GL")
    order = (chosen, *(b for b in BACKENDS if b != chosen)) if chosen else BACKENDS
    errors: dict[str, str] = {}
    for backend in order:
        out = _try(ctx, backend)
        if not out.get("installed"):
            return skip(NAME, "LIBERO is not installed (the libero extra: pip install -e '.[libero]')")
        if out.get("ok"):
            label = LABELS.get(backend, backend)
            if backend == chosen:
                return ok(NAME, f"LIBERO renders headless with {label} (MUJOCO_GL={chosen})", backend=backend)
            if chosen:  # the user's choice fails where another backend works
                return warn(
                    NAME,
                    f"MUJOCO_GL={chosen} does not render ({errors[chosen]}); {label} does",
                    f"export MUJOCO_GL={backend} (or unset MUJOCO_GL{' ' if backend == 'egl' else ''}"
                    f"{'for EGL' if backend == 'egl' else ''})",
                    backend=backend,
                    errors=errors,
                )
            if backend == "egl":
                return ok(NAME, "LIBERO renders headless with EGL", backend=backend)
            return warn(
                NAME,
                f"LIBERO renders headless with OSMesa only (EGL failed: {errors.get('egl', '?')})",
                "export MUJOCO_GL=osmesa before `portable run` (EGL is tried first otherwise)",
                backend=backend,
                errors=errors,
            )
        errors[backend] = str(out.get("error", "failed"))
    tried = "; ".join(f"{LABELS.get(b, b)}: {e}" for b, e in errors.items())
    return warn(
        NAME,
        f"LIBERO cannot render headless ({tried}); only camera-free evaluation (eval.libero.cameras=false) works",
        "install EGL (libegl1, a GPU driver) or OSMesa (apt-get install libosmesa6), or unset a wrong MUJOCO_GL",
        backend=None,
        errors=errors,
    )
