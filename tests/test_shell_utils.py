"""Tests for the Kaldi-style shell helpers utils/parse_options.sh and utils/log.sh.

Each test writes a tiny recipe script (sourcing the repository's utils/*.sh by absolute
path) into a temporary directory and runs it with bash under `set -euo pipefail`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UTILS = REPO / "utils"

RECIPE = """\
#!/usr/bin/env bash
set -euo pipefail
. "{utils}/log.sh"
stage=0
stop_stage=100
use_gpu=true
nj=4
help_message="Usage: run.sh [options] <data-dir> <exp-dir>"
. "{utils}/parse_options.sh"
echo "stage=$stage"
echo "stop_stage=$stop_stage"
echo "use_gpu=$use_gpu"
echo "nj=$nj"
echo "nargs=$#"
for a in "$@"; do echo "arg=$a"; done
"""


def run_recipe(tmp_path: Path, *args: str, body: str = RECIPE) -> subprocess.CompletedProcess:
    script = tmp_path / "run.sh"
    script.write_text(body.format(utils=UTILS))
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )


def values(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line and not line.startswith("arg="))


def positional(stdout: str) -> list[str]:
    return [line[len("arg="):] for line in stdout.splitlines() if line.startswith("arg=")]


def test_defaults_without_options(tmp_path):
    r = run_recipe(tmp_path)
    assert r.returncode == 0, r.stderr
    assert values(r.stdout) == {"stage": "0", "stop_stage": "100", "use_gpu": "true", "nj": "4", "nargs": "0"}


def test_dashes_become_underscores(tmp_path):
    r = run_recipe(tmp_path, "--stop-stage", "3")
    assert r.returncode == 0, r.stderr
    assert values(r.stdout)["stop_stage"] == "3"
    assert values(r.stdout)["stage"] == "0"


def test_name_equals_value(tmp_path):
    r = run_recipe(tmp_path, "--nj=16", "--stage=2")
    assert r.returncode == 0, r.stderr
    v = values(r.stdout)
    assert v["nj"] == "16" and v["stage"] == "2"


def test_boolean_option(tmp_path):
    r = run_recipe(tmp_path, "--use-gpu", "false")
    assert r.returncode == 0, r.stderr
    assert values(r.stdout)["use_gpu"] == "false"
    bad = run_recipe(tmp_path, "--use-gpu", "maybe")
    assert bad.returncode == 1
    assert "--use-gpu" in bad.stderr


def test_unknown_option_fails_and_names_it(tmp_path):
    r = run_recipe(tmp_path, "--no-such-thing", "1")
    assert r.returncode == 1
    assert "unknown option --no-such-thing" in r.stderr
    # the valid options are listed
    for opt in ("--stage", "--stop-stage", "--use-gpu", "--nj"):
        assert opt in r.stderr
    assert "stage=" not in r.stdout  # the script did not continue


def test_missing_value_fails(tmp_path):
    r = run_recipe(tmp_path, "--nj")
    assert r.returncode == 1
    assert "--nj" in r.stderr


def test_config_file_is_sourced_and_overridable(tmp_path):
    conf = tmp_path / "my.conf"
    conf.write_text("nj=8\nstage=2\n")
    r = run_recipe(tmp_path, "--config", str(conf), "--stage", "5")
    assert r.returncode == 0, r.stderr
    v = values(r.stdout)
    assert v["nj"] == "8"  # from the config
    assert v["stage"] == "5"  # command line wins over the config


def test_missing_config_file_is_named(tmp_path):
    r = run_recipe(tmp_path, "--config", "does_not_exist.conf")
    assert r.returncode == 1
    assert "does_not_exist.conf" in r.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_message_and_defaults(tmp_path, flag):
    r = run_recipe(tmp_path, flag)
    assert r.returncode == 0, r.stderr
    assert "Usage: run.sh [options] <data-dir> <exp-dir>" in r.stdout
    assert re.search(r"--stop-stage\b.*100", r.stdout)
    assert re.search(r"--use-gpu\b.*true", r.stdout)
    assert "stage=" not in r.stdout.replace("stop-stage", "")  # exited before the body


def test_positional_args_preserved(tmp_path):
    r = run_recipe(tmp_path, "--stage", "1", "data/train", "exp/run 1", "--not-an-option")
    assert r.returncode == 0, r.stderr
    assert values(r.stdout)["stage"] == "1"
    assert positional(r.stdout) == ["data/train", "exp/run 1", "--not-an-option"]


def test_double_dash_ends_options(tmp_path):
    r = run_recipe(tmp_path, "--nj", "2", "--", "--stage", "9")
    assert r.returncode == 0, r.stderr
    v = values(r.stdout)
    assert v["nj"] == "2" and v["stage"] == "0"
    assert positional(r.stdout) == ["--stage", "9"]


def test_log_prints_timestamped_line_to_stderr(tmp_path):
    body = '#!/usr/bin/env bash\nset -euo pipefail\n. "{utils}/log.sh"\nlog "hello world"\n'
    r = run_recipe(tmp_path, body=body)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \(run\.sh:4\) hello world\n", r.stderr), r.stderr


def test_die_logs_and_exits_1(tmp_path):
    body = '#!/usr/bin/env bash\nset -euo pipefail\n. "{utils}/log.sh"\ndie "bad thing"\necho unreachable\n'
    r = run_recipe(tmp_path, body=body)
    assert r.returncode == 1
    assert "unreachable" not in r.stdout
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \(run\.sh:4\) .*bad thing$", r.stderr, re.M), r.stderr


# ---------------------------------------------------------------- the utils from a recipe dir, fresh shell
RECIPE_DIRS = {"asr": REPO / "recipes" / "librispeech" / "asr1", "lm": REPO / "recipes" / "wikitext103" / "lm1"}


def fresh_shell(cwd: Path, *cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` in ``cwd`` with a clean environment (no path.sh sourced, no venv on PATH)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", *cmd], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def data_dir(tmp_path) -> Path:
    d = tmp_path / "data" / "x"
    d.mkdir(parents=True)
    (d / "wav.scp").write_text("spk1-u1 /nowhere/u1.wav\nspk1-u2 /nowhere/u2.wav\n")
    (d / "text").write_text("spk1-u1 HELLO\nspk1-u2 WORLD\n")
    (d / "utt2spk").write_text("spk1-u1 spk1\nspk1-u2 spk1\n")
    (d / "spk2utt").write_text("spk1 spk1-u1 spk1-u2\n")
    return d


@pytest.mark.parametrize("tool", ["validate_data_dir.sh", "fix_data_dir.sh"])
def test_data_dir_tools_from_a_recipe_dir_in_a_fresh_shell(tool, data_dir):
    r = fresh_shell(RECIPE_DIRS["asr"], f"utils/{tool}", "--check-audio", "false", str(data_dir))
    assert r.returncode == 0, r.stderr
    assert "No such file" not in r.stderr
    # one line says what it did and why: the project's environment (the top level's), not the recipe dir's
    assert f"{tool}: python cannot import gossip_accel: using {REPO}/.venv (. {REPO}/path.sh)" in r.stderr, r.stderr


def test_launch_from_a_recipe_dir_in_a_fresh_shell(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import gossip_accel, sys; print('launched', sys.argv[1])\n")
    r = fresh_shell(RECIPE_DIRS["lm"], "utils/launch.sh", "--num-workers", "1", "--", str(script), "ok")
    assert r.returncode == 0, r.stderr
    assert "launched ok" in r.stdout
    assert f"launch.sh: accelerate is not on PATH: using {REPO}/.venv" in r.stderr, r.stderr


def test_launch_refuses_to_build_the_environment_by_surprise(tmp_path):
    """No environment yet: launch.sh names the command that builds it instead of building ~6 GB."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "GOSSIP_VENV": str(tmp_path / "venv")}
    r = subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "utils/launch.sh", "--", "x.py"],
                       cwd=RECIPE_DIRS["lm"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"set it up once with '. {REPO}/path.sh'" in r.stderr and "6 GB" in r.stderr, r.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("kind", ["asr", "lm"])
def test_stage_scripts_and_recipe_help_in_a_fresh_shell(kind):
    recipe = RECIPE_DIRS[kind]
    for cmd in (["run.sh", "--help"], [f"utils/run_{kind}.sh", "--help"]):
        r = fresh_shell(recipe, *cmd)
        assert r.returncode == 0 and "--num-workers" in r.stdout and "--tag" in r.stdout, (cmd, r.stderr)
