"""The shape of a shape space: its dimensions, dtypes and where it came from (farm.corpus.space)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dim:
    """One varying size: a module constant, or a keyword parameter of get_inputs."""

    name: str
    low: int
    high: int
    base: int  # its value in the shape set (the benchmark case)
    keyword: bool = False

    def as_dict(self) -> dict:
        return {"name": self.name, "low": self.low, "high": self.high, "base": self.base, "keyword": self.keyword}


@dataclass(frozen=True)
class ShapeSpace:
    dims: tuple[Dim, ...] = ()
    dtype_name: str | None = None  # the constant or keyword that holds the inputs' dtype
    dtypes: tuple[str, ...] = ()  # dtype names it may take (the base first)
    dtype_keyword: bool = False
    origin: str = "none"  # declared, derived or none
    note: str = ""

    def describe(self) -> str:
        parts = [f"{d.name} {d.low}..{d.high}" for d in self.dims]
        if self.dtype_name and len(self.dtypes) > 1:
            parts.append(f"{self.dtype_name} {'|'.join(self.dtypes)}")
        return ", ".join(parts) or "fixed"

    def as_dict(self) -> dict:
        return {"dims": [d.as_dict() for d in self.dims], "dtype_name": self.dtype_name, "dtypes": list(self.dtypes),
                "dtype_keyword": self.dtype_keyword, "origin": self.origin, "note": self.note}

    @classmethod
    def from_dict(cls, doc: dict) -> ShapeSpace:
        return cls(tuple(Dim(**d) for d in doc.get("dims", [])), doc.get("dtype_name"), tuple(doc.get("dtypes", [])),
                   bool(doc.get("dtype_keyword")), doc.get("origin", "none"), doc.get("note", ""))
