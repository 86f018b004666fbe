"""LIBERO in the loop (needs the libero extra): no writes outside the cache, upstream's observation layout and
orientation, the gripper sign, the scripted experts, replay parity, and the evaluation protocol's counts.

Each env build costs 5-30 s wall on 2 cores (LIBERO_LAB.md), so the module builds one no-camera env for
libero_spatial/0 and shares it; libero_10/0, the camera env and the no-write subprocess build one each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from reproduction.errors import SimError
from reproduction.sim.libero._runtime import available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not available(), reason="LIBERO is not installed (the libero extra: pip install -e '.[libero]')"
    ),
]

REPO = Path(__file__).resolve().parent.parent
OPEN, CLOSE = -1.0, 1.0


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("libero_cache")


@pytest.fixture(scope="module")
def spatial(cache_dir):
    from reproduction.sim.libero.env import LiberoSim
    from reproduction.sim.libero.tasks import resolve_tasks

    (task,) = resolve_tasks(["libero_spatial/0"], cache_dir=cache_dir)
    sim = LiberoSim(task, cameras=False, cache_dir=cache_dir)
    yield sim
    sim.close()


class _Borrowed:
    """The module's env lent to evaluate_libero through its make_sim seam (close() leaves it open)."""

    def __init__(self, sim):
        self._sim = sim

    def __getattr__(self, name):
        return getattr(self._sim, name)

    def close(self):
        pass


class _Replay:
    """A policy that replays recorded actions as one chunk per call (the rest of the chunk is the tail)."""

    def __init__(self, actions):
        self.actions, self.t = np.asarray(actions), 0

    def reset(self, seed=None):
        self.t = 0

    def __call__(self, batch):
        chunk = self.actions[self.t : self.t + 5]
        if len(chunk) == 0:
            chunk = np.array([[0, 0, 0, 0, 0, 0, OPEN]])
        self.t += len(chunk)
        return chunk[None]


def _width(obs):
    s = obs["observation.state"]
    return float(s[6] - s[7])  # Panda finger qpos: left +, right -; the opening is their difference


def test_observation_is_upstreams_layout(spatial):
    obs = spatial.reset(0)
    assert sorted(obs) == ["observation.object_state", "observation.state", "task"]
    state = obs["observation.state"]
    assert state.dtype == np.float32 and state.shape == (8,)
    raw = spatial.raw
    np.testing.assert_allclose(state[:3], raw["robot0_eef_pos"], rtol=1e-6)
    np.testing.assert_allclose(state[6:], raw["robot0_gripper_qpos"], rtol=1e-6)
    # the gripper points down: an axis-angle of ~pi about x (as RLinf's state has it)
    assert abs(np.linalg.norm(state[3:6]) - np.pi) < 0.2
    assert obs["observation.object_state"].shape == (70,)
    assert obs["task"] == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert spatial.steps == 0 and not spatial.is_success()


def test_gripper_sign_plus_one_closes(spatial):
    obs = spatial.reset(0)
    open_width = _width(obs)
    for _ in range(10):
        obs, _ = spatial.step([0, 0, 0, 0, 0, 0, CLOSE])
    closed = _width(obs)
    for _ in range(10):
        obs, _ = spatial.step([0, 0, 0, 0, 0, 0, OPEN])
    reopened = _width(obs)
    assert open_width > 0.07 and closed < open_width - 0.05, (open_width, closed)
    assert reopened > closed + 0.05, (closed, reopened)


def test_bad_init_index_and_action_dim(spatial):
    with pytest.raises(SimError, match=r"init state 50 out of range for libero_spatial/0: it has init states 0\.\.49"):
        spatial.reset(50)
    spatial.reset(0)
    with pytest.raises(SimError, match=r"shape \(4,\), expected \(7,\)"):
        spatial.step(np.zeros(4))
    assert spatial.steps == 0  # the bad action was refused before any physics step


def test_expert_succeeds_and_replay_reproduces_it(spatial):
    from reproduction.sim.libero.expert import PickPlaceExpert
    from reproduction.sim.libero.protocol import run_episode

    expert = PickPlaceExpert()
    expert.bind(spatial)
    eps = [
        run_episode(spatial, expert, i, chunk=1, max_steps=240, stop_on_success=True, record_actions=True)
        for i in (0, 1)
    ]
    assert [e.success_once for e in eps] == [True, True]
    assert all(60 <= e.steps <= 200 and e.first_success_step == e.steps for e in eps), [e.steps for e in eps]

    rec = eps[1]
    again = run_episode(spatial, _Replay(rec.actions), 1, chunk=5, max_steps=240, stop_on_success=True)
    assert again.success_once and again.first_success_step == rec.first_success_step  # same state, same actions

    # a wrong gripper sign (the bowl is never grasped) is caught: the same replay with gripper negated fails
    flipped = np.asarray(rec.actions)
    flipped[:, 6] *= -1
    bad = run_episode(spatial, _Replay(flipped), 1, chunk=5, max_steps=len(flipped) + 20)
    assert not bad.success_once


def test_protocol_counts_per_task_and_init_state(spatial, cache_dir):
    from reproduction.sim.libero.expert import PickPlaceExpert
    from reproduction.sim.libero.protocol import evaluate_libero

    built = []

    def make_sim(task, **kw):
        built.append((task.task_id, kw["cameras"]))
        return _Borrowed(spatial)

    res = evaluate_libero(
        ["libero_spatial/0"],
        2,
        PickPlaceExpert(),
        chunk=5,
        cameras=False,
        max_steps=130,
        make_sim=make_sim,
        cache_dir=cache_dir,
    )
    assert built == [("libero_spatial/0", False)]  # one env for the task, reused across init states
    assert res.per_task() == {"libero_spatial/0": {"episodes": 2, "success_once": 2, "success_at_end": 2}}
    rows = res.per_init_state()["libero_spatial/0"]
    assert [(r["init_index"], r["success_once"], r["success_at_end"], r["steps"]) for r in rows] == [
        (0, True, True, 130),
        (1, True, True, 130),
    ]
    assert res.steps == 260 and res.to_dict()["per_task"] == res.per_task()

    # a do-nothing policy runs the full limit and fails both counts
    res = evaluate_libero(
        ["libero_spatial/0"],
        1,
        lambda b: np.tile([0, 0, 0, 0, 0, 0, OPEN], (1, 5, 1)),
        max_steps=12,
        make_sim=make_sim,
        cache_dir=cache_dir,
    )
    assert res.per_init_state()["libero_spatial/0"] == [
        {"init_index": 0, "success_once": False, "success_at_end": False, "steps": 12}
    ]


def test_protocol_bad_input_before_any_build(cache_dir):
    from reproduction.sim.libero.protocol import evaluate_libero

    def never(*a, **k):
        raise AssertionError("built an env")

    with pytest.raises(SimError, match=r"episodes_per_task 51 out of range for libero_10/0: it has 50 init states"):
        evaluate_libero(["libero_10/0"], 51, lambda b: None, make_sim=never, cache_dir=cache_dir)
    with pytest.raises(SimError, match="unknown LIBERO task 'no_such_task' in suite libero_10"):
        evaluate_libero(["libero_10/no_such_task"], 1, lambda b: None, make_sim=never, cache_dir=cache_dir)
    with pytest.raises(SimError, match="chunk must be >= 1"):
        evaluate_libero(["libero_10/0"], 1, lambda b: None, chunk=0, make_sim=never, cache_dir=cache_dir)


def test_workers_deal_init_states_and_match_one_process(spatial, cache_dir):
    """Two spawn workers (one fresh env each) give the same episodes as the module's reused env, in order."""
    from reproduction.sim.libero.expert import PickPlaceExpert
    from reproduction.sim.libero.protocol import evaluate_libero, run_episode

    expert = PickPlaceExpert()
    expert.bind(spatial)
    ref = [run_episode(spatial, expert, i, chunk=5, max_steps=240, stop_on_success=True) for i in (0, 1)]
    res = evaluate_libero(
        ["libero_spatial/0"], 2, PickPlaceExpert(), cameras=False, stop_on_success=True, workers=2, cache_dir=cache_dir
    )
    key = lambda e: (e.init_index, e.success_once, e.steps, e.first_success_step)  # noqa: E731
    assert [key(e) for e in res.episodes] == [key(e) for e in ref]
    assert all(e.success_once for e in ref)


def test_each_episode_reseeds_the_envs_reset_from_its_own_seed(spatial, cache_dir):
    """Every episode re-seeds the env (numpy's global RNG, from which robosuite draws the arm's reset noise: zero
    magnitude in LIBERO's robots today) with `seed + init index` before its reset, so an episode cannot depend on
    how many episodes its worker's env ran before it, even if a task's robot adds reset noise."""
    from reproduction.sim.libero.protocol import evaluate_libero

    seeds = []

    class _Recording(_Borrowed):
        def reset(self, init_index, seed=None):
            seeds.append((init_index, seed))
            return self._sim.reset(init_index, seed=seed)

    evaluate_libero(
        ["libero_spatial/0"],
        3,
        lambda b: np.zeros((1, 5, 7)),
        cameras=False,
        max_steps=2,
        seed=100,
        make_sim=lambda t, **kw: _Recording(spatial),
        cache_dir=cache_dir,
    )
    assert seeds == [(0, 100), (1, 101), (2, 102)]


def test_workers_need_a_picklable_policy(cache_dir):
    from reproduction.sim.libero.protocol import evaluate_libero

    with pytest.raises(SimError, match="workers=2 needs a picklable policy"):
        evaluate_libero(["libero_spatial/0"], 2, lambda b: None, workers=2, cache_dir=cache_dir)
    with pytest.raises(SimError, match="workers must be >= 1"):
        evaluate_libero(["libero_spatial/0"], 2, lambda b: None, workers=0, cache_dir=cache_dir)


def test_task_names_and_star_resolve(cache_dir):
    from reproduction.sim.libero.tasks import resolve_tasks

    name = "LIVING_ROOM_SCENE2_put_both_the_alphabet_soup_and_the_tomato_sauce_in_the_basket"
    (by_name,) = resolve_tasks([f"libero_10/{name}"], cache_dir=cache_dir)
    assert (by_name.task_id, by_name.n_init_states, by_name.max_steps) == ("libero_10/0", 50, 520)
    every = resolve_tasks(["libero_spatial/*", "libero_spatial/3"], cache_dir=cache_dir)
    assert [t.index for t in every] == list(range(10))  # duplicates dropped, order kept
    assert Path(every[0].bddl_path).is_file()


def test_libero10_expert_through_the_protocol(cache_dir):
    from reproduction.sim.libero.expert import PickPlaceExpert
    from reproduction.sim.libero.protocol import evaluate_libero

    res = evaluate_libero(
        ["libero_10/0"], 1, PickPlaceExpert(), cameras=False, stop_on_success=True, cache_dir=cache_dir
    )
    (row,) = res.per_init_state()["libero_10/0"]
    assert row["success_once"] and row["success_at_end"] is None and 250 <= row["steps"] <= 400, row


def test_agentview_is_rotated_180_as_openpi_stores_it(cache_dir):
    """LIBERO/openpi's stored agent view = the OpenGL frame rotated 180 deg = MuJoCo's upright render mirrored
    left-right (measured: mean abs diff 11 vs 40-69 for the other three orientations). A missing or vertical-only
    flip matches another orientation and fails here."""
    import mujoco

    from reproduction.sim.libero.env import LiberoSim
    from reproduction.sim.libero.tasks import resolve_tasks

    (task,) = resolve_tasks(["libero_spatial/0"], cache_dir=cache_dir)
    with LiberoSim(task, cameras=True, image_size=96, settle_steps=2, cache_dir=cache_dir) as sim:
        obs = sim.reset(0)
        img, wrist = obs["observation.images.image"], obs["observation.images.wrist_image"]
        assert img.shape == wrist.shape == (96, 96, 3) and img.dtype == np.uint8
        assert img[:16].mean() < img[-16:].mean() - 30  # robot/wall (dark) at the top, table (light) below
        renderer = mujoco.Renderer(sim.sim.model._model, 96, 96)  # an upright (top row first) reference render
        try:
            renderer.update_scene(sim.sim.data._data, camera="agentview")
            ref = renderer.render().astype(np.float64)
        finally:
            renderer.close()
    diffs = {
        "as_rendered": np.abs(ref - img).mean(),
        "flipud": np.abs(ref[::-1] - img).mean(),
        "fliplr": np.abs(ref[:, ::-1] - img).mean(),
        "rot180": np.abs(ref[::-1, ::-1] - img).mean(),
    }
    best = min(diffs, key=diffs.get)
    assert best == "fliplr" and diffs["fliplr"] < 0.6 * min(v for k, v in diffs.items() if k != "fliplr"), diffs


_NO_WRITE_CHILD = """
import numpy as np
from reproduction.sim.libero.tasks import resolve_tasks
from reproduction.sim.libero.env import LiberoSim
(task,) = resolve_tasks(["libero_spatial/0"])
with LiberoSim(task, cameras=True, image_size=64, settle_steps=2) as sim:
    sim.reset(0)
    for _ in range(8):
        sim.step(np.array([0.3, 0, 0, 0, 0, 0, 1.0]))
print("ok")
"""


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                st = os.stat(p)
            except OSError:
                continue
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def test_nothing_written_to_site_packages_or_home(tmp_path):
    site = Path(sysconfig.get_paths()["purelib"])
    home, tmp, cache = tmp_path / "home", tmp_path / "tmp", tmp_path / "cache"
    for d in (home, tmp):
        d.mkdir()
    before = _tree(site)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NUMBA_CACHE_DIR", "MPLCONFIGDIR", "MESA_SHADER_CACHE_DIR", "LIBERO_CONFIG_PATH")
    }
    env.update(
        HOME=str(home), TMPDIR=str(tmp), PORTABLE_CACHE_DIR=str(cache), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"
    )
    out = subprocess.run([sys.executable, "-c", _NO_WRITE_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
    after = _tree(site)
    changed = sorted(p for p in after if before.get(p) != after[p])
    assert changed == [], changed[:10]
    assert list(home.iterdir()) == []
    assert not (tmp / "robosuite.log").exists()
    assert "No private macro file found" not in out.stderr
    numba = cache / "libero" / "numba"
    assert any(p.suffix == ".nbi" for p in numba.rglob("*")), "numba's cache was not redirected under the cache dir"


@pytest.mark.parametrize("backend", ["glx"])  # GLX needs an X display: a headless test has none, on any machine
def test_rendering_unavailable_is_one_line_exit_46_and_nothing_written(tmp_path, backend):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "PYOPENGL_PLATFORM")}
    env.update(MUJOCO_GL=backend, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PORTABLE_CACHE_DIR=str(tmp_path / "c"))
    out = tmp_path / "data"
    argv = ["--task", "libero_spatial/0", "--out", str(out), "--sft", "1", "--rollouts", "0", "--eval", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "reproduction.sim.libero.generate", *argv, "--image-size", "32", "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "hint:", "Traceback", "Exception"))]
    assert proc.returncode == 46, proc.stderr[-2000:]
    assert err[0].startswith(f"error: LIBERO cannot render camera images for libero_spatial/0 with MUJOCO_GL={backend}")
    assert err[1].startswith("hint: `portable check` names a headless backend that works here") and len(err) == 2
    assert not out.exists() or not any(out.rglob("*.parquet"))


class _ExpertOnEvenSeeds:
    """The scripted expert on episodes whose seed is even, a do-nothing arm (gripper open) on odd ones: a policy
    whose outcome differs by init state (the protocol seeds episode i with eval.seed + i)."""

    def __init__(self):
        from reproduction.sim.libero.expert import PickPlaceExpert

        self.expert, self.active = PickPlaceExpert(), True

    def bind(self, sim):
        self.expert.bind(sim)

    def reset(self, seed=None):
        self.expert.reset(seed=seed)
        self.active = seed is None or seed % 2 == 0

    def __call__(self, batch):
        if self.active:
            return self.expert(batch)
        return np.tile([0, 0, 0, 0, 0, 0, OPEN], (1, 5, 1))


def _expert_factory(export_dir: str, guidance_scale: float):
    """The eval stage's `libero_factory` seam: a scripted policy instead of the export's model (a picklable
    zero-argument factory, as PolicyFactory is)."""
    return _ExpertOnEvenSeeds


def test_eval_stage_path_evaluates_in_libero_and_writes_evidence_per_init_state(tmp_path, cache_dir):
    """The run's eval stage on `libero_spatial/0`, 2 init states, with a scripted policy behind a LIBERO-shaped
    export (the expert on init state 0, idle on 1): upstream's protocol in a real env, evidence that validates
    against the schema with one outcome per init state, and a comparison of the evidence with itself paired by
    init state."""
    import json

    import jsonschema

    from reproduction.recap.policy.config import EXPORT_FORMAT, EXPORT_META
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.run.comparison import compare_evidence

    run = tmp_path / "run"
    export = run / "policy" / "bc" / "export"
    export.mkdir(parents=True)
    meta = {"format_version": EXPORT_FORMAT, "mode": "bc", "preset": "tiny", "cameras": {}}
    meta["stats"] = {"state_mean": [0.0] * 8, "action_mean": [0.0] * 7}
    (export / EXPORT_META).write_text(json.dumps(meta))
    config = load_config(
        overrides=[
            "eval.tasks=[libero_spatial/0]",
            "eval.episodes_per_task=2",
            "eval.libero.cameras=false",
            "eval.libero.max_steps=130",
            "policy.modes=[bc]",
        ]
    )
    out = evaluate_exports(config, {"bc": (export, 3)}, run / "eval", run, libero_factory=_expert_factory)
    doc = json.loads((run / out.summary["evidence"]).read_text())
    jsonschema.validate(doc, json.loads((REPO / "evidence" / "evaluation.schema.json").read_text()))
    task = doc["tasks"]["libero_spatial/0"]
    assert task["outcomes"] == {"init_states": [0, 1], "success_once": "10", "success_at_end": "10"}
    assert doc["metrics"]["success_at_end"]["display"] == "50.0% (1/2)"
    assert doc["settings"]["libero"]["settle_steps"] == 15 and doc["settings"]["libero"]["max_steps"] == 130
    rows = out.summary["results"]["bc"]["per_init_state"]["libero_spatial/0"]
    assert [(r["init_index"], r["steps"]) for r in rows] == [(0, 130), (1, 130)]
    cmp = compare_evidence(doc, doc)
    assert all(r.note.startswith("paired by init state: 2 episodes") for r in cmp.rows if r.kind == "rate")


def _libero_shaped_dataset(root: Path, *, episodes: int = 2, length: int = 6, size: int = 32) -> Path:
    """A tiny dataset with upstream's LIBERO features (8-dim state, 7-dim action, the two camera keys): enough to
    train a real policy export for a few steps (its actions mean nothing)."""
    from reproduction.data.writer import EpisodeData, write_dataset
    from reproduction.sim.libero.protocol import IMAGE_KEYS

    task = "pick up the black bowl between the plate and the ramekin and place it on the plate"
    rng = np.random.default_rng(0)
    eps = []
    for i in range(episodes):
        frames = {
            "observation.state": rng.normal(size=(length, 8)).astype(np.float32),
            "action": np.clip(rng.normal(size=(length, 7)), -1, 1).astype(np.float32),
            "is_success": np.arange(length) == length - 1,
            **{k: rng.integers(0, 255, (length, size, size, 3), dtype=np.uint8) for k in IMAGE_KEYS},
        }
        eps.append(EpisodeData(episode_index=i, task=task, frames=frames))
    features = {
        "observation.state": {"dtype": "float32", "shape": [8]},
        "action": {"dtype": "float32", "shape": [7]},
        "is_success": {"dtype": "bool", "shape": [1]},
        **{k: {"dtype": "image", "shape": [size, size, 3]} for k in IMAGE_KEYS},
    }
    write_dataset(root, eps, fps=20, features=features, tasks=[task])
    return root


def test_a_trained_export_with_upstreams_cameras_runs_in_libero_through_the_eval_stage(tmp_path):
    """A real policy export (tiny preset, trained 2 steps on LIBERO-shaped data with upstream's two camera keys)
    evaluated by the eval stage's function in LIBERO with rendering on: the export's features pass the check,
    its GuidedPolicy reads the env's 180-degree views and 8-dim state and returns 7-dim chunks, and the
    evidence is written (1 init state, 5 steps: the numbers mean nothing, the path does)."""
    import json

    from reproduction.recap.policy.config import PolicyConfig
    from reproduction.recap.policy.data import PolicySource, open_policy_input
    from reproduction.recap.policy.task import train_policy
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim.libero.protocol import IMAGE_KEYS

    ds = _libero_shaped_dataset(tmp_path / "libero_data")
    inp = open_policy_input(PolicySource(path=str(ds), type="rollout"), need_labels=False)
    from reproduction.train.config import TrainConfig

    train = TrainConfig(max_steps=2, global_batch=4, micro_batch=4, launcher="inprocess", lr=1e-3, save_interval=2)
    cfg = PolicyConfig(cameras={"image": IMAGE_KEYS[0], "wrist": IMAGE_KEYS[1]}, image_size=32)
    run = tmp_path / "run"
    res = train_policy([inp], cfg, run / "policy" / "bc", mode="bc", train=train)
    config = load_config(
        overrides=[
            "eval.tasks=[libero_spatial/0]",
            "eval.episodes_per_task=1",
            "eval.libero.image_size=64",
            "eval.libero.max_steps=5",
            "policy.modes=[bc]",
        ]
    )
    out = evaluate_exports(config, {"bc": (res.export_dir, 2)}, run / "eval", run)
    doc = json.loads((run / out.summary["evidence"]).read_text())
    assert doc["tasks"]["libero_spatial/0"]["outcomes"]["init_states"] == [0]
    assert doc["settings"]["libero"]["cameras"] is True and doc["settings"]["libero"]["image_size"] == 64
    assert out.summary["results"]["bc"]["steps"] == 5
