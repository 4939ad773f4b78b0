import json

import pytest

from farm.config import load_settings
from farm.errors import ConfigError


def test_defaults_apply_without_file_or_env(monkeypatch):
    monkeypatch.delenv("FARM_STORE")
    s, origin = load_settings(env={})
    assert s.store == "file://~/.farm/store"
    assert s.s3.max_attempts == 8
    assert origin["s3.max_attempts"] == "default"


def test_precedence_cli_over_env_over_file_over_default(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("store: file:///from-file\nreference:\n  seed: 3\n  timeout_s: 9\n")
    env = {"FARM_REFERENCE_SEED": "5"}
    s, origin = load_settings(cfg, overrides={"reference.timeout_s": 1.5}, env=env)
    assert s.store == "file:///from-file" and origin["store"] == f"file {cfg}"
    assert s.reference.seed == 5 and origin["reference.seed"] == "env FARM_REFERENCE_SEED"
    assert s.reference.timeout_s == 1.5 and origin["reference.timeout_s"] == "command line"
    assert s.check.timeout_s == 300.0 and origin["check.timeout_s"] == "default"


def test_standard_aws_variables_feed_s3_settings(tmp_path):
    s, origin = load_settings(env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "abc"})
    assert s.s3.endpoint_url == "http://127.0.0.1:9000"
    assert origin["s3.access_key_id"] == "env AWS_ACCESS_KEY_ID"
    # the farm's own name wins over the standard one
    s, _ = load_settings(env={"AWS_ENDPOINT_URL": "http://a", "FARM_S3_ENDPOINT_URL": "http://b"})
    assert s.s3.endpoint_url == "http://b"


def test_unknown_key_names_key_and_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("reference:\n  sead: 1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: unknown key 'reference.sead'"):
        load_settings(cfg, env={})


def test_wrong_type_names_key_and_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("reference:\n  seed: seven\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: reference.seed: expected int, got 'seven'"):
        load_settings(cfg, env={})


def test_wrong_type_in_environment_names_variable():
    with pytest.raises(ConfigError, match=r"environment FARM_CHECK_TIMEOUT_S \(check.timeout_s\): expected float"):
        load_settings(env={"FARM_CHECK_TIMEOUT_S": "soon"})


def test_sources_mapping_from_env_json_and_pairs():
    s, _ = load_settings(env={"FARM_CORPUS_SOURCES": '{"akg": "/x"}'})
    assert s.corpus.sources == {"akg": "/x"}
    s, _ = load_settings(env={"FARM_CORPUS_SOURCES": "a=/x,b=/y"})
    assert s.corpus.sources == {"a": "/x", "b": "/y"}


def test_config_show_masks_secrets_and_names_sources(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "supersecretvalue")
    result = cli("--set", "reference.seed=4", "config", "show", "--json")
    assert result.exit_code == 0
    rows = {r["key"]: r for r in json.loads(result.stdout)}
    assert "supersecretvalue" not in result.stdout
    assert rows["s3.secret_access_key"]["value"].startswith("****")
    assert rows["s3.secret_access_key"]["source"] == "env AWS_SECRET_ACCESS_KEY"
    assert rows["reference.seed"] == {**rows["reference.seed"], "value": 4, "source": "command line"}


def test_settings_one_command_loads_never_reach_a_later_call(cli, tmp_path):
    """Settings are passed, never kept for the process: a process-wide "current settings" once
    let one test's `--set evaluator.sandbox=off` switch the sandbox off for every later one."""
    from farm.config import environment_settings

    off = tmp_path / "off.yaml"
    off.write_text("evaluator:\n  sandbox: 'off'\n  cases: 1\n")
    first, _ = load_settings(off)
    second, _ = load_settings(sets={"evaluator.cases": "2"})
    assert (first.evaluator.sandbox, first.evaluator.cases) == ("off", 1)
    assert (second.evaluator.sandbox, second.evaluator.cases) == ("auto", 2)
    assert cli("--config", off, "--set", "evaluator.require_sandbox=1", "config", "show").exit_code == 0
    later = environment_settings()  # what a library caller that passes no settings gets
    assert (later.evaluator.sandbox, later.evaluator.cases, later.evaluator.require_sandbox) == ("auto", -1, False)


def test_the_llm_generator_is_built_from_the_commands_settings():
    """`farm search --set llm.base_url=... --set llm.model=...`: the generator gets the command's
    settings (it read the environment's alone, and asked for the --set it had been given)."""
    from farm.cli.search import make_generators
    from farm.generators import DEFAULT_CHAIN

    s, _ = load_settings(sets={"llm.base_url": "http://127.0.0.1:9/v1", "llm.model": "served", "llm.max_retries": "0"})
    gens = make_generators(DEFAULT_CHAIN, s)
    llm = gens[-1]
    assert llm.name == "llm" and llm.tier == 1  # the default chain's last tier, where an endpoint is set
    assert llm.client.endpoint.startswith("http://127.0.0.1:9/v1") and llm.client.model == "served"
    assert llm.client.max_retries == 0
    assert [g.name for g in make_generators(DEFAULT_CHAIN, load_settings()[0])] == DEFAULT_CHAIN.split(",")


def test_config_show_table_and_bad_file_exit_code(cli, tmp_path):
    assert "reference.seed" in cli("config", "show").stdout
    bad = tmp_path / "x.yaml"
    bad.write_text("nope: 1\n")
    result = cli("--config", bad, "config", "show")
    assert result.exit_code == 2
    assert "unknown key 'nope'" in result.stderr
    assert "Traceback" not in result.output
    missing = cli("--config", tmp_path / "none.yaml", "config", "show")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def test_devices_take_the_existing_tools_space_separated_form():
    from farm.cli.main import joined_devices

    assert joined_devices(["search", "--devices", "0", "1", "2", "3", "--max-tasks", "40"]) == [
        "search", "--devices", "0,1,2,3", "--max-tasks", "40"]
    assert joined_devices(["worker", "--devices", "0,1"]) == ["worker", "--devices", "0,1"]
    assert joined_devices(["scale", "search-cuda", "4"]) == ["scale", "search-cuda", "4"]
    assert joined_devices(["search", "--devices", "2"]) == ["search", "--devices", "2"]


def test_secret_values_cover_settings_variables_and_url_passwords():
    from farm.masking import mask_secrets, secret_values

    s, _ = load_settings(env={"FARM_QUEUE_BROKER_URL": "redis://:broker-pass@redis:6379/0",
                              "OPENAI_API_KEY": "sk-llm-123456"})
    env = {"HF_TOKEN": "hf-token-abcdef", "DATABASE_URL": "postgres://u:db-pass-1@h/x", "SHORT_KEY": "1",
           "PATH": "/usr/bin"}
    values = secret_values(s, env)
    assert {"broker-pass", "sk-llm-123456", "hf-token-abcdef", "db-pass-1"} <= set(values)
    assert "1" not in values and "/usr/bin" not in values  # too short to mask; not secret
    text = "auth failed for redis://:broker-pass@redis:6379/0 with hf-token-abcdef in /usr/bin"
    assert mask_secrets(text, values) == "auth failed for **** with **** in /usr/bin"
