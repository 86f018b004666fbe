"""audit51 H7: the simulator's rough edges (LIBERO hints for an unknown task, generator flags checked even when
unused, LIBERO's per-lookup [info] print, a LIBERO export evaluated on Fetch tasks). Unit level: no env is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reproduction.errors import ConfigError, SimError

SUITES_TEXT = "libero_spatial, libero_object, libero_goal, libero_10, libero_90"


# -- 1. an unknown task names the LIBERO form, and for a LIBERO-looking id the LIBERO generator ---------------


def test_unknown_task_names_the_libero_form_and_for_a_libero_typo_the_generator():
    from reproduction.sim.tasks import get_task

    with pytest.raises(SimError) as err:
        get_task("libero10/0")
    assert str(err.value) == (
        "unknown simulator task 'libero10/0'; known: FetchPickAndPlace-v4, FetchPush-v4, or a LIBERO task "
        f"<suite>/<index> (suites: {SUITES_TEXT})"
    )
    assert err.value.exit_code == 45
    assert err.value.hint == (
        f"a LIBERO task id is <suite>/<index> with a suite of {SUITES_TEXT} (e.g. libero_10/0); "
        "LIBERO data: python -m reproduction.sim.libero.generate --out DIR --task libero_10/0 (docs/libero.md)"
    )
    with pytest.raises(SimError) as err:  # a Fetch-looking typo keeps the Fetch hint
        get_task("FetchSlide-v1")
    assert err.value.hint == "use one of FetchPickAndPlace-v4, FetchPush-v4, optionally with a physics variant " + (
        "(FetchPush-v4:slippery)"
    )


def test_sim_generate_with_a_libero_suite_typo_is_one_line_exit_45_naming_the_suites(tmp_path, capsys):
    from reproduction.sim.__main__ import main

    out = tmp_path / "out"
    argv = ["generate", "--out", str(out), "--tasks", "libero10/0", "--sft", "1", "--rollouts", "0", "--eval", "0"]
    assert main(argv) == 45
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and f"LIBERO task <suite>/<index> (suites: {SUITES_TEXT})" in err[0]
    assert (
        err[1].startswith("hint: a LIBERO task id is <suite>/<index>") and "reproduction.sim.libero.generate" in err[1]
    )
    assert not out.exists()


# -- 2/3. generator counts and --modes are checked even when no set reads them ---------------------------------


@pytest.fixture
def no_generation(monkeypatch):
    """Any env or dataset the generator would build fails the test (the checks must come first)."""
    from reproduction.sim.libero import _runtime
    from reproduction.sim.libero import generate as gen

    def never(*a, **k):
        raise AssertionError("the generator went past its checks")

    monkeypatch.setattr(_runtime, "check_render_backend", never)
    monkeypatch.setattr(gen, "generate_libero_dataset", never)
    return gen


@pytest.mark.parametrize("modes", ["expert=-1", "expert=nan", "expert=0,drop=0", "expert=inf"])
def test_generator_bad_mode_fractions_are_refused_when_only_sft_runs(tmp_path, capsys, no_generation, modes):
    out = tmp_path / "out"
    argv = ["--out", str(out), "--sft", "1", "--rollouts", "0", "--eval", "0", "--modes", modes, "--no-progress"]
    assert no_generation.main(argv) == 4
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 2
        and err[0].startswith("error: modes {")
        and err[0].endswith("need non-negative fractions with a positive sum")
    )
    assert err[1] == "hint: e.g. --modes expert=0.3,detour=0.2,noise=0.3,drop=0.2"
    assert not out.exists()


def test_generator_api_refuses_negative_counts_and_unread_bad_modes(tmp_path, no_generation):
    with pytest.raises(ConfigError, match=r"^sft -1 must be >= 0 \(0 skips that set\)$"):
        no_generation.generate_libero_data(tmp_path / "a", sft=-1, rollouts=0, eval_rollouts=0)
    with pytest.raises(ConfigError, match=r"^unknown LIBERO generation mode 'foo'$"):
        no_generation.generate_libero_data(tmp_path / "b", sft=1, rollouts=0, eval_rollouts=0, modes={"foo": 1.0})
    with pytest.raises(ConfigError, match=r"need non-negative fractions"):
        no_generation.generate_libero_data(tmp_path / "c", sft=1, rollouts=0, eval_rollouts=0, modes={"expert": -1})


def test_generator_cli_negative_count_names_the_flag(tmp_path, capsys, no_generation):
    argv = ["--out", str(tmp_path / "o"), "--sft", "-1", "--rollouts", "0", "--eval", "0"]
    assert no_generation.main(argv) == 4
    assert capsys.readouterr().err.splitlines() == [
        "error: --sft -1 must be >= 0 (0 skips that set)",
        "hint: set --sft 0 or more",
    ]


# -- 4. LIBERO's "[info] Applying task order" line is not printed per lookup ----------------------------------


class _Suite:
    lines: tuple[str, ...] = ()
    fail = False

    def __init__(self):
        for line in self.lines:
            print(line)  # as LIBERO's Benchmark._make_benchmark does, on stdout
        if self.fail:
            raise RuntimeError("broken suite")


def _fake_libero(suite_cls) -> dict:
    class Benchmark:
        @staticmethod
        def get_benchmark_dict():
            return {"libero_10": suite_cls}

    return {"benchmark": Benchmark}


def test_make_suite_drops_liberos_info_lines_and_keeps_stdout_clean(capsys):
    from reproduction.sim.libero.tasks import make_suite

    class Suite(_Suite):
        lines = ("[info] Applying task order index 0 (permutation: [0, 1, 2]) for benchmark 'libero_10' (10 tasks).",)

    for _ in range(3):
        assert isinstance(make_suite(_fake_libero(Suite), "libero_10"), Suite)
    assert capsys.readouterr() == ("", "")


def test_make_suite_forwards_liberos_other_lines_to_stderr_even_when_it_raises(capsys):
    from reproduction.sim.libero.tasks import make_suite

    class Suite(_Suite):
        lines = ("[info] Using default task order for benchmark 'libero_10' (10 tasks).", "[warning] odd suite")

    make_suite(_fake_libero(Suite), "libero_10")
    assert capsys.readouterr() == ("", "[warning] odd suite\n")

    class Broken(Suite):
        fail = True

    with pytest.raises(RuntimeError, match="broken suite"):
        make_suite(_fake_libero(Broken), "libero_10")
    assert capsys.readouterr() == ("", "[warning] odd suite\n")


# -- 5. a LIBERO export evaluated on Fetch tasks: the message says so first -----------------------------------


def _export(folder: Path, *, state: int, action: int, cameras: dict, **extra) -> Path:
    from reproduction.recap.policy.config import EXPORT_FORMAT, EXPORT_META

    folder.mkdir(parents=True)
    meta = {
        "format_version": EXPORT_FORMAT,
        "mode": "recap",
        "preset": "tiny",
        "cameras": cameras,
        "stats": {"state_mean": [0.0] * state, "action_mean": [0.0] * action},
        **extra,
    }
    (folder / EXPORT_META).write_text(json.dumps(meta))
    return folder


LIBERO_CAMERAS = {"base_0_rgb": "observation.images.image", "left_wrist_0_rgb": "observation.images.wrist_image"}
TASK = "put both the alphabet soup and the tomato sauce in the basket"


@pytest.mark.parametrize(
    "cameras, extra, signs",
    [
        (
            LIBERO_CAMERAS,
            {},
            "7-dim action (Fetch takes 4); LIBERO's cameras observation.images.image, observation.images.wrist_image",
        ),
        (
            {},
            {"state_keys": ["observation.state", "observation.object_state"]},
            "7-dim action (Fetch takes 4); LIBERO's observation.object_state",
        ),
    ],
)
def test_a_libero_export_on_fetch_tasks_says_it_was_trained_for_libero(tmp_path, monkeypatch, cameras, extra, signs):
    from reproduction.recipes.recap.config import load_config
    from reproduction.recipes.recap.policy import evaluate_exports
    from reproduction.sim import evaluate as fetch_eval

    def never(*a, **k):
        raise AssertionError("a Fetch evaluation started")

    monkeypatch.setattr(fetch_eval, "evaluate_many", never)
    export = _export(tmp_path / "export", state=8, action=7, cameras=cameras, tasks=[TASK], **extra)
    cfg = load_config(overrides=["eval.tasks=[FetchPush-v4]", "eval.episodes_per_task=2", "policy.modes=[recap]"])
    with pytest.raises(ConfigError) as err:
        evaluate_exports(cfg, {"recap": (export, 2)}, tmp_path / "eval", tmp_path, evaluate_libero=never)
    assert str(err.value) == (
        f"the recap policy export {export} was trained for LIBERO on {TASK!r} ({signs}), but eval.tasks names "
        "Fetch tasks (FetchPush-v4)"
    )
    assert err.value.exit_code == 4 and err.value.field == "eval.tasks"
    assert err.value.hint.startswith("evaluate it on the LIBERO task it was trained on (e.g. eval.tasks=[libero_10/0]")
    assert not (tmp_path / "evidence").exists()


def test_a_fetch_export_passes_the_fetch_check():
    from reproduction.sim.evaluate import check_export_for_fetch

    meta = {"stats": {"state_mean": [0.0] * 14, "action_mean": [0.0] * 4}, "cameras": {"c": "observation.images.wrist"}}
    assert check_export_for_fetch(meta, name="x", tasks=["FetchPush-v4"]) is None
