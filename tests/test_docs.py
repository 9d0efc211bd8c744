"""Every ```python block of every page in docs/ runs, in order, per page."""
import pathlib
import re

import pytest

DOCS = sorted((pathlib.Path(__file__).parent.parent / "docs").glob("*.md"))


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_doc_page_runs(page):
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks, f"{page.name} has no python blocks"
    namespace = {"__name__": f"docs_{page.stem}"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{page.name}[block {i}]", "exec"), namespace)
