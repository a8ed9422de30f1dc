"""The documentation as a reader meets it: the site builds strictly, and every example runs.

Each page's ```bash and ```python blocks run in order in a scratch directory that holds
``hf-model/`` (the tiny random Llama), ``model.gguf`` (it as a Q4_0/Q8_0 GGUF), ``artifacts/``
(the repository's, with the embedded model's default export) and ``onnxsample`` on PATH. A renamed
option or function fails here, not for a reader.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _docs_examples import REASONS, ROOT, blocks, pages, runnable
from _exports import export_cached
from _family_models import write_gguf
from _http import free_port

pytestmark = pytest.mark.slow
PAGES = pages()
RUNNABLE = [p for p in PAGES if runnable(p)]
BIN = Path(sys.executable).parent
# the tiny GGUF's types: Q8_0 attention, Q4_0 feed-forward, as a downloaded Q4_0 file mixes them
TYPES = {"attn_q": "Q8_0", "attn_k": "Q8_0", "attn_v": "Q8_0", "attn_output": "Q8_0"}
TYPES |= {"ffn_gate": "Q4_0", "ffn_up": "Q4_0", "ffn_down": "Q4_0"}


def _id(page: Path) -> str:
    return page.stem.replace("-", "_")


@pytest.fixture(scope="session")
def scratch_parts(tiny_hf: Path) -> dict[str, Path]:
    """What every page's scratch directory links to (made once): the embedded model's default
    export is there, as `onnxsample export` writes it, and the scripts."""
    default = ROOT / "artifacts" / "smollm2-135m-instruct-gqa-gguf-a4"
    export_cached(None, default, layout="gqa", precision="gguf", accuracy_level=4, verify_tokens=0)
    gguf = tiny_hf.parent / "docs-model.gguf"
    if not gguf.is_file():
        partial = gguf.with_suffix(".partial")
        write_gguf(tiny_hf, partial, "llama", TYPES)
        partial.rename(gguf)
    return {
        "hf-model": tiny_hf,
        "model.gguf": gguf,
        "artifacts": ROOT / "artifacts",
        "scripts": ROOT / "scripts",
    }


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_example_runs_or_says_why_not(page):
    for block in blocks(page):
        assert block.not_run is None or block.not_run in REASONS, (
            f"{block.where}: an example is not run for {block.not_run!r}; "
            f"the reasons allowed are {REASONS}"
        )
        if block.not_run is not None:
            assert block.language in ("bash", "python"), f"{block.where}: only code is run"


@pytest.mark.parametrize("page", RUNNABLE, ids=_id)
def test_the_examples_of(page, scratch_parts, tmp_path):
    for name, target in scratch_parts.items():
        (tmp_path / name).symlink_to(target)
    listing = tmp_path.parent / f"{tmp_path.name}-blocks.json"
    listing.write_text(
        json.dumps(
            [
                {"where": b.where, "language": b.language, "code": b.code, "serves": b.serves}
                for b in runnable(page)
            ]
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "ONNXSAMPLE_API_KEY"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("_run_page.py")),
            str(listing),
            str(free_port()),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    # each block's seconds: shown for a failure, or with `pytest -rP`
    print("\n".join(s for s in done.stdout.splitlines() if s.startswith(":::") and " took " in s))
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: no broken link, no missing page or reference, no docstring the
    API reference cannot read."""
    done = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_readme_links_to_what_exists():
    """The front page's relative links (into docs/, to the changelog) name files that exist, and
    an anchor into a page names one of its headings."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert links
    for target, anchor in links:
        if "://" in target:
            continue
        path = ROOT / target
        assert path.is_file(), f"README.md links to {target}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README.md links to {target}#{anchor}: no such heading"
