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
