"""Typos that looked green (issue 35): an option, variable or setting with a wrong value is
refused before any work, with a message that names it; a command that only reads a store
refuses one that is not there instead of listing nothing and exiting 0."""

import pytest

from tests.cli.test_front_door import one_line_error


def test_a_typo_of_a_farm_variable_stops_the_command_naming_the_one_meant(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_STORE_URL", f"file://{tmp_path / 'mine'}")
    one_line_error(cli("cache", "ls"), 2, "FARM_STORE_URL", "did you mean FARM_STORE?")
    monkeypatch.delenv("FARM_STORE_URL")
    monkeypatch.setenv("FARM_REFERENCE_TIMEOUT", "60")  # another setting's, cut short
    one_line_error(cli("config", "show"), 2, "FARM_REFERENCE_TIMEOUT", "did you mean FARM_REFERENCE_TIMEOUT_S?")


def test_an_unknown_farm_variable_close_to_nothing_is_a_warning(cli, monkeypatch):
    monkeypatch.setenv("FARM_COLOUR_SCHEME", "dark")
    result = cli("config", "show", "--json")
    assert result.exit_code == 0 and "FARM_COLOUR_SCHEME is not one the farm reads: ignored" in result.stderr


@pytest.mark.parametrize("option, needles", [
    (["--generators", "tune,prot"], ["unknown generator 'prot' (--generators; did you mean 'port'?)"]),
    (["--generators", "tune>"], ["--generators", "empty tier"]),
    (["--profile", "kernelbnech"], ["(--profile; did you mean 'kernelbench'?)"]),
])
def test_farm_run_checks_its_options_before_the_reference_stage(cli, tmp_path, option, needles):
    one_line_error(cli("run", "--target", "cpu", *option), 2, *needles)
    assert not (tmp_path / "store").exists()  # the test's store (conftest): no reference data was made


@pytest.mark.parametrize("args, needles", [
    (["search", "--source", "demo", "--target", "cpu", "--seed", str(2**70)], ["--seed"]),
    (["reference", "--source", "demo", "--seed", str(2**70)], ["--seed (reference.seed)", "<= 4294967295"]),
    (["reference", "--source", "demo", "--timeout", "0.2"], ["--timeout (reference.timeout_s): must be >= 1, not 0.2"]),
    (["ops", "check", "--source", "demo", "--timeout", "nan"], ["--timeout (check.timeout_s)", "finite"]),
    (["reference", "--source", "demo", "--jobs", "-2"], ["--jobs (reference.jobs): must be >= 0"]),
    (["--set", "queue.ops_per_device=0", "config", "show"], ["--set queue.ops_per_device: must be >= 1, not 0"]),
    (["--set", "llm.temperature=inf", "config", "show"], ["--set llm.temperature", "finite"]),
    (["--set", "reference.seed_set=2", "config", "show"], ["did you mean 'reference.seed_sets'?"]),
    (["search", "--source", "demo", "--target", "cpu", "--devices", "a,b"], ["--devices"]),
    (["submit", "--source", "demo", "--max-tasks", "0"], ["--max-tasks"]),
    (["submit", "--source", "demo", "--wait", "--timeout", "nan"], ["--timeout", "finite"]),
    (["workers", "--timeout", "0"], ["--timeout: must be > 0"]),
    (["worker", "--pool", "search", "--target", "cpu", "--devices", "1;2"], ["--devices takes device indices"]),
])
def test_option_values_are_refused_naming_the_option(cli, tmp_path, args, needles):
    flat = one_line_error(cli(*args), 2, *needles)
    assert not (tmp_path / "store").exists() and "sandbox:" not in flat  # nothing was probed or written


def test_a_tasks_folder_that_is_a_file_or_missing_names_the_variable(cli, monkeypatch, tmp_path):
    a_file = tmp_path / "tasks"
    a_file.write_text("")
    monkeypatch.setenv("FARM_CORPUS_TASKS_DIR", str(a_file))
    one_line_error(cli("ops", "list"), 2, "environment FARM_CORPUS_TASKS_DIR (corpus.tasks_dir)", "is a file")
    monkeypatch.setenv("FARM_CORPUS_TASKS_DIR", str(tmp_path / "gone"))
    one_line_error(cli("run", "--target", "cpu"), 2, "corpus.tasks_dir", "(set by FARM_CORPUS_TASKS_DIR) does not exist")


@pytest.mark.parametrize("command", [["cache", "ls"], ["cache", "verify"], ["cache", "pull", "--to", "pulled"]])
def test_reading_a_store_that_is_not_there_fails(cli, tmp_path, command):
    one_line_error(cli(*command, "--store", tmp_path / "nope"), 3, "nope (set by --store) does not exist")
    (tmp_path / "a-file").write_text("")
    one_line_error(cli(*command, "--store", f"file://{tmp_path / 'a-file'}"), 3, "a-file (set by --store) is a file")
    assert not (tmp_path / "nope").exists() and not (tmp_path / "pulled").exists()


def test_a_missing_store_names_the_variable_that_set_it(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_STORE", str(tmp_path / "stroe"))
    one_line_error(cli("cache", "ls", "--json"), 3, "stroe (set by FARM_STORE) does not exist")
    (tmp_path / "stroe").mkdir()
    assert cli("cache", "ls", "--json").exit_code == 0  # an empty store is a store


def test_eval_checks_its_options_before_reading_reference_data(cli, tmp_path):
    (tmp_path / "cand.py").write_text("x = 1\n")
    base = ["eval", "--candidate", tmp_path / "cand.py", "--source", "demo", "--op", "row_sum", "--target", "cpu"]
    # the test's store holds no reference data: the option is what is named, not the missing .pt
    one_line_error(cli(*base, "--profile", "kernelbnech"), 2, "(--profile; did you mean 'kernelbench'?)")
    one_line_error(cli(*base, "--timing-mode", "graf"), 2, "--timing-mode")
