"""LIBERO in `portable run` without LIBERO installed: eval.tasks parsing, routing to the protocol, evidence per init
state, pairing in a comparison, the preflight's not-installed error, the feature mismatch, the progress bar and
`portable check`'s render row (issue 22, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reproduction.errors import ConfigError, MissingDependencyError, PortableError, SimError
from reproduction.recipes.recap.config import EvalSection, load_config

REPO = Path(__file__).resolve().parent.parent


# -- eval.tasks at config load --------------------------------------------------------------------


def test_libero_ids_accepted_at_config_load():
    ev = EvalSection(
        tasks=["libero_10/0", "libero_spatial/*", "libero_goal/open_the_middle_drawer"], episodes_per_task=50
    )
    assert ev.libero.chunk == 5 and ev.libero.cameras and ev.libero.max_steps is None
    cfg = load_config(
        [REPO / "bundle" / "libero10" / "config.yaml"], ["eval.libero.max_steps=20"], bundle=Path("/srv/bundle")
    )
    assert cfg.eval.tasks == ["libero_10/0"] and cfg.eval.episodes_per_task == 50 and cfg.eval.libero.max_steps == 20


@pytest.mark.parametrize(
    ("tasks", "episodes", "field", "words"),
    [
        (["libero_99/0"], 2, "eval.tasks", "unknown LIBERO suite 'libero_99'"),
        (["libero_10/10"], 2, "eval.tasks", "task index 10 out of range in 'libero_10/10': libero_10 has tasks 0..9"),
        (["libero_10"], 2, "eval.tasks", "is not <suite>/<task>"),
        (["libero_10/0"], 51, "eval.episodes_per_task", "past LIBERO's 50 init states per task"),
        (["libero_10/0", "FetchPush-v4"], 2, "eval.tasks", "mixes LIBERO tasks (libero_10/0) with others"),
    ],
)
def test_bad_libero_ids_one_line_errors(tasks, episodes, field, words):
    with pytest.raises(ConfigError) as err:
        EvalSection(tasks=tasks, episodes_per_task=episodes)
    assert words in err.value.message and err.value.field == field and "\n" not in err.value.message
    assert err.value.exit_code == 4 and err.value.hint


def test_bad_libero_settings_refused():
    with pytest.raises(ConfigError, match=r"eval.libero.chunk=0 must be >= 1"):
        load_config(overrides=["eval.tasks=[libero_10/0]", "eval.libero.chunk=0"])
    with pytest.raises(ConfigError, match=r"eval.videos=2: LIBERO evaluation does not record videos"):
        load_config(overrides=["eval.tasks=[libero_10/0]", "eval.videos=2"])
    with pytest.raises(ConfigError, match=r"unknown simulator task 'Fetch'") as err:
        EvalSection(tasks=["Fetch"])
    assert "libero_10/0" in err.value.hint  # a Fetch typo's hint names LIBERO ids too
    # sequential looks split Fetch's seeded batches; LIBERO runs init states per policy: refused, named
    with pytest.raises(
        ConfigError, match=r"not supported for LIBERO tasks yet \(eval.tasks names libero_10/0\)"
    ) as err:
        load_config(overrides=["eval.tasks=[libero_10/0]", "eval.sequential.enabled=true", "eval.reference=r.json"])
    assert err.value.field == "eval.sequential.enabled"


# -- routing, evidence, comparison ------------------------------------------------------------------


def _export(folder: Path, *, state: int = 8, action: int = 7, cameras: dict | None = None, mode: str = "bc") -> Path:
    from reproduction.recap.policy.config import EXPORT_FORMAT, EXPORT_META

    folder.mkdir(parents=True)
    meta = {
        "format_version": EXPORT_FORMAT,
        "mode": mode,
        "preset": "tiny",
        "cameras": cameras or {},
        "stats": {"state_mean": [0.0] * state, "action_mean": [0.0] * action},
    }
    (folder / EXPORT_META).write_text(json.dumps(meta))
    return folder


def _result(task_ids: list[str], outcomes: dict[str, str], steps: int = 20):
    from reproduction.sim.libero.protocol import EpisodeOutcome, LiberoEvalResult

    episodes = [
        EpisodeOutcome(
            task_id=t,
            init_index=i,
            success_once=ch != "0",
            success_at_end=ch == "1",
            steps=steps,
            first_success_step=5 if ch != "0" else None,
        )
        for t in task_ids
        for i, ch in enumerate(outcomes[t])
    ]
    return LiberoEvalResult(episodes=episodes, chunk=5, settle_steps=15, cameras=False, seconds=1.0, steps=0)


class _FakeProtocol:
    """evaluate_libero's signature; answers per policy label (by call order) and records each call."""

    def __init__(self, answers: list[dict[str, str]]):
        self.answers, self.calls = list(answers), []

    def __call__(self, task_ids, episodes_per_task, policy, **kw):
        self.calls.append({"task_ids": task_ids, "episodes": episodes_per_task, "policy": policy, **kw})
        return _result(task_ids, self.answers.pop(0))


def _config(*extra: str):
    return load_config(
        overrides=[
            "eval.tasks=[libero_10/0,libero_spatial/3]",
            "eval.episodes_per_task=4",
            "eval.libero.cameras=false",
            "eval.libero.max_steps=30",
            "policy.modes=[recap,bc]",
            "eval.guidance_scales=[1.0,2.0]",
            *extra,
        ]
    )


def test_libero_ids_route_to_the_protocol_and_evidence_has_init_states(tmp_path):
    import jsonschema

    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim.libero.protocol import LazyPolicy

    run = tmp_path / "run"
    exports = {m: (_export(run / "policy" / m / "export", mode=m), 7) for m in ("recap", "bc")}
    fake = _FakeProtocol(
        [
            {"libero_10/0": "1x01", "libero_spatial/3": "1100"},  # recap w=1 (x: succeeded once, not at the end)
            {"libero_10/0": "1111", "libero_spatial/3": "1101"},  # recap w=2
            {"libero_10/0": "0001", "libero_spatial/3": "0000"},  # bc
        ]
    )
    out = evaluate_exports(_config(), exports, run / "eval", run, evaluate_libero=fake)
    assert len(fake.calls) == 3
    call = fake.calls[0]
    assert call["task_ids"] == ["libero_10/0", "libero_spatial/3"] and call["episodes"] == 4
    assert (call["chunk"], call["cameras"], call["max_steps"], call["workers"], call["seed"]) == (5, False, 30, 1, 1000)
    assert isinstance(call["policy"], LazyPolicy) and call["policy"]._policy is None  # nothing built here
    assert call["policy"].factory.guidance_scale == 1.0 and fake.calls[1]["policy"].factory.guidance_scale == 2.0

    doc = json.loads((run / out.summary["evidence"]).read_text())
    jsonschema.validate(doc, json.loads((REPO / "evidence" / "evaluation.schema.json").read_text()))
    assert doc["policy"]["label"] == "recap w=2" and [b["policy"]["label"] for b in doc["baselines"]] == [
        "recap w=1",
        "bc",
    ]
    task = doc["tasks"]["libero_10/0"]
    assert task["outcomes"] == {"init_states": [0, 1, 2, 3], "success_once": "1111", "success_at_end": "1111"}
    w1 = doc["baselines"][0]["tasks"]["libero_10/0"]
    assert w1["outcomes"] == {"init_states": [0, 1, 2, 3], "success_once": "1101", "success_at_end": "1001"}
    assert w1["success_once"]["display"] == "75.0% (3/4)" and w1["success_at_end"]["display"] == "50.0% (2/4)"
    assert doc["metrics"]["success_at_end"]["display"] == "87.5% (7/8)"
    lib = doc["settings"]["libero"]
    assert doc["settings"]["simulator"] == "libero" and lib["cameras"] is False and lib["max_steps"] == 30
    assert (
        lib["observation"].startswith("no images") and "privileged object state" in lib["observation"]
    )  # a camera-free evaluation says so
    per_init = out.summary["results"]["bc"]["per_init_state"]["libero_10/0"]
    assert [(r["init_index"], r["success_at_end"]) for r in per_init] == [(0, False), (1, False), (2, False), (3, True)]


def test_comparison_pairs_libero_evidence_by_init_state(tmp_path):
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.run.comparison import compare_evidence

    docs = []
    for k, seed in enumerate((1000, 2000)):  # another eval seed does not change LIBERO's fixed init states
        run = tmp_path / f"run{k}"
        exports = {"bc": (_export(run / "policy" / "bc" / "export"), 7)}
        fake = _FakeProtocol([{"libero_10/0": "1101", "libero_spatial/3": "0110"}])
        out = evaluate_exports(
            _config("policy.modes=[bc]", f"eval.seed={seed}"), exports, run / "eval", run, evaluate_libero=fake
        )
        docs.append(json.loads((run / out.summary["evidence"]).read_text()))
    cmp = compare_evidence(docs[1], docs[0])
    rows = [r for r in cmp.rows if r.kind == "rate"]
    assert rows and all(r.method == "tango-paired" for r in rows)
    assert all(r.note.startswith("paired by init state: ") for r in rows)
    assert not any("different initial states" in n for n in cmp.notes)


def test_fetch_policy_on_libero_is_a_named_feature_mismatch_before_any_env(tmp_path):
    from reproduction.recipes.recap.policy import evaluate_exports

    run = tmp_path / "run"
    exports = {
        "recap": (_export(run / "policy" / "recap" / "export", mode="recap"), 7),
        "bc": (_export(run / "policy" / "bc" / "export", state=13, action=4), 7),  # Fetch: state + goal, 4-dim
    }
    fake = _FakeProtocol([])
    with pytest.raises(SimError) as err:
        evaluate_exports(_config(), exports, run / "eval", run, evaluate_libero=fake)
    msg = err.value.message
    assert msg.startswith("feature mismatch: the bc policy") and "\n" not in msg and err.value.exit_code == 45
    assert "state 13 values (LIBERO gives 8)" in msg and "action 4 dims (LIBERO takes 7)" in msg
    assert fake.calls == []  # refused before the first (even the matching) policy ran


def test_camera_policy_needs_libero_cameras():
    from reproduction.sim.libero.protocol import IMAGE_KEYS, check_policy_features

    check_policy_features(state_dim=8, action_dim=7, image_keys=list(IMAGE_KEYS), cameras=True)
    with pytest.raises(SimError, match="cameras observation.images.image .*eval.libero.cameras is false"):
        check_policy_features(state_dim=8, action_dim=7, image_keys=[IMAGE_KEYS[0]], cameras=False)
    with pytest.raises(SimError, match="cameras observation.images.top"):
        check_policy_features(state_dim=8, action_dim=7, image_keys=["observation.images.top"])


# -- preflight: LIBERO not installed --------------------------------------------------------------


def test_preflight_names_the_extra_when_libero_is_missing(monkeypatch):
    import reproduction.sim.libero as libero_pkg
    from reproduction.recipes.recap.recipe import libero_problems
    from reproduction.run.preflight import raise_problems

    monkeypatch.setattr(libero_pkg, "available", lambda: False)
    assert libero_problems(["FetchPush-v4"]) == []
    (problem,) = libero_problems(["libero_10/0"])
    assert isinstance(problem, MissingDependencyError) and problem.exit_code == 10
    assert "LIBERO is not installed" in problem.message and "[libero]" in problem.hint
    with pytest.raises(MissingDependencyError) as err:
        raise_problems([problem])
    assert "\n" not in err.value.message


def test_run_preflight_refuses_before_any_stage(tmp_path, monkeypatch):
    """The run's preflight (before any stage trains) carries the not-installed error when eval is selected."""
    import reproduction.sim.libero as libero_pkg
    from reproduction.recipes.recap.recipe import preflight

    monkeypatch.setattr(libero_pkg, "available", lambda: False)
    cfg = load_config(overrides=["eval.tasks=[libero_10/0]"], run_dir=tmp_path / "run")
    problems = preflight(cfg, tmp_path / "run", {}, ["returns", "value", "advantages", "policy", "eval"])
    assert any(isinstance(p, MissingDependencyError) for p in problems)
    problems = preflight(cfg, tmp_path / "run", {}, ["returns"])
    assert not any(isinstance(p, MissingDependencyError) for p in problems)


# -- the protocol's progress bar and policy hooks, with a fake env ---------------------------------


class _FakeSim:
    """LiberoSim's surface: success after `succeed_at` steps from odd init states."""

    def __init__(self, task, **kw):
        self.task, self.kw, self.t, self.init = task, kw, 0, 0

    def reset(self, init_index, seed=None):
        self.t, self.init = 0, init_index
        return {"observation.state": [0.0] * 8, "task": self.task.language}

    def step(self, action):
        self.t += 1
        return {"observation.state": [0.0] * 8, "task": self.task.language}, self.init % 2 == 1 and self.t >= 3

    def close(self):
        pass


class _SeedlessPolicy:
    """An export's GuidedPolicy has reset() without a seed: the protocol must still call it."""

    resets = 0

    def reset(self):
        _SeedlessPolicy.resets += 1

    def __call__(self, batch):
        import numpy as np

        return np.zeros((1, 5, 7))


def test_progress_bar_moves_per_episode_with_rate_and_eta(monkeypatch, recorded_progress):
    from reproduction.sim.libero import protocol
    from reproduction.sim.libero.tasks import LiberoTask

    task = LiberoTask("libero_10", 0, "t0", "put both", "/x.bddl", 50, 520)
    monkeypatch.setattr(protocol, "resolve_tasks", lambda ids, cache_dir=None: [task])
    seen = recorded_progress(protocol)
    _SeedlessPolicy.resets = 0
    res = protocol.evaluate_libero(
        ["libero_10/0"], 3, protocol.LazyPolicy(_SeedlessPolicy), max_steps=6, make_sim=_FakeSim
    )
    assert _SeedlessPolicy.resets == 3
    assert [r["success_once"] for r in res.per_init_state()["libero_10/0"]] == [False, True, False]
    assert seen[0] == ("task", "evaluate LIBERO", 3)
    assert [s for s in seen if s[0] == "advance"] == [("advance", 1)] * 3
    shows = [s[1] for s in seen if s[0] == "show"]
    assert all(set(s) == {"rate", "eta"} for s in shows) and shows[-1]["rate"].endswith(" steps/s")
    assert shows[-1]["eta"] == "00:00:00"


def test_lazy_policy_pickles_without_its_built_policy():
    import pickle

    from reproduction.sim.libero.protocol import LazyPolicy

    lazy = LazyPolicy(_SeedlessPolicy)
    lazy.reset(seed=3)
    assert lazy._policy is not None
    assert pickle.loads(pickle.dumps(lazy))._policy is None


# -- portable check: the render row ---------------------------------------------------------------


def _render_row(tmp_path, answers: dict[str, dict], env: dict | None = None):
    from reproduction.checks.render import probe_libero_render
    from tests.fixtures.checks.fakes import FakeRun, make_context, out

    def answer(argv, env):
        return out(answers[env["MUJOCO_GL"]])

    ctx = make_context(tmp_path, run=FakeRun({"probe:libero render": answer}))
    ctx.env = dict(env or {})
    return probe_libero_render(ctx)


def test_check_reports_libero_render_backend(tmp_path):
    row = _render_row(tmp_path, {"egl": {"installed": False}})
    assert row.status == "skip" and "libero extra" in row.finding
    row = _render_row(tmp_path, {"egl": {"installed": True, "ok": True}})
    assert row.status == "ok" and row.finding == "LIBERO renders headless with EGL" and row.details["backend"] == "egl"
    row = _render_row(
        tmp_path,
        {"egl": {"installed": True, "ok": False, "error": "no EGL device"}, "osmesa": {"installed": True, "ok": True}},
    )
    assert row.status == "warn" and "OSMesa only (EGL failed: no EGL device)" in row.finding
    assert "MUJOCO_GL=osmesa" in row.fix
    row = _render_row(tmp_path, {"osmesa": {"installed": True, "ok": True}}, env={"MUJOCO_GL": "osmesa"})
    assert row.status == "ok" and "OSMesa (MUJOCO_GL=osmesa)" in row.finding
    osmesa_missing = {"installed": True, "ok": False, "error": "AttributeError: no OSMesa"}
    row = _render_row(
        tmp_path, {"osmesa": osmesa_missing, "egl": {"installed": True, "ok": True}}, {"MUJOCO_GL": "osmesa"}
    )
    assert row.status == "warn" and row.finding.startswith("MUJOCO_GL=osmesa does not render (AttributeError")
    assert row.finding.endswith("; EGL does") and "export MUJOCO_GL=egl" in row.fix
    bad = {"installed": True, "ok": False, "error": "x"}
    row = _render_row(tmp_path, {"egl": bad, "osmesa": bad})
    assert row.status == "warn" and "cannot render headless" in row.finding and "libosmesa6" in row.fix


def test_error_types_are_portable_errors():
    assert issubclass(SimError, PortableError) and issubclass(ConfigError, PortableError)


def test_fetch_ids_still_go_to_the_fetch_simulator(tmp_path, monkeypatch):
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim import evaluate as fetch_eval

    def fake_many(jobs, ui=None, killed_hint=None):
        out = []
        for job in jobs:
            eps = [
                {"episode": i, "reset_seed": 101 + 2 * i, "success_once": True, "success_at_end": i == 0}
                | {"first_success_step": 9, "detours": 0, "stalls": 0, "drops": 0}
                for i in range(2)
            ]
            task = fetch_eval.TaskResult(
                task="FetchPush-v4", episodes=2, success_once=2, success_at_end=1, episode_metrics=eps
            )
            out.append(
                fetch_eval.EvalResult(
                    config=job.config, tasks={"FetchPush-v4": task}, reset_seeds={}, videos=[], seconds=1.0
                )
            )
        return out

    monkeypatch.setattr(fetch_eval, "evaluate_many", fake_many)
    run = tmp_path / "run"
    exports = {"bc": (_export(run / "policy" / "bc" / "export", state=14, action=4), 7)}  # Fetch: 11 + goal 3
    cfg = load_config(overrides=["eval.tasks=[FetchPush-v4]", "eval.episodes_per_task=2", "policy.modes=[bc]"])
    never = _FakeProtocol([])
    out = evaluate_exports(cfg, exports, run / "eval", run, evaluate_libero=never)
    doc = json.loads((run / out.summary["evidence"]).read_text())
    assert never.calls == [] and "simulator" not in doc["settings"]
    assert doc["tasks"]["FetchPush-v4"]["outcomes"] == {
        "reset_seeds": [101, 103],
        "success_once": "11",
        "success_at_end": "10",
    }
