"""Fill bench/gpu/carry/ (git-ignored, a few MiB) with what bench/gpu/run.py needs on a machine without network:
the pure-Python and binary wheels of pydantic, math-verify, pebble, rich and pyyaml for CPython 3.10-3.13 on
x86-64 Linux, and the SmolLM2 tokenizer (no hub there). Then copy the checkout, bench/gpu/carry/ included, to the
GPU machine and run the GPU script there.

    python bench/gpu/prepare.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
PACKAGES = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "math-verify",
            "latex2sympy2-extended", "antlr4-python3-runtime==4.13.2", "pebble", "rich", "markdown-it-py", "mdurl",
            "pygments", "pyyaml"]  # fmt: skip


def main() -> None:
    wheels = HERE / "carry" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for py in ("3.10", "3.11", "3.12", "3.13"):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", py, "--platform", "manylinux2014_x86_64", "--platform",
                        "manylinux_2_17_x86_64", "-d", str(wheels), *PACKAGES], check=True)  # fmt: skip
    from mugrpo.policy.models import load_tokenizer, smollm2_gguf_path

    load_tokenizer(smollm2_gguf_path()).save_pretrained(HERE / "carry" / "tokenizer")
    size = sum(f.stat().st_size for f in (HERE / "carry").rglob("*") if f.is_file())
    print(f"bench/gpu/carry: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
