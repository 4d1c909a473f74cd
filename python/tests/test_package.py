"""The package around the module: stubs that match it, docstrings, the kernel lookup."""

import ast
import os

import simpler
from simpler import _simpler


def stub_tree():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "simpler", "_simpler.pyi")
    with open(path) as f:
        return ast.parse(f.read())


def test_stub_declares_every_public_name_of_the_module_and_no_other():
    tree = stub_tree()
    declared = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(_simpler) if not n.startswith("_")}
    assert public - declared == set(), "names the stub lacks"
    assert declared - public == set(), "names the stub has and the module does not"


def test_stub_declares_every_method_of_each_class():
    tree = stub_tree()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or issubclass(getattr(_simpler, node.name), BaseException):
            continue
        cls = getattr(_simpler, node.name)
        declared = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        declared |= {t.id for n in node.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
        public = {n for n in vars(cls) if not n.startswith("_")}
        if issubclass(cls, __import__("enum").Enum) or hasattr(cls, "__members__"):
            public -= set(getattr(cls, "__members__", {}))
            public -= {"name", "value"}
        assert public - declared == set(), f"{node.name}: members the stub lacks"


def test_the_package_reexports_the_module_and_documents_the_api():
    for name in dir(_simpler):
        if not name.startswith("_") and name != "example_kernel":
            assert getattr(simpler, name) is getattr(_simpler, name)
    assert "Worker(level=" in simpler.Worker.__doc__
    for method in ("init", "close", "register", "submit", "run", "copy_to", "copy_from", "shared_array"):
        assert getattr(simpler.Worker, method).__doc__, method
    assert "KeyboardInterrupt" in simpler.RunHandle.wait.__doc__


def test_example_kernel_honours_simpler_kernel_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPLER_KERNEL_DIR", str(tmp_path))
    (tmp_path / "vector_add_add.so").write_bytes(b"")
    assert simpler.example_kernel("vector_add_add") == str(tmp_path / "vector_add_add.so")


def test_readme_python_blocks_run():
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme) as f:
        text = f.read()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks, "README.md has no ```python block"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def build_dir():
    """The build tree this module was imported from (<build>/python/simpler), or None when installed."""
    d = os.path.normpath(os.path.join(os.path.dirname(simpler.__file__), "..", ".."))
    return d if os.path.isfile(os.path.join(d, "CMakeCache.txt")) else None


def test_make_install_puts_a_working_module_where_the_interpreter_finds_it(tmp_path):
    import subprocess
    import sys

    build = build_dir()
    if build is None:
        import pytest

        pytest.skip("the module was not imported from a build tree, so there is nothing to install")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", build, "--prefix", str(prefix)], check=True, capture_output=True,
                   timeout=120)
    site = [p for p in prefix.glob("lib/python3*/*-packages") if (p / "simpler").is_dir()]
    assert len(site) == 1, list(prefix.rglob("simpler"))
    script = ("import simpler, os\n"
              "from simpler.examples import vector_add\n"
              "print(os.path.realpath(simpler.__file__))\n"
              "print(os.path.realpath(simpler.example_kernel('vector_add_add')))\n"
              "print(vector_add.run(runs=2))\n")
    env = {k: v for k, v in os.environ.items() if k != "SIMPLER_KERNEL_DIR"}
    env["PYTHONPATH"] = str(site[0])
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    module, kernel, detail = out.stdout.splitlines()
    root = os.path.realpath(str(prefix))
    assert module.startswith(root) and kernel.startswith(root), out.stdout
    assert detail.startswith("vector_add:")
