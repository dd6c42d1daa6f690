#!/usr/bin/env python3
"""The course's two commands (see README.md).

    python3 course.py lab     set everything up (first time only) and open JupyterLab on the course
    python3 course.py test    set everything up and run the whole test suite, exactly as CI does
    python3 course.py progress [--reset]   which exercises you have passed, across all notebooks
    python3 course.py site    build the static site into site/ from the stored notebooks ("Read online")
    python3 course.py studies --check | NAME ... | --all
                              the long experiments (studies/): check their records' fingerprints,
                              or re-run studies and record new fingerprints

For contributors, the quick loop while you work (lint, import tiers, unit tests; no browser, no
slow re-training, no nbval):

    python3 course.py test --fast

For instructors, after editing a notebook or a helper it uses:

    python3 course.py execute [notebooks/NN_name.ipynb ...]   re-run notebooks in a fresh kernel
                                                              and store their outputs (default: all)

Setting up means: a virtual environment in ``.venv`` with the exact versions from
``requirements.txt`` (the helper package ``attn_helpers`` included, editable). It is reinstalled
only when ``requirements.txt`` or ``pyproject.toml`` change. Needs Python 3.11 or newer and
nothing else.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".course-installed"
NOTEBOOKS = ROOT / "notebooks"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def run(args: list, env: dict | None = None) -> None:
    """Run a command from the repository root; stop the whole script if it fails."""
    result = subprocess.run([str(a) for a in args], cwd=ROOT, env=env)
    if result.returncode != 0:
        print(f"\ncourse.py: step failed (exit {result.returncode}): {' '.join(map(str, args))}",
              file=sys.stderr)
        sys.exit(result.returncode)


def install_fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def setup() -> None:
    """Create ``.venv`` and install the pinned requirements, unless already up to date."""
    if sys.version_info < (3, 11):  # noqa: UP036 (this script may be started by an old Python)
        sys.exit(f"course.py: Python 3.11 or newer is needed, this is {sys.version.split()[0]}")
    if not PYTHON.exists():
        say(f"creating the virtual environment {VENV.relative_to(ROOT)}")
        run([sys.executable, "-m", "venv", VENV])
    fingerprint = install_fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return
    say("installing the pinned requirements (first time: a few minutes)")
    install()
    STAMP.write_text(fingerprint)


def install() -> None:
    """``requirements.txt`` into ``.venv``: with uv, which installs the same pinned versions about
    3x faster than pip (about 15 s against 3 minutes on a 2-core machine, from an empty cache),
    given pip's own settings; with pip when uv cannot be installed or fails. uv compiles nothing
    to bytecode (its --compile-bytecode spent 46 s of CI's 60 s on all 17,300 files of the venv);
    warm_up() writes the bytecode of what the course imports."""
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check"]
    if subprocess.run([*pip, "-q", "uv"], cwd=ROOT).returncode == 0:
        options, env = uv_options()
        uv = [PYTHON, "-m", "uv", "pip", "install", "--python", PYTHON, "-r", "requirements.txt",
              "--index-strategy", "unsafe-best-match",   # pip's choice among indexes
              *options]
        if subprocess.run([str(a) for a in uv], cwd=ROOT, env=env).returncode == 0:
            warm_up()
            return
        say("uv could not install the requirements; pip installs them")
    run([*pip, "-r", "requirements.txt"])


WARM_UP = """
from jupyter_client.manager import start_new_kernel
manager, client = start_new_kernel(startup_timeout=600)
try:
    client.execute_interactive("import attn_helpers, torch, matplotlib.pyplot, seaborn, ipywidgets",
                               timeout=600)
finally:
    client.stop_channels()
    manager.shutdown_kernel(now=True)
"""


# The tools' imports, compiled beside the kernel's: the warm-up kernel keeps about one core busy.
WARM_UP_TOOLS = ("import jupyter_server.serverapp, jupyterlab, nbval, pytest, hypothesis, "
                 "playwright.sync_api, sphinx.application, myst_nb, sphinx_book_theme, bs4")


def warm_up() -> None:
    """Bytecode for what the course imports, written before the checks start: a kernel started
    once and the course's imports run in it, and the tools' imports in a second process beside it
    (18 and 13 s of CPU). Without it, three lanes starting kernels at once while each compiled
    torch and IPython once made a kernel miss nbval's startup timeout."""
    tools = subprocess.Popen([str(PYTHON), "-c", WARM_UP_TOOLS], cwd=ROOT)
    run([PYTHON, "-c", WARM_UP])
    if tools.wait() != 0:
        sys.exit(f"course.py: the warm-up imports failed (exit {tools.returncode}): {WARM_UP_TOOLS}")


def allow_bytecode() -> None:
    """Python writes bytecode next to the sources it imports, even where the machine sets
    PYTHONDONTWRITEBYTECODE (uv compiles nothing at install here, see install())."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def uv_options() -> tuple[list[str], dict]:
    """pip's configuration (its files and PIP_* variables, as ``pip config list`` shows them):
    indexes, local wheels and constraints as uv's options, pip's certificate for uv's TLS."""
    listed = subprocess.run([PYTHON, "-m", "pip", "config", "list"], cwd=ROOT, text=True,
                            capture_output=True).stdout
    flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
             "find-links": "--find-links", "constraint": "--constraint"}
    options, env = {}, dict(os.environ)
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        key, value = key.rsplit(".", 1)[-1], value.strip("'\"")
        if key == "cert":
            env.setdefault("SSL_CERT_FILE", value)
        for item in value.split() if key in flags else []:
            options[(flags[key], item)] = None
    return [part for pair in options for part in pair], env


def lab(extra: list[str]) -> None:
    setup()
    say("opening JupyterLab on the course (stop it with Ctrl+C)")
    # Kernel messages without Nagle's delay: about 30 ms less from a slider move to its picture
    # (see attn_helpers/labserver.py).
    run([BIN / "jupyter", "lab", f"--ServerApp.root_dir={NOTEBOOKS}",
         "--ServerApp.kernel_websocket_connection_class=attn_helpers.labserver.NoDelayChannels",
         *extra])


# pytest for the 22 strict-nbval jobs, started lighter: 1.3 s of CPU instead of 6.1 s each. Without
# hypothesis's plugin (no property tests there), and without rfc3987_syntax, which jsonschema
# imports only for its optional "iri" format check and which compiles a Lark grammar at import
# (2.8 s). nbval imports nbformat, nbformat imports jsonschema, and no notebook schema uses "iri".
NBVAL_PYTEST = [PYTHON, "-c", "import sys; sys.modules['rfc3987_syntax'] = None; import pytest; "
                "sys.exit(pytest.console_main())", "-p", "no:hypothesispytest"]


def nbval_command(notebook: Path) -> list:
    """Strict nbval on one notebook: its stored outputs must match a fresh run exactly
    (after the sanitize file's substitutions). The log ends with its 5 slowest cells."""
    return [*NBVAL_PYTEST, "--nbval", "--nbval-current-env",
            "--nbval-sanitize-with", SANITIZE, "--nbval-cell-timeout=600",
            "--nbval-kernel-startup-timeout=300", "-p", "no:cacheprovider",
            "-q", "--durations=5", notebook]


def notebooks_heaviest_first() -> list[Path]:
    """Every notebook, the later (heavier: 10 trains a GPT, 09 runs a pretrained encoder) first,
    so that the short ones fill the lanes at the end."""
    return sorted(NOTEBOOKS.glob("*.ipynb"), reverse=True)


# The second strict nbval pass: another floating-point path through ATen and MKL (no AVX2/AVX-512
# kernels, one thread) on the same machine, so stored outputs are shown to survive a change of CPU.
OTHER_FP_PATH = {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
ARTIFACTS = ROOT / "artifacts"
NO_TESTS_OK = (0, 5)    # pytest's exit 5: every test deselected (e.g. by a -k given to course.py test)


def test(extra: list[str]) -> None:
    setup()
    # Every pytest and nbval run gets a fresh, empty exercise-progress directory: a learner's own
    # passes never change a stored output or a test.
    with tempfile.TemporaryDirectory(prefix="attn-course-test-") as scratch:
        run_tests(extra, Path(scratch))


def run_tests(extra: list[str], scratch: Path) -> None:
    fast = "--fast" in extra
    extra = [a for a in extra if a != "--fast"]
    started = time.monotonic()

    def step(message: str) -> None:      # each step with the time since the start, for the CI log
        say(f"[{time.monotonic() - started:.0f} s] {message}")

    step("lint: ruff on the package, the tests and the notebooks")
    run([PYTHON, "-m", "ruff", "check", "attn_helpers", "tests", "notebooks", "studies", "docs",
         "course.py"])
    step("import tiers: lint-imports (contracts in pyproject.toml)")
    run([BIN / "lint-imports", "--no-cache"])
    step("studies: every shipped record's fingerprint matches today's code (studies/README.md)")
    studies(["--check"])

    def env(name: str, base: dict | None = None, **settings: str) -> dict:
        (scratch / name).mkdir()
        return dict(os.environ if base is None else base, ATTN_COURSE_PROGRESS_DIR=str(scratch / name),
                    **settings)

    # The pytest jobs on one thread each: jobs share the cores, so a second thread per job only
    # waits for a core held by another lane (their results hold on any thread count).
    one = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if fast:
        step("fast loop: unit, property, widget and hygiene tests (no browser, no slow, no nbval)")
        run([PYTHON, "-m", "pytest", "tests", "-p", "no:cacheprovider", "-q",
             "-m", "not slow and not browser", *extra],
            env=env("fast", **one))          # one thread: tests/core 65 -> 30 CPU-s
        say(f"fast checks passed in {time.monotonic() - started:.0f} s")
        return
    ARTIFACTS.mkdir(exist_ok=True)
    # Independent jobs, each started as soon as a lane is free, longest first: the browser pass
    # (every notebook run in JupyterLab in Chromium, its sliders moved and timed), strict nbval of
    # 10 and 09 on the other floating-point path and with this environment's settings, the tests
    # in a few groups (see TEST_GROUPS), then strict nbval of the other notebooks, one job each
    # per setting. One lane per core, plus one for the browser pass: it waits on Chromium and the
    # server as much as it computes. Its timings are judged only as ratios to a floor sampled
    # just before and after each notebook (the same machine load), and a notebook over the ratio
    # is measured again, alone, below (--confirm).
    other = " ".join(f"{k}={v}" for k, v in OTHER_FP_PATH.items())
    # The nbval pass with this environment's settings: its thread count too (a pin is dropped).
    default = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    pytest = [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "--durations=25"]
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    browser = Path(chromium).exists() or os.environ.get("CI") == "true"
    # Strict nbval in both settings, one job per notebook and setting (22 short jobs balance the
    # lanes: CI, 2026-11-29, two whole passes of 759 and 778 s ended 150 s before the tests did).
    nbval = [(f"strict nbval, {notebook.stem}, {title}", f"nbval_{notebook.stem}_{tag}",
              nbval_command(notebook), env(f"nbval-{notebook.stem}-{tag}", base, **settings))
             for notebook in notebooks_heaviest_first()
             for title, tag, base, settings in [(other, "other_fp_path", None, OTHER_FP_PATH),
                                                (f"default settings ({os.cpu_count()} cores)",
                                                 "default", default, {})]]
    jobs = [
        *nbval[:4],         # 10 and 09 (two minutes and one each), then the tests, then ...
        # Each group with its tests marked slow: one process collects a folder once and loads a
        # fixture once (a separate job for the slow tests collected all 1,700 tests, 19 s of CPU,
        # and loaded the pretrained encoder a second time).
        *((f"unit, property, widget, hygiene and slow tests: {', '.join(group)}", f"pytest_{i}",
           [*pytest, *(f"tests/{d}" for d in group), "-m", "not browser",
            "--basetemp", scratch / f"tmp-rest-{i}", *extra],
           env(f"pytest-{i}", **one), NO_TESTS_OK)
          for i, group in enumerate(test_groups(), start=1)),
    ]
    # A slider move against re-creating a seaborn heatmap, both timed in the same job (the ratio
    # holds under the other lanes' load: about 0.03 at most against 0.1). It ran alone after the
    # lanes, with one core idle (26 s on 2026-11-30).
    jobs.append(("speed in the kernel: a slider move at most 1/10 of re-creating a seaborn "
                 "heatmap", "bench_widget",
                 [PYTHON, "-m", "attn_helpers", "bench", "widget", "--repeats", "20", "--check"],
                 env("bench-widget", **one)))
    jobs += nbval[4:]                       # ... the other notebooks (under a minute each) last
    if browser:
        jobs.insert(0, ("JupyterLab in Chromium: every notebook run up to its last widget and "
                        "checked (no error; a slider move changes the picture and the readouts), "
                        "every slider move timed",
                        "browser", [PYTHON, "-m", "pytest", "tests/notebooks/test_browser.py",
                                    "-p", "no:cacheprovider", "-m", "browser"], env("browser")))
    else:
        say(f"no Chromium at {chromium}: the browser pass is skipped (see README)")
    cores = max(2, os.cpu_count() or 2)
    if browser and shutil.which("nice"):
        # The browser pass times key press to picture, so the other lanes yield the CPU to it
        # (nice 10): on 2026-11-30 two notebooks' widgets read over 2x the floor with the other
        # lanes computing beside them (1.4x and 1.6x the day before), and measuring them again,
        # alone, cost about 90 s.
        jobs = [job if job[1] == "browser" else (job[0], job[1], ["nice", "-n", "10", *job[2]],
                                                 *job[3:]) for job in jobs]
    run_in_lanes(jobs, started, lanes=cores + 1 if browser else cores)
    if browser:
        # Each notebook's median against 2x the floor moves just before and after it. A notebook
        # over the ratio is measured again in a pass of its own, now alone on the machine
        # (--confirm): the check fails only when that confirms it.
        step("speed in the browser: every notebook's median at most 2x the floor around it")
        run([PYTHON, "-m", "attn_helpers", "bench", "browser", "--check", "--confirm",
             "--results", ARTIFACTS / "browser" / "results.json"], env=env("bench-browser"))
    say(f"all checks passed in {time.monotonic() - started:.0f} s")


# The tests (but the browser pass), in a few groups of folders, each a job of its own, heaviest
# first: whichever lane frees first takes the next group, so the lanes end within a group's time
# (about a minute) of each other, instead of one lane running all of them while the other waits
# (CI, 2026-11-26: the nbval lane freed 47 s before the slow tests ended and then ran all 245 s
# of them alone).
TEST_GROUPS = (("exercises",), ("core", "shared", "tools"), ("widgets", "notebooks"),
               ("lessons", "site"))


def test_groups() -> list[tuple[str, ...]]:
    """:data:`TEST_GROUPS`, plus any folder of ``tests/`` they do not name (in a group of its
    own), so that a new folder of tests is never left out."""
    named = {d for group in TEST_GROUPS for d in group}
    found = sorted(p.parent.name for p in (ROOT / "tests").glob("*/test_*.py"))
    return [*TEST_GROUPS, *((d,) for d in dict.fromkeys(found) if d not in named)]


def run_in_lanes(jobs: list[tuple], started: float, lanes: int = 2) -> None:
    """Run ``jobs`` ((title, log name, command, environment[, exit codes that count as a pass]),
    in that order), at most ``lanes`` at a time, each started as soon as a lane is free. A job's
    output goes to ``artifacts/<log name>.log`` and its tail is printed when it ends. The first
    failure stops the jobs still running and the script. Times are printed from ``started``
    (a ``time.monotonic()``)."""
    pending, running, cpu_seconds, machine = list(jobs), {}, 0.0, busy_cpu_seconds()
    lanes_began = time.monotonic()
    try:
        while pending or running:
            while pending and len(running) < lanes:
                title, name, args, env, *ok = pending.pop(0)
                log = ARTIFACTS / f"{name}.log"
                out = open(log, "w")
                process = subprocess.Popen([str(a) for a in args], cwd=ROOT, env=env,
                                           stdout=out, stderr=subprocess.STDOUT)
                running[process] = (title, log, out, time.monotonic(), ok[0] if ok else (0,))
                say(f"[{time.monotonic() - started:.0f} s] started: {title} "
                    f"(output: {log.relative_to(ROOT)})")
            time.sleep(0.5)
            for process, cpu in [(p, cpu) for p in running if (cpu := reap(p)) is not None]:
                title, log, out, began, passing = running.pop(process)
                out.close()
                code, now = process.returncode, time.monotonic()
                cpu_seconds += cpu
                say(f"[{now - started:.0f} s] {'finished' if code in passing else 'FAILED'} "
                    f"after {now - began:.0f} s ({cpu:.0f} s of CPU): {title}")
                print(log.read_text()[-6000:], flush=True)
                if code not in passing:
                    print(f"\ncourse.py: {title} failed (exit {code}); see {log}", file=sys.stderr)
                    sys.exit(code)
        busy, cores = busy_cpu_seconds() - machine, os.cpu_count() or 1
        say(f"[{time.monotonic() - started:.0f} s] the jobs used {cpu_seconds:.0f} s of CPU; "
            f"the machine's {cores} cores were busy {busy:.0f} s of their "
            f"{cores * (time.monotonic() - lanes_began):.0f} s since the first job started")
    finally:
        for process, (_, _, out, *_) in running.items():   # a failure or Ctrl+C: stop the others
            if process.poll() is None:
                process.terminate()
                process.wait()
            out.close()


def reap(process: subprocess.Popen) -> float | None:
    """``None`` while ``process`` runs; once it has ended, its CPU seconds (its own and those of the
    children it waited for: a notebook's kernel, Chromium), its exit code set (0 s where the
    system cannot tell, e.g. on Windows)."""
    if not hasattr(os, "wait4"):
        return None if process.poll() is None else 0.0
    pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def busy_cpu_seconds() -> float:
    """Seconds all of the machine's cores have spent not idle since boot (Linux; else 0)."""
    try:
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def execute(paths: list[str]) -> None:
    setup()
    notebooks = [Path(p).resolve() for p in paths] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for notebook in notebooks:
        say(f"executing {notebook.relative_to(ROOT)} top to bottom in a fresh kernel")
        # No widget state in the stored file: exported HTML, GitHub and nbviewer then show each
        # widget's static picture (its image/png) instead of an embed that needs a kernel.
        # A fresh progress file: the stored outputs never show the instructor's own passes.
        with tempfile.TemporaryDirectory() as progress_dir:
            run([BIN / "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                 "--ExecutePreprocessor.timeout=600",
                 "--ExecutePreprocessor.store_widget_state=False", notebook],
                env=dict(os.environ, ATTN_COURSE_PROGRESS_DIR=progress_dir))


# --- studies: long experiments whose records ship in the package (studies/README.md) ---------------

STUDIES = ROOT / "studies"
FINGERPRINTS = STUDIES / "fingerprints.json"


def _module_imports(path: Path, module: str) -> set[str]:
    """The ``attn_helpers`` modules that ``path`` (module name ``module``) imports, by its import
    statements (absolute and relative; any depth of the file)."""
    import ast

    found, package = set(), module.rsplit(".", 1)[0] if module else ""
    if path.name == "__init__.py":
        package = module
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {name for name in found if name == "attn_helpers" or name.startswith("attn_helpers.")}


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def study_sources(study: Path) -> list[Path]:
    """The study's own file and every package module it imports, transitively (each package on
    the way counts too: importing ``attn_helpers.lessons.x`` runs ``attn_helpers/__init__.py``)."""
    seen: dict[str, Path] = {}
    todo = sorted(_module_imports(study, ""))
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):                      # the packages on the way in
            prefix = ".".join(parts[:i])
            file = _module_file(prefix)
            if file is not None and prefix not in seen:
                seen[prefix] = file
                todo.extend(_module_imports(file, prefix))
    return [study, *sorted(set(seen.values()))]


def torch_version() -> str:
    ask = "import importlib.metadata as m; print(m.version('torch'))"
    out = subprocess.run([str(PYTHON), "-c", ask], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def study_records(study: Path) -> list[str]:
    """The study's ``RECORDS``: a literal list of repository-relative paths it writes."""
    import ast

    for node in ast.parse(study.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["RECORDS"]:
            return list(ast.literal_eval(node.value))
    sys.exit(f"course.py: {study.relative_to(ROOT)} has no literal RECORDS = [...] list")


def code_of(source: Path) -> bytes:
    """What runs in ``source``: its syntax tree without docstrings. Comments, docstrings, blank
    lines and line breaks do not change a record, so editing them does not stale a study."""
    import ast

    tree = ast.parse(source.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def fingerprint(study: Path, torch: str) -> str:
    digest = hashlib.sha256(f"torch {torch}\n".encode())
    for source in study_sources(study):
        digest.update(f"{source.relative_to(ROOT).as_posix()}\n".encode())
        digest.update(code_of(source))
    return digest.hexdigest()


def all_studies() -> list[Path]:
    return sorted(p for p in STUDIES.glob("*.py") if not p.name.startswith("_"))


def studies(extra: list[str]) -> None:
    """``--check``: every study's fingerprint and records match today's code (seconds).
    ``NAME ...`` or ``--all``: re-run those studies, then record their fingerprints."""
    import json

    setup()
    known = json.loads(FINGERPRINTS.read_text()) if FINGERPRINTS.exists() else {}
    torch = torch_version()
    if extra == ["--check"]:
        stale = []
        for study in all_studies():
            name, entry = study.stem, known.get(study.stem)
            problems = []
            if entry is None:
                problems.append("never recorded")
            else:
                if entry["fingerprint"] != fingerprint(study, torch):
                    problems.append("its source, a package module it imports or torch changed")
                for record in study_records(study):
                    path = ROOT / record
                    if not path.is_file():
                        problems.append(f"{record} is missing")
                    elif entry["records"].get(record) != sha256(path):
                        problems.append(f"{record} is not the file it wrote")
            print(f"{'stale' if problems else 'ok':5} {name}"
                  + (f": {'; '.join(problems)}" if problems else ""))
            if problems:
                stale.append(name)
        for name in sorted(set(known) - {s.stem for s in all_studies()}):
            print(f"stale {name}: recorded in {FINGERPRINTS.name} but studies/{name}.py is gone")
            stale.append(name)
        if stale:
            sys.exit("course.py: stale studies; re-run each with: "
                     + "; ".join(f"python3 course.py studies {n}" for n in stale))
        print(f"all {len(all_studies())} studies' fingerprints match today's code")
        return
    names = [n.removesuffix(".py") for n in extra]
    chosen = all_studies() if extra == ["--all"] else [STUDIES / f"{n}.py" for n in names]
    if not chosen or any(not p.is_file() for p in chosen) or "--check" in extra:
        sys.exit("usage: python3 course.py studies --check | NAME ... | --all   (studies: "
                 + ", ".join(p.stem for p in all_studies()) + ")")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    for study in chosen:
        say(f"study {study.stem}: re-running {study.relative_to(ROOT)}")
        began = time.monotonic()
        run([PYTHON, study], env=env)
        # Read again: another `course.py studies` may have recorded its own study meanwhile.
        known = json.loads(FINGERPRINTS.read_text()) if FINGERPRINTS.exists() else {}
        known[study.stem] = {"fingerprint": fingerprint(study, torch),
                             "records": {r: sha256(ROOT / r) for r in study_records(study)}}
        FINGERPRINTS.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
        say(f"study {study.stem}: passed in {time.monotonic() - began:.0f} s; fingerprint recorded")


def site(extra: list[str]) -> None:
    """Build the static site into ``site/`` from the stored notebooks (``docs/site/build.py``)."""
    setup()
    say("building the static site into site/ from the stored notebooks (nothing is executed)")
    run([PYTHON, ROOT / "docs" / "site" / "build.py", *extra])


def progress(extra: list[str]) -> None:
    setup()
    run([PYTHON, "-m", "attn_helpers", "progress", *extra])


def main(argv: list[str]) -> None:
    commands = {"lab": lab, "test": test, "execute": execute, "progress": progress,
                "studies": studies, "site": site}
    if not argv or argv[0] not in commands:
        print(__doc__)
        sys.exit(2)
    allow_bytecode()
    commands[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
