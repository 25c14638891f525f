"""The code blocks of the user docs, by their markers, for the tests that run or check them.

A fenced block of README.md or docs/DEEPSPEED.md is preceded by one marker line:

* ``<!-- example: NAME -->``: a whole script a test runs as printed (``RUN_BY`` names the test);
* ``<!-- file: PATH -->``: the block is the repository file PATH, character for character;
* ``<!-- fragment -->``: a piece of a program (names defined elsewhere), not meant to run alone.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/DEEPSPEED.md")
#: example name -> the test that runs it
RUN_BY = {
    "readme-accelerate": "tests/test_user_guide.py::test_readme_accelerate_example_runs_as_printed",
    "readme-checkpoint": "tests/test_user_guide.py::test_readme_checkpoint_example_resumes_exactly",
    "readme-config": "tests/test_docs_examples.py::test_readme_config_block_loads",
    "deepspeed-accelerate": "tests/test_docs_examples.py::test_deepspeed_accelerate_example_runs_as_printed",
}
BLOCK = re.compile(r"^(?:<!-- (?P<kind>example|file|fragment)(?::\s*(?P<arg>[^ ]+))? -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```$",
                   re.S | re.M)


def blocks(doc: str) -> list[dict]:
    """Every fenced block of ``doc`` (a path under the repository root) with its marker (or None)."""
    text = (ROOT / doc).read_text()
    return [{"doc": doc, "line": text.count("\n", 0, m.start()) + 1, "kind": m["kind"], "arg": m["arg"],
             "lang": m["lang"], "code": m["code"]} for m in BLOCK.finditer(text)]


def example(name: str) -> str:
    """The code of the block marked ``<!-- example: name -->`` in one of DOCS."""
    found = [b["code"] for doc in DOCS for b in blocks(doc) if b["kind"] == "example" and b["arg"] == name]
    assert len(found) == 1, f"{len(found)} blocks marked '<!-- example: {name} -->' in {', '.join(DOCS)}"
    return found[0]


def run_as_printed(work: Path, script: str, cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``cmd train.py`` (a launcher) on ``script`` in ``work``, which sees the repository's conf/ as
    the docs' scripts do when run from the root; GUIDE_OUT names ``work`` for what the test saves."""
    if not (work / "conf").exists():
        (work / "conf").symlink_to(ROOT / "conf")
    (work / "train.py").write_text(script)
    env = dict(os.environ, OMP_NUM_THREADS="1", GUIDE_OUT=str(work), CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    proc = subprocess.run([*cmd, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc
