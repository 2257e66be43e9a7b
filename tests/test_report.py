"""BENCHMARKS.md is what scripts/report.py renders from the JSON in benchmarks/."""
from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("report", REPO / "scripts" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_the_rendering_of_the_committed_json(report):
    page = (REPO / "BENCHMARKS.md").read_text()
    assert page == report.render(REPO / "benchmarks"), (
        "BENCHMARKS.md differs from the rendering: run python scripts/report.py")
    assert len(page.splitlines()) <= 250


def test_benchmarks_folder_holds_only_what_the_page_reads(report):
    read = {name for names in report.SOURCES.values()
            for name in (names if isinstance(names, tuple) else (names,))}
    assert {p.name for p in (REPO / "benchmarks").iterdir()} == read


def test_check_fails_when_a_measured_figure_changes(report, tmp_path):
    bench = tmp_path / "benchmarks"
    shutil.copytree(REPO / "benchmarks", bench)
    page = tmp_path / "BENCHMARKS.md"
    shutil.copy(REPO / "BENCHMARKS.md", page)
    flags = ["--benchmarks", str(bench), "--page", str(page)]
    assert report.main(["--check", *flags]) == 0

    path = bench / report.SOURCES["compare"]
    data = json.loads(path.read_text())
    row = random.choice([r for r in data["results"] if r["variant"].startswith("maxk")])
    row["epoch_ms"] *= random.uniform(1.5, 3.0)
    path.write_text(json.dumps(data))
    assert report.main(["--check", *flags]) == 1
    assert page.read_text() == (REPO / "BENCHMARKS.md").read_text()  # --check writes nothing

    assert report.main(flags) == 0
    assert report.main(["--check", *flags]) == 0
    assert f"{row['epoch_ms']:.1f} (" in page.read_text()


def test_minibatch_rows_of_several_passes_show_their_spread(report):
    """A run of several passes: each row's seeds/s with its slowest and fastest pass, the
    split per step of its breakdown pass, and the text says how many passes it timed."""
    passes = random.randint(2, 5)
    spread = sorted(random.uniform(1e5, 3e5) for _ in range(passes))
    row = {"sampler": "device", "step": "graphed", "variant": "maxk-k32", "gpus": 1,
           "throughput_seeds_per_s": sum(spread) / passes, "step_ms": 4.0,
           "steps": 192 * passes, "breakdown_steps": 192, "sample_s": 0.192,
           "copy_s": 0.0192, "compute_s": 0.768, "pass_seeds_per_s": spread}
    data = {"args": {"breakdown": True, "steps": 200, "passes": passes}, "results": [row]}
    (cells,) = report.minibatch_rows(data)
    assert cells[4] == (f"{row['throughput_seeds_per_s']:,.0f} "
                        f"({spread[0]:,.0f}-{spread[-1]:,.0f})")
    assert cells[6] == "1.0 / 0.1 / 4.0"
    assert report._timed_steps(data) == f"{passes} passes of 192 timed steps (one epoch)"


def test_a_missing_file_is_one_error_line(report, tmp_path, capsys):
    assert report.main(["--check", "--benchmarks", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1


def test_every_figure_of_the_readme_results_is_on_the_benchmarks_page():
    """The README's results tables quote BENCHMARKS.md (rendered from the JSON): each time,
    throughput and ratio in their cells, the first column (the row's name) aside."""
    import re
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Results"):readme.index("## Install")]
    page = (REPO / "BENCHMARKS.md").read_text()
    cells = [c.strip() for line in section.splitlines() if line.startswith("| ")
             and not line.startswith("|---") for c in line.strip("|").split("|")[1:]]
    figures = [f for c in cells for f in re.findall(r"\d[\d,]*(?:\.\d+)?x?", c)
               if not re.fullmatch(r"k=\d+", c)]
    figures = [f for f in figures if re.search(r"[.,x]", f)]  # times, seeds/s and ratios
    assert len(figures) >= 20
    missing = [f for f in figures if f not in page]
    assert not missing, f"README figures not on BENCHMARKS.md: {missing}"


@pytest.mark.parametrize("name,label", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "vectorized_elementwise_kernel<4, FillFunctor<float>, std::arr..."),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long)",
     "vectorized_gather_kernel<16, long>"),
    ("maxk_reg", "maxk_reg"),
    # a parenthesis inside the template arguments is not the parameter list
    ("void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda"
     "_out(c10::Scalar const&)::{lambda()#1}>(long, long)",
     "elementwise_kernel_with_index<int, arange_cuda_out(c10::Scala...")])
def test_kernel_labels_keep_the_template_and_drop_namespaces_and_parameters(report, name,
                                                                             label):
    assert report.kernel_label(name) == label and len(label) <= 64
