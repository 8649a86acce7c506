"""The report files of a bench run: `bench.json`, the one record of the run, and
`bench.md` and `bench.png` rendered from that JSON (not from the objects in memory), so
what a reader sees can always be rendered again from the JSON alone (`render`)."""

from __future__ import annotations

import json
from pathlib import Path

from localspec.bench.chart import chart_png
from localspec.bench.markdown import to_markdown
from localspec.bench.results import Report
from localspec.bench.suite import BenchError
from localspec.paths import write_atomic


def write_report(report: Report, out_dir: Path, chart: bool = True) -> tuple[Path, ...]:
    """bench.json, then bench.md and bench.png rendered from it, in `out_dir`, each
    written atomically; returns the paths written (the Markdown first)."""
    js = out_dir / "bench.json"
    write_atomic(js, json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    md, *png = render(js, chart)
    return (md, js, *png)


def render(json_path: Path, chart: bool = True) -> tuple[Path, ...]:
    """The Markdown (and the PNG) beside a report's JSON, rendered from it alone: for
    bench.json, bench.md and bench.png."""
    report = load_report(json_path)
    md, png = json_path.with_suffix(".md"), json_path.with_suffix(".png")
    write_atomic(md, to_markdown(report))
    if not chart:
        return (md,)
    write_atomic(png, chart_png(report))
    return md, png


def load_report(path: Path) -> Report:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchError(f"report not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BenchError(f"cannot read {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    return Report.from_json(data)
