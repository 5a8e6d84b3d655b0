"""The README's Python quick start runs as written: every ```-fenced block of its "Using it from Python" section
that is Python (not shell) is executed; the blocks that need a CUDA device are skipped without one."""
import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_blocks():
    text = open(README, encoding="utf-8").read()
    section = text.split("## Using it from Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    return [b for b in blocks if b.lstrip().startswith("import ")]


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_block_runs(index):
    torch = pytest.importorskip("torch")
    block = python_blocks()[index]
    if "cuda" in block.replace('.to("cuda")', "") and not torch.cuda.is_available():
        pytest.skip("the block runs on a CUDA device")
    exec(compile(block, "README.md python block %d" % index, "exec"), {})
