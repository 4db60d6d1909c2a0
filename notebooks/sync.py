"""Puts notebooks/first_cell.py into every notebook here as its first code cell, outputs cleared.

Run ``python notebooks/sync.py`` after editing first_cell.py; tests/tools/test_notebooks.py checks that
every notebook's first code cell is that file, verbatim.
"""

import pathlib

import nbformat

HERE = pathlib.Path(__file__).resolve().parent
FIRST_CELL = (HERE / "first_cell.py").read_text(encoding="utf-8").rstrip("\n")
MARK = "# tpushim first cell"


def sync(path):
    notebook = nbformat.read(path, as_version=4)
    code = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    if code and notebook.cells[code[0]].source.startswith(MARK):
        notebook.cells[code[0]].source = FIRST_CELL
    else:
        # First after the title, before anything else.
        title = bool(notebook.cells) and notebook.cells[0].cell_type == "markdown"
        notebook.cells.insert(int(title), nbformat.v4.new_code_cell(FIRST_CELL))
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(notebook, path)


if __name__ == "__main__":
    for path in sorted(HERE.glob("*.ipynb")):
        sync(path)
        print("synced", path.name)
