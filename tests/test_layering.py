"""The house rule, checked on every .py file's imports: data flows one way, jobs -> pipeline -> engine -> kernels.
jobs/ holds entry points only (nothing imports a job); the engine knows nothing of the pipeline, Ray or the jobs, and
reaches kernels/ only through engine/ops.py; kernels are leaves. bench/ measures the product and never imports
research/ (research may import bench, not the other way)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "legacy", "node_modules", "__pycache__"}


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not SKIP & set(p.relative_to(root).parts))


def imported(path: Path) -> set[str]:
    """The absolute modules a file imports, anywhere in it (function-level imports included), as dotted names; a
    module named by a string constant to importlib.import_module or __import__ counts too, so a rule cannot be dodged
    by importing through a string."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            module = node.args[0].value
            if func in ("import_module", "__import__") and isinstance(module, str) and not module.startswith("."):
                names.add(module)
    return names


def violations(root: Path) -> list[str]:
    """'file: module' for every import that breaks the rule."""
    def top_level_in(names: set[str], banned: set[str]) -> list[str]:
        return sorted(n for n in names if n.split(".")[0] in banned)

    bad = []
    for path in python_files(root):
        rel = path.relative_to(root)
        names = imported(path)
        if rel.parts[0] != "jobs":
            bad += [f"{rel}: {n} (nothing imports a job)" for n in top_level_in(names, {"jobs"})]
        if rel.parts[0] == "engine":
            bad += [f"{rel}: {n} (the engine knows nothing of Ray, the pipeline, jobs or benchmarks)"
                    for n in top_level_in(names, {"pipeline", "ray", "jobs", "bench", "research"})]
            if rel != Path("engine/ops.py"):
                bad += [f"{rel}: {n} (engine/ops.py is the engine's one door to kernels/)"
                        for n in top_level_in(names, {"kernels"})]
        if rel.parts[0] == "kernels":
            bad += [f"{rel}: {n} (kernels are leaves)"
                    for n in top_level_in(names, {"engine", "pipeline", "jobs", "bench", "research", "ray"})]
        if rel.parts[0] == "bench":
            bad += [f"{rel}: {n} (bench measures the product; research may import bench, not the other way)"
                    for n in top_level_in(names, {"research"})]
    return sorted(set(bad))


def test_imports_flow_one_way():
    assert violations(ROOT) == []


# an import statement of research/ at any indentation, or research/ named to importlib / __import__ as a string
RESEARCH_IMPORT = re.compile(r"""^\s*(?:from|import)\s+research\b|(?:import_module|__import__)\(\s*["']research\b""",
                             re.MULTILINE)


def test_bench_imports_nothing_from_research():
    """No file under bench/ imports research/, read from the source text itself (a second reading beside the syntax
    tree of test_imports_flow_one_way): a research study that needs an import of research/ lives in research/."""
    bad = [str(p.relative_to(ROOT)) for p in python_files(ROOT / "bench") if RESEARCH_IMPORT.search(p.read_text())]
    assert bad == []


def test_the_check_sees_each_kind_of_violation(tmp_path):
    """A tree that breaks each rule once: every break is reported, and a job may import the pipeline."""
    files = {
        "jobs/run.py": "from pipeline.job import run\n",
        "tests/test_x.py": "def test():\n    from jobs.run import main\n",
        "bench/b.py": "import jobs.benchmark as b\n",
        "engine/a.py": "import ray\nfrom pipeline import storage\n",
        "engine/b.py": "from kernels import rmsnorm\n",
        "engine/ops.py": "from kernels import rmsnorm\n",
        "kernels/k.py": "from engine.config import ModelConfig\n",
        "bench/r.py": "def f():\n    from research.ocria_tiny.eval_ocr import Score\n",
        "bench/s.py": "import importlib\nimportlib.import_module('research.ocria_tiny')\n",
        "research/t.py": "from bench.engine_bench import sync\n",
        ".venv/lib/site.py": "import jobs\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert [v.split(" (")[0] for v in violations(tmp_path)] == [
        "bench/b.py: jobs.benchmark", "bench/r.py: research.ocria_tiny.eval_ocr", "bench/s.py: research.ocria_tiny",
        "engine/a.py: pipeline", "engine/a.py: ray", "engine/b.py: kernels", "kernels/k.py: engine.config",
        "tests/test_x.py: jobs.run"]
    # the source scan finds the same two, and not research/ named in prose or as a subprocess's module
    assert [n for n in files if n.startswith("bench/") and RESEARCH_IMPORT.search(files[n])] == ["bench/r.py",
                                                                                                 "bench/s.py"]
    prose = '"""see research/ocria_tiny/eval_ocr.py"""\nEVAL_MODULE = "research.ocria_tiny.eval_ocr"\n'
    assert not RESEARCH_IMPORT.search(prose)
