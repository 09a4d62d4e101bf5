"""The front door: the README's two commands are what CI runs, and the demo fails when a step
ends otherwise than it should."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pytest_fusion.demo import run

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The command lines of the README's "Two commands" block, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^## Two commands\n.*?^```\n(.*?)^```", text, flags=re.M | re.S)
    assert block, "README.md has no '## Two commands' section with a code block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_commands_are_the_ones_ci_runs_in_their_order():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = readme_commands()
    assert "python3 -m pytest_fusion demo" in commands and "python3 -m pytest -n auto" in commands
    positions = [ci.index(c) if c in ci else -1 for c in commands]
    assert -1 not in positions, [c for c, p in zip(commands, positions, strict=True) if p < 0]
    assert positions == sorted(positions), "the README's commands run in another order in .ci/run"


def test_a_step_that_ends_otherwise_than_expected_fails_the_demo(tmp_path, monkeypatch, capsys):
    # a passing selection that the step expects to fail: the demo must not call that a success
    wrong = run.Step("planted bug that is not there", ("-q", "-p", "no:cacheprovider", "-k",
                     "test_fused_linear_gelu and not bench- and float32", "--fusion-examples", "2"),
                     expect=run.PYTEST_FAILED)
    monkeypatch.setattr(run, "steps", lambda baselines: [wrong])
    assert run.main(["--keep", str(tmp_path / "demo")]) == 1
    out = capsys.readouterr()
    assert "UNEXPECTED: pytest exited 0, expected 1" in out.out
    assert "a step did not end as expected" in out.err
    assert (tmp_path / "demo" / "test_demo.py").exists()


def test_the_planted_bug_step_shows_its_failure_from_the_header_line(tmp_path, monkeypatch, capsys):
    # the excerpt a new user reads must say what failed (the test, the failure's kind and headline)
    # before the case and its repro, not start halfway down the message
    (bug,) = [s for s in run.steps(tmp_path / "baselines") if s.title.startswith("2.")]
    monkeypatch.setattr(run, "steps", lambda baselines: [bug])
    assert run.main(["--keep", str(tmp_path / "demo")]) == 0
    lines = capsys.readouterr().out.splitlines()
    command = next(i for i, line in enumerate(lines) if line.startswith("$ python3 -m pytest "))
    banner, header, dims = lines[command + 1:command + 4]
    assert re.fullmatch(r"_+ test_planted_bug_strided_blind_linear\[float32\] _+", banner), lines
    assert re.fullmatch(r"\[pytest-fusion\] mismatch: \d+ of \d+ elements of the output outside the error "
                        r"budget \(call 1 of 2\)", header), lines
    assert dims.split()[0] == "dims", lines
    assert any("--fusion-repro=" in line for line in lines[command:]), lines


def test_an_excerpt_starts_at_the_failure_however_long_its_message():
    failure = ["_" * 10 + " test_k[bench-small-float32] " + "_" * 10,
               "test_k.py::test_k [small-float32] failed the performance gate:",
               *[f"  speedup over provider{i} ..." for i in range(40)]]
    lines = ["..FF   [100%]", "=" * 10 + " FAILURES " + "=" * 10, *failure, "2 failed in 1s"]
    assert run.excerpt(lines, run.GATE_HEADER) == [*failure, "2 failed in 1s"]
    assert run.excerpt(lines, "") == lines
    assert run.excerpt(lines, "no such line") == lines  # an unexpected run is shown whole


def test_the_demo_steps_expect_the_planted_faults_to_fail():
    steps = run.steps(Path("baselines"))
    expected = {s.title.split(".")[0]: s.expect for s in steps}
    assert expected == {"1": 0, "2": run.PYTEST_FAILED, "3": 0, "4": run.PYTEST_FAILED}
    slower = [s for s in steps if dict(s.env).get("PYTEST_FUSION_DEMO_SLOWER") == "1"]
    assert [s.title[0] for s in slower] == ["4"]


def test_the_readme_options_table_names_every_option():
    from pytest_fusion.plugin.config import OPTIONS

    readme = (ROOT / "README.md").read_text()
    missing = [f"--fusion-{o.flag}" for o in OPTIONS if f"--fusion-{o.flag}" not in readme]
    assert not missing, f"options missing from README.md's options table: {missing}"


def test_the_docs_show_repro_lines_as_a_failure_prints_them():
    # a pasted `pytest ...` line may run another environment's pytest; the plugin prints python3 -m pytest
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    shown = [(p.name, line.strip()) for p in docs for line in p.read_text().splitlines()
             if re.search(r"pytest \S+ --fusion-repro='", line)]
    assert shown, "no repro line in README.md or docs/"
    bare = [(name, line) for name, line in shown if not re.search(r"python3 -m pytest \S+ --fusion-repro='", line)]
    assert not bare, bare


def test_the_readme_and_help_say_how_many_rounds_a_re_measure_takes():
    # a re-measure takes REMEASURE_FACTOR x rounds, time floor and cap: past --fusion-max-rounds,
    # which a user reading only the options table could not tell
    from pytest_fusion.gate.rule import REMEASURE_FACTOR
    from pytest_fusion.measure.timing import DEFAULT_MAX_ROUNDS
    from pytest_fusion.plugin.config import OPTIONS

    (row,) = [line for line in (ROOT / "README.md").read_text().splitlines()
              if line.startswith("| `--fusion-max-rounds N` |")]
    rule = f"{REMEASURE_FACTOR}x each of `--fusion-rounds`, `--fusion-min-time` and this cap"
    assert rule in row and f"up to {REMEASURE_FACTOR * DEFAULT_MAX_ROUNDS} rounds by default" in row, row
    (option,) = [o for o in OPTIONS if o.flag == "max-rounds"]
    assert rule.replace("`", "") in option.help, option.help


def test_each_steps_shown_command_is_the_one_it_runs_and_pastes_as_is(tmp_path):
    steps = run.steps(tmp_path / "baselines")
    for step in steps:
        words = shlex.split(run.shown_command(step))
        env = [w for w in words[:len(step.env)] if "=" in w]
        assert env == [f"{k}={v}" for k, v in step.env], words
        assert words[len(env):] == ["python3", "-m", "pytest", *step.args, run.DEMO_FILE.name], words
    assert any(" and " in arg for step in steps for arg in step.args)  # a -k expression that needs quoting


def test_a_temporary_demo_directory_says_how_to_keep_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run, "steps", lambda baselines: [])
    assert run.main([]) == 0
    assert "removed at the end; --keep DIR" in capsys.readouterr().out
    assert run.main(["--keep", str(tmp_path / "kept")]) == 0
    assert "removed at the end" not in capsys.readouterr().out
