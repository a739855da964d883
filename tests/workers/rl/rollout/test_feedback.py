"""repair_outcome and repair/fixed_after_feedback on planted trajectories: what counts as a test run, an edit and a
fix, read from the tool results alone."""

from tests.support.repair import FAILING, FIX, bash, editor, planted, run_tests, submit
from workers.rl.rollout.feedback import (
    FIXED_AFTER_FEEDBACK,
    fix_chain,
    pytest_passed,
    repair,
    repair_events,
    repair_outcome,
    repair_points,
)
from workers.rl.rollout.metrics import RunCounters, step_points
from workers.rl.training.tracking import MemoryTracker
from workers.rl.types import ToolResult


def test_a_failing_run_an_edit_and_a_passing_run_is_fixed_by_feedback():
    trajectory = planted(run_tests(1), editor("view"), editor("str_replace", diff=FIX), run_tests(0), submit())
    found = repair(trajectory.turns, trajectory.reward)
    assert found.outcome == "fixed_by_feedback"
    failing, edit, passing = found.chain
    # Turn indices: system, user, then (assistant, tool) per call; the chain is the tool turns.
    assert (failing.turn, edit.turn, passing.turn) == (3, 7, 9)
    assert failing.output == FAILING and edit.diff == FIX and passing.passed is True
    # The view is no edit: three events, not four.
    assert [event.kind for event in found.events] == ["test", "edit", "test"]


def test_solved_without_a_failing_run_first_is_guessed():
    assert repair_outcome(planted(editor("str_replace", diff=FIX), run_tests(0), submit())) == "guessed"
    assert repair_outcome(planted(editor("str_replace", diff=FIX), submit())) == "guessed"  # an edit, no run
    # A run that failed and nothing edited after it: the passing run is not the edit's doing.
    assert repair_outcome(planted(editor("str_replace", diff=FIX), run_tests(1), run_tests(0))) == "guessed"


def test_an_edit_after_a_failure_without_a_later_passing_run_is_guessed_when_solved():
    assert repair_outcome(planted(run_tests(1), editor("str_replace", diff=FIX), submit())) == "guessed"
    # The passing run came before the edit.
    assert repair_outcome(planted(run_tests(1), run_tests(0), editor("str_replace", diff=FIX))) == "guessed"


def test_a_passing_run_before_any_failure_is_no_feedback():
    trajectory = planted(run_tests(0), editor("str_replace", diff=FIX), run_tests(0), submit())
    assert repair_outcome(trajectory) == "guessed" and repair(trajectory.turns, trajectory.reward).chain is None


def test_unsolved_is_gave_up_and_no_tools_is_no_repair_trajectory():
    assert repair_outcome(planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(1), submit(),
                                  reward=0.0)) == "gave_up"
    assert repair_outcome(planted(run_tests(1), reward=0.5)) == "gave_up"  # partial credit is not solved
    # Even a textbook loop that the hidden tests fail gave up.
    assert repair_outcome(planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(0), reward=0.0)) == \
        "gave_up"
    assert repair_outcome(planted(submit())) is None
    assert repair_outcome(planted(editor("view"), submit())) is None
    assert repair_outcome(planted(reward=1.0, said="def add(a, b): return a + b")) is None
    # Not graded (the verifier's sandbox failed): nothing to classify yet.
    assert repair_outcome(planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(0), reward=None)) is None


def test_edits_are_successful_editor_writes_or_a_changed_workspace():
    # A failed str_replace edits nothing; undo_edit, insert and create do.
    assert repair_outcome(planted(run_tests(1), editor("str_replace", exit_code=1), run_tests(0))) == "guessed"
    for command in ("undo_edit", "insert", "create"):
        assert repair_outcome(planted(run_tests(1), editor(command), run_tests(0))) == "fixed_by_feedback"
    # bash's sed changed the workspace's diff: an edit.
    sed = bash("sed -i 's/a - b/a + b/' solution.py", "", diff=FIX)
    assert repair_outcome(planted(run_tests(1), sed, run_tests(0))) == "fixed_by_feedback"
    # A diff recorded again unchanged (the first call records the base's "", submit records its own) is no edit.
    unchanged = bash("ls", "solution.py", diff="")
    assert repair_outcome(planted(run_tests(1), unchanged, run_tests(0), bash("cat solution.py", "", diff=""))) \
        == "guessed"
    assert repair_outcome(planted(editor("str_replace", diff=FIX), run_tests(1), bash("ls", "", diff=FIX),
                                  run_tests(0))) == "guessed"


def test_bash_pytest_is_read_from_its_summary_line():
    failing = "F..\n=================== 1 failed, 2 passed in 0.05s ===================\n"
    passing = "...\n3 passed in 0.02s\n"
    loop = (bash("python -m pytest -q 2>&1 | tail -5", failing), editor("str_replace", diff=FIX),
            bash("pytest test_solution.py", passing))
    assert repair_outcome(planted(*loop)) == "fixed_by_feedback"
    assert repair_outcome(planted(bash("py.test -x", "E   assert -1 == 3\n1 failed in 0.1s"),
                                  editor("str_replace", diff=FIX), bash("cd . && pytest", passing))) == \
        "fixed_by_feedback"
    # The exit code of a piped run is tail's: the summary line decides.
    piped = bash("pytest | tail -3", failing, exit_code=0)
    assert repair_outcome(planted(piped, editor("str_replace", diff=FIX), run_tests(0))) == "fixed_by_feedback"
    # A collection error fails the run; "no tests ran" and a command that is not pytest are no test run.
    assert pytest_passed("ERROR collecting test_solution.py\n!!! Interrupted: 1 error during collection !!!\n"
                         "=============== 1 error in 0.12s ===============") is False
    assert pytest_passed("== 2 passed, 1 error in 0.3s ==") is False
    assert pytest_passed("== 4 passed, 1 skipped, 2 warnings in 65.01s (0:01:05) ==") is True
    assert pytest_passed("no tests ran in 0.01s") is None and pytest_passed("exit code 0\n") is None
    assert repair_outcome(planted(bash("python solution.py", "1 failed, 2 passed in 0.05s"),
                                  editor("str_replace", diff=FIX), run_tests(0))) == "guessed"


def test_only_tool_results_count_never_the_models_own_text():
    # The model says it ran the tests and saw them fail, then pass; it ran nothing.
    said = "I ran pytest: 1 failed, 2 passed in 0.05s. After my fix: 3 passed in 0.01s."
    trajectory = planted(editor("str_replace", diff=FIX), submit(), said=said)
    assert repair_outcome(trajectory) == "guessed"
    # A tool call's arguments are the model's too: a str_replace whose new text reads like pytest's summary, or a
    # bash command naming pytest whose output (what actually ran) has no summary line.
    writes_summary = editor("str_replace", diff=FIX)
    writes_summary[1]["new_str"] = "3 passed in 0.01s"
    echo = bash("echo pytest", "pytest")
    assert repair_outcome(planted(run_tests(1), writes_summary, echo, submit())) == "guessed"
    # A result whose tool the policy names is read as that tool's: run_tests's exit code, not its text.
    lying = ("run_tests", {}, ToolResult(status="error", text="", exit_code=1), "3 passed in 0.01s")
    assert repair_outcome(planted(lying, editor("str_replace", diff=FIX), lying)) == "guessed"


def test_the_chain_is_the_failure_the_fix_answered():
    second_diff = FIX + "+# second try\n"
    events = repair_events(planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(1),
                                   editor("str_replace", diff=second_diff), run_tests(0)).turns)
    failing, edit, passing = fix_chain(events)
    assert (failing.turn, edit.turn, passing.turn) == (7, 9, 11) and edit.diff == second_diff
    # A failure, an edit, then a failure again and a pass with no edit between: the first edit and a later pass
    # still make the loop the metric counts.
    events = repair_events(planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(1), run_tests(0)).turns)
    assert [event.turn for event in fix_chain(events)] == [3, 5, 9]


def test_fixed_after_feedback_is_over_the_solved_repair_trajectories():
    fixed = planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(0))
    guessed = planted(editor("str_replace", diff=FIX), run_tests(0))
    gave_up = planted(run_tests(1), reward=0.0)
    not_repair = planted(reward=1.0, said="42")
    assert repair_points([fixed, guessed, guessed, gave_up, not_repair]) == {FIXED_AFTER_FEEDBACK: 1 / 3}
    assert repair_points([fixed], prefix="eval/") == {"eval/repair/fixed_after_feedback": 1.0}
    # Nothing solved, or no repair trajectory: no point at all, not a zero.
    assert repair_points([gave_up, not_repair]) == {} and repair_points([]) == {}


def test_a_steps_points_carry_the_rate_only_where_repair_trajectories_were_solved():
    fixed = planted(run_tests(1), editor("str_replace", diff=FIX), run_tests(0))
    guessed = planted(editor("str_replace", diff=FIX), run_tests(0))
    arithmetic = planted(reward=1.0, said="42")

    def points(consumed):
        return step_points(counters=RunCounters(active_seconds=1.0), consumed=consumed, trained=consumed, stats=None,
                           idle={}, step_seconds=1.0, groups=1, effective_groups=1,
                           generation_tokens_per_second=0.0, staleness=[])

    assert points([fixed, guessed, arithmetic])[FIXED_AFTER_FEEDBACK] == 0.5
    assert FIXED_AFTER_FEEDBACK not in points([arithmetic, arithmetic])


def test_a_run_without_repair_tasks_charts_no_repair_line(make_pipeline):
    """The arithmetic pipeline, evaluated at its start and end: its evaluations are recorded, and no step or
    evaluation has a repair point (no always-zero line on every run's page)."""
    names = set()
    # Every recording, not the tracker's last per step: the end's evaluation is recorded at the last step's number.
    tracker = MemoryTracker(on_step=lambda step, points: names.update(points))
    pipeline, _ = make_pipeline(1, mode="sync", eval_tasks_per_domain=2, tracker=tracker)
    pipeline.run()
    assert "eval/reward/arithmetic" in names and "reward/mean" in names
    assert not [name for name in names if "repair/" in name]
