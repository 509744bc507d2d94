"""``turnloom loadtest --plot FILE``: a valid PNG or SVG of the run, refusals at the door."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import anyio
import msgspec
import pytest

from turnloom.tools.loadtest import LoadtestSamples, loadtest
from turnloom.tools.plot import bucket_seconds, check_plot_path, windows
from turnloom.tools.trajectories import builtin_trajectories

ROOT = Path(__file__).resolve().parents[2]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="the plot extra is not installed")


def _cli(*args: str | Path, block_matplotlib: bool = False) -> subprocess.CompletedProcess[str]:
    prelude = "import sys\n"
    if block_matplotlib:
        prelude += "sys.modules['matplotlib'] = None\n"
    code = prelude + "from turnloom.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=300,
    )


@needs_matplotlib
def test_plot_png_is_a_png_and_the_run_is_as_without_it(tmp_path: Path) -> None:
    done = _cli("loadtest", "--sessions", "4", "--no-progress", "--plot", tmp_path / "run.png")
    assert (done.returncode, done.stderr) == (0, "")
    data = (tmp_path / "run.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert done.stdout.splitlines()[0].startswith("sessions: 4  failed: 0")


@needs_matplotlib
def test_plot_svg_is_svg_xml_with_the_four_panels(tmp_path: Path) -> None:
    done = _cli("loadtest", "--sessions", "4", "--no-progress", "--plot", tmp_path / "run.SVG")
    assert (done.returncode, done.stderr) == (0, "")
    text = (tmp_path / "run.SVG").read_text(encoding="utf-8")
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    for label in ("prepare latency (ms)", "loop lag, max (ms)", "GC pause (ms)", "prepares/s"):
        assert f"<!-- {label} -->" in text


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (("--plot", "run.pdf"), "--plot run.pdf must end in .png or .svg."),
        (
            ("--plot", "no-such-folder/run.png"),
            "cannot write --plot no-such-folder/run.png: the folder no-such-folder does not exist.",
        ),
        (
            ("--plot", "run.png", "--processes", "2"),
            "--plot runs in one process; it cannot be used with --processes.",
        ),
        (
            ("--plot", "run.png", "--sustained"),
            "--plot draws one run; it cannot be used with --sustained.",
        ),
    ],
    ids=["suffix", "missing-folder", "processes", "sustained"],
)
def test_a_plot_that_cannot_be_drawn_is_refused_before_the_run(
    extra: tuple[str, ...], line: str
) -> None:
    if not HAS_MATPLOTLIB and extra[1].endswith(".png"):
        pytest.skip("without matplotlib the first refusal is the missing extra")
    done = _cli("loadtest", "--sessions", "2", *extra)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[0] == f"turnloom loadtest: error: {line}"
    assert not (ROOT / "run.png").exists()


def test_without_matplotlib_plot_is_refused_naming_the_extra(tmp_path: Path) -> None:
    done = _cli("loadtest", "--plot", tmp_path / "run.png", block_matplotlib=True)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "turnloom loadtest: error: --plot needs matplotlib: pip install 'turnloom[plot]'.\n"
    )
    assert not (tmp_path / "run.png").exists()


def test_check_plot_path_takes_either_case_of_the_suffix() -> None:
    assert check_plot_path(Path("a.txt")) == "--plot a.txt must end in .png or .svg."
    if HAS_MATPLOTLIB:
        assert check_plot_path(Path("a.PNG")) is None
        assert check_plot_path(Path("a.svg")) is None


def test_windows_put_each_value_in_the_window_of_its_time() -> None:
    grouped = windows([0.0, 0.09, 0.1, 0.25, 9.0], [1.0, 2.0, 3.0, 4.0, 5.0], 0.1, 3)
    assert grouped == [[1.0, 2.0], [3.0], [4.0, 5.0]]  # past the end: the last window
    assert bucket_seconds(6.0) == 0.1
    assert bucket_seconds(0.0) == 0.01


def test_the_samples_match_the_report() -> None:
    """Every delivered prepare and ticker wake-up is a sample with a time inside the run."""
    samples = LoadtestSamples()

    async def run() -> None:
        report = await loadtest(builtin_trajectories(3, turns=(4, 4)), sessions=3, samples=samples)
        assert len(samples.prepare_at) == len(samples.prepare_latency) == report.prepares == 12
        assert samples.seconds == report.seconds
        assert max(samples.prepare_latency) * 1000 >= report.prepare_p99_ms
        assert max(samples.lag, default=0.0) * 1000 == report.loop_lag_max_ms

    anyio.run(run)
    assert samples.prepare_at == sorted(samples.prepare_at)
    assert len(samples.lag_at) == len(samples.lag)
    assert len(samples.gc_at) == len(samples.gc_pause) == len(samples.gc_generation)
    assert all(0.0 <= t <= samples.seconds for t in samples.prepare_at + samples.lag_at)


def test_plot_loadtest_without_matplotlib_raises_the_typed_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnloom.errors import MissingDependencyError
    from turnloom.tools.loadtest import LoadtestReport
    from turnloom.tools.plot import plot_loadtest

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    required = [f.name for f in msgspec.structs.fields(LoadtestReport) if f.required]
    report = msgspec.convert({**dict.fromkeys(required, 0), "errors": []}, LoadtestReport)
    with pytest.raises(MissingDependencyError) as caught:
        plot_loadtest(LoadtestSamples(), report, tmp_path / "run.png")
    assert (caught.value.package, caught.value.extra) == ("matplotlib", "plot")
    assert not (tmp_path / "run.png").exists()
