"""The static site (``docs/site/build.py``), built once per session from the stored notebooks (marked
``slow``): a page per notebook in order, every link resolves, nothing loads from the network, under
60 MB, math typeset in Chromium (screenshots in ``artifacts/site/``). And the GitHub workflows.
Missing tools skip a test, except under ``CI=true``, where they fail."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from attn_helpers.bench import lab
from attn_helpers.course_map import COURSE

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "docs" / "site" / "build.py"
WORKFLOWS = ROOT / ".github" / "workflows"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = Path(os.environ.get("SITE_ARTIFACTS", ROOT / "artifacts" / "site"))
IN_CI = os.environ.get("CI", "").lower() == "true"
GENERATOR = {"sphinx": "Sphinx", "myst_nb": "myst-nb", "sphinx_book_theme": "sphinx-book-theme",
             "sphinx_togglebutton": "sphinx-togglebutton", "sphinx_design": "sphinx-design",
             "sphinx-mathjax-offline": "sphinx-mathjax-offline"}
MAX_MB = 60
TEST_COMMAND = "python3 course.py test"
# Attributes through which a page loads something by itself (an <a href> is only followed).
LOADING = {**dict.fromkeys(("script", "img", "source", "iframe", "embed", "video", "audio", "track",
                            "input"), "src"), "link": "href", "object": "data"}
REMOTE = re.compile(r"^(https?:)?//", re.I)


def need(missing: list[str]) -> None:
    if missing:
        reason = "; ".join(missing)
        if IN_CI:
            pytest.fail(f"CI=true but this test cannot run: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site, built once for the session into a temporary folder."""
    absent = [name for module, name in GENERATOR.items() if importlib.util.find_spec(module) is None]
    need([f"the site's generator is not installed: {', '.join(absent)} "
          "(pip install -r requirements.txt)"] if absent else [])
    out = tmp_path_factory.mktemp("site") / "site"
    result = subprocess.run([sys.executable, str(BUILD), "--strict", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (
        "the site build failed (--strict: any Sphinx warning fails it):\n"
        f"{result.stdout}\n{result.stderr}")
    return out


@cache
def soup(path: Path):
    from bs4 import BeautifulSoup
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


@pytest.mark.slow
def test_the_landing_page_is_the_course_map(site):
    article = soup(site / "index.html").select_one("article")
    links = [a["href"] for a in article.select("a[href]")]
    positions = []
    for lesson in COURSE:
        page = f"{lesson.number}_{lesson.slug}.html"
        assert page in links, f"the course map does not link {page}"
        positions.append(links.index(page))
        card = next(a for a in article.select("a[href]") if a["href"] == page).find_parent(
            class_="sd-card")
        text = " ".join(card.get_text(" ").split())
        assert " ".join(lesson.idea.split()) in text, f"{page}: its one idea is missing"
        assert card.select_one(f'img[src$="{lesson.number}.png"]'), f"{page}: no thumbnail"
    assert positions == sorted(positions), "the course map is not in the course's order"


@pytest.mark.slow
def test_one_page_per_notebook_linked_in_the_course_order(site):
    order = ["index", *(f"{lesson.number}_{lesson.slug}" for lesson in COURSE)]
    built = {p.stem for p in site.glob("*.html")} - {"search", "genindex"}
    assert built == set(order) and order[1:] == [nb.stem for nb in NOTEBOOKS], (
        "expected index and one page per notebook; COURSE and notebooks/ must agree")
    for i, name in enumerate(order):
        page = soup(site / f"{name}.html")
        prev, nxt = page.select_one("a.left-prev"), page.select_one("a.right-next")
        if i > 0:
            assert prev is not None and prev["href"] == f"{order[i - 1]}.html", f"{name}: previous"
        if i < len(order) - 1:
            assert nxt is not None and nxt["href"] == f"{order[i + 1]}.html", f"{name}: next"


@pytest.mark.slow
def test_solutions_going_deeper_and_widgets_are_presented_as_promised(site):
    """Reference solutions folded, Going deeper folded (its toggle), and a caption under every
    widget's picture saying it is live in JupyterLab."""
    import json
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        solutions = sum("solution" in c.get("metadata", {}).get("tags", []) for c in cells)
        widgets = sum(any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                          for o in c.get("outputs", [])) for c in cells)
        collapsed = sum(bool(c.get("metadata", {}).get("jp-MarkdownHeadingCollapsed"))
                        for c in cells)
        page = soup(site / f"{nb.stem}.html")
        folded = page.select("details.hide.above-input")
        assert len(folded) == solutions, f"{nb.stem}: {len(folded)} folded cells, {solutions} solutions"
        assert all("reference solution" in d.summary.get_text() for d in folded)
        captions = [f for f in page.select("figure.widget-picture")
                    if f.select_one("img") and "Live in JupyterLab" in f.get_text()]
        assert len(captions) == widgets, f"{nb.stem}: {len(captions)} captions for {widgets} widgets"
        toggles = page.select("section div.toggle")
        assert len(toggles) == collapsed, f"{nb.stem}: {len(toggles)} folded sections"


@pytest.mark.slow
def test_every_internal_link_resolves_and_nothing_loads_from_the_network(site):
    broken, remote, ids = [], [], {}
    # the themes also copy Jinja macro files named *.html into _static/: not pages
    for page in sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts):
        where = page.relative_to(site)
        for tag in soup(page).find_all(["a", *LOADING]):
            attr = "href" if tag.name == "a" else LOADING[tag.name]
            url = tag.get(attr)
            if tag.name != "a" and any(v and REMOTE.match(v.strip()) for v in (url, tag.get("srcset"))):
                remote.append(f"{where}: <{tag.name} {attr}={url!r}>")
            if not url or url.startswith(("mailto:", "data:", "javascript:")) or REMOTE.match(url):
                continue
            parts = urlsplit(url)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_file():
                broken.append(f"{where}: <{tag.name} {attr}={url!r}>")
            elif parts.fragment and target.suffix == ".html":
                if target not in ids:
                    ids[target] = {t["id"] for t in soup(target).find_all(id=True)}
                if unquote(parts.fragment) not in ids[target]:
                    broken.append(f"{where}: {url!r} (no such anchor)")
        remote += [f"{where}: <link rel={t['rel']}>" for t in soup(page).find_all("link", rel=True)
                   if {"preconnect", "dns-prefetch"} & set(t["rel"])]
    for css in site.rglob("*.css"):
        text = css.read_text(encoding="utf-8")
        for url in re.findall(r"url\(\s*['\"]?([^'\")]+)", text) + re.findall(
                r"@import\s+['\"]([^'\"]+)", text):
            if REMOTE.match(url.strip()):
                remote.append(f"{css.relative_to(site)}: {url}")
            elif not url.startswith(("data:", "#")) and not (
                    css.parent / unquote(urlsplit(url).path)).is_file():
                broken.append(f"{css.relative_to(site)}: url({url})")
    assert not broken, "broken internal links or pictures:\n" + "\n".join(sorted(set(broken)))
    assert not remote, "the site would load these from the network:\n" + "\n".join(remote)


@pytest.mark.slow
def test_the_site_is_small_enough_to_publish_anywhere(site):
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    assert size <= MAX_MB * 2**20, f"the site is {size / 2**20:.1f} MB, over {MAX_MB} MB"


RENDERED = """async () => {
    if (window.MathJax && MathJax.startup) { await MathJax.startup.promise; }
    await document.fonts.ready;
    const images = [...document.images];
    images.forEach(i => { i.loading = "eager"; });
    await Promise.all(images.map(i => i.complete ? null
        : new Promise(done => { i.onload = i.onerror = done; })));
    const article = document.querySelector("article").cloneNode(true);
    article.querySelectorAll("pre, code, mjx-container, script, style, .cell_output, .output")
        .forEach(e => e.remove());
    return {
        prose: article.textContent,
        math: document.querySelectorAll("article mjx-container").length,
        math_errors: [...document.querySelectorAll("mjx-merror")].map(e => e.textContent),
        broken_images: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
        images: images.length,
    };
}"""


@pytest.fixture(scope="session")
def chromium():
    need(lab.missing())
    with lab.chromium() as browser:
        yield browser


@pytest.mark.slow
@pytest.mark.parametrize("name, min_math", [("index", 0), ("03_scaling", 20)])
def test_chromium_shows_math_and_pictures_offline(site, chromium, name, min_math):
    """The page opened from the file system: every request stays local, the math is typeset
    (no raw ``$...$``, no MathJax error), every picture loaded. Full-page screenshot kept."""
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    remote = []

    def route(r):
        if urlsplit(r.request.url).scheme in ("file", "data", "blob", "about"):
            r.continue_()
        else:
            remote.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto((site / f"{name}.html").as_uri(), wait_until="load")
    seen = page.evaluate(RENDERED)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    page.close()
    assert not remote, f"{name}: requests to the network: {remote}"
    raw = re.findall(r"\$[^$\n]{1,80}\$|\\\(.{1,80}?\\\)|\\\[", seen["prose"])
    assert not raw, f"{name}: raw math left in the rendered text: {raw[:5]}"
    assert not seen["math_errors"], f"{name}: MathJax errors: {seen['math_errors'][:5]}"
    assert seen["math"] >= min_math, f"{name}: only {seen['math']} typeset formulas"
    assert seen["images"] >= (11 if name == "index" else 5), f"{name}: {seen['images']} images"
    assert not seen["broken_images"], f"{name}: pictures that did not load: {seen['broken_images']}"


def test_workflows_validate_against_githubs_schema():
    need([] if importlib.util.find_spec("check_jsonschema") else
         ["check-jsonschema is not installed (pip install -r requirements.txt)"])
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"test.yml", "site.yml"}
    # without rfc3987_syntax: jsonschema's "iri" format, unused here, costs 3 s of CPU to import
    check = "import sys; sys.modules['rfc3987_syntax'] = None; from check_jsonschema import main; main()"
    result = subprocess.run([sys.executable, "-c", check, "--builtin-schema",
                             "vendor.github-workflows", *map(str, files)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_test_workflow_runs_the_readme_test_command():
    assert TEST_COMMAND in (ROOT / "README.md").read_text(encoding="utf-8"), (
        "the README no longer gives this test command")
    import yaml
    data = yaml.safe_load((WORKFLOWS / "test.yml").read_text(encoding="utf-8"))
    assert {"push", "pull_request"} <= set(data.get("on", data.get(True)))  # YAML 1.1: `on` is True
    runs = "\n".join(step.get("run", "") for job in data["jobs"].values()
                     for step in job.get("steps", []))
    assert re.search(rf"^\s*{re.escape(TEST_COMMAND)}\s*$", runs, flags=re.M), runs

