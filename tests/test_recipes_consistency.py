"""Every recipe against the template (the CI check of docs/RECIPES.md):

* its shared boilerplate is the template's: ``path.sh`` has the same bytes, ``utils`` is a link
  to the project's utils/ (``../../../utils``), ``run.sh`` is executable;
* every conf it names (in run.sh, README.md or conf/run.conf) exists, and every conf under its
  conf/ loads with the trainer's loader and no overrides (a dry run: structured config, types,
  the sync section validated), plus the sync period confs of LM recipes;
* ``run.sh --help`` exits 0 and lists its options;
* its run.sh holds only the corpus (ESPnet's shape): a short file that execs the shared stage
  script with "$@", declares none of the shared options (utils/stages.sh declares them once), and
  a local/data.sh does the data preparation; a misspelled option is refused, naming it;
* utils/new_recipe.sh makes a recipe (in tmp, and under recipes/) that passes the same checks
  and whose run.sh --help works.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(p for p in (ROOT / "recipes").glob("*/*") if p.is_dir() and (p / "run.sh").exists())
TEMPLATE = {"asr": ROOT / "recipes" / "TEMPLATE" / "asr1", "lm": ROOT / "recipes" / "TEMPLATE" / "lm1"}
_CONF = re.compile(r"(?<![\w/.])((?:\$?[A-Za-z_]*ROOT/|\.\./)*conf/[\w./-]+\.yaml)")


def kind(recipe: Path) -> str:
    return "lm" if recipe.name.startswith("lm") else "asr"


def load_conf_dry(recipe: Path, conf: Path) -> None:
    """Load a conf as its trainer would (no overrides), and validate its sync section."""
    from omegaconf import OmegaConf

    from gossip_accel.sync.config import load_sync_config

    lm = kind(recipe) == "lm" or conf.name.startswith("lm")
    if lm:
        from gossip_accel.bin.train_lm import load_conf
    else:
        from gossip_accel.bin.train_asr import load_conf
    c = load_conf([str(conf)], [])
    sync = OmegaConf.to_container(c.sync) if not isinstance(c.sync, dict) else c.sync
    if sync:
        load_sync_config(sync)


def named_confs(recipe: Path) -> set[Path]:
    """conf/*.yaml paths named in run.sh, README.md and conf/run.conf (relative to the recipe)."""
    out = set()
    for f in ("run.sh", "README.md", "conf/run.conf"):
        p = recipe / f
        if p.is_file():
            for m in _CONF.findall(p.read_text(encoding="utf-8")):
                if "$" in m or "ROOT/" in m or "{" in m or "period_${" in m:
                    continue
                out.add(Path(m))
    return out


def check_recipe(recipe: Path, template: Path) -> None:
    assert (recipe / "path.sh").read_bytes() == (template / "path.sh").read_bytes(), \
        f"{recipe}/path.sh differs from {template}/path.sh (shared boilerplate: copy the template's)"
    utils = recipe / "utils"
    assert utils.is_symlink(), f"{utils} must be a link to the project's utils/"
    assert utils.resolve() == (ROOT / "utils").resolve(), f"{utils} -> {os.readlink(utils)}, not the project's utils/"
    if recipe.parent.parent == ROOT / "recipes":
        assert os.readlink(utils) == "../../../utils", f"{utils} -> {os.readlink(utils)} (expected ../../../utils)"
    assert os.access(recipe / "run.sh", os.X_OK), f"{recipe}/run.sh is not executable"
    for c in named_confs(recipe):
        assert (recipe / c).is_file(), f"{recipe}: names {c}, which does not exist"
    confs = sorted((recipe / "conf").rglob("*.yaml"))
    assert confs, f"{recipe}/conf has no yaml"
    for c in confs:
        if c.name.startswith("period_"):
            continue                      # sync-only confs: loaded with the model conf below
        try:
            load_conf_dry(recipe, c)
        except Exception as e:  # noqa: BLE001 - report which conf
            pytest.fail(f"{c.relative_to(ROOT) if ROOT in c.parents else c} does not load: {e}")
    for p in sorted((recipe / "conf").glob("period_*.yaml")):
        model = next((c for c in confs if not c.name.startswith(("period_", "lm"))), None)
        if model is not None:
            from gossip_accel.bin.train_lm import load_conf
            from omegaconf import OmegaConf

            from gossip_accel.sync.config import load_sync_config
            load_sync_config(OmegaConf.to_container(load_conf([str(model), str(p)], []).sync))
    r = subprocess.run(["bash", str(recipe / "run.sh"), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{recipe}/run.sh --help exited {r.returncode}: {r.stderr[-2000:]}"
    assert "--stage" in r.stdout and "--num-workers" in r.stdout, r.stdout


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(r.relative_to(ROOT / "recipes")) for r in RECIPES])
def test_recipe_matches_template(recipe):
    check_recipe(recipe, TEMPLATE[kind(recipe)])


SHARED_OPTIONS = set(re.findall(r"^([a-z][a-z0-9_]*)=", (ROOT / "utils" / "stages.sh").read_text(), re.M)) - {"help_message"}


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(r.relative_to(ROOT / "recipes")) for r in RECIPES])
def test_run_sh_holds_only_the_corpus(recipe):
    text = (recipe / "run.sh").resolve().read_text()
    assert len(text.splitlines()) <= 40, f"{recipe}/run.sh: {len(text.splitlines())} lines (the stages belong in utils/)"
    assert re.search(rf"^exec utils/run_{kind(recipe)}\.sh .*\"\$@\"(\s+#.*)?$", text, re.M | re.S), \
        f"{recipe}/run.sh does not exec utils/run_{kind(recipe)}.sh with \"$@\""
    declared = set(re.findall(r"^([a-z][a-z0-9_]*)=", text, re.M))
    assert not declared & SHARED_OPTIONS, f"{recipe}/run.sh declares shared options {declared & SHARED_OPTIONS}"
    assert os.access(recipe / "local" / "data.sh", os.X_OK), f"{recipe}/local/data.sh missing or not executable"
    typo = subprocess.run(["bash", str(recipe / "run.sh"), "--num-wrokers", "3"], capture_output=True, text=True,
                          timeout=60)
    assert typo.returncode == 1 and "unknown option --num-wrokers" in typo.stderr, typo.stderr


def test_options_of_local_data_sh_are_options_of_run_sh():
    """./run.sh --help lists the corpus's options (those of local/data.sh) beside the shared ones."""
    for recipe, opts in ((ROOT / "recipes" / "librispeech" / "asr1", ["--librispeech-root", "--mini-train-utts"]),
                         (ROOT / "recipes" / "swbd" / "asr1", ["--swbd-root", "--eval2000-speech", "--dev-utts"]),
                         (ROOT / "recipes" / "wikitext103" / "lm1", ["--wikitext-root"]),
                         (ROOT / "recipes" / "gutenberg" / "lm1", ["--books", "--min-count"]),
                         (TEMPLATE["asr"], ["--corpus-root", "--train-utts"])):
        r = subprocess.run(["bash", str(recipe / "run.sh"), "--help"], capture_output=True, text=True, timeout=60)
        corpus, shared = r.stdout.split("Options (current default values):")
        for o in opts:
            assert f"  {o} <" in corpus, (recipe, o, r.stdout)
        for o in ("--stage", "--tag", "--baseline", "--num-nodes", "--max-restarts"):
            assert f"  {o} <" in shared, (recipe, o)


def test_every_recipe_is_checked():
    names = {str(r.relative_to(ROOT / "recipes")) for r in RECIPES}
    assert {"TEMPLATE/asr1", "TEMPLATE/lm1", "swbd/asr1", "librispeech/asr1"} <= names, names


def test_recipes_with_num_nodes_pass_it_on():
    """Recipes that offer --num-nodes hand it (and the node rank and master) to the shared stages."""
    for recipe in RECIPES:
        text = (recipe / "run.sh").read_text()
        if re.search(r"^num_nodes=", text, re.M):
            assert "--num-nodes" in text and "--node-rank" in text and "--master-addr" in text, recipe


@pytest.mark.parametrize("typ", ["asr", "lm"])
def test_new_recipe_in_tmp(tmp_path, typ):
    dst = tmp_path / "mycorpus" / f"{typ}1"
    r = subprocess.run(["bash", str(ROOT / "utils" / "new_recipe.sh"), str(dst)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (dst / "run.sh").is_symlink() and (dst / "run.sh").resolve() == (TEMPLATE[typ] / "run.sh").resolve()
    assert (dst / "local" / "data.sh").is_file() and os.access(dst / "local" / "data.sh", os.X_OK)
    check_recipe(dst, TEMPLATE[typ])
    again = subprocess.run(["bash", str(ROOT / "utils" / "new_recipe.sh"), str(dst)], capture_output=True, text=True)
    assert again.returncode == 1 and "not empty" in again.stderr


def test_new_recipe_under_recipes():
    """At recipes/<corpus>/<task> the recipe gets the template's path.sh as a file and utils -> ../../../utils."""
    corpus = ROOT / "recipes" / "zz_new_recipe_test"
    assert not corpus.exists()
    try:
        dst = corpus / "asr1"
        r = subprocess.run(["bash", str(ROOT / "utils" / "new_recipe.sh"), "--copy-run", "true", str(dst)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert not (dst / "path.sh").is_symlink() and not (dst / "run.sh").is_symlink()
        check_recipe(dst, TEMPLATE["asr"])
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
