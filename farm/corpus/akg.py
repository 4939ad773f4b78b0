"""AKG's benchmark corpus (akg_agents/benchmark/akg_kernels_bench/thirdparty/) as farm sources,
its files unchanged: which folders are sources and what each is called."""

from __future__ import annotations

from pathlib import Path

from farm.errors import FarmError

# The names the farm has always used for AKG's three original folders; every other folder is
# named by its path under thirdparty/ ('pytorch/group_1' -> 'pytorch_group_1').
AKG_FOLDERS = {"sglang": "sglang", "vllm_triton": "vllm/triton_ops", "vllm_torch": "vllm/torch_ops"}
AKG_CORPUS = "benchmark/akg_kernels_bench/thirdparty"
# Folders of AKG's corpus that hold no standalone tasks: sglang/class_method/'s files are
# methods of allocator classes (AKG's own reference generator skips them too).
AKG_NOT_SOURCES = {"sglang/class_method"}


def _akg_base(root: Path) -> Path | None:
    """thirdparty/ inside a checkout or its akg_agents/, or `root` itself where it holds one of
    AKG's original folders (any folder of .py files would otherwise pass for a corpus)."""
    for base in (root / "akg_agents" / AKG_CORPUS, root / AKG_CORPUS):
        if base.is_dir() and any(_akg_task_folders(base)):
            return base
    if any((root / sub).is_dir() for sub in AKG_FOLDERS.values()) and any(_akg_task_folders(root)):
        return root
    return None


def _akg_task_folders(base: Path):
    """Folders under thirdparty/ that hold task files of their own, at any depth (AKG adds
    folders between releases: attention_kernels/, pytorch/group_N/)."""
    for folder in sorted(p for p in base.rglob("*") if p.is_dir()):
        rel = folder.relative_to(base)
        if rel.as_posix() in AKG_NOT_SOURCES or any(part.startswith((".", "_")) for part in rel.parts):
            continue
        if any(f.name != "__init__.py" for f in folder.glob("*.py")):  # a package marker is no task
            yield rel.as_posix(), folder


def akg_source_name(rel: str) -> str:
    names = {sub: name for name, sub in AKG_FOLDERS.items()}
    return names.get(rel, rel.replace("/", "_"))


def akg_folders(root: str | Path) -> dict[str, Path]:
    """Every task folder of an AKG checkout, by farm source name. `root` may be the checkout,
    its akg_agents/ folder, or the thirdparty/ folder itself. Only the top-level files of a
    folder are its tasks; sglang/class_method/ is not a source (AKG_NOT_SOURCES)."""
    root = Path(root).expanduser()
    base = _akg_base(root)
    if base is None:
        raise FarmError(f"corpus.akg_root: {root} is not an AKG checkout (no folder of task files under "
                        f"{AKG_CORPUS}/, e.g. {', '.join(AKG_FOLDERS.values())})")
    return {akg_source_name(rel): folder for rel, folder in _akg_task_folders(base)}
