"""bench/zoo.py's table of merged runs: rows measured on other CPUs keep the CPU they ran on (a
speed-up on one VM is not another's), and a later run's row replaces an earlier one's."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def zoo_bench():
    spec = importlib.util.spec_from_file_location("zoo_bench", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(model, speedup, **extra):
    variant = {"per_s": 100.0, "speedup": speedup, "speedup_ci": [speedup - 0.05, speedup + 0.05], "error": None,
               "ready_s": 3.0}
    return dict({"model": model, "unit": "tokens", "threads": 2, "tune_s": 10.0, "kept": ["rms_norm"],
                 "eager": dict(variant, speedup=1.0), "opfuse": variant,
                 "compile": variant, "opfuse + compile": variant, "opfuse_compile_vs_compile": None}, **extra)


def run(path, cpu, rows):
    path.write_text(json.dumps({"size": "bench", "rounds": 5, "machine": {"cpu": cpu}, "rows": rows}))
    return str(path)


def test_merged_rows_name_their_cpu_and_the_later_run_wins(zoo_bench, tmp_path):
    older = run(tmp_path / "a.json", "CPU A", [row("llama_sdpa", 1.10), row("gpt2_sdpa", 1.05)])
    newer = run(tmp_path / "b.json", "CPU B", [row("gpt2_sdpa", 1.20, cpu="CPU B")])
    assert zoo_bench.main(["--merge", older, newer, "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "zoo.json").read_text())
    assert {r["model"]: r["cpu"] for r in merged["rows"]} == {"llama_sdpa": "CPU A", "gpt2_sdpa": "CPU B"}
    table = (tmp_path / "merged" / "zoo.md").read_text().splitlines()
    assert table[0].startswith("CPU A and CPU B, 2 threads")
    assert table[2].endswith("| kept | cpu |")
    gpt2 = next(line for line in table if line.startswith("| gpt2_sdpa "))
    assert "x1.20 [1.15, 1.25]" in gpt2 and gpt2.endswith("| CPU B |")


def test_one_cpu_needs_no_cpu_column(zoo_bench, tmp_path):
    only = run(tmp_path / "a.json", "CPU A", [row("llama_sdpa", 1.10)])
    assert zoo_bench.main(["--merge", only, "--out", str(tmp_path / "merged")]) == 0
    table = (tmp_path / "merged" / "zoo.md").read_text().splitlines()
    assert table[0].startswith("CPU A, 2 threads") and table[2].endswith("| kept |")
