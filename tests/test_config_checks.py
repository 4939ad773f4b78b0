"""Settings are checked where they are read (farm.config_checks): every numeric setting has a
declared range, every value out of it is refused naming where it came from, and a FARM_*
variable the farm does not read is reported with the name it was probably meant as."""

import re
import subprocess
from pathlib import Path

import pytest

from farm import config_checks
from farm.config import S3Settings, Settings, leaves, load_settings
from farm.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
TYPO_EXAMPLES = {"FARM_STORE_URL", "FARM_LLM_TEMP"}  # docs/configuration.md shows what a typo meets
TYPO_TESTS = {"tests/test_config_checks.py", "tests/cli/test_typos.py"}  # these make typos on purpose
NUMERIC = [leaf for leaf in leaves() if leaf.type in (int, float)]


def _outside(leaf) -> list:
    """Values just outside a leaf's declared range."""
    low, above, high = leaf.range
    bad = [low - 1] if low is not None else []
    bad += [above] if above is not None else []
    bad += [high + 1] if high is not None else []
    return bad


def test_every_numeric_setting_declares_a_range():
    assert NUMERIC and not [leaf.key for leaf in NUMERIC if not leaf.range]


@pytest.mark.parametrize("leaf", NUMERIC, ids=lambda leaf: leaf.key)
def test_a_value_outside_a_settings_range_names_the_variable(leaf):
    for bad in _outside(leaf):
        value = str(int(bad)) if leaf.type is int else repr(float(bad))
        with pytest.raises(ConfigError, match=rf"environment {leaf.env} \({re.escape(leaf.key)}\): must be"):
            load_settings(env={leaf.env: value})


@pytest.mark.parametrize("leaf", [leaf for leaf in NUMERIC if leaf.type is float], ids=lambda leaf: leaf.key)
@pytest.mark.parametrize("word", ["nan", "inf", "-inf"])
def test_no_float_setting_takes_nan_or_infinity(leaf, word):
    with pytest.raises(ConfigError, match=f"{leaf.key}.*finite number"):
        load_settings(env={leaf.env: word})


def test_the_named_settings_of_the_issue_refuse_zero_and_negatives():
    for key in ("reference.seed_sets", "s3.max_attempts", "queue.ops_per_device", "corpus.small_budget_mb"):
        for value in ("0", "-3"):
            with pytest.raises(ConfigError, match=re.escape(key)):
                load_settings(sets={key: value}, env={})
    for key, value in (("llm.temperature", "-0.5"), ("llm.temperature", "2.5"), ("corpus.memory_limit_mb", "-1")):
        with pytest.raises(ConfigError, match=f"--set {re.escape(key)}: must be"):
            load_settings(sets={key: value}, env={})
    s, _ = load_settings(sets={"corpus.memory_limit_mb": "0", "llm.temperature": "0"}, env={})  # the edges hold
    assert s.corpus.memory_limit_mb == 0 and s.llm.temperature == 0


def test_a_file_value_out_of_range_names_file_and_key(tmp_path):
    cfg = tmp_path / "farm.yaml"
    cfg.write_text("queue:\n  chunk_candidates: 0\n")
    with pytest.raises(ConfigError, match=r"farm.yaml: queue.chunk_candidates: must be >= 1, not 0"):
        load_settings(cfg, env={})


def test_an_option_out_of_range_names_the_option():
    with pytest.raises(ConfigError, match=r"--seed \(reference.seed\): must be >= 0 and <= 4294967295, not " + str(2**70)):
        load_settings(overrides={"reference.seed": 2**70}, env={})
    with pytest.raises(ConfigError, match=r"--timeout \(check.timeout_s\): must be >= 1, not 0.2"):
        load_settings(overrides={"check.timeout_s": 0.2}, env={})


def test_settings_built_in_code_are_checked_too():
    with pytest.raises(ConfigError, match="s3.max_attempts: must be >= 1, not 0"):
        S3Settings(max_attempts=0)
    with pytest.raises(ConfigError, match="addressing_style"):
        S3Settings(addressing_style="virtaul")
    assert Settings().s3.max_attempts == 8


def test_ranges_are_one_table_shown_in_the_settings_reference():
    page = (REPO / "docs" / "reference" / "settings.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `s3.max_attempts`"))
    assert ">= 1" in row
    row = next(line for line in page.splitlines() if line.startswith("| `llm.temperature`"))
    assert ">= 0 and <= 2" in row


# ---------------------------------------------------------------- FARM_* variables


@pytest.mark.parametrize("name, meant", [
    ("FARM_STORE_URL", "FARM_STORE"),  # a known name with a word added
    ("farm_store", "FARM_STORE"),  # lower case
    ("FARM_QUEUE_BROKER", "FARM_QUEUE_BROKER_URL"),  # cut short
    ("FARM_LLM_TEMP", "FARM_LLM_TEMPERATURE"),
    ("FARM_REFERENCE_SEEDSETS", "FARM_REFERENCE_SEED_SETS"),  # spelt nearly alike
    ("FARM_CACHEDIR", "FARM_CACHE_DIR"),  # a variable that is no setting
])
def test_a_typo_of_a_variable_is_an_error_naming_the_one_meant(name, meant):
    with pytest.raises(ConfigError, match=rf"environment variable {name} is not one the farm reads: "
                                          rf"did you mean {meant}"):
        load_settings(env={name: "file:///somewhere"})


def test_an_unrelated_variable_is_said_once_and_an_empty_typo_changes_nothing(capsys):
    config_checks._said.discard("FARM_HELLO_WORLD")
    env = {"FARM_HELLO_WORLD": "1", "FARM_STORE_URL": ""}
    load_settings(env=env)
    load_settings(env=env)
    said = capsys.readouterr().err
    assert said.count("FARM_HELLO_WORLD is not one the farm reads: ignored") == 1
    assert "FARM_STORE_URL" not in said


def test_every_farm_variable_the_repository_names_is_known():
    """A variable a script, a deployment file or the code reads is never reported as unknown."""
    listed = subprocess.run(["git", "ls-files", "farm", "scripts", "deploy", "bench", "tests", "docs", "worker_images",
                             ".ci", "README.md"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    known = {leaf.env for leaf in leaves()} | set(config_checks.OTHER_VARIABLES)
    found = {}
    for rel in listed:
        path = REPO / rel
        if path.suffix in (".png", ".pt", ".whl") or not path.is_file():
            continue
        for name in re.findall(r"(?<![A-Za-z0-9_])FARM_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*<{])",
                               path.read_text(errors="replace")):
            if name not in known | TYPO_EXAMPLES and rel not in TYPO_TESTS:
                found.setdefault(name, rel)
    assert not found, f"add these to farm.config_checks.OTHER_VARIABLES (or make them settings): {found}"


def test_a_folder_setting_that_is_a_file_or_missing_names_where_it_came_from(tmp_path):
    a_file = tmp_path / "tasks.txt"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"environment FARM_CORPUS_TASKS_DIR \(corpus.tasks_dir\): .*is a file"):
        load_settings(env={"FARM_CORPUS_TASKS_DIR": str(a_file)})
    with pytest.raises(ConfigError, match=r"--set corpus.akg_root: .*is a file"):
        load_settings(sets={"corpus.akg_root": str(a_file)}, env={})
    missing, _ = load_settings(env={"FARM_CORPUS_TASKS_DIR": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match=r"corpus.tasks_dir .*nope \(set by FARM_CORPUS_TASKS_DIR\) does not exist"):
        missing.tasks_dir()


def test_range_words():
    assert config_checks.range_text((0, None, 65535)) == ">= 0 and <= 65535"
    assert config_checks.range_text((None, 0, None)) == "> 0"
    assert config_checks.range_text((-1, None, 0.5)) == ">= -1 and <= 0.5"
